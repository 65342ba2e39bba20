package applycheck_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

func configMaps(first, target string) map[string]string {
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n" + data
	}
	return map[string]string{"templates/a.yaml": cm("a-first", "  x: \""+first+"\"\n"), "templates/b.yaml": cm("b-target", "  mode: "+target+"\n")}
}

// TestConflictPreflightMatchesHelm: a field another manager took (as `kubectl patch`
// does) makes the real Helm 4 upgrade stop at that object after applying the ones before
// it. The dry-run pre-flight names the field, the manager and that partial state, and
// writes nothing.
func TestConflictPreflightMatchesHelm(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := testenv.ForTest(t)
	ctx := t.Context()
	v1, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", configMaps("1", "a"))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "app", "1.1.0", configMaps("2", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Helm("install", "app", v1, "-n", "apps", "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := cs.CoreV1().ConfigMaps("apps").Patch(ctx, "b-target", types.MergePatchType, []byte(`{"data":{"mode":"manual"}}`),
		metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}

	ch, err := chartsource.Load(ctx, chartsource.Options{Ref: v2, ReleaseName: "app", Namespace: "apps", IsUpgrade: true})
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	rep, err := applycheck.Run(ctx, dyn, mapper, ch.Manifest, applycheck.Options{FieldManager: "helm", Namespace: "apps"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Safe || rep.StopsAt != "ConfigMap/apps/b-target" || !cmp.Equal(rep.PartialState, []string{"ConfigMap/apps/a-first"}) {
		t.Fatalf("report %+v", rep)
	}
	if diff := cmp.Diff([]applycheck.FieldConflict{{Field: ".data.mode", Manager: "kubectl-patch"}}, rep.Objects[1].Conflicts); diff != "" {
		t.Errorf("conflicts (-want +got):\n%s", diff)
	}
	if cm, _ := cs.CoreV1().ConfigMaps("apps").Get(ctx, "a-first", metav1.GetOptions{}); cm.Data["x"] != "1" {
		t.Errorf("the dry run wrote: a-first x=%s", cm.Data["x"])
	}

	// The real upgrade fails where predicted, with the predicted partial state.
	out, err := cp.Helm("upgrade", "app", v2, "-n", "apps").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "conflict") || !strings.Contains(string(out), "kubectl-patch") {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	a, _ := cs.CoreV1().ConfigMaps("apps").Get(ctx, "a-first", metav1.GetOptions{})
	b, _ := cs.CoreV1().ConfigMaps("apps").Get(ctx, "b-target", metav1.GetOptions{})
	if a.Data["x"] != "2" || b.Data["mode"] != "manual" {
		t.Errorf("after the failed upgrade a-first x=%s b-target mode=%s, want the predicted partial state (2, manual)", a.Data["x"], b.Data["mode"])
	}

	// Flux's helm-controller forces conflicts: the same upgrade applies.
	rep, err = applycheck.Run(ctx, dyn, mapper, ch.Manifest, applycheck.Options{FieldManager: "helm-controller", Force: true, Namespace: "apps"})
	if err != nil || !rep.Safe {
		t.Errorf("forced: %v %+v", err, rep)
	}
}
