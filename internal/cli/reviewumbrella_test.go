package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// umbrellaYAML is the Chart.yaml of the umbrella chart "platform" with one dependency;
// the dependency's version is on line 7.
func umbrellaYAML(dep, version, repoURL string) string {
	return `apiVersion: v2
name: platform
version: 0.1.0
description: what the platform team deploys on every cluster
dependencies:
  - name: ` + dep + `
    version: "` + version + `"
    repository: ` + repoURL + `
`
}

// gitHelmRelease is a GitRepository naming the fleet repository and a HelmRelease
// "platform" in ns that renders the chart at ./charts/platform from it, as a GitOps
// repository holds them.
func gitHelmRelease(ns string) string {
	return `apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata:
  name: fleet
  namespace: ` + ns + `
spec:
  interval: 1m
  url: https://git.example.com/platform/fleet.git
  ref:
    branch: main
---
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: platform
  namespace: ` + ns + `
spec:
  interval: 1h
  chart:
    spec:
      chart: ./charts/platform
      sourceRef:
        kind: GitRepository
        name: fleet
`
}

// argoPathApplication is an Argo CD Application "platform" whose source is the chart
// folder charts/platform of the fleet repository, deployed to ns.
func argoPathApplication(ns string) string {
	return `apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: platform
  namespace: argocd
spec:
  project: default
  destination:
    server: https://kubernetes.default.svc
    namespace: ` + ns + `
  source:
    repoURL: https://git.example.com/platform/fleet.git
    path: charts/platform
    targetRevision: main
`
}

// umbrellaDir writes the umbrella chart whose Chart.yaml is chartYAML into a new folder
// and runs the real `helm dependency update` in it, which fetches the dependency into
// charts/ and writes Chart.lock; it returns the folder.
func umbrellaDir(t *testing.T, cp *testenv.ControlPlane, chartYAML string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "platform")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte(chartYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	helmOn(t, cp, "dependency", "update", dir)
	return dir
}

// download GETs url.
func download(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(data)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestReviewUmbrellaFlux: a fleet repository deploys the umbrella chart charts/platform,
// whose dependency is the real flux2 chart, through a HelmRelease whose source is a
// GitRepository naming the repository. On the cluster, the release "platform" stored
// HelmRepositories at v1beta2 before flux2 2.17.2, so storedVersions still holds it. A
// pull request that bumps the dependency to 2.18.2 in Chart.yaml and Chart.lock touches
// no HelmRelease file, yet review finds the HelmRelease, builds the head's chart with its
// dependency fetched from the Helm repository on loopback, and exits 1 naming the CRDs and
// upgradeguard migrate, at the Chart.yaml line that moved. A Chart.lock-only bump (a
// range in Chart.yaml) does the same at the lock's line; a Chart.yaml bump whose lock
// still pins 2.17.2 is judged as Flux builds it (from the lock: safe) and says the lock
// is stale. After the migration, the bump passes.
func TestReviewUmbrellaFlux(t *testing.T) {
	needCluster(t)
	prod := testenv.ForTest(t)
	fx := fixturesDir(t)
	repo, err := servers.NewChartRepo(filepath.Join(t.TempDir(), "charts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	// flux2 "1.0.0": source-controller v1.2.0's CRDs, stored at v1beta2.
	if err := repo.Add(fixtureChart(t, "flux2", "1.0.0", src("buckets"), src("helmcharts"), src("helmrepositories"))); err != nil {
		t.Fatal(err)
	}
	if err := repo.Add(filepath.Join(fx, "charts", "flux2-2.17.2")); err != nil {
		t.Fatal(err)
	}
	pinned := func(v string) string { return umbrellaYAML("flux2", v, repo.URL) }
	const ranged = ">=2.17.0 <2.19.0"

	// The cluster: platform with flux2 1.0.0, HelmRepositories at v1beta2, then 2.17.2.
	helmOn(t, prod, "install", "platform", umbrellaDir(t, prod, pinned("1.0.0")), "-n", "flux-system", "--create-namespace")
	if err := scenario.HelmRepositoriesAtV1beta2(t.Context(), prod); err != nil {
		t.Fatal(err)
	}
	at2172 := umbrellaDir(t, prod, pinned("2.17.2"))
	helmOn(t, prod, "upgrade", "platform", at2172, "-n", "flux-system")
	rangedAt2172 := umbrellaDir(t, prod, umbrellaYAML("flux2", ranged, repo.URL))
	// 2.18.2 is published.
	if err := repo.Add(filepath.Join(fx, "charts", "flux2-2.18.2")); err != nil {
		t.Fatal(err)
	}
	at2182 := umbrellaDir(t, prod, pinned("2.18.2"))
	rangedAt2182 := umbrellaDir(t, prod, umbrellaYAML("flux2", ranged, repo.URL))

	g := servers.NewGitRepo(t)
	chart := func(dir string) map[string]string {
		return map[string]string{"charts/platform/Chart.yaml": readFile(t, filepath.Join(dir, "Chart.yaml")), "charts/platform/Chart.lock": readFile(t, filepath.Join(dir, "Chart.lock"))}
	}
	base := g.Commit("platform with flux2 2.17.2", map[string]string{
		"clusters/prod/platform.yaml": gitHelmRelease("flux-system"),
		"charts/platform/Chart.yaml":  pinned("2.17.2"), "charts/platform/Chart.lock": readFile(t, filepath.Join(at2172, "Chart.lock")),
	})
	head := g.Commit("Update flux2 to 2.18.2", chart(at2182))
	stale := g.Commit("flux2 2.18.2 in Chart.yaml only", map[string]string{"charts/platform/Chart.yaml": pinned("2.18.2"),
		"charts/platform/Chart.lock": readFile(t, filepath.Join(at2172, "Chart.lock"))})
	rangeBase := g.Commit("flux2 within a range", chart(rangedAt2172))
	rangeHead := g.Commit("Lock file maintenance", chart(rangedAt2182))
	args := func(base, head plumbing.Hash, more ...string) []string {
		return append([]string{"--kubeconfig", prod.Kubeconfig, "review", "--repo", g.Dir, "--base", base.String(), "--head", head.String()}, more...)
	}

	one := func(name string, base, head plumbing.Hash, code int) review.Row {
		t.Helper()
		r := run(t, args(base, head, "-o", "json")...)
		rows := reviewRows(t, r)
		if r.code != code || len(rows) != 1 {
			t.Fatalf("%s: exit %d with %d rows, want %d and one row\n%s%s", name, r.code, len(rows), code, r.stdout, r.stderr)
		}
		var rep struct {
			Charts []review.ChartReview `json:"charts"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Charts) > 0 {
			t.Errorf("%s: the deployed chart is also judged as a chart repository's chart (%v):\n%s", name, err, r.stdout)
		}
		return rows[0]
	}
	findings := func(row review.Row) []string {
		var out []string
		if row.Report != nil {
			for _, c := range row.Report.Findings() {
				out = append(out, string(c.Verdict)+" "+c.Name)
			}
		}
		return out
	}
	wantMigrate := []string{"migrate " + buckets, "migrate " + charts, "migrate " + helmrepos}

	// The bump in Chart.yaml and Chart.lock.
	row := one("the bump", base, head, cli.ExitFindings)
	if got := findings(row); !slices.Equal(got, wantMigrate) {
		t.Errorf("the bump: findings %v, want %v", got, wantMigrate)
	}
	if row.Subject != "HelmRelease/flux-system/platform" || row.What != review.WhatDependencies || row.From != "flux2 2.17.2" || row.To != "flux2 2.18.2" ||
		row.File != "charts/platform/Chart.yaml" || row.Line != 7 || row.StaleLock != "" {
		t.Errorf("the bump: %s %s %q -> %q at %s:%d (stale lock %q), want HelmRelease/flux-system/platform's dependencies flux2 2.17.2 -> 2.18.2 at charts/platform/Chart.yaml:7",
			row.Subject, row.What, row.From, row.To, row.File, row.Line, row.StaleLock)
	}
	text := run(t, args(base, head)...)
	for _, want := range []string{"BLOCKED", "upgradeguard migrate", helmrepos, "flux2 2.17.2 -> flux2 2.18.2", "charts/platform/Chart.yaml:7"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("the bump, text output lacks %q:\n%s", want, text.stdout)
		}
	}
	// A snapshot of the cluster gives the same verdict.
	sameFromSnapshots(t, args(base, head), takeSnapshots(t, map[string]*testenv.ControlPlane{contextOf(t, prod): prod}, ""))

	// Chart.lock alone moves within Chart.yaml's range: the row points at the lock.
	row = one("the lock's bump", rangeBase, rangeHead, cli.ExitFindings)
	if got := findings(row); !slices.Equal(got, wantMigrate) || row.File != "charts/platform/Chart.lock" || row.From != "flux2 2.17.2" || row.To != "flux2 2.18.2" || row.StaleLock != "" {
		t.Errorf("the lock's bump: findings %v, %q -> %q at %s (stale lock %q), want %v, flux2 2.17.2 -> 2.18.2 at charts/platform/Chart.lock",
			got, row.From, row.To, row.File, row.StaleLock, wantMigrate)
	}

	// Chart.yaml moves and Chart.lock does not: Flux builds from the lock, 2.17.2, which is
	// what the cluster runs; the review passes and says the lock is stale.
	row = one("the stale lock", base, stale, cli.ExitSafe)
	if row.Report == nil || !row.Report.Safe || !strings.Contains(row.StaleLock, "the lock pins 2.17.2") {
		t.Errorf("the stale lock: %+v, want safe and the lock named stale", row)
	}
	text = run(t, args(base, stale)...)
	for _, want := range []string{review.CheckStaleLock + " charts/platform", "helm dependency update charts/platform"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("the stale lock, text output lacks %q:\n%s", want, text.stdout)
		}
	}

	// An Argo CD Application whose source is the chart's path in the repository: the
	// same bump, judged as Argo CD syncs it; a stale lock fails Argo CD's helm dependency
	// build, so that Application is not judged, and review says why.
	ga := servers.NewGitRepo(t)
	aBase := ga.Commit("platform through Argo CD", map[string]string{"clusters/prod/platform.yaml": argoPathApplication("flux-system"),
		"charts/platform/Chart.yaml": pinned("2.17.2"), "charts/platform/Chart.lock": readFile(t, filepath.Join(at2172, "Chart.lock"))})
	aHead := ga.Commit("Update flux2 to 2.18.2", chart(at2182))
	aStale := ga.Commit("flux2 2.18.2 in Chart.yaml only", map[string]string{"charts/platform/Chart.lock": readFile(t, filepath.Join(at2172, "Chart.lock"))})
	argoRow := func(name string, base, head plumbing.Hash, code int) review.Row {
		t.Helper()
		r := run(t, "--kubeconfig", prod.Kubeconfig, "review", "--repo", ga.Dir, "--base", base.String(), "--head", head.String(), "-o", "json")
		rows := reviewRows(t, r)
		if r.code != code || len(rows) != 1 || rows[0].Subject != "Application/argocd/platform" {
			t.Fatalf("%s: exit %d with rows %+v, want %d and the Application's row\n%s", name, r.code, rows, code, r.stderr)
		}
		return rows[0]
	}
	row = argoRow("the Application's bump", aBase, aHead, cli.ExitFindings)
	if got := findings(row); !slices.Equal(got, wantMigrate) || row.File != "charts/platform/Chart.yaml" || row.Line != 7 {
		t.Errorf("the Application's bump: findings %v at %s:%d, want %v at charts/platform/Chart.yaml:7", got, row.File, row.Line, wantMigrate)
	}
	if row = argoRow("the Application's stale lock", aBase, aStale, cli.ExitSafe); !strings.Contains(row.NotJudged, "Argo CD's repo-server runs `helm dependency build charts/platform`") {
		t.Errorf("the Application's stale lock: not judged %q, want the reason", row.NotJudged)
	}

	// After the migration, the bump passes.
	m := run(t, "--kubeconfig", prod.Kubeconfig, "migrate", "--chart", at2182, "--release", "platform", "-n", "flux-system", "--lease-namespace", "flux-system")
	if m.code != cli.ExitSafe {
		t.Fatalf("migrate: exit %d\n%s%s", m.code, m.stdout, m.stderr)
	}
	if row := one("the bump after the migration", base, head, cli.ExitSafe); row.Report == nil || !row.Report.Safe {
		t.Errorf("the bump after the migration: %+v, want safe", row)
	}
}

// TestReviewUmbrellaLWS: the umbrella chart's lws dependency moves from 0.7.0 to 0.8.0,
// which moved its CRD from templates/ to crds/ (kubernetes-sigs/lws#880): the upgrade
// deletes the CRD and every LeaderWorkerSet. review flags the deletion with the object
// count, whether Chart.yaml (without a lock: resolved from Chart.yaml as Flux does) or a
// subchart vendored in charts/ moves.
func TestReviewUmbrellaLWS(t *testing.T) {
	needCluster(t)
	own := testenv.ForTest(t)
	repo := lwsChartRepo(t)
	helmOn(t, own, "install", "platform", umbrellaDir(t, own, umbrellaYAML("lws", "0.7.0", repo.URL)), "-n", "lws-system", "--create-namespace")
	if err := testenv.CreateLeaderWorkerSets(t.Context(), own.Config, testenv.LWSGroup, "lws-system", 3); err != nil {
		t.Fatal(err)
	}

	g := servers.NewGitRepo(t)
	base := g.Commit("platform with lws 0.7.0", map[string]string{
		"clusters/prod/platform.yaml": gitHelmRelease("lws-system"),
		"charts/platform/Chart.yaml":  umbrellaYAML("lws", "0.7.0", repo.URL),
	})
	head := g.Commit("Update lws to 0.8.0", map[string]string{"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.8.0", repo.URL)})
	// The same chart with lws vendored in charts/ and no dependencies declared.
	vendoredYAML := "apiVersion: v2\nname: platform\nversion: 0.1.0\n"
	vendoredBase := g.Commit("vendor lws 0.7.0", map[string]string{"charts/platform/Chart.yaml": vendoredYAML,
		"charts/platform/charts/lws-0.7.0.tgz": download(t, repo.URL+"/lws-0.7.0.tgz")})
	vendoredHead := g.Commit("vendor lws 0.8.0", map[string]string{"charts/platform/charts/lws-0.7.0.tgz": "",
		"charts/platform/charts/lws-0.8.0.tgz": download(t, repo.URL+"/lws-0.8.0.tgz")})

	// The HelmRelease without its GitRepository in the repository: reported, not judged.
	hrOnly := gitHelmRelease("lws-system")[strings.Index(gitHelmRelease("lws-system"), "---\n")+4:]
	orphanBase := g.Commit("the GitRepository lives elsewhere", map[string]string{"clusters/prod/platform.yaml": hrOnly,
		"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.7.0", repo.URL), "charts/platform/charts/lws-0.8.0.tgz": ""})
	orphanHead := g.Commit("Update lws to 0.8.0 again", map[string]string{"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.8.0", repo.URL)})
	r := run(t, "--kubeconfig", own.Kubeconfig, "review", "--repo", g.Dir, "--base", orphanBase.String(), "--head", orphanHead.String(), "-o", "json")
	if rows := reviewRows(t, r); r.code != cli.ExitSafe || len(rows) != 1 || !strings.Contains(rows[0].NotJudged, "GitRepository lws-system/fleet is not in the repository") {
		t.Errorf("without the GitRepository: exit %d, rows %+v, want 0 and one row not judged, naming the GitRepository", r.code, rows)
	}

	for name, c := range map[string]struct {
		base, head plumbing.Hash
		file       string
	}{
		"Chart.yaml":      {base, head, "charts/platform/Chart.yaml:7"},
		"a vendored .tgz": {vendoredBase, vendoredHead, "charts/platform/charts/lws-0.8.0.tgz:1"},
	} {
		r := run(t, "--kubeconfig", own.Kubeconfig, "review", "--repo", g.Dir, "--base", c.base.String(), "--head", c.head.String())
		for _, want := range []string{"delete " + testenv.LWSCRD, "3 LeaderWorkerSet objects", "lws 0.7.0 -> lws 0.8.0", c.file} {
			if r.code != cli.ExitFindings || !strings.Contains(r.stdout, want) {
				t.Errorf("%s: exit %d, want 1 and %q\n%s%s", name, r.code, want, r.stdout, r.stderr)
			}
		}
	}

	// Once the repository has a remote, a GitRepository that fetches another repository
	// does not render this one's chart: its bump touches no HelmRelease.
	if out, err := exec.CommandContext(t.Context(), "git", "-C", g.Dir, "remote", "add", "origin", "git@git.example.com:platform/fleet.git").CombinedOutput(); err != nil {
		t.Fatalf("git remote add: %v\n%s", err, out)
	}
	r = run(t, "--kubeconfig", own.Kubeconfig, "review", "--repo", g.Dir, "--base", base.String(), "--head", head.String(), "-o", "json")
	if rows := reviewRows(t, r); r.code != cli.ExitFindings || len(rows) != 1 {
		t.Errorf("with the repository's own remote: exit %d, %d rows, want 1 and the deletion", r.code, len(rows))
	}
	other := g.Commit("the platform chart from another repository", map[string]string{"clusters/prod/platform.yaml": strings.Replace(gitHelmRelease("lws-system"), "platform/fleet.git", "platform/other.git", 1),
		"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.7.0", repo.URL)})
	otherHead := g.Commit("Update lws to 0.8.0 once more", map[string]string{"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.8.0", repo.URL)})
	r = run(t, "--kubeconfig", own.Kubeconfig, "review", "--repo", g.Dir, "--base", other.String(), "--head", otherHead.String(), "-o", "json")
	if rows := reviewRows(t, r); r.code == cli.ExitCouldNot || len(rows) != 0 {
		t.Errorf("a GitRepository of another repository: exit %d, rows %+v, want no row", r.code, rows)
	}
}

// lwsChartRepo serves the real lws 0.7.0 and 0.8.0 charts (lwsCharts) from a Helm
// repository on loopback.
func lwsChartRepo(t *testing.T) *servers.ChartRepo {
	t.Helper()
	repo, err := servers.NewChartRepo(filepath.Join(t.TempDir(), "charts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	for _, dir := range lwsCharts(t) {
		if err := repo.Add(dir); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

// lwsCharts are folders holding the real lws 0.7.0 and 0.8.0 charts; both upstream
// Chart.yamls say 0.1.0, so each says its release's version, as helm package --version
// packages it.
func lwsCharts(t *testing.T) []string {
	t.Helper()
	fx := fixturesDir(t)
	var dirs []string
	for _, v := range []string{"0.7.0", "0.8.0"} {
		dir := filepath.Join(t.TempDir(), "lws")
		if err := os.CopyFS(dir, os.DirFS(filepath.Join(fx, "charts", "lws-"+v))); err != nil {
			t.Fatal(err)
		}
		meta := filepath.Join(dir, "Chart.yaml")
		data := readFile(t, meta)
		if !strings.Contains(data, "\nversion: 0.1.0\n") {
			t.Fatalf("lws-%s/Chart.yaml does not say version: 0.1.0", v)
		}
		if err := os.WriteFile(meta, []byte(strings.Replace(data, "\nversion: 0.1.0\n", "\nversion: "+v+"\n", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	return dirs
}

// TestReviewUmbrellaChartRepository: an umbrella chart that no HelmRelease of the
// repository deploys is judged as a chart repository's chart, against its last release,
// with its dependencies fetched from their Helm repository (and a file:// one read from
// the same revision): its lws dependency moving from 0.7.0 to 0.8.0 deletes the
// LeaderWorkerSet CRD on the upgrade. No cluster.
func TestReviewUmbrellaChartRepository(t *testing.T) {
	repo := lwsChartRepo(t)
	g := servers.NewGitRepo(t)
	// A second dependency, a chart of the same repository (file://).
	common := "  - name: common\n    version: 1.0.0\n    repository: file://../common\n"
	released := g.Commit("platform 0.1.0", map[string]string{"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.7.0", repo.URL) + common,
		"charts/common/Chart.yaml":            "apiVersion: v2\nname: common\nversion: 1.0.0\n",
		"charts/common/templates/config.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: common\n"})
	g.Tag("platform-0.1.0", released)
	head := g.Commit("Update lws to 0.8.0", map[string]string{"charts/platform/Chart.yaml": strings.Replace(umbrellaYAML("lws", "0.8.0", repo.URL), "version: 0.1.0", "version: 0.2.0", 1) + common})
	r, charts := reviewCharts(t, g.Dir, "--base", released.String(), "--head", head.String())
	if got := findingsOf(charts, "delete"); r.code != cli.ExitFindings || !slices.Equal(got, []string{"delete " + testenv.LWSCRD}) {
		t.Errorf("exit %d, findings %v, want 1 and the deletion of %s\n%s%s", r.code, got, testenv.LWSCRD, r.stdout, r.stderr)
	}
}

// TestReviewUmbrellaPrivateRepository: the umbrella chart's dependency comes from a
// private Helm repository (on loopback, behind basic authentication). Without stored
// credentials the repository answers 401 and review cannot judge the chart: exit 2,
// naming helm repo add. Once the real `helm repo add --username --password-stdin` has
// stored them, review reads the dependency with them, as helm dependency build does, and
// judges the bump: the deletion of the LeaderWorkerSet CRD. The password is never printed.
func TestReviewUmbrellaPrivateRepository(t *testing.T) {
	const user, password = "reader", "s3cret-pass"
	repoDir := t.TempDir()
	for _, dir := range lwsCharts(t) {
		if _, err := testenv.Package(dir, repoDir); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepoBasicAuth(repoDir, user, password)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// Helm's repositories file and cache for this test alone, for review and the Helm CLI.
	helmHome := t.TempDir()
	t.Setenv("HELM_REPOSITORY_CONFIG", filepath.Join(helmHome, "repositories.yaml"))
	t.Setenv("HELM_REPOSITORY_CACHE", filepath.Join(helmHome, "cache"))

	g := servers.NewGitRepo(t)
	released := g.Commit("platform 0.1.0", map[string]string{"charts/platform/Chart.yaml": umbrellaYAML("lws", "0.7.0", url)})
	g.Tag("platform-0.1.0", released)
	head := g.Commit("Update lws to 0.8.0", map[string]string{"charts/platform/Chart.yaml": strings.Replace(umbrellaYAML("lws", "0.8.0", url), "version: 0.1.0", "version: 0.2.0", 1)})
	args := []string{"review", "--repo", g.Dir, "--base", released.String(), "--head", head.String(), "-o", "json"}

	r := run(t, args...)
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "401") || !strings.Contains(r.stderr, "helm repo add lws "+url+" --username USER --password-stdin") {
		t.Errorf("without credentials: exit %d, want 2 naming the 401 and helm repo add\n%s%s", r.code, r.stdout, r.stderr)
	}

	cmd := cp.Helm("repo", "add", "private", url, "--username", user, "--password-stdin") // the environment above
	cmd.Stdin = strings.NewReader(password)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm repo add: %v\n%s", err, out)
	}
	r, charts := reviewCharts(t, g.Dir, "--base", released.String(), "--head", head.String())
	if got := findingsOf(charts, "delete"); r.code != cli.ExitFindings || !slices.Equal(got, []string{"delete " + testenv.LWSCRD}) {
		t.Errorf("with helm repo add's credentials: exit %d, findings %v, want 1 and the deletion of %s\n%s%s", r.code, got, testenv.LWSCRD, r.stdout, r.stderr)
	}
	for _, out := range []string{r.stdout, r.stderr} {
		if strings.Contains(out, password) {
			t.Errorf("the output shows the password:\n%s", out)
		}
	}
}
