package cli_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestCheckDataLoss: a chart upgrade whose CRD the API server accepts but whose schema
// drops fields objects hold (kro 0.2.0 -> 0.9.3). check exits 1 with the paths and no
// values; the real helm upgrade then succeeds, and the fields are gone, as predicted.
func TestCheckDataLoss(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	const crd = "resourcegraphdefinitions.kro.run"
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("delete the CRDs: %v", err)
		}
	})
	rev1 := fixtureChart(t, "kro", "0.2.0", "crds/kro/v0.2.0/kro.run_resourcegraphdefinitions.yaml")
	rev2 := fixtureChart(t, "kro", "0.9.3", "crds/kro/v0.9.3/kro.run_resourcegraphdefinitions.yaml")
	mustHelm(t, nil, "install", "kro", rev1, "-n", "kro", "--create-namespace")
	uninstallOnCleanup(t, nil, "kro", "kro")
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(cp.Config), crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateKroGraph(ctx, cp.Config, "kro.run", "web"); err != nil {
		t.Fatal(err)
	}
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(schema.GroupVersionResource{Group: "kro.run", Version: "v1alpha1", Resource: "resourcegraphdefinitions"})

	r := ug(t, "check", "--chart", rev2, "--release", "kro", "-n", "kro", "-o", "json")
	if r.code != cli.ExitFindings {
		t.Fatalf("check exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	rep := report(t, r)
	if got := verdicts(rep)[predict.DataLoss]; len(got) != 1 || got[0] != crd {
		t.Fatalf("verdicts %v, want %s data-loss", verdicts(rep), crd)
	}
	text := ug(t, "check", "--chart", rev2, "--release", "kro", "-n", "kro")
	for _, want := range []string{"data loss: spec.defaultServiceAccounts is dropped at v1alpha1 from 1 objects (web)",
		"upgradeguard.io/allow-field-loss=true", "data-loss"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
	if strings.Contains(text.stdout+r.stdout, testenv.KroLostValue) {
		t.Errorf("a field's value reached the output")
	}

	// The API server accepts the upgrade: nothing fails, and the field is gone.
	mustHelm(t, nil, "upgrade", "kro", rev2, "-n", "kro")
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ri.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, found, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "defaultServiceAccounts")
		return !found, nil
	})
	if err != nil {
		t.Fatalf("after the real upgrade spec.defaultServiceAccounts is still served: %v", err)
	}
}

// TestPlanDataLoss: plan treats a step whose schema drops stored fields as a blocker: with
// kro 0.2.0 installed and 0.9.3 the only newer chart, there is no path (exit 1, naming the
// CRD, the version and the path); once the live CRD accepts the loss, the upgrade is one
// safe step.
func TestPlanDataLoss(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	const group = "plan-loss.example.com"
	const crd = "resourcegraphdefinitions." + group
	const ns = "plan-loss"
	dir := t.TempDir()
	chart := func(v string) string {
		p, err := testenv.KroChart(filepath.Join(dir, v), v, group)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	older := chart("0.2.0")
	newer, err := testenv.Package(chart("0.9.3"), dir)
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "kro-plan", older, "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "kro-plan", "-n", ns) })
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	if err := testenv.WaitEstablished(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateKroGraph(ctx, cp.Config, group, "web"); err != nil {
		t.Fatal(err)
	}

	r := ug(t, "plan", "--release", "kro-plan", "-n", ns, older, newer)
	if r.code != cli.ExitFindings || !strings.Contains(r.stderr+r.stdout, crd) || !strings.Contains(r.stderr+r.stdout, "0.9.3") ||
		!strings.Contains(r.stderr+r.stdout, "spec.defaultServiceAccounts") {
		t.Fatalf("plan through a data-loss step: exit %d, want 1 (no path) naming %s, 0.9.3 and the path\n%s%s", r.code, crd, r.stdout, r.stderr)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, predict.AllowFieldLossAnnotation)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	p := planOf(t, cli.ExitSafe, "--release", "kro-plan", "-n", ns, older, newer)
	if len(p.Steps) != 1 || p.Steps[0].ChartVersion != "0.9.3" {
		t.Fatalf("steps %+v, want the one upgrade to 0.9.3", p.Steps)
	}
}
