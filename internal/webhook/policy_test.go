package webhook_test

import (
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
)

// TestGatePolicyDenied: a HelmRelease runs Gateway API v1.5.1's CRDs (a real Helm
// release of a chart that renders them), and the cluster has Gateway API's safe-upgrades
// policy. Moving the HelmRelease back to v1.4.1 (a Git revert) would write CRDs that the
// policy refuses, and delete the two CRDs v1.4.1 does not have, one of which a deletion
// guardrail modelled on Cozystack's protects: the HelmRelease gate denies the change before
// helm-controller sees it, with the policy verdict for both, each policy, binding and
// message named, the way past each (safe-upgrades' documented exception, keeping the
// protected CRD), and the gate's record on the HelmRelease says so. No CRD is written.
func TestGatePolicyDenied(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "gateway-system"
	if out, err := s.cp.Helm("install", "gateway-api", s.charts["gateway-api-crds-1.5.1"], "-n", ns, "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = s.cp.Helm("uninstall", "gateway-api", "-n", ns).Run() })
	const protected = "listenersets.gateway.networking.k8s.io" // v1.5.1's, not v1.4.1's
	cs := apiextclient.NewForConfigOrDie(s.cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	patch := []byte(`{"metadata":{"labels":{"` + testenv.NoDeleteLabel + `":"true"}}}`) // as Cozystack labels its CRDs
	if _, err := cs.Patch(ctx, protected, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.cp.InstallSafeUpgrades(t)
	policy, binding := testenv.NoDelete()
	s.cp.InstallAdmissionPolicies(t, []*admissionregistrationv1.ValidatingAdmissionPolicy{policy}, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{binding},
		s.cp.DryRunDeleteCRD(protected))
	before := map[string]string{}
	list, err := cs.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		if strings.HasSuffix(c.Name, ".gateway.networking.k8s.io") {
			before[c.Name] = c.ResourceVersion
		}
	}

	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	helmRelease(t, ns, "gateway-api", "gateway-api-crds", "1.5.1", "charts")
	err = setVersion(ctx, s.c, ns, "gateway-api", "1.4.1")
	mustDeny(t, err, gate.WhyPolicy,
		"gateways.gateway.networking.k8s.io: ValidatingAdmissionPolicy "+testenv.SafeUpgrades+" (binding "+testenv.SafeUpgrades+") denies the write: "+testenv.SafeUpgradesRefusal,
		protected+": ValidatingAdmissionPolicy "+testenv.NoDeleteName+" (binding "+testenv.NoDeleteName+") denies the deletion: "+testenv.NoDeleteMessage,
		"kubectl delete validatingadmissionpolicy "+testenv.SafeUpgrades,
		"kubectl annotate crd "+protected+" helm.sh/resource-policy=keep")

	var hr helmv2.HelmRelease
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gateway-api"}, &hr); err != nil {
		t.Fatal(err)
	}
	if hr.Spec.Chart.Spec.Version != "1.5.1" {
		t.Errorf("the HelmRelease changed to %s", hr.Spec.Chart.Spec.Version)
	}
	st := gateState(t, ns, "gateway-api", func(st webhook.State) bool { return st.Decision == webhook.OutcomeBlocked })
	if !strings.Contains(st.Message, testenv.SafeUpgradesRefusal) || !strings.Contains(st.Message, testenv.NoDeleteMessage) {
		t.Errorf("gate state %+v, want both policies' messages", st)
	}
	list, err = cs.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		if rv, ok := before[c.Name]; ok && rv != c.ResourceVersion {
			t.Errorf("%s was written (resourceVersion %s -> %s)", c.Name, rv, c.ResourceVersion)
		}
	}
}
