package servers

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"helm.sh/helm/v4/pkg/chart/loader"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/registry"
	repo "helm.sh/helm/v4/pkg/repo/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// ServeRepo serves dir (packaged charts) as a chart repository over loopback HTTP, with
// an index.yaml made by the Helm SDK. Call the returned function to stop it.
func ServeRepo(dir string) (url string, stop func(), err error) {
	return serveRepo(dir, http.FileServer(http.Dir(dir)))
}

// ServeRepoBasicAuth is ServeRepo behind HTTP basic authentication: a request without
// username and password gets 401 Unauthorized, as a private chart repository answers.
func ServeRepoBasicAuth(dir, username, password string) (url string, stop func(), err error) {
	files := http.FileServer(http.Dir(dir))
	return serveRepo(dir, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != username || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="charts"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		files.ServeHTTP(w, r)
	}))
}

func serveRepo(dir string, h http.Handler) (url string, stop func(), err error) {
	srv := httptest.NewServer(h)
	idx, err := repo.IndexDirectory(dir, srv.URL)
	if err != nil {
		srv.Close()
		return "", nil, err
	}
	if err := idx.WriteFile(filepath.Join(dir, "index.yaml"), 0o644); err != nil {
		srv.Close()
		return "", nil, err
	}
	return srv.URL, srv.Close, nil
}

// ServeOCI runs an OCI registry in-process on loopback and returns its host:port.
func ServeOCI() (host string, stop func()) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(nopLogger())))
	return strings.TrimPrefix(srv.URL, "http://"), srv.Close
}

// PushOCI pushes a packaged chart to host/path/NAME:VERSION with the Helm SDK's registry
// client and returns the chart's oci:// URL.
func PushOCI(tgz, host, path string) (string, error) { return PushOCITag(tgz, host, path, "") }

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// ChartRepo is a loopback HTTP chart repository whose contents can change while it
// serves: Add packages a chart into it and rewrites index.yaml, as a chart publisher's
// release does, so a Flux HelmRepository sees the new version on its next reconcile.
type ChartRepo struct {
	// URL is the repository's base URL.
	URL string
	dir string
	srv *httptest.Server
}

// NewChartRepo serves an empty chart repository from dir on loopback. Close stops it.
func NewChartRepo(dir string) (*ChartRepo, error) { return NewChartRepoAt(dir, "") }

// NewChartRepoAt is NewChartRepo listening on host (an IP address; "" is loopback), for
// clients that cannot reach the test's loopback, such as a node's Pods.
func NewChartRepoAt(dir, host string) (*ChartRepo, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	srv := httptest.NewUnstartedServer(http.FileServer(http.Dir(dir)))
	if host != "" {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("chart repository on %s: %w", host, err)
		}
		_ = srv.Listener.Close()
		srv.Listener = l
	}
	srv.Start()
	r := &ChartRepo{URL: srv.URL, dir: dir, srv: srv}
	if err := r.reindex(); err != nil {
		srv.Close()
		return nil, err
	}
	return r, nil
}

// Add packages the chart directory into the repository and rewrites its index.
func (r *ChartRepo) Add(chartDir string) error {
	if _, err := testenv.Package(chartDir, r.dir); err != nil {
		return fmt.Errorf("package %s: %w", chartDir, err)
	}
	return r.reindex()
}

func (r *ChartRepo) reindex() error {
	idx, err := repo.IndexDirectory(r.dir, r.URL)
	if err != nil {
		return err
	}
	idx.SortEntries()
	return idx.WriteFile(filepath.Join(r.dir, "index.yaml"), 0o644)
}

// Close stops serving.
func (r *ChartRepo) Close() { r.srv.Close() }

// PushOCITag pushes a packaged chart to host/path/NAME:tag, where tag need not be the
// chart's version (a channel tag such as "stable" that a publisher moves from one version
// to the next; "" means the chart's version), and returns the chart's oci:// URL.
func PushOCITag(tgz, host, path, tag string) (string, error) {
	data, err := os.ReadFile(tgz)
	if err != nil {
		return "", err
	}
	ch, err := loader.LoadArchive(strings.NewReader(string(data)))
	if err != nil {
		return "", err
	}
	c := ch.(*chart.Chart)
	rc, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard))
	if err != nil {
		return "", err
	}
	if tag == "" {
		tag = c.Metadata.Version
	}
	ref := fmt.Sprintf("%s/%s/%s:%s", host, path, c.Name(), tag)
	if _, err := rc.Push(data, ref, registry.PushOptStrictMode(tag == c.Metadata.Version)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return "oci://" + host + "/" + path + "/" + c.Name(), nil
}
