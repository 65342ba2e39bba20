package flux

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// CRDsFixture holds Flux's own CRDs at the version the controllers below serve: the
// CRDs of the flux2 2.18.2 distribution (source-controller 1.8, helm-controller 1.5 API
// level, v1 and v2 only). They are what source- and helm-controller need to run. Keep
// them apart from the charts under test: the Flux incident itself migrates these very
// CRDs, so a scenario about Flux's CRDs must not run real Flux controllers on the same
// control plane.
const CRDsFixture = "charts/flux2-2.18.2/rendered/crds.yaml"

// Flux versions run by Start (bin/flux, built by `make testbin`).
const (
	SourceControllerVersion = "v1.9.1"
	HelmControllerVersion   = "v1.6.2"
)

// Scheme knows the core kinds and Flux's source and helm APIs.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = apiextv1.AddToScheme(s)
	_ = sourcev1.AddToScheme(s)
	_ = helmv2.AddToScheme(s)
	return s
}

// IsCRD reports whether crd is one of Flux's own CRDs (group *.toolkit.fluxcd.io), so
// that testenv.DeleteCRDs can keep them between scenarios while Flux runs.
func IsCRD(crd *apiextv1.CustomResourceDefinition) bool {
	return strings.HasSuffix(crd.Spec.Group, ".toolkit.fluxcd.io")
}

// ApplyCRDs applies Flux's own CRDs (CRDsFixture) and waits until they are
// established.
func ApplyCRDs(ctx context.Context, cp *testenv.ControlPlane) error {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	return testenv.ApplyFixtureCRDs(ctx, cs, CRDsFixture)
}

// Flux is Flux's real source-controller and helm-controller running as processes outside
// the cluster against a testenv.ControlPlane, the way they run in a cluster but without pods: they
// read KUBECONFIG, leader election is off, and metrics, health and (for source-controller)
// artifacts are served on free loopback ports.
//
// There is no kubelet, so nothing a chart deploys ever becomes ready: use charts whose
// objects need no pod (CRDs, ConfigMaps), or set the HelmRelease's disableWait.
type Flux struct {
	// Client reads and writes Flux objects (Scheme) as the admin user.
	Client client.Client
	// SourceLog and HelmLog are the controllers' log files.
	SourceLog, HelmLog string

	cp      *testenv.ControlPlane
	dir     string
	source  *testenv.Process
	helm    *testenv.Process
	stopped bool
}

// Start applies Flux's CRDs, starts source-controller and helm-controller, waits until
// both are healthy, and stops them when the test ends. When the test fails, the tail of
// both logs is printed.
func Start(t testing.TB, cp *testenv.ControlPlane) *Flux {
	t.Helper()
	f, err := StartControllers(t.Context(), cp)
	if err != nil {
		t.Fatalf("flux: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("source-controller log (tail):\n%s", testenv.Tail(f.SourceLog, 40))
			t.Logf("helm-controller log (tail):\n%s", testenv.Tail(f.HelmLog, 40))
		}
		if err := f.Stop(); err != nil {
			t.Errorf("stop flux: %v", err)
		}
	})
	return f
}

// StartControllers is Start for callers without a testing.TB (the demo). Call Stop
// when done.
func StartControllers(ctx context.Context, cp *testenv.ControlPlane) (*Flux, error) {
	bins := filepath.Join(cp.Bin, "flux")
	if err := testenv.CheckBins(bins, "source-controller", "helm-controller"); err != nil {
		return nil, err
	}
	if err := ApplyCRDs(ctx, cp); err != nil {
		return nil, fmt.Errorf("apply Flux CRDs from %s: %w", CRDsFixture, err)
	}
	c, err := client.New(cp.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(cp.Dir(), "flux-")
	if err != nil {
		return nil, err
	}
	f := &Flux{Client: c, cp: cp, dir: dir,
		SourceLog: filepath.Join(dir, "source-controller.log"),
		HelmLog:   filepath.Join(dir, "helm-controller.log")}
	storage := filepath.Join(dir, "artifacts")
	if err := os.MkdirAll(storage, 0o700); err != nil {
		return nil, err
	}
	ports, err := testenv.FreePorts(5)
	if err != nil {
		return nil, fmt.Errorf("flux: find free ports: %w", err)
	}
	storageAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	f.source, err = f.start(ctx, filepath.Join(bins, "source-controller"), f.SourceLog, ports[1], ports[2],
		"--storage-path="+storage,
		"--storage-addr="+storageAddr,
		"--storage-adv-addr="+storageAddr,
	)
	if err != nil {
		return nil, errors.Join(err, f.Stop())
	}
	f.helm, err = f.start(ctx, filepath.Join(bins, "helm-controller"), f.HelmLog, ports[3], ports[4],
		// On SIGTERM helm-controller waits for running reconciles; a test does not need
		// the production default of ten minutes.
		"--graceful-shutdown-timeout=10s",
	)
	if err != nil {
		return nil, errors.Join(err, f.Stop())
	}
	return f, nil
}

func (f *Flux) start(ctx context.Context, bin, logPath string, metricsPort, healthPort int, args ...string) (*testenv.Process, error) {
	name := filepath.Base(bin)
	home := filepath.Join(f.dir, name+"-home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	args = append([]string{
		"--enable-leader-election=false",
		"--metrics-addr=127.0.0.1:" + strconv.Itoa(metricsPort),
		"--health-addr=127.0.0.1:" + strconv.Itoa(healthPort),
		"--log-encoding=console",
	}, args...)
	cmd := exec.Command(bin, args...)
	// No --kubeconfig flag: Flux's controllers read KUBECONFIG. HOME keeps Helm's cache
	// and config away from the user's.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+f.cp.Kubeconfig, "HOME="+home, "TMPDIR="+home)
	p, err := testenv.StartProcess(cmd, name, logPath)
	if err != nil {
		return nil, err
	}
	if err := p.WaitHealthy(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", healthPort), time.Minute); err != nil {
		return nil, errors.Join(err, p.Stop(15*time.Second))
	}
	return p, nil
}

// Stop stops both controllers. It is safe to call twice.
func (f *Flux) Stop() error {
	if f.stopped {
		return nil
	}
	f.stopped = true
	var err error
	// helm-controller first, so it does not act on a source that has gone away.
	for _, p := range []*testenv.Process{f.helm, f.source} {
		if p != nil {
			err = errors.Join(err, p.Stop(20*time.Second))
		}
	}
	return err
}

// LogTail returns the last n lines of both controllers' logs, for failure messages.
func (f *Flux) LogTail(n int) string {
	return "source-controller:\n" + testenv.Tail(f.SourceLog, n) + "\nhelm-controller:\n" + testenv.Tail(f.HelmLog, n)
}

// EnsureNamespace creates namespace ns unless it exists.
func (f *Flux) EnsureNamespace(ctx context.Context, ns string) error {
	err := f.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// HelmRepository returns a HelmRepository for a loopback HTTP chart repository (see
// servers.ChartRepo). It is not created.
func HelmRepository(ns, name, url string) *sourcev1.HelmRepository {
	return &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: sourcev1.HelmRepositorySpec{
			URL: url,
			// Tests ask for a reconcile (RequestReconcile) instead of waiting for it.
			Interval: metav1.Duration{Duration: time.Hour},
		},
	}
}

// OCIRepository returns an OCIRepository for a chart pushed to a loopback OCI registry
// (servers.ServeOCI, servers.PushOCI; url is what PushOCI returns) at ref (a tag or a
// semver range), with the layer selector a HelmRelease's chartRef needs. It is not created.
func OCIRepository(ns, name, url string, ref sourcev1.OCIRepositoryRef) *sourcev1.OCIRepository {
	return &sourcev1.OCIRepository{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: sourcev1.OCIRepositorySpec{
			URL:       url,
			Reference: &ref,
			LayerSelector: &sourcev1.OCILayerSelector{
				MediaType: "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
				Operation: sourcev1.OCILayerCopy,
			},
			// The loopback registry speaks plain HTTP.
			Insecure: true,
			Interval: metav1.Duration{Duration: time.Hour},
		},
	}
}

// HelmReleaseFromRepository returns a HelmRelease of chart at version (a version or a
// semver range) from the HelmRepository repo in the same namespace. It is not created.
func HelmReleaseFromRepository(ns, name, repo, chart, version string) *helmv2.HelmRelease {
	return &helmv2.HelmRelease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: helmv2.HelmReleaseSpec{
			Interval: metav1.Duration{Duration: time.Hour},
			Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
				Chart:    chart,
				Version:  version,
				Interval: &metav1.Duration{Duration: time.Hour},
				SourceRef: helmv2.CrossNamespaceObjectReference{
					Kind: sourcev1.HelmRepositoryKind, Name: repo,
				},
			}},
		},
	}
}

// HelmReleaseFromOCIRepository returns a HelmRelease whose chartRef is the OCIRepository
// repo in the same namespace. It is not created.
func HelmReleaseFromOCIRepository(ns, name, repo string) *helmv2.HelmRelease {
	return &helmv2.HelmRelease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: helmv2.HelmReleaseSpec{
			Interval: metav1.Duration{Duration: time.Hour},
			ChartRef: &helmv2.CrossNamespaceSourceReference{
				Kind: sourcev1.OCIRepositoryKind, Name: repo,
			},
		},
	}
}

// RequestReconcile asks Flux to reconcile obj now (what `flux reconcile` does: it sets
// the reconcile.fluxcd.io/requestedAt annotation) and returns the token it set.
func (f *Flux) RequestReconcile(ctx context.Context, obj client.Object) (string, error) {
	token := strconv.FormatInt(time.Now().UnixNano(), 10)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := f.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[meta.ReconcileRequestAnnotation] = token
		obj.SetAnnotations(ann)
		return f.Client.Update(ctx, obj)
	})
	return token, err
}

// Update re-reads obj, applies mutate and writes it back, retrying on conflicts.
func (f *Flux) Update(ctx context.Context, obj client.Object, mutate func()) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := f.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate()
		return f.Client.Update(ctx, obj)
	})
}

// WaitHelmRelease polls the HelmRelease ns/name until done says so, and returns its last
// state. On timeout the error carries the release's conditions.
func (f *Flux) WaitHelmRelease(ctx context.Context, ns, name string, timeout time.Duration, done func(*helmv2.HelmRelease) bool) (*helmv2.HelmRelease, error) {
	hr := &helmv2.HelmRelease{}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := f.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, hr); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return done(hr), nil
	})
	if err != nil {
		return hr, fmt.Errorf("HelmRelease %s/%s: %w; conditions: %s", ns, name, err, conditionsString(hr.Status.Conditions))
	}
	return hr, nil
}

// ReadyAtGeneration reports that the HelmRelease has been reconciled at its current
// generation and its Ready condition has the given status (True after a successful
// install or upgrade, False after a failed one).
func ReadyAtGeneration(status metav1.ConditionStatus) func(*helmv2.HelmRelease) bool {
	return func(hr *helmv2.HelmRelease) bool {
		c := apimeta.FindStatusCondition(hr.Status.Conditions, meta.ReadyCondition)
		return c != nil && c.Status == status && c.ObservedGeneration == hr.Generation && hr.Status.ObservedGeneration == hr.Generation
	}
}

// WaitSourceReady polls a Flux source (HelmRepository, OCIRepository, HelmChart) until
// its Ready condition is True at its generation and its artifact has a revision different
// from notRevision ("" for any), and returns that revision.
func (f *Flux) WaitSourceReady(ctx context.Context, obj client.Object, notRevision string, timeout time.Duration) (string, error) {
	var rev string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := f.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		conds, art := sourceStatus(obj)
		c := apimeta.FindStatusCondition(conds, meta.ReadyCondition)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != obj.GetGeneration() || art == "" {
			return false, nil
		}
		rev = art
		return notRevision == "" || art != notRevision, nil
	})
	if err != nil {
		conds, _ := sourceStatus(obj)
		return "", fmt.Errorf("%T %s/%s: %w; conditions: %s", obj, obj.GetNamespace(), obj.GetName(), err, conditionsString(conds))
	}
	return rev, nil
}

func sourceStatus(obj client.Object) ([]metav1.Condition, string) {
	switch o := obj.(type) {
	case *sourcev1.HelmRepository:
		if o.Status.Artifact != nil {
			return o.Status.Conditions, o.Status.Artifact.Revision
		}
		return o.Status.Conditions, ""
	case *sourcev1.OCIRepository:
		if o.Status.Artifact != nil {
			return o.Status.Conditions, o.Status.Artifact.Revision
		}
		return o.Status.Conditions, ""
	case *sourcev1.HelmChart:
		if o.Status.Artifact != nil {
			return o.Status.Conditions, o.Status.Artifact.Revision
		}
		return o.Status.Conditions, ""
	}
	return nil, ""
}

func conditionsString(conds []metav1.Condition) string {
	if len(conds) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(conds))
	for _, c := range conds {
		parts = append(parts, fmt.Sprintf("%s=%s (%s): %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

// ChartSemver drops the build metadata helm-controller appends to a chart version pulled
// through an OCIRepository ("3.2.8+7b81b0d6f1ec" -> "3.2.8").
func ChartSemver(v string) string {
	v, _, _ = strings.Cut(v, "+")
	return v
}
