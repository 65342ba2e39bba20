package uninstall_test

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// TestCRDDeletionDeniedByPolicy: a release renders an empty CRD from templates/ that a
// deletion guardrail modelled on Cozystack's protects (testenv.NoDelete; the CRD is
// labelled as Cozystack labels its own). The pre-flight evaluates the policies for the
// uninstall's DELETE of the CRD and finds the denial, naming the policy, its binding and
// message, with the keep advice; the real helm uninstall fails on that very refusal and
// the CRD stays. With policies it may not read, the pre-flight says they were not asked.
// Without the policy the uninstall goes through.
func TestCRDDeletionDeniedByPolicy(t *testing.T) {
	needCluster(t)
	const name = "guarded.policy.uninstall.test"
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.` + name + `
  labels: {"` + testenv.NoDeleteLabel + `": "true"}
spec:
  group: ` + name + `
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`
	ch := dbChart(t, "1.0.0", map[string]string{"templates/crd.yaml": crd})
	const rel, ns = "guarded", "uninstall-policy"
	mustHelm(t, nil, "install", rel, ch, "-n", ns, "--create-namespace")
	crdName := "widgets." + name
	t.Cleanup(func() {
		_ = apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Delete(t.Context(), crdName, metav1.DeleteOptions{})
	})
	policy, binding := testenv.NoDelete()
	cp.InstallAdmissionPolicies(t, []*admissionregistrationv1.ValidatingAdmissionPolicy{policy}, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{binding},
		cp.DryRunDeleteCRD(crdName))

	evaluator := func(t *testing.T, user string, rules ...rbacv1.PolicyRule) uninstall.PolicyEvaluator {
		t.Helper()
		cfg := cp.Config
		if user != "" {
			cp.Grant(t, user, rules...)
			var err error
			if cfg, err = cp.AddUser(user); err != nil {
				t.Fatal(err)
			}
		}
		k, err := livecluster.NewKubeCluster(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	rep := check(t, uninstall.Options{Release: rel, Namespace: ns, Policies: evaluator(t, "")})
	fs := findings(rep, uninstall.CheckCRDDeletionDenied)
	want := "ValidatingAdmissionPolicy " + testenv.NoDeleteName + " (binding " + testenv.NoDeleteName + ") denies the deletion: " + testenv.NoDeleteMessage
	if len(fs) != 1 || !strings.Contains(fs[0].Message, want) || !strings.Contains(fs[0].Message, "then fails on this one") ||
		!strings.Contains(fs[0].Remediation, "helm.sh/resource-policy") || rep.Safe || rep.PoliciesNotAsked != "" {
		t.Fatalf("findings %+v (safe %v, not asked %q), want one %s naming %q", rep.Findings, rep.Safe, rep.PoliciesNotAsked, uninstall.CheckCRDDeletionDenied, want)
	}
	if o := objectByKind(rep, "CustomResourceDefinition", crdName); o == nil || len(o.Policies) != 1 || !o.Policies[0].Deletion() {
		t.Errorf("CRD object %+v, want the denial on it", o)
	}

	// Policies this identity may not read: not asked, said, never a silent pass.
	nothing := evaluator(t, "uninstall-policy-blind", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}})
	if rep := check(t, uninstall.Options{Release: rel, Namespace: ns, Policies: nothing}); rep.PoliciesNotAsked == "" || len(findings(rep, uninstall.CheckCRDDeletionDenied)) != 0 {
		t.Errorf("policies not readable: not asked %q, findings %+v; want it said", rep.PoliciesNotAsked, rep.Findings)
	}

	// The real uninstall fails on the predicted refusal (its --debug log names it); the
	// CRD stays.
	out, err := helm(t, nil, "uninstall", rel, "-n", ns, "--debug")
	t.Logf("helm uninstall: %v\n%s", err, out)
	if err == nil || !strings.Contains(out, "ValidatingAdmissionPolicy '"+testenv.NoDeleteName+"' with binding '"+testenv.NoDeleteName+"' denied request: "+testenv.NoDeleteMessage) {
		t.Errorf("helm uninstall: %v, want it to fail on the policy's refusal", err)
	}
	if _, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), crdName, metav1.GetOptions{}); err != nil {
		t.Errorf("%s after the refused uninstall: %v", crdName, err)
	}
}
