package applycheck_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/repo/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

// TestPredictReadsChartAndValuesOnce: an upgrade's chart, from a repository, and its
// values file, from a URL, are each fetched once for the replay and the CRD check, and
// the values given are the ones rendered. A values file that cannot be read is a
// *chartsource.LoadError, before the chart is fetched.
func TestPredictReadsChartAndValuesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	for _, env := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		t.Setenv(env, t.TempDir()) // no chart or index cached from another run
	}
	c := newCluster(t)
	const ns, rel = "once", "web"
	v1 := webChart{mode: "one", x: "1", v: "1", selector: "web"}.write(t, "1.0.0")
	if out, err := c.helm(t, "install", rel, v1, "-n", ns, "--create-namespace"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	dir := t.TempDir()
	if _, err := testenv.Package(webChart{mode: "one", x: "1", v: "1", selector: "web"}.write(t, "1.1.0"), dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "values.yaml"), []byte("password: given\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hits := map[string]int{}
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	idx, err := repo.IndexDirectory(dir, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.WriteFile(filepath.Join(dir, "index.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	chart := func(valuesFile string) chartsource.Options {
		return chartsource.Options{Ref: "web", RepoURL: srv.URL, Version: "1.1.0", Values: values.Options{ValueFiles: []string{srv.URL + valuesFile}}}
	}

	p, err := applycheck.Predict(t.Context(), c.sources(t, ns), applycheck.Request{Release: rel, Namespace: ns, Chart: chart("/values.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	if hits["/web-1.1.0.tgz"] != 1 || hits["/values.yaml"] != 1 {
		t.Errorf("fetched the chart %d times and the values %d times, want once each", hits["/web-1.1.0.tgz"], hits["/values.yaml"])
	}
	if p.CRDCheck.ChartVersion != "1.1.0" || p.Apply.Operation != applycheck.OpUpgrade {
		t.Errorf("CRD check of chart %q, replay of %q; want the upgrade to 1.1.0", p.CRDCheck.ChartVersion, p.Apply.Operation)
	}
	if o := outcomes(p.Apply); o["Secret/once/creds"] != applycheck.Updated || o["ConfigMap/once/b-guarded"] != applycheck.Updated {
		t.Errorf("the values given (a new password) are not what was rendered: %v", o)
	}
	if !p.Safe || !p.ReleaseReport.Safe || !p.CRDCheck.Safe {
		t.Errorf("safe %v (replay %v, CRD check %v), want safe", p.Safe, p.ReleaseReport.Safe, p.CRDCheck.Safe)
	}

	_, err = applycheck.Predict(t.Context(), c.sources(t, ns), applycheck.Request{Release: rel, Namespace: ns, Chart: chart("/missing.yaml")})
	var load *chartsource.LoadError
	if !errors.As(err, &load) || load.Step != "values" {
		t.Errorf("missing values file: %v, want a LoadError at step values", err)
	}
	if hits["/web-1.1.0.tgz"] != 1 {
		t.Errorf("the chart was fetched after its values failed")
	}
}
