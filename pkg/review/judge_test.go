package review_test

import (
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"helm.sh/helm/v4/pkg/cli"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// requests counts what a cluster's clients ask: the version reads that prove the API
// server answers (one per connection, livecluster.Connect) and the dry-run writes that
// ask it whether it accepts a CRD.
type requests struct{ versions, dryRuns atomic.Int64 }

func (n *requests) config(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch {
			case r.Method == http.MethodGet && r.URL.Path == "/version":
				n.versions.Add(1)
			case r.URL.Query().Get("dryRun") != "":
				n.dryRuns.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	return cfg
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestJudgeSharesOneConnectionPerCluster: a pull request that bumps the flux2
// HelmRelease from 2.17.2 to 2.18.2 and changes a file of the same flux2 CRDs lands two
// changes on one cluster. The review connects to it once (one version read), and the
// second judgement asks the API server none of the dry runs the first asked (the same
// live CRDs, the same incoming CRDs): the review of both changes makes as many dry runs
// as the review of the HelmRelease alone.
func TestJudgeSharesOneConnectionPerCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := testenv.ForTest(t)
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	installed, err := testenv.FixtureChart(t.TempDir(), "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := scenario.Helm(cp, "install", "flux2", installed, "-n", "flux-system", "--create-namespace"); err != nil {
		t.Fatal(err)
	}
	charts, err := scenario.ChartRepo(filepath.Join(t.TempDir(), "charts"), "flux2-2.17.2", "flux2-2.18.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(charts.Close)
	crds := func(version string) string {
		b, err := os.ReadFile(filepath.Join(fx, "charts", "flux2-"+version, "rendered", "crds.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	settings, home := cli.New(), t.TempDir()
	settings.RepositoryCache = filepath.Join(home, "repository")
	settings.RepositoryConfig = filepath.Join(home, "repositories.yaml")
	settings.RegistryConfig = filepath.Join(home, "registry.json")
	settings.ContentCache = filepath.Join(home, "content")
	g := servers.NewGitRepo(t)
	base := g.Commit("flux2 2.17.2", map[string]string{
		"clusters/prod/flux.yaml": scenario.FluxGitManifests(charts.URL, "2.17.2"),
		"clusters/prod/crds.yaml": crds("2.17.2"),
	})
	hrOnly := g.Commit("flux2 2.18.2", map[string]string{"clusters/prod/flux.yaml": scenario.FluxGitManifests(charts.URL, "2.18.2")})
	both := g.Commit("flux2 2.18.2 CRDs", map[string]string{"clusters/prod/crds.yaml": crds("2.18.2")})

	judge := func(head string, changes int) *requests {
		t.Helper()
		d, err := review.Changes(t.Context(), review.Options{Repo: g.Dir, Base: base.String(), Head: head})
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Changes) != changes {
			t.Fatalf("%d changes, want %d: %+v", len(d.Changes), changes, d.Changes)
		}
		n := &requests{}
		rep, err := review.Judge(t.Context(), d, []review.Cluster{{Name: "prod", Config: n.config(cp.Config)}}, settings)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Rows) != changes {
			t.Fatalf("%d rows, want %d", len(rep.Rows), changes)
		}
		for _, r := range rep.Rows {
			if r.Report == nil {
				t.Fatalf("%s not judged: %s", r.Subject, r.NotJudged)
			}
		}
		return n
	}
	alone := judge(hrOnly.String(), 1)
	if alone.dryRuns.Load() == 0 {
		t.Fatal("the HelmRelease's judgement asked no dry run: the CRDs it changes are not asked about")
	}
	two := judge(both.String(), 2)
	if got := two.versions.Load(); got != 1 {
		t.Errorf("two changes on one cluster read its version %d times, want 1 (one connection per cluster and review)", got)
	}
	// A dry run answered with a conflict is asked again (the API server may still be
	// writing a new CRD's status), so either count may hold one more; unshared, the two
	// changes would ask each CRD twice.
	if got, alone := two.dryRuns.Load(), alone.dryRuns.Load(); got > alone+1 {
		t.Errorf("two changes of the same CRDs made %d dry runs, want at most the %d (and a retry) of the HelmRelease alone (the answers shared)", got, alone)
	}
}
