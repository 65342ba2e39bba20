package webhook_test

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestReleaseRecordDataLoss: a helm upgrade whose CRD the API server would accept, but
// whose schema drops a field stored objects hold (kro 0.2.0 -> 0.9.3). The release-record
// gate denies it before anything is applied, naming the path; nothing of the revision
// lands. With the loss accepted on the live CRD, the same upgrade goes through.
func TestReleaseRecordDataLoss(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	// kro's real CRDs under a group of this test's own: other tests of the package
	// install kro itself.
	const ns, group = "schemaloss", "loss.example.com"
	const crd = "resourcegraphdefinitions." + group
	namespace(t, s.c, ns)
	chart := func(v string) string {
		p, err := testenv.KroChart(t.TempDir(), v, group)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mustHelm(t, "install", "kro-loss", chart("0.2.0"), "-n", ns)
	cs := apiextclient.NewForConfigOrDie(s.cp.Config)
	if err := testenv.WaitEstablished(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateKroGraph(ctx, s.cp.Config, group, "web"); err != nil {
		t.Fatal(err)
	}
	ri := dynamic.NewForConfigOrDie(s.cp.Config).Resource(schema.GroupVersionResource{Group: group, Version: "v1alpha1", Resource: "resourcegraphdefinitions"})
	before := revisions(t, ns)

	out, err := helmCLI(t, "upgrade", "kro-loss", chart("0.9.3"), "-n", ns)
	if err == nil {
		t.Fatalf("helm upgrade succeeded; want it denied for the fields it drops:\n%s", out)
	}
	mustContain(t, out, `admission webhook "release.upgradeguard.io" denied the request`,
		"the incoming schema would drop fields that stored objects hold",
		"spec.defaultServiceAccounts (1 objects)", predict.AllowFieldLossAnnotation)
	if diff := cmp.Diff(before, revisions(t, ns)); diff != "" {
		t.Errorf("release history changed by the denied upgrade (-before +after):\n%s", diff)
	}
	got, err := ri.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "defaultServiceAccounts"); !found {
		t.Fatal("the field is gone although the upgrade was denied")
	}

	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, predict.AllowFieldLossAnnotation)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	mustHelm(t, "upgrade", "kro-loss", chart("0.9.3"), "-n", ns)
}
