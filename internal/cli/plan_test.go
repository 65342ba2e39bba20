package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// planOf runs plan with -o json and decodes it.
func planOf(t *testing.T, wantCode int, args ...string) *plan.Plan {
	t.Helper()
	r := ug(t, append([]string{"plan", "-o", "json"}, args...)...)
	if r.code != wantCode {
		t.Fatalf("plan %v: exit %d, want %d\n%s%s", args, r.code, wantCode, r.stdout, r.stderr)
	}
	var p plan.Plan
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatalf("plan JSON: %v\n%s%s", err, r.stdout, r.stderr)
	}
	return &p
}

// runCommand carries out one command a plan names: helm with the real Helm CLI,
// upgradeguard through the CLI, kubectl with the real kubectl.
func runCommand(t *testing.T, command string) {
	t.Helper()
	if i := strings.Index(command, " ("); i > 0 {
		command = command[:i] // a trailing explanation
	}
	args := strings.Fields(command)
	switch args[0] {
	case "helm":
		mustHelm(t, nil, args[1:]...)
	case "upgradeguard":
		if r := ug(t, append(args[1:], "--lease-namespace", "default")...); r.code != cli.ExitSafe {
			t.Fatalf("%s: exit %d\n%s%s", command, r.code, r.stdout, r.stderr)
		}
	case "kubectl":
		out, err := exec.Command(filepath.Join(cp.Bin, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args[1:]...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", command, err, out)
		}
	default:
		t.Fatalf("plan named a command the walk cannot run: %s", command)
	}
}

// walk carries out every step of p in order. Before each upgrade it asks
// `upgradeguard check` about that exact upgrade, on the cluster as the steps before have
// left it, and requires check's verdicts to equal the plan's prediction; after each
// step it requires the live storage and stored versions the plan predicted.
func walk(t *testing.T, p *plan.Plan) {
	t.Helper()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	for i, s := range p.Steps {
		t.Logf("step %d: %s %s %v", i+1, s.Kind, s.ChartVersion, s.Commands)
		if s.Kind == plan.Upgrade {
			args := strings.Fields(s.Commands[0])[2:] // helm upgrade RELEASE REF flags...
			release := strings.Fields(s.Commands[0])[2]
			checkArgs := append([]string{"check", "--chart", args[1], "--release", release, "-o", "json"}, args[2:]...)
			r := ug(t, checkArgs...)
			if r.code != cli.ExitSafe {
				t.Fatalf("step %d: check of the upgrade to %s: exit %d, but the plan predicted it safe\n%s%s", i+1, s.ChartVersion, r.code, r.stdout, r.stderr)
			}
			if diff := cmp.Diff(verdicts(s.Check), verdicts(report(t, r))); diff != "" {
				t.Fatalf("step %d: check disagrees with the plan's prediction (-plan +check):\n%s", i+1, diff)
			}
		}
		for _, c := range s.Commands {
			runCommand(t, c)
		}
		for _, want := range s.After {
			live, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), want.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			got := plan.CRDState{Name: live.Name, StorageVersion: crdversions.StorageVersion(live), StoredVersions: live.Status.StoredVersions}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("step %d: %s differs from the prediction (-plan +live):\n%s", i+1, want.Name, diff)
			}
		}
	}
}

// syntheticCRD is a CRD of group plan.example.com with the given versions; "v1*" is the
// storage version.
func syntheticCRD(plural, kind string, versions ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: %s.plan.example.com\nspec:\n  group: plan.example.com\n  scope: Namespaced\n  names:\n    plural: %s\n    singular: %s\n    kind: %s\n    listKind: %sList\n  versions:\n",
		plural, plural, strings.ToLower(kind), kind, kind)
	for _, v := range versions {
		storage := strings.HasSuffix(v, "*")
		fmt.Fprintf(&b, "  - name: %s\n    served: true\n    storage: %v\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n", strings.TrimSuffix(v, "*"), storage)
	}
	return b.String()
}

// syntheticSeries is six chart versions: two storage switches (v1alpha1 -> v1beta1 at
// 2.0.0, v1beta1 -> v1 at 4.0.0), two version removals (v1alpha1 at 3.0.0, v1beta1 at
// 5.0.0), and a second CRD that 6.0.0 no longer renders.
func syntheticSeries(t *testing.T, dir string) []string {
	t.Helper()
	widgets := map[string][]string{
		"1.0.0": {"v1alpha1*"},
		"2.0.0": {"v1alpha1", "v1beta1*"},
		"3.0.0": {"v1beta1*"},
		"4.0.0": {"v1beta1", "v1*"},
		"5.0.0": {"v1*"},
		"6.0.0": {"v1*", "v2"},
	}
	var out []string
	for _, v := range []string{"1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0"} {
		files := map[string]string{"templates/widgets.yaml": syntheticCRD("widgets", "Widget", widgets[v]...)}
		if v != "6.0.0" {
			files["templates/gadgets.yaml"] = syntheticCRD("gadgets", "Gadget", "v1*")
		}
		p, err := testenv.WriteChart(filepath.Join(dir, v), "synthetic", v, files)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

const widgets, gadgets = "widgets.plan.example.com", "gadgets.plan.example.com"

// TestPlanSyntheticWalk: a release on 1.0.0 with objects stored at v1alpha1 plans to
// 6.0.0 from local charts. No single upgrade is safe; the plan goes through 2.0.0 and
// 4.0.0 with a migration before each later upgrade and a keep annotation for the CRD
// 6.0.0 drops, and every step, carried out with the real helm CLI and upgradeguard
// migrate, succeeds where check agrees with the plan.
func TestPlanSyntheticWalk(t *testing.T) {
	needCluster(t)
	charts := syntheticSeries(t, t.TempDir())
	const ns = "plan-synthetic"
	mustHelm(t, nil, "install", "syn", charts[0], "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "syn", "-n", ns) })
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	for _, n := range []string{widgets, gadgets} {
		if err := testenv.WaitEstablished(t.Context(), cs, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "plan.example.com", Version: "v1alpha1", Resource: "widgets"},
		Kind: "Widget", Namespaces: []string{ns}, PerNS: 3, Spec: map[string]any{"size": 1},
	}); err != nil {
		t.Fatal(err)
	}

	// A direct upgrade is blocked: check says bridge, and plan finds the way round.
	if r := ug(t, "check", "--chart", charts[5], "--release", "syn", "-n", ns); r.code != cli.ExitFindings {
		t.Fatalf("check of 1.0.0 -> 6.0.0: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	args := append([]string{"--release", "syn", "-n", ns, "--latest", "--upgrade-keeps-rollback"}, charts...)
	p := planOf(t, cli.ExitFindings, args...)
	var kinds []string
	for _, s := range p.Steps {
		kinds = append(kinds, string(s.Kind)+" "+s.ChartVersion)
	}
	want := []string{"upgrade 2.0.0", "migrate ", "upgrade 4.0.0", "keep ", "migrate ", "upgrade 6.0.0"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Fatalf("steps (-want +got):\n%s", diff)
	}
	if p.From != "1.0.0" || p.Target != "6.0.0" || !p.Reachable {
		t.Errorf("from %q target %q reachable %v", p.From, p.Target, p.Reachable)
	}
	if p.Steps[1].Objects != 3 || !slices.Equal(p.Steps[1].CRDs, []string{widgets}) {
		t.Errorf("first migration: %d objects of %v, want 3 of widgets", p.Steps[1].Objects, p.Steps[1].CRDs)
	}
	if l := p.Latest; l == nil || l.DirectlySafe != "2.0.0" || l.Newest != "6.0.0" || len(l.Blocked) == 0 {
		t.Errorf("latest: %+v, want 2.0.0 directly safe and what blocks 3.0.0-6.0.0", p.Latest)
	} else {
		blocked := map[string]bool{}
		for _, b := range l.Blocked {
			blocked[b.Version] = true
		}
		for _, v := range []string{"3.0.0", "4.0.0", "5.0.0", "6.0.0"} {
			if !blocked[v] {
				t.Errorf("latest does not say what blocks %s: %+v", v, l.Blocked)
			}
		}
	}
	if p.KeepsRollback == nil || p.KeepsRollback.Reach != plan.Unreachable {
		t.Errorf("keeps rollback: %+v, want unreachable (v1alpha1 is gone after the plan)", p.KeepsRollback)
	}

	// The text form names each step's command.
	text := ug(t, append([]string{"plan"}, args...)...)
	for _, w := range []string{"1. upgrade to chart version 2.0.0", "$ helm upgrade syn " + charts[1], "$ upgradeguard migrate --crd " + widgets, "$ kubectl annotate crd " + gadgets} {
		if !strings.Contains(text.stdout, w) {
			t.Errorf("text plan lacks %q:\n%s", w, text.stdout)
		}
	}

	walk(t, p)
	if r := ug(t, "plan", "--release", "syn", "-n", ns, charts[5]); r.code != cli.ExitSafe {
		t.Errorf("plan once there: exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), gadgets, metav1.GetOptions{}); err != nil {
		t.Errorf("the kept CRD is gone after the walk: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), gadgets, metav1.DeleteOptions{})
	})
	_ = predict.OK
}
