package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/output/citest"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
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
		out, err := exec.Command(filepath.Join(cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args[1:]...)...).CombinedOutput()
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
	// Gadgets in the CRD 6.0.0 drops: deleting it would lose them, so the plan keeps it.
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "plan.example.com", Version: "v1", Resource: "gadgets"},
		Kind: "Gadget", Namespaces: []string{ns}, PerNS: 2, Spec: map[string]any{"size": 1},
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
}

// cleanCRDs deletes the CRDs of a group that another test's release may own, before
// and after a test that installs them under its own release.
func cleanCRDs(t *testing.T, group string) {
	t.Helper()
	other := func(c *apiextv1.CustomResourceDefinition) bool { return !strings.HasSuffix(c.Spec.Group, group) }
	if err := cp.DeleteCRDs(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteCRDs(context.Background(), other) })
}

// fluxSeries packages flux2-like charts 2.12.0 to 2.18.2 into dir: source-controller
// CRDs v1.2.0 (2.12), v1.3.0 (2.13), v1.4.0 buckets (2.14), v1.6.0 (2.16), then the
// real flux2 2.17.2 CRDs and the real flux2 2.18.2 chart.
func fluxSeries(t *testing.T, dir string) {
	t.Helper()
	src := func(tag string, kinds ...string) []string {
		var out []string
		for _, k := range kinds {
			out = append(out, "crds/flux-source-controller/"+tag+"/source.toolkit.fluxcd.io_"+k+".yaml")
		}
		return out
	}
	series := map[string][]string{
		"2.12.0": src("v1.2.0", "buckets", "helmcharts", "helmrepositories"),
		"2.13.0": src("v1.3.0", "buckets", "helmcharts", "helmrepositories"),
		"2.14.0": append(src("v1.4.0", "buckets"), src("v1.3.0", "helmcharts", "helmrepositories")...),
		"2.16.0": src("v1.6.0", "buckets", "gitrepositories", "helmcharts", "helmrepositories", "ocirepositories"),
		"2.17.2": {"charts/flux2-2.17.2/rendered/crds.yaml"},
	}
	for v, files := range series {
		if _, err := testenv.Package(fixtureChart(t, "flux2", v, files...), dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := testenv.Package(filepath.Join(fixturesDir(t), "charts/flux2-2.18.2"), dir); err != nil {
		t.Fatal(err)
	}
}

// TestPlanFluxFromOCI: flux2 2.12 -> 2.18 with HelmRepositories stored at v1beta2, the
// chart versions read from an OCI registry's tags. First the way back: on 2.17.2, a
// rollback to 2.12 is reachable after a reverse migration and keep annotations, and the
// real helm rollback succeeds after them. Then the way forward: 2.18.2 is reached
// through 2.17.2 and a migration, walked with the real helm CLI. Last, the rollback to
// 2.12 that plan calls unreachable really fails when forced.
func TestPlanFluxFromOCI(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "fluxcd.io")
	pkgs := t.TempDir()
	fluxSeries(t, pkgs)
	host, stop := servers.ServeOCI()
	defer stop()
	tgzs, _ := filepath.Glob(filepath.Join(pkgs, "*.tgz"))
	var ref string
	for _, tgz := range tgzs {
		r, err := servers.PushOCI(tgz, host, "charts")
		if err != nil {
			t.Fatal(err)
		}
		ref = r
	}
	const ns = "plan-flux"
	chart := []string{"--chart", ref, "--plain-http"}
	mustHelm(t, nil, "install", "fluxplan", ref, "--version", "2.12.0", "--plain-http", "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "fluxplan", "-n", ns) })
	if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), helmrepos); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{ns}, PerNS: 2,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}); err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "upgrade", "fluxplan", ref, "--version", "2.17.2", "--plain-http", "-n", ns)

	// The way back from 2.17.2: reachable after steps, carried out.
	p := planOf(t, cli.ExitFindings, append([]string{"--release", "fluxplan", "-n", ns, "--version", "2.18.2", "--rollback"}, chart...)...)
	if len(p.Rollbacks) != 1 || p.Rollbacks[0].Revision != 1 || p.Rollbacks[0].Reach != plan.ReachableAfterSteps {
		t.Fatalf("rollbacks %+v, want revision 1 reachable after steps", p.Rollbacks)
	}
	steps := p.Rollbacks[0].Steps
	if !strings.HasPrefix(steps[len(steps)-1], "helm rollback fluxplan 1 -n "+ns) || !slices.ContainsFunc(steps, func(s string) bool { return strings.Contains(s, "migrate --rollback") }) {
		t.Fatalf("rollback steps %q, want a reverse migration then helm rollback", steps)
	}
	// CI reads the way back as a warning on a case of its own, the steps its remediation;
	// it changes no exit code.
	junit := ug(t, append([]string{"plan", "--release", "fluxplan", "-n", ns, "--version", "2.18.2", "--rollback", "-o", "junit"}, chart...)...)
	if want := "Release/" + ns + "/fluxplan: rollback to revision 1 (chart 2.12.0) out"; junit.code != cli.ExitFindings ||
		!slices.Contains(citest.JUnit(t, junit.stdout), want) {
		t.Errorf("--rollback -o junit: exit %d (want 1), cases %q lack %q", junit.code, citest.JUnit(t, junit.stdout), want)
	}
	for _, s := range steps {
		runCommand(t, s)
	}

	// The way forward from 2.12.0 (revision 3), objects at v1beta2.
	if r := ug(t, append([]string{"check", "--release", "fluxplan", "-n", ns, "--version", "2.18.2"}, chart...)...); r.code != cli.ExitFindings {
		t.Fatalf("direct check 2.12 -> 2.18.2: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	p = planOf(t, cli.ExitFindings, append([]string{"--release", "fluxplan", "-n", ns, "--version", "2.18.2", "--upgrade-keeps-rollback"}, chart...)...)
	var kinds []string
	for _, s := range p.Steps {
		kinds = append(kinds, string(s.Kind)+" "+s.ChartVersion)
	}
	if diff := cmp.Diff([]string{"upgrade 2.17.2", "migrate ", "upgrade 2.18.2"}, kinds); diff != "" {
		t.Fatalf("steps (-want +got):\n%s", diff)
	}
	if !slices.Equal(p.Steps[1].CRDs, []string{buckets, charts, helmrepos}) || p.Steps[1].Objects != 2 {
		t.Errorf("migration of %v rewriting %d objects, want the three source CRDs and 2 objects", p.Steps[1].CRDs, p.Steps[1].Objects)
	}
	if p.KeepsRollback == nil || p.KeepsRollback.Reach != plan.Unreachable {
		t.Errorf("keeps rollback %+v, want unreachable: 2.18.2 drops v1beta2 for good", p.KeepsRollback)
	}
	walk(t, p)

	// The way back to 2.12 is now unreachable, and the real rollback fails.
	p = planOf(t, cli.ExitSafe, append([]string{"--release", "fluxplan", "-n", ns, "--version", "2.18.2", "--rollback"}, chart...)...)
	forced := 0
	for _, rb := range p.Rollbacks {
		if rb.ChartVersion != "2.12.0" {
			continue
		}
		forced++
		if rb.Reach != plan.Unreachable || len(rb.Why) == 0 {
			t.Errorf("revision %d (2.12.0): %s %q, want unreachable with a reason", rb.Revision, rb.Reach, rb.Why)
		}
		out, err := helm(t, nil, "rollback", "fluxplan", fmt.Sprint(rb.Revision), "-n", ns)
		if err == nil {
			t.Errorf("forced rollback to unreachable revision %d succeeded\n%s", rb.Revision, out)
		}
		assertStoredVersionsRejected(t, out, "v1")
	}
	if forced == 0 {
		t.Errorf("no revision at 2.12.0 among the rollback targets: %+v", p.Rollbacks)
	}
}

// kyvernoSeries packages kyverno-like charts whose templates hold the real kyverno CRDs
// of 1.10 (chart 3.0.0), 1.11 (3.1.0), 1.12 (3.2.8) and 1.13 (3.3.7).
func kyvernoSeries(t *testing.T, dir string) {
	t.Helper()
	for chart, app := range map[string]string{"3.0.0": "v1.10.7", "3.1.0": "v1.11.4", "3.2.8": "v1.12.6", "3.3.7": "v1.13.4"} {
		var files []string
		for _, k := range []string{"admissionreports", "cleanuppolicies", "policyexceptions", "updaterequests"} {
			if k == "admissionreports" && app == "v1.13.4" {
				continue // 1.13 deleted the kyverno.io AdmissionReport CRD
			}
			files = append(files, "crds/kyverno/"+app+"/kyverno.io_"+k+".yaml")
		}
		if _, err := testenv.Package(fixtureChart(t, "kyverno", chart, files...), dir); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPlanKyvernoFromRepository: kyverno 1.10 -> 1.13 (kyverno#12633) with
// PolicyExceptions stored at v2alpha1, the versions read from an HTTP repository's
// index. 1.13 drops v2alpha1 and the AdmissionReport CRD: the plan goes through 1.12,
// migrates, keeps AdmissionReport, and every step succeeds with the real helm CLI.
func TestPlanKyvernoFromRepository(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "kyverno.io")
	pkgs := t.TempDir()
	kyvernoSeries(t, pkgs)
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const ns = "plan-kyverno"
	mustHelm(t, nil, "install", "kyverno", "kyverno", "--repo", url, "--version", "3.0.0", "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "kyverno", "-n", ns) })
	if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), "policyexceptions.kyverno.io"); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "kyverno.io", Version: "v2alpha1", Resource: "policyexceptions"},
		Kind: "PolicyException", Namespaces: []string{ns}, PerNS: 2,
		Spec: map[string]any{"exceptions": []any{}, "match": map[string]any{}},
	}); err != nil {
		t.Fatal(err)
	}
	// AdmissionReports in the CRD 1.13 drops: deleting it would lose them.
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "kyverno.io", Version: "v1alpha2", Resource: "admissionreports"},
		Kind: "AdmissionReport", Namespaces: []string{ns}, PerNS: 2,
		Spec: map[string]any{"owner": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}},
	}); err != nil {
		t.Fatal(err)
	}
	one := planOf(t, cli.ExitSafe, "--release", "kyverno", "-n", ns, "--chart", "kyverno", "--repo", url, "--version", "3.2.8")
	if len(one.Steps) != 1 || one.Steps[0].ChartVersion != "3.2.8" {
		t.Errorf("plan to 3.2.8: %+v, want one upgrade step", one.Steps)
	}
	p := planOf(t, cli.ExitFindings, "--release", "kyverno", "-n", ns, "--chart", "kyverno", "--repo", url, "--latest")
	var kinds []string
	for _, s := range p.Steps {
		kinds = append(kinds, string(s.Kind)+" "+s.ChartVersion)
	}
	if diff := cmp.Diff([]string{"upgrade 3.2.8", "keep ", "migrate ", "upgrade 3.3.7"}, kinds); diff != "" {
		t.Fatalf("steps (-want +got):\n%s", diff)
	}
	if p.Latest == nil || p.Latest.DirectlySafe != "3.2.8" {
		t.Errorf("latest %+v, want 3.2.8 directly safe", p.Latest)
	}
	blocked := false
	for _, b := range p.Latest.Blocked {
		blocked = blocked || (b.Version == "3.3.7" && b.CRD == "policyexceptions.kyverno.io" && b.Verdict == string(predict.Bridge))
	}
	if !blocked {
		t.Errorf("latest does not say that policyexceptions blocks 3.3.7: %+v", p.Latest.Blocked)
	}
	walk(t, p)
}

// TestPlanStorageSwitch: the live CRD stores at v1alpha1 and serves v1beta1; the only
// newer chart keeps v1beta1 alone. Without --allow-storage-switch there is no path: exit
// 1 naming the CRD and the version, and the CI formats fail on it. With it, the plan
// switches storage to v1beta1 first (a warning in CI, with the switch as its fix), and
// both steps succeed on the real API server with the real helm CLI.
func TestPlanStorageSwitch(t *testing.T) {
	needCluster(t)
	dir := t.TempDir()
	const crd = "switches.plan.example.com"
	one, err := testenv.WriteChart(filepath.Join(dir, "1"), "switch", "1.0.0", map[string]string{"templates/crd.yaml": syntheticCRD("switches", "Switch", "v1alpha1*", "v1beta1")})
	if err != nil {
		t.Fatal(err)
	}
	two, err := testenv.WriteChart(filepath.Join(dir, "2"), "switch", "2.0.0", map[string]string{"templates/crd.yaml": syntheticCRD("switches", "Switch", "v1beta1*")})
	if err != nil {
		t.Fatal(err)
	}
	tgz, err := testenv.Package(two, dir)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "plan-switch"
	mustHelm(t, nil, "install", "sw", one, "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "sw", "-n", ns) })
	if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "plan.example.com", Version: "v1alpha1", Resource: "switches"},
		Kind: "Switch", Namespaces: []string{ns}, PerNS: 2, Spec: map[string]any{"on": true},
	}); err != nil {
		t.Fatal(err)
	}

	const sentinel = "s3cr3t-plan-sentinel"
	values := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(values, []byte("token: "+sentinel+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"text", "json"} {
		r := ug(t, "plan", "--release", "sw", "-n", ns, "--allow-storage-switch", "--rollback", "--set", "password="+sentinel, "-f", values, "-o", o, one, tgz)
		if strings.Contains(r.stdout+r.stderr, sentinel) {
			t.Errorf("plan -o %s printed a value:\n%s%s", o, r.stdout, r.stderr)
		}
		if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "-f "+values) {
			t.Errorf("plan -o %s: exit %d, want 1 and the values file named in the upgrade command\n%s%s", o, r.code, r.stdout, r.stderr)
		}
	}

	r := ug(t, "plan", "--release", "sw", "-n", ns, one, tgz)
	if r.code != cli.ExitFindings || !strings.Contains(r.stderr, crd) || !strings.Contains(r.stderr, "2.0.0") || !strings.Contains(r.stdout, "NO PATH") {
		t.Fatalf("plan without --allow-storage-switch: exit %d, want 1 naming %s and 2.0.0\n%s%s", r.code, crd, r.stdout, r.stderr)
	}
	// CI reads the same verdicts: the blocked plan fails on the bridge; the path through a
	// storage switch is a finding with its fix that fails nothing.
	r = ug(t, "plan", "--release", "sw", "-n", ns, "-o", "sarif", one, tgz)
	if diff := cmp.Diff([]string{"bridge error " + crd}, citest.SARIF(t, r.stdout)); diff != "" || r.code != cli.ExitFindings {
		t.Errorf("no path, -o sarif: exit %d (want 1), results (-want +got):\n%s", r.code, diff)
	}
	r = ug(t, "plan", "--release", "sw", "-n", ns, "--allow-storage-switch", "-o", "junit", one, tgz)
	if diff := cmp.Diff([]string{"Release/" + ns + "/sw: 1.0.0 → 2.0.0 out"}, citest.JUnit(t, r.stdout)); diff != "" || r.code != cli.ExitFindings {
		t.Errorf("storage switch, -o junit: exit %d (want 1), cases (-want +got):\n%s", r.code, diff)
	}
	r = ug(t, "plan", "--release", "sw", "-n", ns, "--allow-storage-switch", "-o", "markdown", one, tgz)
	if want := "| ⚠️ warning | 1.0.0 → 2.0.0: " + crd + " | `bridge` |"; !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "upgradeguard migrate") {
		t.Errorf("storage switch, -o markdown: no %q with the switch's command:\n%s", want, r.stdout)
	}
	p := planOf(t, cli.ExitFindings, "--release", "sw", "-n", ns, "--allow-storage-switch", one, tgz)
	if len(p.Steps) != 2 || p.Steps[0].Kind != plan.StorageSwitch || p.Steps[0].Objects != 2 || p.Steps[1].ChartVersion != "2.0.0" {
		t.Fatalf("steps %+v, want a storage switch of 2 objects then the upgrade to 2.0.0", p.Steps)
	}
	walk(t, p)
}

func TestPlanFlagErrorsExit2(t *testing.T) {
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"plan", "--chart", "x"}, "--release"},
		{[]string{"plan", "--release", "r"}, "--chart REF"},
		{[]string{"plan", "--release", "r", "--chart", "x", "./local"}, "not both"},
		{[]string{"plan", "--release", "r", "--chart", "x", "--latest", "--version", "1.0.0"}, "do not go together"},
		{[]string{"plan", "--helmrelease", "flux", "--latest"}, "NAMESPACE/NAME"},
		{[]string{"plan", "--helmrelease", "a/b", "--release", "r"}, "drop --release"},
		{[]string{"plan", "--release", "r", "--chart", "x", "-o", "yaml"}, "-o json"},
		{[]string{"plan", "--release", "r", "--chart", "x", "--to-revision", "2"}, "--rollback lists every revision"},
	}
	for _, tc := range cases {
		r := run(t, tc.args...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.mention)
		}
	}
}
