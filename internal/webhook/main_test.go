package webhook_test

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr/funcr"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// suite is the control plane with the gate registered on a real webhook server, the
// fixture charts served over HTTP and OCI, and Flux's CRDs installed by a real Helm
// release of the flux2 2.17.2 chart (as the incident cluster had them).
type suite struct {
	cp      *testenv.ControlPlane
	c       client.Client
	scheme  *runtime.Scheme
	repoURL string // HTTP chart repository
	ociHost string // OCI registry host:port
	charts  map[string]string
	logs    logBuffer
}

// logBuffer keeps every log line the suite's processes write.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) write(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, line)
}

func (b *logBuffer) all() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

var s suite

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	stop, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		if stop != nil {
			stop()
		}
		os.Exit(2)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// fixtureCharts are the charts the tests serve: name, version and the fixture CRD files
// their templates/ hold.
var fixtureCharts = []struct {
	name, version string
	files         []string
}{
	{"flux2", "2.17.2", []string{"charts/flux2-2.17.2/rendered/crds.yaml"}},
	{"flux2", "2.18.2", []string{"charts/flux2-2.18.2/rendered/crds.yaml"}},
	{"crossplane", "1.17.3", []string{"crds/crossplane/v1.17.3"}},
	// The fixture set holds only the CRD files that changed: 1.18.0 ships 1.17.3's
	// Function CRDs unchanged.
	{"crossplane", "1.18.0", []string{"crds/crossplane/v1.18.0", "crds/crossplane/v1.17.3/pkg.crossplane.io_functionrevisions.yaml",
		"crds/crossplane/v1.17.3/pkg.crossplane.io_functions.yaml"}},
	// A chart that stops rendering the Function CRDs: Helm would delete them.
	{"crossplane", "1.18.1", []string{"crds/crossplane/v1.18.0"}},
	{"kro", "0.2.0", []string{"crds/kro/v0.2.0"}},
	{"kro", "0.9.0", []string{"crds/kro/v0.2.0"}},
	{"kro", "0.9.3", []string{"crds/kro/v0.9.3"}},
	{"cert-manager", "1.6.3", []string{"crds/cert-manager/v1.6.3"}},
	{"cert-manager", "1.7.0", []string{"crds/cert-manager/v1.7.0"}},
}

func setup() (stop func(), err error) {
	// Every log line of the manager, the webhook and the libraries it calls, up to the
	// controller's --debug (logr V(4)), so a test can assert what never appears in them.
	// Beyond that, client-go dumps response bodies, which no flag of ours reaches.
	ctrllog.SetLogger(funcr.New(func(prefix, args string) { s.logs.write(prefix + " " + args) }, funcr.Options{Verbosity: 4}))
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	cp, err := testenv.Start(testenv.Options{Webhooks: &envtest.WebhookInstallOptions{
		Paths: []string{filepath.Join(root, "config", "webhook")},
	}})
	if err != nil {
		return nil, err
	}
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		_ = cp.Stop()
	}
	s.cp = cp
	ctx := context.Background()

	if err := testenv.ApplyUpgradeguardCRDs(ctx, cp.Config); err != nil {
		return stop, err
	}
	dir, err := os.MkdirTemp("", "upgradeguard-gate-")
	if err != nil {
		return stop, err
	}
	stops = append(stops, func() { _ = os.RemoveAll(dir) })
	repoDir := filepath.Join(dir, "repo")
	s.charts = map[string]string{}
	for _, fc := range fixtureCharts {
		files, err := expand(fc.files)
		if err != nil {
			return stop, err
		}
		chartDir, err := testenv.FixtureChart(filepath.Join(dir, "src", fc.name+"-"+fc.version), fc.name, fc.version, files...)
		if err != nil {
			return stop, err
		}
		tgz, err := testenv.Package(chartDir, repoDir)
		if err != nil {
			return stop, err
		}
		s.charts[fc.name+"-"+fc.version] = tgz
	}
	// Gateway API's standard CRDs at two releases, for the policy verdict.
	for _, tag := range []string{testenv.GatewayAPIOld, testenv.GatewayAPINew} {
		chartDir, err := testenv.GatewayAPIChart(filepath.Join(dir, "src", "gateway-api-"+tag), tag)
		if err != nil {
			return stop, err
		}
		tgz, err := testenv.Package(chartDir, repoDir)
		if err != nil {
			return stop, err
		}
		s.charts["gateway-api-crds-"+strings.TrimPrefix(tag, "v")] = tgz
	}
	if err := widgetCharts(filepath.Join(dir, "src"), repoDir); err != nil {
		return stop, err
	}
	url, stopRepo, err := servers.ServeRepo(repoDir)
	if err != nil {
		return stop, err
	}
	stops = append(stops, stopRepo)
	s.repoURL = url
	host, stopOCI := servers.ServeOCI()
	stops = append(stops, stopOCI)
	s.ociHost = host
	for _, v := range []string{"0.2.0", "0.9.0", "0.9.3"} {
		if _, err := servers.PushOCI(s.charts["kro-"+v], host, "charts"); err != nil {
			return stop, fmt.Errorf("push kro %s: %w", v, err)
		}
	}

	// Flux's CRDs come from a real Helm release of the flux2 chart.
	if out, err := cp.Helm("install", "flux", s.charts["flux2-2.17.2"], "-n", "flux-system", "--create-namespace").CombinedOutput(); err != nil {
		return stop, fmt.Errorf("helm install flux2 2.17.2: %w: %s", err, out)
	}

	s.scheme = runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, helmv2.AddToScheme, sourcev1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s.scheme); err != nil {
			return stop, err
		}
	}
	// The API server serves the new CRDs' kinds a moment after they are established:
	// build the client once it does.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := client.New(cp.Config, client.Options{Scheme: s.scheme})
		if err != nil {
			return false, err
		}
		if c.List(ctx, &sourcev1.HelmRepositoryList{}) != nil || c.List(ctx, &helmv2.HelmReleaseList{}) != nil ||
			c.List(ctx, &sourcev1.OCIRepositoryList{}) != nil {
			return false, nil
		}
		s.c = c
		return true, nil
	})
	if err != nil {
		return stop, fmt.Errorf("the Flux kinds are not served: %w", err)
	}

	// Argo CD's Application kind (a stand-in CRD: no Argo CD runs here), served before
	// the manager starts, so that the gate follows Applications' server-side diffs.
	if err := argocd.InstallApplicationCRD(ctx, apiextclient.NewForConfigOrDie(cp.Config)); err != nil {
		return stop, err
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(argocd.ApplicationGVR).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		return stop, fmt.Errorf("the Application kind is not served: %w", err)
	}

	// The production wiring: the controller's manager (StorageMigration reconciler,
	// proactive and policy controllers) with the gate registered on its webhook server,
	// serving where envtest pointed the installed configuration.
	wh := cp.Webhooks
	mgr, err := controller.NewManager(cp.Config, controller.Options{
		LeaderElectionNamespace: "default", MetricsAddr: "0", ProbeAddr: "0",
		EnableWebhook: true, WebhookPort: wh.LocalServingPort, WebhookCertDir: wh.LocalServingCertDir,
	})
	if err != nil {
		return stop, err
	}
	if err := webhook.Setup(mgr, webhook.Options{Timeout: 20 * time.Second, HelmCacheDir: filepath.Join(dir, "helm")}); err != nil {
		return stop, err
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	stops = append(stops, func() { cancel(); <-done })
	return stop, waitServing(net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort)))
}

// waitServing waits until the webhook server accepts TLS connections.
func waitServing(addr string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a readiness probe of our own loopback server
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("webhook server on %s did not start: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a readiness probe
	}
}

// expand turns fixture directories into their files.
func expand(paths []string) ([]string, error) {
	fx, err := testenv.Fixtures()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range paths {
		st, err := os.Stat(filepath.Join(fx, p))
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		entries, err := os.ReadDir(filepath.Join(fx, p))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out = append(out, filepath.Join(p, e.Name()))
		}
	}
	return out, nil
}
