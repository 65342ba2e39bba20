package argocd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// Version is the Argo CD Start runs: bin/argocd, built by
// `./hack/testbin.sh --argocd` (make test-argocd), with the CRDs and base config objects
// of the same module beside it.
const Version = "v3.6.1"

// Namespace is where Start installs Argo CD's config and AppProject, and
// where Applications live.
const Namespace = "argocd"

// InClusterServer is the destination server of Argo CD's own cluster. The controller
// runs outside the cluster with ARGOCD_FAKE_IN_CLUSTER, so this destination is the test
// control plane (its KUBECONFIG).
const InClusterServer = "https://kubernetes.default.svc"

var appProjectGVR = schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "appprojects"}

// ArgoCD is Argo CD's real repo-server and application-controller, with their own
// Redis, running as processes outside the cluster against a testenv.ControlPlane, the way
// Argo CD's own Procfile runs them for development: ARGOCD_FAKE_IN_CLUSTER makes the in-cluster
// destination (InClusterServer) the control plane of KUBECONFIG. No API server, UI, Dex
// or ApplicationSet controller runs: tests write Applications and read their status with
// the Kubernetes API, as GitOps does.
//
// There is no kubelet, so nothing an Application deploys ever runs: use charts whose
// objects need no pod (CRDs, ConfigMaps, custom resources), whose health Argo CD
// computes without one.
type ArgoCD struct {
	// Dynamic reads and writes Applications (ApplicationGVR) and every other object.
	Dynamic dynamic.Interface
	// RedisLog, RepoServerLog and ControllerLog are the processes' log files.
	RedisLog, RepoServerLog, ControllerLog string

	cp                      *testenv.ControlPlane
	dir                     string
	redis, repo, controller *testenv.Process
	stopped                 bool
}

// Options configure the Argo CD that Start runs.
type Options struct {
	// Settings are entries of the argocd-cm ConfigMap, set over those of the shipped
	// file before any component starts: "application.resourceTrackingMethod": "label"
	// (the Argo CD 2 default; v3 tracks by annotation), for example.
	Settings map[string]string
	// Resync is the application-controller's resync period (--app-resync, what argocd-cm's
	// timeout.reconciliation sets; Argo CD's default is 3 minutes plus up to a minute of
	// jitter): how often it compares an Application that nothing changed. 0 keeps an
	// hour, as tests refresh an Application by changing it; when set, there is no jitter.
	Resync time.Duration
	// PersistResourceHealth stores each resource's health in the Application's
	// status.resources (--persist-resource-health; Argo CD 2 did so by default, v3 keeps
	// it in Redis only), for tests that read what Argo CD judged of one resource.
	PersistResourceHealth bool
}

// TrackingMethodKey is the argocd-cm entry that chooses how Argo CD tells the objects of
// an Application: "annotation" (v3's default, also when unset), "label" or
// "annotation+label".
const TrackingMethodKey = "application.resourceTrackingMethod"

// Start installs Argo CD's CRDs, its base config objects and the `default`
// AppProject, starts Redis, the repo-server and the application-controller, waits until
// they are healthy, and stops them when the test ends. When the test fails, the tail of
// each log is printed. At most one Options is read.
func Start(t testing.TB, cp *testenv.ControlPlane, opts ...Options) *ArgoCD {
	t.Helper()
	a, err := StartControllers(t.Context(), cp, opts...)
	if err != nil {
		t.Fatalf("argo cd: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Argo CD logs (tail):\n%s", a.LogTail(60))
		}
		if err := a.Stop(); err != nil {
			t.Errorf("stop argo cd: %v", err)
		}
	})
	return a
}

// StartControllers is Start for callers without a testing.TB. Call Stop when
// done.
func StartControllers(ctx context.Context, cp *testenv.ControlPlane, opts ...Options) (*ArgoCD, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	bins := filepath.Join(cp.Bin, "argocd")
	if err := checkArgoCDBins(bins); err != nil {
		return nil, err
	}
	redisServer, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is missing (%w): Argo CD keeps its caches in Redis; run ./hack/argocd-deps.sh (apt-get install redis-server)", err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		return nil, fmt.Errorf("the git command is missing (%w): Argo CD's repo-server clones with it; run ./hack/argocd-deps.sh (apt-get install git)", err)
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	if err := install(ctx, cp, bins, o.Settings); err != nil {
		return nil, fmt.Errorf("install Argo CD's CRDs and config from %s: %w", bins, err)
	}
	dir, err := os.MkdirTemp(cp.Dir(), "argocd-")
	if err != nil {
		return nil, err
	}
	a := &ArgoCD{Dynamic: dyn, cp: cp, dir: dir,
		RedisLog:      filepath.Join(dir, "redis.log"),
		RepoServerLog: filepath.Join(dir, "repo-server.log"),
		ControllerLog: filepath.Join(dir, "application-controller.log"),
	}
	ports, err := testenv.FreePorts(5)
	if err != nil {
		return nil, fmt.Errorf("argo cd: find free ports: %w", err)
	}
	redisAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	if a.redis, err = a.startRedis(ctx, redisServer, ports[0]); err != nil {
		return nil, errors.Join(err, a.Stop())
	}
	repoAddr := "127.0.0.1:" + strconv.Itoa(ports[1])
	a.repo, err = a.start(ctx, "argocd-repo-server", a.RepoServerLog, ports[2],
		"--address=127.0.0.1", "--port="+strconv.Itoa(ports[1]),
		"--metrics-address=127.0.0.1", "--metrics-port="+strconv.Itoa(ports[2]),
		// Plain gRPC on loopback; the client CA path defaults to one under /app, which
		// --disable-tls refuses.
		"--redis="+redisAddr, "--disable-tls", "--client-ca-path=")
	if err != nil {
		return nil, errors.Join(err, a.Stop())
	}
	// Tests refresh an Application by changing it; no periodic resync in between, unless
	// asked for.
	resync, jitter := "--app-resync=3600", "--app-resync-jitter=60"
	if o.Resync > 0 {
		resync, jitter = "--app-resync="+strconv.Itoa(int(o.Resync.Seconds())), "--app-resync-jitter=0"
	}
	args := []string{"--kubeconfig=" + cp.Kubeconfig, "--namespace=" + Namespace,
		"--metrics-port=" + strconv.Itoa(ports[3]),
		"--redis=" + redisAddr, "--repo-server=" + repoAddr, "--repo-server-plaintext",
		"--commit-server=127.0.0.1:" + strconv.Itoa(ports[4]),
		resync, jitter, "--app-hard-resync=0"}
	if o.PersistResourceHealth {
		args = append(args, "--persist-resource-health")
	}
	a.controller, err = a.start(ctx, "argocd-application-controller", a.ControllerLog, ports[3], args...)
	if err != nil {
		return nil, errors.Join(err, a.Stop())
	}
	return a, nil
}

func checkArgoCDBins(bins string) error {
	for _, f := range []string{"argocd", "git-verify-wrapper.sh", "manifests/crds/application-crd.yaml", "manifests/config/argocd-cm.yaml"} {
		if _, err := os.Stat(filepath.Join(bins, f)); err != nil {
			return fmt.Errorf("%s/%s is missing: run ./hack/testbin.sh --argocd (make test-argocd) first", bins, f)
		}
	}
	return nil
}

// install applies Argo CD's CRDs and base config objects as shipped in its module
// (bin/argocd/manifests), with settings set in argocd-cm, and creates the `default`
// AppProject Argo CD's install creates: every source, destination and kind allowed.
func install(ctx context.Context, cp *testenv.ControlPlane, bins string, settings map[string]string) error {
	if err := applyCRDs(ctx, cp, bins); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	configs, err := filepath.Glob(filepath.Join(bins, "manifests", "config", "argocd-*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range configs {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		obj.SetNamespace(Namespace)
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
		if obj.GetKind() == "Secret" {
			gvr.Resource = "secrets"
		}
		if obj.GetKind() == "ConfigMap" && obj.GetName() == "argocd-cm" && len(settings) > 0 {
			for k, v := range settings {
				if err := unstructured.SetNestedField(obj.Object, v, "data", k); err != nil {
					return fmt.Errorf("%s: set %s: %w", f, k, err)
				}
			}
			// The settings must hold from the components' start: replace what an
			// earlier start left.
			err := dyn.Resource(gvr).Namespace(Namespace).Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: %w", f, err)
			}
		}
		_, err = dyn.Resource(gvr).Namespace(Namespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	project := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1",
		"kind":       "AppProject",
		"metadata":   map[string]any{"name": "default", "namespace": Namespace},
		"spec": map[string]any{
			"sourceRepos":              []any{"*"},
			"destinations":             []any{map[string]any{"server": "*", "namespace": "*"}},
			"clusterResourceWhitelist": []any{map[string]any{"group": "*", "kind": "*"}},
		},
	}}
	_, err = dyn.Resource(appProjectGVR).Namespace(Namespace).Create(ctx, project, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ApplyCRDs installs Argo CD's CRDs (those Start installs) and waits until
// they are established, without starting Argo CD: a controller that looks up at its start
// whether the API server serves Argo CD's kinds (upgradeguard's manager does) sees them.
func ApplyCRDs(ctx context.Context, cp *testenv.ControlPlane) error {
	bins := filepath.Join(cp.Bin, "argocd")
	if err := checkArgoCDBins(bins); err != nil {
		return err
	}
	return applyCRDs(ctx, cp, bins)
}

func applyCRDs(ctx context.Context, cp *testenv.ControlPlane, bins string) error {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	crds, err := filepath.Glob(filepath.Join(bins, "manifests", "crds", "*-crd.yaml"))
	if err != nil {
		return err
	}
	for _, f := range crds {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		parsed, err := crdversions.FromManifest(f, data)
		if err != nil {
			return err
		}
		for _, crd := range parsed {
			if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
				return fmt.Errorf("%s: %w", crd.Name, err)
			}
			if err := testenv.WaitEstablished(ctx, cs, crd.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// startRedis runs redis-server on port with its own directory and no persistence.
func (a *ArgoCD) startRedis(ctx context.Context, bin string, port int) (*testenv.Process, error) {
	dir := filepath.Join(a.dir, "redis")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "")
	p, err := testenv.StartProcess(cmd, "redis-server", a.RedisLog)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, fmt.Errorf("redis-server exited during start-up (%w)", p.Err())
		default:
		}
		return redisPing(ctx, addr) == nil, nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("redis-server not answering PING at %s: %w:\n%s", addr, err, testenv.Tail(a.RedisLog, 20)), p.Stop(5*time.Second))
	}
	return p, nil
}

// redisPing sends Redis's inline PING and expects +PONG.
func redisPing(ctx context.Context, addr string) error {
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("redis answered %q", line)
	}
	return nil
}

// start runs one Argo CD component (the busybox binary picks it by ARGOCD_BINARY_NAME)
// and waits until its /healthz on healthPort answers.
func (a *ArgoCD) start(ctx context.Context, name, logPath string, healthPort int, args ...string) (*testenv.Process, error) {
	home := filepath.Join(a.dir, name+"-home")
	for _, d := range []string{"tmp", "tls", "ssh", "gpg", "plugins"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o700); err != nil {
			return nil, err
		}
	}
	bins := filepath.Join(a.cp.Bin, "argocd")
	cmd := exec.Command(filepath.Join(bins, "argocd"), append([]string{"--loglevel=info", "--logformat=text"}, args...)...)
	cmd.Env = append(os.Environ(),
		"ARGOCD_BINARY_NAME="+name,
		"ARGOCD_FAKE_IN_CLUSTER=true",
		"KUBECONFIG="+a.cp.Kubeconfig,
		// The repo-server runs helm (bin/helm, the Helm 4 Argo CD v3.6 pins) and the git
		// wrapper of its module from PATH.
		"PATH="+bins+string(os.PathListSeparator)+a.cp.Bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		// Everything Argo CD would write under /app, /tmp or HOME stays in the test's
		// directory: the repo-server clones into $TMPDIR/_argocd-repo.
		"HOME="+home,
		"TMPDIR="+filepath.Join(home, "tmp"),
		"ARGOCD_TLS_DATA_PATH="+filepath.Join(home, "tls"),
		"ARGOCD_SSH_DATA_PATH="+filepath.Join(home, "ssh"),
		"ARGOCD_GNUPGHOME="+filepath.Join(home, "gpg"),
		"ARGOCD_GPG_ENABLED=false",
		"ARGOCD_PLUGINSOCKFILEPATH="+filepath.Join(home, "plugins"),
		"ARGOCD_ASK_PASS_SOCK="+filepath.Join(home, "askpass.sock"),
		"HELM_CACHE_HOME="+filepath.Join(home, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "helm", "data"),
	)
	p, err := testenv.StartProcess(cmd, name, logPath)
	if err != nil {
		return nil, err
	}
	if err := p.WaitHealthy(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", healthPort), 2*time.Minute); err != nil {
		return nil, errors.Join(err, p.Stop(15*time.Second))
	}
	return p, nil
}

// Stop stops the controller, the repo-server and Redis. It is safe to call twice.
func (a *ArgoCD) Stop() error {
	if a.stopped {
		return nil
	}
	a.stopped = true
	var err error
	for _, p := range []*testenv.Process{a.controller, a.repo, a.redis} {
		if p != nil {
			err = errors.Join(err, p.Stop(20*time.Second))
		}
	}
	return err
}

// LogTail returns the last n lines of each component's log, for failure messages.
func (a *ArgoCD) LogTail(n int) string {
	return "argocd-application-controller:\n" + testenv.Tail(a.ControllerLog, n) +
		"\nargocd-repo-server:\n" + testenv.Tail(a.RepoServerLog, n) +
		"\nredis-server:\n" + testenv.Tail(a.RedisLog, 5)
}

// ApplicationSource is an Application's spec.source: a chart in a git repository (Path)
// or a chart of a Helm repository (Chart).
type ApplicationSource struct {
	RepoURL        string
	Path           string // a chart directory in a git repository
	Chart          string // a chart name in a Helm repository
	TargetRevision string // a git revision, or a chart version
}

// GitSource is the chart at path in the git repository at dir (a file:// URL, which the
// repo-server clones with the git command) at revision.
func GitSource(dir, path, revision string) ApplicationSource {
	return ApplicationSource{RepoURL: "file://" + dir, Path: path, TargetRevision: revision}
}

// HelmRepoSource is chart at version from the Helm chart repository at url
// (servers.ServeRepo, servers.NewChartRepo).
func HelmRepoSource(url, chart, version string) ApplicationSource {
	return ApplicationSource{RepoURL: url, Chart: chart, TargetRevision: version}
}

func (s ApplicationSource) object() map[string]any {
	out := map[string]any{"repoURL": s.RepoURL, "targetRevision": s.TargetRevision}
	if s.Path != "" {
		out["path"] = s.Path
	}
	if s.Chart != "" {
		out["chart"] = s.Chart
	}
	return out
}

// SyncRetry is an Application's spec.syncPolicy.retry: Limit attempts after the first,
// waiting Backoff, then Backoff*Factor each time, up to MaxBackoff.
type SyncRetry struct {
	Limit               int64
	Backoff, MaxBackoff time.Duration
	Factor              int64
}

// AutomatedApplication returns an Application (not created) in Namespace that
// deploys source into namespace destNS of the in-cluster destination, with automated
// sync (no prune, no self-heal: Argo CD's defaults), CreateNamespace, and retry.
func AutomatedApplication(name string, source ApplicationSource, destNS string, r SyncRetry) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1",
		"kind":       "Application",
		"metadata":   map[string]any{"name": name, "namespace": Namespace},
		"spec": map[string]any{
			"project":     "default",
			"source":      source.object(),
			"destination": map[string]any{"server": InClusterServer, "namespace": destNS},
			"syncPolicy": map[string]any{
				"automated":   map[string]any{},
				"syncOptions": []any{"CreateNamespace=true"},
				"retry": map[string]any{
					"limit": r.Limit,
					"backoff": map[string]any{
						"duration":    r.Backoff.String(),
						"factor":      r.Factor,
						"maxDuration": r.MaxBackoff.String(),
					},
				},
			},
		},
	}}
}

// CompareOptionsAnnotation is the Application annotation of Argo CD's compare options.
const CompareOptionsAnnotation = "argocd.argoproj.io/compare-options"

// RefreshAnnotation asks Argo CD's controller to compare an Application now ("normal" or
// "hard"); the controller removes it once it has.
const RefreshAnnotation = "argocd.argoproj.io/refresh"

// ServerSideApplyAndDiff sets an Application (not created) to sync with server-side apply
// (syncOptions ServerSideApply=true) and to compare by Argo CD's server-side diff, a
// server-side dry-run apply of each object (the compare-options annotation
// ServerSideDiff=true): what many Argo CD users set together.
func ServerSideApplyAndDiff(app *unstructured.Unstructured) {
	opts, _, _ := unstructured.NestedSlice(app.Object, "spec", "syncPolicy", "syncOptions")
	_ = unstructured.SetNestedSlice(app.Object, append(opts, "ServerSideApply=true"), "spec", "syncPolicy", "syncOptions")
	ann := app.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[CompareOptionsAnnotation] = "ServerSideDiff=true"
	app.SetAnnotations(ann)
}

// Refresh asks Argo CD to compare the Application name again now, as `argocd app get
// --refresh` does: the refresh annotation, "normal".
func (a *ArgoCD) Refresh(ctx context.Context, name string) error {
	return a.updateApplication(ctx, name, func(app *unstructured.Unstructured) error {
		ann := app.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[RefreshAnnotation] = "normal"
		app.SetAnnotations(ann)
		return nil
	})
}

// Create creates the Application.
func (a *ArgoCD) Create(ctx context.Context, app *unstructured.Unstructured) error {
	_, err := a.Dynamic.Resource(ApplicationGVR).Namespace(app.GetNamespace()).Create(ctx, app, metav1.CreateOptions{})
	return err
}

// SetTargetRevision points the Application's source at revision (a commit, or a chart
// version): what a GitOps change of the Application does. The controller refreshes on
// the change, and automated sync follows.
func (a *ArgoCD) SetTargetRevision(ctx context.Context, name, revision string) error {
	return a.updateApplication(ctx, name, func(app *unstructured.Unstructured) error {
		return unstructured.SetNestedField(app.Object, revision, "spec", "source", "targetRevision")
	})
}

// Get reads the Application name.
func (a *ArgoCD) Get(ctx context.Context, name string) (*Application, error) {
	obj, err := a.Dynamic.Resource(ApplicationGVR).Namespace(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return applicationOf(obj)
}

// WaitApplication watches the Application name until done says so and returns its last
// state. It watches (rather than polls) from the resourceVersion it first reads, so it
// sees every status Argo CD writes: a retrying operation passes through states shorter
// than any poll interval. On timeout the error carries the last status.
func (a *ArgoCD) WaitApplication(ctx context.Context, name string, timeout time.Duration, done func(*Application) bool) (*Application, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ri := a.Dynamic.Resource(ApplicationGVR).Namespace(Namespace)
	var last *Application
	for {
		obj, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return last, fmt.Errorf("Application %s/%s: %w", Namespace, name, err)
		}
		if last, err = applicationOf(obj); err != nil {
			return last, err
		}
		if done(last) {
			return last, nil
		}
		w, err := ri.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: obj.GetResourceVersion()})
		if err != nil {
			return last, fmt.Errorf("watch Application %s/%s: %w; last: %s", Namespace, name, err, last)
		}
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				break // an error event (a compacted resourceVersion): read again
			}
			if last, err = applicationOf(u); err != nil {
				w.Stop()
				return last, err
			}
			if done(last) {
				w.Stop()
				return last, nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return last, fmt.Errorf("Application %s/%s: %w; last: %s", Namespace, name, ctx.Err(), last)
		}
	}
}

// Delete deletes the Application without cascading to what it deployed (Argo CD
// cascades only with its resources finalizer, which AutomatedApplication does not set).
func (a *ArgoCD) Delete(ctx context.Context, name string) error {
	err := a.Dynamic.Resource(ApplicationGVR).Namespace(Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// DisableAutomatedSync turns the Application's automated sync off (`argocd app set NAME
// --sync-policy none`): spec.syncPolicy.automated goes, its retry and sync options stay.
// Argo CD refuses a rollback while automated sync is on.
func (a *ArgoCD) DisableAutomatedSync(ctx context.Context, name string) error {
	return a.updateApplication(ctx, name, func(app *unstructured.Unstructured) error {
		unstructured.RemoveNestedField(app.Object, "spec", "syncPolicy", "automated")
		return nil
	})
}

// Rollback starts the rollback of the Application name to its history entry id as
// `argocd app rollback NAME ID` does (Argo CD v3.6's API server, Rollback in
// server/application): refused while automated sync is on or another operation runs, it
// sets operation.sync to the entry's revision and source, with the Application's sync
// options, the apply strategy and no retry, and clears status.operationState. The
// Application's spec is left as it is, so it reads OutOfSync afterwards.
func (a *ArgoCD) Rollback(ctx context.Context, name string, id int64) error {
	return a.updateApplication(ctx, name, func(obj *unstructured.Unstructured) error {
		if _, on, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "syncPolicy", "automated"); on {
			return errors.New("rollback cannot be initiated when auto-sync is enabled")
		}
		if _, running, _ := unstructured.NestedFieldNoCopy(obj.Object, "operation"); running {
			return errors.New("another operation is already in progress")
		}
		app, err := applicationOf(obj)
		if err != nil {
			return err
		}
		var entry *HistoryEntry
		for i := range app.Status.History {
			if app.Status.History[i].ID == id {
				entry = &app.Status.History[i]
			}
		}
		if entry == nil {
			return fmt.Errorf("application %s does not have deployment with id %d", name, id)
		}
		sync := map[string]any{"revision": entry.Revision, "source": entry.Source, "syncStrategy": map[string]any{"apply": map[string]any{}}}
		if opts, found, _ := unstructured.NestedSlice(obj.Object, "spec", "syncPolicy", "syncOptions"); found {
			sync["syncOptions"] = opts
		}
		obj.Object["operation"] = map[string]any{"sync": sync, "initiatedBy": map[string]any{"username": "admin"}}
		unstructured.RemoveNestedField(obj.Object, "status", "operationState")
		return nil
	})
}

// Sync starts a sync of the Application name at its target revision as `argocd app sync
// NAME` does (`--prune` when prune; Argo CD v3.6's API server, Sync in
// server/application): refused while another operation runs, it sets operation.sync with
// the Application's source, sync options and retry, and clears status.operationState.
// Automated sync need not be off.
func (a *ArgoCD) Sync(ctx context.Context, name string, prune bool) error {
	return a.updateApplication(ctx, name, func(obj *unstructured.Unstructured) error {
		if _, running, _ := unstructured.NestedFieldNoCopy(obj.Object, "operation"); running {
			return errors.New("another operation is already in progress")
		}
		source, found, err := unstructured.NestedMap(obj.Object, "spec", "source")
		if err != nil {
			return fmt.Errorf("spec.source: %w", err)
		}
		if !found {
			return errors.New("no spec.source")
		}
		sync := map[string]any{"revision": source["targetRevision"], "source": source, "prune": prune}
		if opts, found, _ := unstructured.NestedSlice(obj.Object, "spec", "syncPolicy", "syncOptions"); found {
			sync["syncOptions"] = opts
		}
		op := map[string]any{"sync": sync, "initiatedBy": map[string]any{"username": "admin"}}
		if r, found, _ := unstructured.NestedMap(obj.Object, "spec", "syncPolicy", "retry"); found {
			op["retry"] = r
		}
		obj.Object["operation"] = op
		unstructured.RemoveNestedField(obj.Object, "status", "operationState")
		return nil
	})
}

// updateApplication reads the Application name, changes it and writes it back, again on
// a conflict (Argo CD writes its status into the same object).
func (a *ArgoCD) updateApplication(ctx context.Context, name string, change func(*unstructured.Unstructured) error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ri := a.Dynamic.Resource(ApplicationGVR).Namespace(Namespace)
		app, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := change(app); err != nil {
			return fmt.Errorf("Application %s/%s: %w", Namespace, name, err)
		}
		_, err = ri.Update(ctx, app, metav1.UpdateOptions{})
		return err
	})
}
