package check_test

import (
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdguard"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// dropCharts writes two versions of a chart "gadgets": 1.0.0 renders crd from templates/
// with a ConfigMap, 2.0.0 the ConfigMap alone (the upgrade drops the CRD, so Helm deletes
// it).
func dropCharts(t *testing.T, crd *apiextv1.CustomResourceDefinition) (v1, v2 string) {
	t.Helper()
	c := crd.DeepCopy()
	c.TypeMeta = metav1.TypeMeta{APIVersion: apiextv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"}
	data, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gadgets-version\ndata:\n  version: {{ .Chart.Version | quote }}\n"
	dir := t.TempDir()
	if v1, err = testenv.WriteChart(filepath.Join(dir, "1"), "gadgets", "1.0.0", map[string]string{"templates/crd.yaml": string(data), "templates/cm.yaml": cm}); err != nil {
		t.Fatal(err)
	}
	if v2, err = testenv.WriteChart(filepath.Join(dir, "2"), "gadgets", "2.0.0", map[string]string{"templates/cm.yaml": cm}); err != nil {
		t.Fatal(err)
	}
	return v1, v2
}

// predictDrop predicts the upgrade of release gadgets in ns to chart as cfg, by deployer.
func predictDrop(t *testing.T, cfg *rest.Config, ns, chart string, deployer predict.Deployer) *check.Report {
	t.Helper()
	cluster, err := livecluster.NewKubeCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := helmrelease.NewReader(kubernetes.NewForConfigOrDie(cfg), ns, "secret")
	if err != nil {
		t.Fatal(err)
	}
	p, err := check.Predict(t.Context(), check.Sources{Cluster: cluster, Releases: reader, Release: "gadgets", Namespace: ns, Deployer: deployer,
		Chart: chartsource.CheckChart(chartsource.Helm{}, chartsource.Options{Ref: chart})})
	if err != nil {
		t.Fatal(err)
	}
	return p.Report
}

// TestDeletionDeniedByPolicy: an upgrade whose chart drops an empty CRD that a deletion
// guardrail modelled on Cozystack's protects (testenv.NoDelete, the CRD labelled as
// Cozystack labels its own). Without the policy the deletion loses nothing: ok. With it, the API server
// refuses the DELETE, and Helm 4 fails the upgrade there: check predicts the policy
// verdict, naming the policy, its binding, the deletion and the message, for an admin
// and for a user who may only read, and its next step is to keep the CRD; the real helm
// upgrade then fails on that very refusal, and the CRD stays. Helm 3 logs the refusal and
// goes on: ok, and the real helm3 upgrade succeeds with the CRD in place. The CRD kept
// (the next step) is ok again.
func TestDeletionDeniedByPolicy(t *testing.T) {
	ctx, cs, _ := freshCluster(t)
	reader := "policy-delete-reader"
	cp.Grant(t, reader,
		rbacv1.PolicyRule{APIGroups: []string{apiextv1.GroupName}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list"}},
		rbacv1.PolicyRule{APIGroups: []string{admissionregistrationv1.GroupName},
			Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"gadgets"}, Verbs: []string{"list"}})
	readerCfg, err := cp.AddUser(reader)
	if err != nil {
		t.Fatal(err)
	}

	type helmCase struct {
		name, ns string
		helm     func(args ...string) []byte
		deployer predict.Deployer
	}
	run := func(cli func(args ...string) ([]byte, error)) func(args ...string) []byte {
		return func(args ...string) []byte {
			t.Helper()
			out, err := cli(args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			return out
		}
	}
	helm4 := func(args ...string) ([]byte, error) { return cp.Helm(args...).CombinedOutput() }
	helm3 := func(args ...string) ([]byte, error) { return cp.Helm3(args...).CombinedOutput() }
	cases := []struct {
		helmCase
		cli func(args ...string) ([]byte, error)
	}{
		{helmCase{name: "helm4", ns: "policy-delete-4", deployer: predict.Helm4}, helm4},
		{helmCase{name: "helm3", ns: "policy-delete-3", deployer: predict.Helm3}, helm3},
	}
	crds := map[string]*apiextv1.CustomResourceDefinition{}
	charts := map[string][2]string{}
	for i := range cases {
		c := &cases[i]
		c.helm = run(c.cli)
		crd := fieldsCRD(c.name + ".policydelete.check.test")
		crd.Labels = map[string]string{testenv.NoDeleteLabel: "true"} // as Cozystack labels its CRDs
		v1, v2 := dropCharts(t, crd)
		crds[c.name], charts[c.name] = crd, [2]string{v1, v2}
		c.helm("install", "gadgets", v1, "-n", c.ns, "--create-namespace")
		t.Cleanup(func() { _, _ = c.cli("uninstall", "gadgets", "-n", c.ns) })
		if err := testenv.WaitEstablished(ctx, cs, crd.Name); err != nil {
			t.Fatal(err)
		}
	}

	// No policy: the CRD holds nothing, so its deletion loses nothing.
	for _, c := range cases {
		rep := predictDrop(t, cp.Config, c.ns, charts[c.name][1], c.deployer)
		if got := find(t, rep, crds[c.name].Name); got.Verdict != predict.OK || !rep.Safe || !strings.Contains(got.Reason, "nothing is lost") {
			t.Fatalf("%s, no policy: %s (safe %v) %q, want ok: nothing is lost", c.name, got.Verdict, rep.Safe, got.Reason)
		}
	}

	policy, binding := testenv.NoDelete()
	cp.InstallAdmissionPolicies(t, []*admissionregistrationv1.ValidatingAdmissionPolicy{policy}, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{binding},
		cp.DryRunDeleteCRD(crds["helm4"].Name))
	refusal := "ValidatingAdmissionPolicy '" + testenv.NoDeleteName + "' with binding '" + testenv.NoDeleteName + "' denied request: " + testenv.NoDeleteMessage

	c4 := cases[0]
	name := crds["helm4"].Name
	for _, who := range []struct {
		name string
		cfg  *rest.Config
	}{{"admin", cp.Config}, {"reader", readerCfg}} {
		rep := predictDrop(t, who.cfg, c4.ns, charts["helm4"][1], c4.deployer)
		got := find(t, rep, name)
		if got.Verdict != predict.PolicyDenied || rep.Safe || len(rep.Unasked) > 0 {
			t.Fatalf("%s: %s (safe %v, not asked %+v) %q, want the policy verdict", who.name, got.Verdict, rep.Safe, rep.Unasked, got.Reason)
		}
		if len(got.Policies) != 1 || got.Policies[0].Policy != testenv.NoDeleteName || got.Policies[0].Binding != testenv.NoDeleteName ||
			got.Policies[0].Operation != admissionregistrationv1.Delete || got.Policies[0].Message != testenv.NoDeleteMessage {
			t.Errorf("%s: denials %+v, want %s's of the DELETE", who.name, got.Policies, testenv.NoDeleteName)
		}
		reasonSays(t, who.name, got.Reason, "ValidatingAdmissionPolicy "+testenv.NoDeleteName+" (binding "+testenv.NoDeleteName+") denies the deletion: "+testenv.NoDeleteMessage,
			"the upgrade fails at the deletion", "nothing is lost")
		keep := predict.Keep([]string{name}).String()
		if len(rep.NextSteps) != 1 || rep.NextSteps[0] != keep || !strings.Contains(got.Action, keep) || !strings.Contains(got.Action, "kubectl get validatingadmissionpolicy "+testenv.NoDeleteName) {
			t.Errorf("%s: next steps %q, action %q; want %q first, and the policy named", who.name, rep.NextSteps, got.Action, keep)
		}
	}

	// The real Helm 4 upgrade fails on the predicted refusal, after applying the rest;
	// the CRD stays.
	out, err := helm4("upgrade", "gadgets", charts["helm4"][1], "-n", c4.ns)
	t.Logf("helm upgrade: %v\n%s", err, out)
	if err == nil || !strings.Contains(string(out), "failed to delete resource") || !strings.Contains(string(out), refusal) {
		t.Errorf("helm upgrade: %v, want it to fail on the policy's refusal:\n%s", err, out)
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("%s after the refused deletion: %v", name, err)
	}

	// Helm 3 logs the refused deletion and goes on: ok, as its real upgrade shows.
	c3 := cases[1]
	name3 := crds["helm3"].Name
	if got := find(t, predictDrop(t, cp.Config, c3.ns, charts["helm3"][1], c3.deployer), name3); got.Verdict != predict.OK ||
		len(got.Policies) != 1 || !strings.Contains(got.Reason, "Helm 3 logs the refused deletion and goes on") {
		t.Errorf("helm3: %s %q (denials %+v), want ok naming the refusal", got.Verdict, got.Reason, got.Policies)
	}
	c3.helm("upgrade", "gadgets", charts["helm3"][1], "-n", c3.ns)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name3, metav1.GetOptions{}); err != nil {
		t.Errorf("%s after helm3's upgrade: %v", name3, err)
	}

	// The next step: the CRD kept, Helm leaves it, and nothing asks for the deletion.
	keep(t, cs, name)
	if got := find(t, predictDrop(t, cp.Config, c4.ns, charts["helm4"][1], c4.deployer), name); got.Verdict != predict.OK || len(got.Policies) != 0 {
		t.Errorf("kept: %s %q (denials %+v), want ok", got.Verdict, got.Reason, got.Policies)
	}
}

// TestOwnGuardPolicyPredicted: upgradeguard's own CRD deletion guard as admission
// policies (crdguard.Objects, what the chart renders for webhook.crdDeletion.mode policy)
// is predicted by the same evaluation: an upgrade that drops a CRD holding objects,
// labelled upgradeguard.io/holds-objects=true (as the controller keeps it), is the
// policy verdict, once: one finding for the CRD, the deletion's loss in its reason, not
// a Delete verdict beside it. Annotated upgradeguard.io/allow-delete=true, the policy
// lets it go, and the deletion with its objects is the Delete verdict again.
func TestOwnGuardPolicyPredicted(t *testing.T) {
	ctx, cs, cluster := freshCluster(t)
	crd := fieldsCRD("guard.policydelete.check.test")
	crd.Labels = map[string]string{crdguard.LabelHoldsObjects: "true"} // as the controller keeps it
	applyAll(t, ctx, cs, []*apiextv1.CustomResourceDefinition{crd})
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: crd.Spec.Group, Version: "v1", Resource: "gadgets"},
		Kind: "Gadget", Namespaces: []string{"guarded"}, PerNS: 2,
	}); err != nil {
		t.Fatal(err)
	}
	guard := crdguard.Objects(crdguard.Options{ServiceAccountNamespace: "upgradeguard-system", ServiceAccountName: "upgradeguard"})
	policies, bindings := guard.List()
	cp.InstallAdmissionPolicies(t, policies, bindings, cp.DryRunDeleteCRD(crd.Name))

	req := check.Request{Operation: predict.Upgrade, Release: "gadgets", Namespace: "guarded", Current: templates([]*apiextv1.CustomResourceDefinition{crd})}
	rep, err := check.Run(ctx, cluster, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.CRDs) != 1 {
		t.Fatalf("%d verdicts, want one for %s: %+v", len(rep.CRDs), crd.Name, rep.CRDs)
	}
	got := rep.CRDs[0]
	if got.Verdict != predict.PolicyDenied || len(got.Policies) != 1 || got.Policies[0].Policy != crdguard.Name || !got.Policies[0].Deletion() {
		t.Fatalf("%s %q (denials %+v), want the policy verdict of %s, once", got.Verdict, got.Reason, got.Policies, crdguard.Name)
	}
	reasonSays(t, "guarded", got.Reason, "denies the deletion: CustomResourceDefinition "+crd.Name+" holds objects", "all 2 Gadget objects")
	if f := rep.FindingReport(); len(f.Cases) != 1 || len(f.Cases[0].Findings) != 1 || f.Cases[0].Findings[0].Check != string(predict.PolicyDenied) {
		t.Errorf("findings %+v, want one policy finding", f.Cases)
	}

	patch := []byte(`{"metadata":{"annotations":{"` + predict.AllowDeleteAnnotation + `":"true"}}}`)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if rep, err = check.Run(ctx, cluster, req); err != nil {
		t.Fatal(err)
	}
	if got := find(t, rep, crd.Name); got.Verdict != predict.Delete || len(got.Policies) != 0 {
		t.Errorf("allowed: %s %q (denials %+v), want the delete verdict", got.Verdict, got.Reason, got.Policies)
	}
}

// keep annotates the live CRD helm.sh/resource-policy=keep.
func keep(t *testing.T, cs apiextclient.Interface, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
