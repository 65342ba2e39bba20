package cli_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// inputsRepo is the state of a GitOps repository that deploys the flux2 chart to one
// cluster four ways: a kustomize overlay that patches a base HelmRelease's version, a
// Flux Kustomization whose postBuild.substitute gives another HelmRelease's version, an
// Argo CD Application (and a multi-source one whose values come from the repository
// through $values), and the flux2 CRDs as plain manifests.
type inputsRepo struct {
	url                               string
	overlay, substitute, crds, app    string
	values                            string
	unrelated                         bool
	crds1772, crds1822, repoURLOfRepo string
}

func (s inputsRepo) files() map[string]string {
	resources := "  - ../../base/flux2\n  - apps.yaml\n"
	crds := map[string]string{"2.17.2": s.crds1772, "2.18.2": s.crds1822}[s.crds]
	files := map[string]string{
		"base/flux2/kustomization.yaml": "resources:\n  - flux.yaml\n",
		"base/flux2/flux.yaml":          scenario.FluxGitManifests(s.url, "2.17.2"),
		"clusters/prod/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n" + resources +
			"patches:\n  - path: flux2-version.yaml\n",
		"clusters/prod/flux2-version.yaml": `apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: flux2
  namespace: flux-system
spec:
  chart:
    spec:
      version: "` + s.overlay + `"
`,
		"clusters/prod/apps.yaml": `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: apps
  namespace: flux-system
spec:
  interval: 10m
  path: ./apps/flux2
  prune: true
  sourceRef:
    kind: GitRepository
    name: flux-system
  postBuild:
    substitute:
      flux_version: "` + s.substitute + `"
`,
		// No kustomization file: Flux's generator writes one, as kustomize-controller does.
		// Another HelmRelease of the same Helm release (releaseName).
		"apps/flux2/flux.yaml": strings.NewReplacer("name: flux2\n", "name: flux2-apps\n", "spec:\n  interval: 1h\n  chart:", "spec:\n  interval: 1h\n  releaseName: flux2\n  chart:").
			Replace(scenario.GitManifests("flux-system", "fluxcd", "flux2", s.url, "${flux_version}", "")),
		"clusters/prod/crds/flux.yaml": crds,
		"clusters/prod/argo.yaml": `apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: flux2
  namespace: argocd
spec:
  project: default
  destination:
    server: https://kubernetes.default.svc
    namespace: flux-system
  source:
    repoURL: ` + s.url + `
    chart: flux2
    targetRevision: ` + s.app + `
---
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: flux2-multi
  namespace: argocd
spec:
  project: default
  destination:
    server: https://kubernetes.default.svc
    namespace: flux-system
  sources:
    - repoURL: ` + s.url + `
      chart: flux2
      targetRevision: 2.18.2
      helm:
        releaseName: flux2
        valueFiles:
          - $values/clusters/prod/flux2-values.yaml
    - repoURL: ` + s.repoURLOfRepo + `
      targetRevision: main
      ref: values
`,
		"clusters/prod/flux2-values.yaml": s.values,
	}
	if s.unrelated {
		files["clusters/prod/kustomization.yaml"] = strings.Replace(files["clusters/prod/kustomization.yaml"], "  - apps.yaml\n", "  - apps.yaml\n  - settings.yaml\n", 1)
		files["clusters/prod/settings.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: flux-system\ndata:\n  region: eu\n"
	}
	return files
}

// TestReviewInputs: review's other inputs, each in a real repository with real commits,
// judged against a real API server where flux2 2.17.2 runs with v1beta2 still in the
// storedVersions of three CRDs (flux2 2.18.2 drops it). A kustomize overlay's patch that
// bumps the HelmRelease to 2.18.2 is blocked at the patch's version line; an overlay
// change that touches no HelmRelease passes; a Flux Kustomization's
// postBuild.substitute that bumps another HelmRelease is blocked at the substitute line.
// CRD manifests that drop the stored v1beta2 are blocked as check --manifests blocks
// them. An Argo CD Application's targetRevision bump names the CRDs and upgradeguard
// migrate, with the status (what is deployed) read from the live Application; a
// multi-source Application whose $values file changes in the repository is judged with
// the head's values. A snapshot gives the same verdicts on every input. After the cluster
// is migrated, the Application bump passes.
func TestReviewInputs(t *testing.T) {
	needCluster(t)
	prod := testenv.ForTest(t)
	ctx := t.Context()
	if err := scenario.FluxStoredV1beta2(ctx, prod, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	fx := fixturesDir(t)
	repo := fluxChartRepo(t)
	// The live Applications: Argo CD's Application CRD (no Argo CD runs: review reads
	// only the status), flux2 deployed at 2.17.2.
	if err := argocd.InstallApplicationCRD(ctx, apiextclient.NewForConfigOrDie(prod.Config)); err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(prod.Config).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "argocd"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"flux2", "flux2-multi"} {
		app := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
			"metadata": map[string]any{"name": name, "namespace": "argocd"},
			"spec": map[string]any{"project": "default", "destination": map[string]any{"server": "https://kubernetes.default.svc", "namespace": "flux-system"},
				"source": map[string]any{"repoURL": repo.URL, "chart": "flux2", "targetRevision": "2.17.2"}},
			"status": map[string]any{"sync": map[string]any{"status": "Synced", "revision": "2.17.2"},
				"history": []any{map[string]any{"revision": "2.17.2"}}}}}
		if _, err := dynamic.NewForConfigOrDie(prod.Config).Resource(argocd.ApplicationGVR).Namespace("argocd").Create(ctx, app, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	readCRDs := func(v string) string {
		data, err := os.ReadFile(filepath.Join(fx, "charts", "flux2-"+v, "rendered", "crds.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	g := servers.NewGitRepo(t)
	s := inputsRepo{url: repo.URL, overlay: "2.17.2", substitute: "2.17.2", crds: "2.17.2", app: "2.17.2", values: "logLevel: info\n",
		crds1772: readCRDs("2.17.2"), crds1822: readCRDs("2.18.2"), repoURLOfRepo: "file://" + g.Dir}
	c0 := g.Commit("flux2 2.17.2 four ways", s.files())
	s.overlay = "2.18.2"
	c1 := g.Commit("overlay: flux2 2.18.2", s.files())
	s.unrelated = true
	c2 := g.Commit("overlay: a ConfigMap", s.files())
	s.substitute = "2.18.2"
	c3 := g.Commit("apps: flux_version 2.18.2", s.files())
	s.crds = "2.18.2"
	c4 := g.Commit("CRDs of flux2 2.18.2", s.files())
	s.app = "2.18.2"
	c5 := g.Commit("Application flux2 2.18.2", s.files())
	s.values = "logLevel: debug\n"
	c6 := g.Commit("Application flux2-multi: debug logs", s.files())

	rev := func(base, head string, more ...string) result {
		return run(t, append([]string{"--kubeconfig", prod.Kubeconfig, "review", "--repo", g.Dir, "--base", base, "--head", head}, more...)...)
	}
	// one runs a review that must touch exactly one deployment, and returns its row.
	one := func(name string, base, head string, code int) review.Row {
		t.Helper()
		r := rev(base, head, "-o", "json")
		rows := reviewRows(t, r)
		if r.code != code || len(rows) != 1 {
			t.Fatalf("%s: exit %d with %d rows, want %d with one row\n%s%s", name, r.code, len(rows), code, r.stdout, r.stderr)
		}
		return rows[0]
	}
	migrateFindings := func(name string, row review.Row) {
		t.Helper()
		var got []string
		for _, c := range row.Report.Findings() {
			got = append(got, string(c.Verdict)+" "+c.Name)
		}
		if want := []string{"migrate " + buckets, "migrate " + charts, "migrate " + helmrepos}; !slices.Equal(got, want) {
			t.Errorf("%s: findings %v, want %v", name, got, want)
		}
	}

	// Kustomize: the overlay's patch bumps the HelmRelease the overlay builds.
	row := one("overlay patch", c0.String(), c1.String(), cli.ExitFindings)
	migrateFindings("overlay patch", row)
	if row.Subject != "HelmRelease/flux-system/flux2" || row.From != "2.17.2" || row.To != "2.18.2" || row.File != "clusters/prod/flux2-version.yaml" || row.Line != 9 {
		t.Errorf("overlay patch: %s %s -> %s at %s:%d, want HelmRelease/flux-system/flux2 2.17.2 -> 2.18.2 at clusters/prod/flux2-version.yaml:9",
			row.Subject, row.From, row.To, row.File, row.Line)
	}
	if r := rev(c1.String(), c2.String()); r.code != cli.ExitSafe || !strings.Contains(r.stdout, "touches no HelmRelease") {
		t.Errorf("an overlay change that touches no HelmRelease: exit %d, want 0 and saying so\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A Flux Kustomization's post-build substitution.
	row = one("postBuild.substitute", c2.String(), c3.String(), cli.ExitFindings)
	migrateFindings("postBuild.substitute", row)
	if row.Subject != "HelmRelease/flux-system/flux2-apps" || row.From != "2.17.2" || row.To != "2.18.2" || row.File != "clusters/prod/apps.yaml" || row.Line != 15 {
		t.Errorf("postBuild.substitute: %s %s -> %s at %s:%d, want HelmRelease/flux-system/flux2-apps 2.17.2 -> 2.18.2 at clusters/prod/apps.yaml:15",
			row.Subject, row.From, row.To, row.File, row.Line)
	}

	// CRD manifests changed in the repository, judged as check --manifests judges them.
	row = one("CRD manifests", c3.String(), c4.String(), cli.ExitFindings)
	migrateFindings("CRD manifests", row)
	if row.Subject != "clusters/prod/crds/flux.yaml" || row.What != review.WhatCRDs {
		t.Errorf("CRD manifests: subject %q what %q, want clusters/prod/crds/flux.yaml, %s", row.Subject, row.What, review.WhatCRDs)
	}

	// A snapshot gives the same verdicts on the overlay patch, the substitution and the
	// CRD manifests, with no cluster credentials.
	snaps := takeSnapshots(t, map[string]*testenv.ControlPlane{contextOf(t, prod): prod}, "")
	for _, p := range [][2]string{{c0.String(), c1.String()}, {c2.String(), c3.String()}, {c3.String(), c4.String()}} {
		sameFromSnapshots(t, []string{"--kubeconfig", prod.Kubeconfig, "review", "--repo", g.Dir, "--base", p[0], "--head", p[1]}, snaps)
	}

	// Argo CD: the Application's targetRevision bump.
	row = one("Application", c4.String(), c5.String(), cli.ExitFindings)
	migrateFindings("Application", row)
	if row.Subject != "Application/argocd/flux2" || row.From != "2.17.2" || row.To != "2.18.2" || row.File != "clusters/prod/argo.yaml" || row.Line != 14 {
		t.Errorf("Application: %s %s -> %s at %s:%d, want Application/argocd/flux2 2.17.2 -> 2.18.2 at clusters/prod/argo.yaml:14",
			row.Subject, row.From, row.To, row.File, row.Line)
	}
	if text := rev(c4.String(), c5.String()); !strings.Contains(text.stdout, "upgradeguard migrate") || !strings.Contains(text.stdout, helmrepos) {
		t.Errorf("Application: the text names neither upgradeguard migrate nor %s:\n%s", helmrepos, text.stdout)
	}
	// A multi-source Application whose $values file changes in the repository.
	row = one("$values", c5.String(), c6.String(), cli.ExitFindings)
	migrateFindings("$values", row)
	if row.Subject != "Application/argocd/flux2-multi" || row.What != "values" || row.File != "clusters/prod/flux2-values.yaml" || row.Line != 1 {
		t.Errorf("$values: %s (%s) at %s:%d, want Application/argocd/flux2-multi (values) at clusters/prod/flux2-values.yaml:1", row.Subject, row.What, row.File, row.Line)
	}

	// From a snapshot, read from a file and from a registry on loopback, both Application
	// changes give the same verdicts: the status and Argo CD's settings as recorded.
	ociSnaps := takeSnapshots(t, map[string]*testenv.ControlPlane{contextOf(t, prod): prod}, ociRegistry(t))
	for _, sn := range [][]string{snaps, ociSnaps} {
		for _, p := range [][2]string{{c4.String(), c5.String()}, {c5.String(), c6.String()}} {
			sameFromSnapshots(t, []string{"--kubeconfig", prod.Kubeconfig, "review", "--repo", g.Dir, "--base", p[0], "--head", p[1]}, sn)
		}
	}

	// After the cluster is migrated, the same Application bump passes.
	m := run(t, "--kubeconfig", prod.Kubeconfig, "migrate", "--chart", filepath.Join(fx, "charts", "flux2-2.18.2"), "--release", "flux2", "-n", "flux-system", "--lease-namespace", "flux-system")
	if m.code != cli.ExitSafe {
		t.Fatalf("migrate: exit %d\n%s%s", m.code, m.stdout, m.stderr)
	}
	if row := one("Application after the migration", c4.String(), c5.String(), cli.ExitSafe); row.Report == nil || !row.Report.Safe {
		t.Errorf("Application after the migration: %+v, want safe", row)
	}
}

// fluxChartRepo serves the real flux2 2.17.2 and 2.18.2 charts from a Helm repository on
// loopback until the test ends.
func fluxChartRepo(t *testing.T) *servers.ChartRepo {
	t.Helper()
	repo, err := scenario.ChartRepo(filepath.Join(t.TempDir(), "charts"), "flux2-2.17.2", "flux2-2.18.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	return repo
}
