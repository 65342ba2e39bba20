package cli_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// createApplication installs the Application CRD (a stand-in for Argo CD's: no Argo CD
// runs here) and creates an Application in argocd.Namespace from spec, deleted
// when the test ends.
func createApplication(t *testing.T, name string, spec map[string]any) {
	t.Helper()
	ctx := t.Context()
	if err := argocd.InstallApplicationCRD(ctx, apiextclient.NewForConfigOrDie(cp.Config)); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: argocd.Namespace}}
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(argocd.ApplicationGVR).Namespace(argocd.Namespace)
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"name": name, "namespace": argocd.Namespace},
		"spec":     spec,
	}}
	if _, err := ri.Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ri.Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Application %s: %v", name, err)
		}
	})
}

func appSpec(source map[string]any, destNS string) map[string]any {
	return map[string]any{"project": "default", "source": source,
		"destination": map[string]any{"server": argocd.InClusterServer, "namespace": destNS}}
}

// fluxLiveStoresV1beta2 leaves the flux source CRDs as flux2 2.12 then 2.17.2 leave
// them: storage v1, storedVersions [v1beta2 v1], with HelmRepositories stored at v1beta2.
func fluxLiveStoresV1beta2(t *testing.T) {
	t.Helper()
	fluxLive212(t)
	applyFixtures(t, "charts/flux2-2.17.2/rendered/crds.yaml")
}

// fluxLive212 leaves the flux source CRDs as flux2 2.12 leaves them (source-controller
// v1.2.0: storage v1beta2), with two HelmRepositories stored at v1beta2.
func fluxLive212(t *testing.T) {
	t.Helper()
	cleanCRDs(t, "toolkit.fluxcd.io")
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	applyFixtures(t, src("buckets"), src("helmcharts"), src("helmrepositories"))
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"default"}, PerNS: 2,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}); err != nil {
		t.Fatal(err)
	}
}

// realFluxPackages packages the real flux2 2.17.2 and 2.18.2 charts into a directory.
func realFluxPackages(t *testing.T) string {
	t.Helper()
	pkgs := t.TempDir()
	for _, v := range []string{"2.17.2", "2.18.2"} {
		if _, err := testenv.Package(filepath.Join(fixturesDir(t), "charts/flux2-"+v), pkgs); err != nil {
			t.Fatal(err)
		}
	}
	return pkgs
}

// sameAsChart asserts that check --argocd-app reports what check --chart ...
// --crd-policy create-replace reports: the exit code, and per CRD the same finding and
// next action.
func sameAsChart(t *testing.T, app string, chartArgs ...string) *check.Report {
	t.Helper()
	byChart := ug(t, append([]string{"check", "--crd-policy", "create-replace", "-o", "json"}, chartArgs...)...)
	byApp := ug(t, "check", "--argocd-app", app, "-o", "json")
	if byChart.code != cli.ExitFindings || byApp.code != byChart.code {
		t.Fatalf("exit %d from --argocd-app, %d from --chart (want 1)\n%s%s\n%s", byApp.code, byChart.code, byApp.stdout, byApp.stderr, byChart.stderr)
	}
	want, got := report(t, byChart), report(t, byApp)
	if diff := cmp.Diff(want.CRDs, got.CRDs); diff != "" {
		t.Errorf("CRDs: --chart (-) and --argocd-app (+):\n%s", diff)
	}
	if diff := cmp.Diff(want.NextSteps, got.NextSteps); diff != "" {
		t.Errorf("next steps: --chart (-) and --argocd-app (+):\n%s", diff)
	}
	if got.Application != app || got.Chart != want.Chart || got.ChartVersion != want.ChartVersion || got.Namespace != "flux-system" {
		t.Errorf("application %q chart %s %s namespace %q, want %s, %s %s, flux-system", got.Application, got.Chart, got.ChartVersion, got.Namespace,
			app, want.Chart, want.ChartVersion)
	}
	migrate := []string{buckets, charts, helmrepos}
	if diff := cmp.Diff(migrate, verdicts(got)[predict.Migrate]); diff != "" {
		t.Errorf("migrate verdicts (-want +got):\n%s", diff)
	}
	return got
}

// TestCheckArgoCDAppHelmRepository: an Application of the real flux2 2.18.2 chart from
// a chart repository, its targetRevision a semver range, over live CRDs 2.17.2 left
// storing v1beta2: check --argocd-app gives check --chart's verdicts under
// create-replace, and plan --argocd-app names targetRevision values to commit.
func TestCheckArgoCDAppHelmRepository(t *testing.T) {
	needCluster(t)
	fluxLiveStoresV1beta2(t)
	pkgs := realFluxPackages(t)
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	createApplication(t, "flux", appSpec(map[string]any{"repoURL": url, "chart": "flux2", "targetRevision": "~2.18"}, "flux-system"))

	rep := sameAsChart(t, "argocd/flux", "--chart", "flux2", "--repo", url, "--version", "2.18.2", "-n", "flux-system")
	if rep.ChartVersion != "2.18.2" {
		t.Errorf("targetRevision ~2.18 resolved to %q, want 2.18.2 (the highest match)", rep.ChartVersion)
	}
	text := ug(t, "check", "--argocd-app", "argocd/flux")
	for _, want := range []string{"Upgrade of Argo CD Application argocd/flux (namespace flux-system) to flux2 2.18.2", "upgradeguard migrate --crd " + buckets} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}

	out := ug(t, "plan", "--argocd-app", "argocd/flux", "-o", "json")
	var p plan.Plan
	if err := json.Unmarshal([]byte(out.stdout), &p); err != nil {
		t.Fatalf("plan JSON: %v\n%s%s", err, out.stdout, out.stderr)
	}
	var steps, commands []string
	for _, s := range p.Steps {
		steps = append(steps, string(s.Kind)+" "+s.ChartVersion)
		commands = append(commands, s.Commands...)
	}
	if diff := cmp.Diff([]string{"migrate ", "upgrade 2.18.2"}, steps); diff != "" || out.code != cli.ExitFindings || p.Application != "argocd/flux" || p.Release != "flux" {
		t.Fatalf("plan (exit %d, application %q, release %q) steps (-want +got):\n%s\n%s", out.code, p.Application, p.Release, diff, out.stderr)
	}
	if want := "argocd app set argocd/flux --revision 2.18.2"; !strings.Contains(strings.Join(commands, "\n"), want) {
		t.Errorf("plan commands lack %q:\n%s", want, strings.Join(commands, "\n"))
	}
	if p.From != "" || p.FromSource != "" {
		t.Errorf("plan of a never-synced Application from %q (%s), want no start version", p.From, p.FromSource)
	}

	// Argo CD synced 2.17.2 (history), and its last attempt at 2.18.2 failed (sync
	// status): the plan starts at the deployed version.
	setApplicationStatus(t, "flux", map[string]any{"sync": map[string]any{"status": "OutOfSync", "revision": "2.18.2"},
		"history": []any{map[string]any{"id": int64(0), "revision": "2.17.2"}}})
	out = ug(t, "plan", "--argocd-app", "argocd/flux", "-o", "json")
	p = plan.Plan{}
	if err := json.Unmarshal([]byte(out.stdout), &p); err != nil {
		t.Fatalf("plan JSON: %v\n%s%s", err, out.stdout, out.stderr)
	}
	if p.From != "2.17.2" || p.FromSource != "status.history" || p.Target != "2.18.2" {
		t.Errorf("plan from %q (%q) to %q, want from 2.17.2 (status.history) to 2.18.2", p.From, p.FromSource, p.Target)
	}
	text = ug(t, "plan", "--argocd-app", "argocd/flux")
	if want := "chart 2.17.2 (deployed, from status.history) -> 2.18.2"; !strings.Contains(text.stdout, want) {
		t.Errorf("plan text lacks %q:\n%s", want, text.stdout)
	}

	// The same chart as the second of two sources (the first holds values): argocd app
	// set needs the Helm source's position.
	createApplication(t, "flux-multi", map[string]any{"project": "default",
		"destination": map[string]any{"server": argocd.InClusterServer, "namespace": "flux-system"},
		"sources": []any{
			map[string]any{"repoURL": "https://git.example.com/values.git", "ref": "values"},
			map[string]any{"repoURL": url, "chart": "flux2", "targetRevision": "~2.18"},
		}})
	multi := ug(t, "plan", "--argocd-app", "argocd/flux-multi")
	if want := "argocd app set argocd/flux-multi --source-position 2 --revision 2.18.2"; !strings.Contains(multi.stdout, want) {
		t.Errorf("plan of a multi-source Application lacks %q (exit %d):\n%s%s", want, multi.code, multi.stdout, multi.stderr)
	}
}

// setApplicationStatus writes the status of Application argocd/name (the test CRD, like
// Argo CD's, has no status subresource: an update writes it).
func setApplicationStatus(t *testing.T, name string, status map[string]any) {
	t.Helper()
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(argocd.ApplicationGVR).Namespace(argocd.Namespace)
	app, err := ri.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	app.Object["status"] = status
	if _, err := ri.Update(t.Context(), app, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckArgoCDAppGit: the same chart as a path in a git repository, cloned at the
// Application's targetRevision: the verdicts of check --chart on the chart directory.
func TestCheckArgoCDAppGit(t *testing.T) {
	needCluster(t)
	servers.NeedGitCLI(t)
	fluxLiveStoresV1beta2(t)
	chartDir := filepath.Join(fixturesDir(t), "charts/flux2-2.18.2")
	files := map[string]string{}
	if err := filepath.WalkDir(chartDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(chartDir, p)
		files["charts/flux2/"+filepath.ToSlash(rel)] = string(data)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	repo := servers.NewGitRepo(t)
	repo.Commit("flux2 2.18.2", files)
	repo.Branch("release", repo.Commit("a later change", map[string]string{"README.md": "flux\n"}))
	createApplication(t, "flux-git", appSpec(map[string]any{"repoURL": "file://" + repo.Dir, "path": "charts/flux2", "targetRevision": "release"}, "flux-system"))

	sameAsChart(t, "argocd/flux-git", "--chart", chartDir, "-n", "flux-system")
}

// TestArgoCDAppErrors: what check --argocd-app cannot read exits 2 and says what to do.
func TestArgoCDAppErrors(t *testing.T) {
	needCluster(t)
	createApplication(t, "kustomized", appSpec(map[string]any{"repoURL": "https://git.example.com/app", "path": "deploy",
		"kustomize": map[string]any{"namePrefix": "x-"}}, "app"))
	createApplication(t, "two-charts", map[string]any{"project": "default", "destination": map[string]any{"namespace": "app"},
		"sources": []any{
			map[string]any{"repoURL": "https://charts.example.com", "chart": "a", "targetRevision": "1.0.0"},
			map[string]any{"repoURL": "https://charts.example.com", "chart": "b", "targetRevision": "1.0.0"},
		}})
	for _, tc := range []struct {
		args     []string
		mentions []string
	}{
		{[]string{"check", "--argocd-app", "argocd/missing"}, []string{"Application argocd/missing not found", "kubectl get applications.argoproj.io -A"}},
		{[]string{"check", "--argocd-app", "argocd/kustomized"}, []string{"Kustomize", "argocd app manifests kustomized | upgradeguard check --manifests -"}},
		{[]string{"plan", "--argocd-app", "argocd/two-charts"}, []string{"2 sources render", "argocd app manifests two-charts"}},
		{[]string{"check", "--argocd-app", "kustomized"}, []string{"NAMESPACE/NAME"}},
		{[]string{"check", "--argocd-app", "argocd/kustomized", "--chart", "x", "--crd-policy", "helm"}, []string{"--chart, --crd-policy do not go together"}},
		{[]string{"check", "rel", "--argocd-app", "argocd/kustomized"}, []string{"Argo CD keeps no Helm release"}},
		{[]string{"plan", "--argocd-app", "argocd/kustomized", "--release", "x"}, []string{"--release do not go together"}},
	} {
		r := ug(t, tc.args...)
		if r.code != cli.ExitCouldNot {
			t.Errorf("%v: exit %d, want 2\n%s%s", tc.args, r.code, r.stdout, r.stderr)
		}
		for _, m := range tc.mentions {
			if !strings.Contains(r.stderr, m) {
				t.Errorf("%v: stderr lacks %q:\n%s", tc.args, m, r.stderr)
			}
		}
	}
}

// TestCheckArgoCDAppCRDsFolder: kyverno's CRDs in the chart's crds/ folder (1.13 drops
// v2alpha1, which 1.10 stored). Argo CD renders with --include-crds and applies them, so
// check --argocd-app finds what check --chart --crd-policy create-replace finds; with
// helm.skipCrds it leaves crds/ out, and the sync is safe.
func TestCheckArgoCDAppCRDsFolder(t *testing.T) {
	needCluster(t)
	servers.NeedGitCLI(t)
	cleanCRDs(t, "kyverno.io")
	applyFixtures(t, fixtureSet(t, "kyverno/v1.10.7")...)
	applyFixtures(t, fixtureSet(t, "kyverno/v1.12.6")...)
	files := map[string]string{"charts/kyverno/Chart.yaml": "apiVersion: v2\nname: kyverno\nversion: 3.3.7\n"}
	for _, f := range fixtureSet(t, "kyverno/v1.13.4") {
		data, err := os.ReadFile(filepath.Join(fixturesDir(t), f))
		if err != nil {
			t.Fatal(err)
		}
		files["charts/kyverno/crds/"+filepath.Base(f)] = string(data)
	}
	repo := servers.NewGitRepo(t)
	repo.Commit("kyverno 3.3.7", files)
	source := map[string]any{"repoURL": "file://" + repo.Dir, "path": "charts/kyverno", "targetRevision": "HEAD"}
	createApplication(t, "kyverno", appSpec(source, "kyverno"))

	r := ug(t, "check", "--argocd-app", "argocd/kyverno", "-o", "json")
	want := []string{"cleanuppolicies.kyverno.io", "policyexceptions.kyverno.io"}
	if got := verdicts(report(t, r))[predict.Migrate]; r.code != cli.ExitFindings || !cmp.Equal(got, want) {
		t.Errorf("exit %d, migrate %v; want 1 and %v (crds/ applied, as Argo CD does)\n%s", r.code, got, want, r.stderr)
	}

	skip := map[string]any{"repoURL": "file://" + repo.Dir, "path": "charts/kyverno", "targetRevision": "HEAD", "helm": map[string]any{"skipCrds": true}}
	createApplication(t, "kyverno-skip-crds", appSpec(skip, "kyverno"))
	if r := ug(t, "check", "--argocd-app", "argocd/kyverno-skip-crds"); r.code != cli.ExitSafe {
		t.Errorf("helm.skipCrds: exit %d, want 0 (crds/ left out)\n%s%s", r.code, r.stdout, r.stderr)
	}
}
