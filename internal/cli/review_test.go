package cli_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// TestReviewFluxBump: a pull request that bumps the flux2 HelmRelease from 2.17.2 to
// 2.18.2 in two clusters' folders, reviewed against two real API servers. On prod-eu the
// HelmRepositories, Buckets and HelmCharts were stored at v1beta2 before 2.17.2, and
// storedVersions still holds it, so the bump fails there; staging was installed at 2.17.2
// and holds v1 only. One report gives the two rows, names the CRDs and upgradeguard
// migrate; after prod-eu is migrated, the same pull request passes. The chart comes from
// a real Helm repository on loopback that the HelmRepository in the repository names.
func TestReviewFluxBump(t *testing.T) {
	needCluster(t)
	prod, staging := testenv.ForTest(t), testenv.ForTest(t)
	fx := fixturesDir(t)
	// prod-eu: objects stored at v1beta2 by an older flux2, then 2.17.2.
	if err := scenario.FluxStoredV1beta2(t.Context(), prod, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	installed := fixtureChart(t, "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	// staging: 2.17.2 from the start.
	helmOn(t, staging, "install", "flux2", installed, "-n", "flux-system", "--create-namespace")

	repo := fluxChartRepo(t)
	g := servers.NewGitRepo(t)
	files := func(version string) map[string]string {
		m := map[string]string{"README.md": "fleet\n"}
		for _, c := range []string{"prod-eu", "staging"} {
			m["clusters/"+c+"/flux.yaml"] = scenario.FluxGitManifests(repo.URL, version)
		}
		return m
	}
	base := g.Commit("flux2 2.17.2", files("2.17.2"))
	head := g.Commit("Update Helm release flux2 to v2.18.2", files("2.18.2"))
	docs := g.Commit("docs only", map[string]string{"README.md": "fleet of two\n"})
	widened := g.Commit("flux2 >=2.17.0 <3.0.0", files(">=2.17.0 <3.0.0"))

	kubeconfig := mergedKubeconfig(t, map[string]*testenv.ControlPlane{"prod-eu": prod, "staging": staging})
	reviewArgs := func(base, head string, more ...string) []string {
		return append([]string{"--kubeconfig", kubeconfig, "review", "--repo", g.Dir, "--base", base, "--head", head,
			"--cluster", "clusters/prod-eu/=prod-eu", "--cluster", "clusters/staging/=staging"}, more...)
	}

	r := run(t, reviewArgs(base.String(), head.String(), "-o", "json")...)
	if r.code != cli.ExitFindings {
		t.Fatalf("review: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	rows := reviewRows(t, r)
	if got := rowsBy(rows); !slices.Equal(got, []string{"prod-eu blocked", "staging safe"}) {
		t.Fatalf("rows %v, want prod-eu blocked and staging safe\n%s", got, r.stdout)
	}
	p := rows[0]
	var migrate []string
	for _, c := range p.Report.Findings() {
		migrate = append(migrate, string(c.Verdict)+" "+c.Name)
	}
	if want := []string{"migrate " + buckets, "migrate " + charts, "migrate " + helmrepos}; !slices.Equal(migrate, want) {
		t.Errorf("prod-eu findings %v, want %v", migrate, want)
	}
	if p.From != "2.17.2" || p.To != "2.18.2" || p.File != "clusters/prod-eu/flux.yaml" || p.Line != 20 {
		t.Errorf("prod-eu change %s -> %s at %s:%d, want 2.17.2 -> 2.18.2 at clusters/prod-eu/flux.yaml:20", p.From, p.To, p.File, p.Line)
	}
	text := run(t, reviewArgs(base.String(), head.String())...)
	for _, want := range []string{"BLOCKED", "upgradeguard migrate", helmrepos, "staging"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
	// The annotation points at the line the pull request changed.
	gh := run(t, reviewArgs(base.String(), head.String(), "-o", "github")...)
	if want := "::error file=clusters/prod-eu/flux.yaml,line=20,title=migrate%3A " + helmrepos + "::"; !strings.Contains(gh.stdout, want) || strings.Contains(gh.stdout, "clusters/staging") {
		t.Errorf("-o github: want %q and nothing on staging:\n%s", want, gh.stdout)
	}

	// A snapshot of each cluster gives the same verdicts with no cluster credentials, and
	// says its age.
	clusters := map[string]*testenv.ControlPlane{"prod-eu": prod, "staging": staging}
	fromFiles := takeSnapshots(t, clusters, "")
	snapArgs := sameFromSnapshots(t, reviewArgs(base.String(), head.String()), fromFiles)
	snapshotAgeShown(t, snapArgs)
	sameFromSnapshots(t, reviewArgs(base.String(), widened.String()), fromFiles)

	// A change that touches no HelmRelease passes and says so.
	r = run(t, reviewArgs(head.String(), docs.String())...)
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "touches no HelmRelease") {
		t.Errorf("docs-only change: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A widened semver range is a possible jump: it resolves to 2.18.2 from the repository,
	// as source-controller would, and fails on prod-eu the same way.
	r = run(t, reviewArgs(base.String(), widened.String(), "-o", "json")...)
	if got := rowsBy(reviewRows(t, r)); r.code != cli.ExitFindings || !slices.Equal(got, []string{"prod-eu blocked", "staging safe"}) {
		t.Errorf("widened range: exit %d, rows %v, want 1, prod-eu blocked and staging safe\n%s", r.code, got, r.stderr)
	}
	if rows := reviewRows(t, r); len(rows) > 0 && (rows[0].Report == nil || rows[0].Report.ChartVersion != "2.18.2" || rows[0].To != ">=2.17.0 <3.0.0") {
		t.Errorf("widened range: %+v, want the range resolved to 2.18.2", rows[0])
	}

	// After prod-eu is migrated, the same pull request passes.
	m := run(t, "--kubeconfig", prod.Kubeconfig, "migrate", "--chart", filepath.Join(fx, "charts", "flux2-2.18.2"), "--release", "flux2", "-n", "flux-system", "--lease-namespace", "flux-system")
	if m.code != cli.ExitSafe {
		t.Fatalf("migrate prod-eu: exit %d\n%s%s", m.code, m.stdout, m.stderr)
	}
	r = run(t, reviewArgs(base.String(), head.String(), "-o", "json")...)
	if got := rowsBy(reviewRows(t, r)); r.code != cli.ExitSafe || !slices.Equal(got, []string{"prod-eu safe", "staging safe"}) {
		t.Errorf("after the migration: exit %d, rows %v, want 0 and both safe\n%s", r.code, got, r.stderr)
	}
	// So does a snapshot pushed to a registry after the migration, read from there.
	sameFromSnapshots(t, reviewArgs(base.String(), head.String()), takeSnapshots(t, clusters, ociRegistry(t)))
}

// TestReviewFlagErrors: what review cannot run with exits 2 and says what to give.
func TestReviewFlagErrors(t *testing.T) {
	g := servers.NewGitRepo(t)
	c := g.Commit("one", map[string]string{"a.yaml": "a: 1\n"})
	for _, tc := range []struct {
		args    []string
		mention string
	}{
		{[]string{"review", "--repo", g.Dir, "--base", c.String(), "--head", c.String(), "--cluster", "clusters/prod"}, "want PATH=CONTEXT"},
		{[]string{"review", "--repo", g.Dir, "--base", "no-such-ref", "--head", c.String()}, "resolve no-such-ref"},
		{[]string{"review", "--repo", t.TempDir()}, "open git repository"},
	} {
		r := run(t, tc.args...) // each fails before any cluster is read
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.mention)
		}
	}
}

func helmOn(t *testing.T, cp *testenv.ControlPlane, args ...string) {
	t.Helper()
	if err := scenario.Helm(cp, args...); err != nil {
		t.Fatal(err)
	}
}

// mergedKubeconfig writes one kubeconfig with a context per control plane, by name.
func mergedKubeconfig(t *testing.T, cps map[string]*testenv.ControlPlane) string {
	t.Helper()
	out := clientcmdapi.NewConfig()
	for name, cp := range cps {
		c, err := clientcmd.LoadFromFile(cp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		ctx := c.Contexts[c.CurrentContext]
		out.Clusters[name] = c.Clusters[ctx.Cluster]
		out.AuthInfos[name] = c.AuthInfos[ctx.AuthInfo]
		out.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
		out.CurrentContext = name
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*out, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func reviewRows(t *testing.T, r result) []review.Row {
	t.Helper()
	var rep struct {
		Rows []review.Row `json:"rows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("JSON output: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
	slices.SortFunc(rep.Rows, func(a, b review.Row) int { return strings.Compare(a.Cluster, b.Cluster) })
	return rep.Rows
}

// rowsBy says each row's cluster and verdict: "prod-eu blocked".
func rowsBy(rows []review.Row) []string {
	var out []string
	for _, r := range rows {
		v := "not judged"
		if r.Report != nil {
			v = map[bool]string{true: "safe", false: "blocked"}[r.Report.Safe]
		}
		out = append(out, r.Cluster+" "+v)
	}
	return out
}

// lwsDeployed serves the real lws 0.7.0 and 0.8.0 charts from a Helm repository on
// loopback until the test ends, and installs 0.7.0 on cp as release lws in lws-system with
// 3 LeaderWorkerSets.
func lwsDeployed(t *testing.T, cp *testenv.ControlPlane) *servers.ChartRepo {
	t.Helper()
	fx := fixturesDir(t)
	charts := filepath.Join(t.TempDir(), "charts")
	for _, v := range []string{"0.7.0", "0.8.0"} {
		// Both upstream Chart.yamls say 0.1.0: the release's version is given at packaging.
		helmOn(t, cp, "package", filepath.Join(fx, "charts", "lws-"+v), "--version", v, "-d", charts)
	}
	repo, err := servers.NewChartRepo(charts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	helmOn(t, cp, "install", "lws", filepath.Join(charts, "lws-0.7.0.tgz"), "-n", "lws-system", "--create-namespace")
	if err := testenv.CreateLeaderWorkerSets(t.Context(), cp.Config, testenv.LWSGroup, "lws-system", 3); err != nil {
		t.Fatal(err)
	}
	return repo
}

// TestReviewLWSDeletion: the real lws chart moved its CRD from templates/ to crds/ in
// 0.8.0 (kubernetes-sigs/lws#880), so the upgrade deletes every LeaderWorkerSet. A bump
// of the HelmRelease from 0.7.0 to 0.8.0 fails the review with the deletion and its object
// count; acknowledged, by the HelmRelease's annotation or by --acknowledge, it passes and
// is still shown.
func TestReviewLWSDeletion(t *testing.T) {
	needCluster(t)
	own := testenv.ForTest(t)
	repo := lwsDeployed(t, own)

	g := servers.NewGitRepo(t)
	hr := func(version, annotation string) map[string]string {
		return map[string]string{"clusters/prod/lws.yaml": scenario.GitManifests("lws-system", "lws", "lws", repo.URL, version, annotation)}
	}
	base := g.Commit("lws 0.7.0", hr("0.7.0", ""))
	head := g.Commit("Update Helm release lws to v0.8.0", hr("0.8.0", ""))
	acked := g.Commit("lws 0.8.0, deleting the CRD on purpose", hr("0.8.0", "delete/"+testenv.LWSCRD))
	args := func(head string, more ...string) []string {
		return append([]string{"--kubeconfig", own.Kubeconfig, "review", "--repo", g.Dir, "--base", base.String(), "--head", head}, more...)
	}

	r := run(t, args(head.String())...)
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "delete "+testenv.LWSCRD) || !strings.Contains(r.stdout, "3 LeaderWorkerSet objects") {
		t.Errorf("bump to 0.8.0: exit %d, want 1 naming the deletion of %s and its 3 objects\n%s%s", r.code, testenv.LWSCRD, r.stdout, r.stderr)
	}
	for name, a := range map[string][]string{
		"annotation":    args(acked.String()),
		"--acknowledge": args(head.String(), "--acknowledge", "delete/"+testenv.LWSCRD),
	} {
		r := run(t, a...)
		if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "delete "+testenv.LWSCRD+" (acknowledged)") {
			t.Errorf("acknowledged by %s: exit %d, want 0 and the deletion shown as acknowledged\n%s%s", name, r.code, r.stdout, r.stderr)
		}
		md := run(t, append(a, "-o", "markdown")...)
		if md.code != cli.ExitSafe || !strings.Contains(md.stdout, "☑️ acknowledged blocking") {
			t.Errorf("acknowledged by %s, -o markdown: exit %d\n%s", name, md.code, md.stdout)
		}
	}
	// A snapshot gives the same deletion and object count, acknowledged or not.
	snaps := takeSnapshots(t, map[string]*testenv.ControlPlane{contextOf(t, own): own}, "")
	sameFromSnapshots(t, args(head.String()), snaps)
	sameFromSnapshots(t, args(acked.String()), snaps)
	sameFromSnapshots(t, args(head.String(), "--acknowledge", "delete/"+testenv.LWSCRD), snaps)

	r = run(t, args(head.String(), "--acknowledge", "delete")...)
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "want CHECK/SUBJECT") {
		t.Errorf("--acknowledge delete: exit %d %s", r.code, r.stderr)
	}
}
