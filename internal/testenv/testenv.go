// Package testenv starts and stops the real control plane for integration tests, the demo
// and the benchmarks: kube-apiserver and etcd from bin/kube/MINOR (built by `make
// testbin`; the minors are kube-versions), and kube-controller-manager when a scenario
// asks for it (StartControllerManager). It is the one place that knows how the control
// plane is found and wired. Start runs one control plane; StartFleet runs several API
// servers on one etcd. Besides it holds what needs only a control plane: users, tokens
// and RBAC grants (AddUser, Grant), the audit log, etcd reads (StoredVersions), CRD and
// object helpers and fixtures (crds.go, objects.go, kro.go, lws.go), the Helm CLI against
// the control plane (Helm, Helm3), charts written to disk (WriteChart, Package), and the
// helpers the harnesses below share (Process, FreePorts, Tail).
//
// Stop (ForTest and RunTests call it) stops kube-controller-manager, kube-apiserver and
// etcd and removes the control plane's directory (upgradeguard-cp-* in the temporary
// directory, Dir): its certificates, kubeconfigs, audit log, Helm home, and the files of
// any harness that kept them there. If the test binary is killed, every process dies with
// it (internal/childproc ties them), but that directory stays.
//
// Each system that runs beside a control plane has a package of its own, which takes
// the control plane as an argument and imports this one (never the reverse):
//
//   - internal/testenv/node: a real node (containerd, kubelet, kube-proxy, scheduler);
//   - internal/testenv/flux: Flux's real source-controller and helm-controller;
//   - internal/testenv/argocd: Argo CD's real repo-server and application-controller, and
//     the one Application definition the tests share;
//   - internal/testenv/servers: chart repositories, an OCI registry and git repositories.
package testenv

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
)

// ControlPlane is a running kube-apiserver with its etcd.
type ControlPlane struct {
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for the same admin user, for the Helm
	// CLI and upgradeguard.
	Kubeconfig string
	// Bin is bin/ at the repository root: helm, helm3 and flux/.
	Bin string
	// KubeBin holds this control plane's kube-apiserver, kube-controller-manager, kubectl
	// and etcd: bin/kube/MINOR for the minor KubeMinor names.
	KubeBin string
	// Minor is the Kubernetes minor version running (32 for 1.32), for tests that assert a
	// version's own behaviour.
	Minor int
	// AuditLog is the API server's audit log (JSON lines) when started with Audit.
	AuditLog string
	// Webhooks is envtest's webhook installation when started with Options.Webhooks:
	// the local host, port and certificate directory a webhook server must serve on.
	Webhooks *envtest.WebhookInstallOptions

	env    *envtest.Environment
	dir    string
	tokens map[string]string
	kcm    *controllerManager
	node   bool // started with Options.Node
	// releases free the threads that started envtest's processes (childproc.Hold), once
	// those have stopped.
	releases []func()
}

// hold runs start, which starts envtest's processes, through childproc.Hold.
func (cp *ControlPlane) hold(start func() error) error {
	release, err := childproc.Hold(start)
	cp.releases = append(cp.releases, release)
	return err
}

// release frees the threads hold kept, after the processes have stopped.
func (cp *ControlPlane) release() {
	for _, r := range cp.releases {
		r()
	}
	cp.releases = nil
}

// tiedBinaries points envtest at kube-apiserver and etcd from kubeBin through
// childproc.TiedPath links in dir, so that they die with this process (envtest builds
// their exec.Cmd itself and offers no way to set SysProcAttr.Pdeathsig).
func tiedBinaries(dir, kubeBin string) (apiserver, etcd string, err error) {
	tied := filepath.Join(dir, "tied")
	if err := os.MkdirAll(tied, 0o700); err != nil {
		return "", "", err
	}
	if apiserver, err = childproc.TiedPath(tied, filepath.Join(kubeBin, "kube-apiserver")); err != nil {
		return "", "", err
	}
	etcd, err = childproc.TiedPath(tied, filepath.Join(kubeBin, "etcd"))
	return apiserver, etcd, err
}

// TokenConfig returns a client config that authenticates as user with its bearer token
// (see Options.Tokens).
func (cp *ControlPlane) TokenConfig(user string) *rest.Config {
	return &rest.Config{
		Host:            cp.Config.Host,
		BearerToken:     cp.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.Config.CAData},
		WarningHandler:  rest.NoWarnings{},
	}
}

// Options tune the control plane.
type Options struct {
	// Audit records every request in an audit log (see ControlPlane.AuditLog), so tests
	// can prove which verbs a command sent.
	Audit bool
	// Tokens are bearer tokens the API server accepts (user name -> token), for tests
	// that authenticate the way a ServiceAccount or CI job does.
	Tokens map[string]string
	// Webhooks installs admission webhook configurations (Paths or objects) pointing at
	// a local serving port with generated certificates (see ControlPlane.Webhooks).
	Webhooks *envtest.WebhookInstallOptions
	// ControllerManager also runs the real kube-controller-manager (built by
	// `./hack/testbin.sh --with-kcm`), for scenarios that need PV/PVC binding, garbage
	// collection or namespace cleanup. See StartControllerManager.
	ControllerManager bool
	// Controllers overrides DefaultControllers when ControllerManager is set.
	Controllers []string
	// Node prepares the control plane for a real node (node.Start): kube-apiserver serves
	// on every address with a certificate for the host's address and the `kubernetes`
	// Service IP, and admits Pods with their ServiceAccount token. node.Start runs
	// kube-controller-manager itself: leave ControllerManager unset.
	Node bool
	// RuntimeConfig enables API versions the minor serves only when asked
	// (kube-apiserver --runtime-config), e.g. "storagemigration.k8s.io/v1beta1=true".
	RuntimeConfig []string
}

// Start starts a control plane of the Kubernetes minor KubeMinor names. The binaries come
// from bin/ at the repository root, or from $UPGRADEGUARD_TESTBIN when set.
func Start(opts ...Options) (*ControlPlane, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	minor, kubeBin, err := KubeBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "upgradeguard-cp-")
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    kubeBin,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cp := &ControlPlane{Bin: bin, KubeBin: kubeBin, Minor: minor, env: env, dir: dir}
	// A fixed certificate directory keeps the serving certificate across RestartAPIServer.
	api := env.ControlPlane.GetAPIServer()
	etcd := &envtest.Etcd{}
	env.ControlPlane.Etcd = etcd
	if api.Path, etcd.Path, err = tiedBinaries(dir, kubeBin); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	api.CertDir = filepath.Join(dir, "apiserver")
	// Stopping kube-apiserver otherwise waits up to its request timeout (60 s, as long as
	// envtest's stop timeout) for clients' watches to end: kube-controller-manager's never
	// do. With this flag it drains the requests in flight, answering new ones with 429
	// and Retry-After, and then gives the watches 2 s, as a rolling control plane does.
	api.Configure().Set("shutdown-send-retry-after", "true")
	if err := os.MkdirAll(api.CertDir, 0o700); err != nil {
		return nil, err
	}
	if o.Audit {
		policy := filepath.Join(dir, "audit-policy.yaml")
		rule := "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"
		if err := os.WriteFile(policy, []byte(rule), 0o600); err != nil {
			return nil, err
		}
		cp.AuditLog = filepath.Join(dir, "audit.log")
		env.ControlPlane.GetAPIServer().Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", cp.AuditLog).
			Set("audit-log-mode", "blocking")
	}
	if o.Node {
		if err := servingForNode(api); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		cp.node = true
	}
	if len(o.Tokens) > 0 {
		var csv strings.Builder
		for user, token := range o.Tokens {
			fmt.Fprintf(&csv, "%s,%s,%s\n", token, user, user)
		}
		path := filepath.Join(dir, "tokens.csv")
		if err := os.WriteFile(path, []byte(csv.String()), 0o600); err != nil {
			return nil, err
		}
		env.ControlPlane.GetAPIServer().Configure().Set("token-auth-file", path)
		cp.tokens = o.Tokens
	}
	if len(o.RuntimeConfig) > 0 {
		api.Configure().Set("runtime-config", strings.Join(o.RuntimeConfig, ","))
	}
	if o.Webhooks != nil {
		env.WebhookInstallOptions = *o.Webhooks
		cp.Webhooks = &env.WebhookInstallOptions
	}
	var cfg *rest.Config
	if err := cp.hold(func() (err error) { cfg, err = env.Start(); return err }); err != nil {
		_ = env.Stop()
		cp.release()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start control plane from %s: %w", kubeBin, err)
	}
	cfg.WarningHandler = rest.NoWarnings{}
	cp.Config = cfg
	if err := cp.writeKubeconfig(); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	if o.ControllerManager {
		if err := cp.StartControllerManager(o.Controllers...); err != nil {
			_ = cp.Stop()
			return nil, err
		}
	}
	return cp, nil
}

// ForTest starts a control plane for one test (or package) and stops it at cleanup.
func ForTest(t testing.TB, opts ...Options) *ControlPlane {
	t.Helper()
	cp, err := Start(opts...)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

// Stop stops the control plane and removes its files.
func (cp *ControlPlane) Stop() error {
	err := errors.Join(cp.StopControllerManager(), cp.env.Stop())
	cp.release()
	if cp.dir != "" {
		err = errors.Join(err, os.RemoveAll(cp.dir))
	}
	return err
}

// Dir is the control plane's own directory, which Stop removes: harnesses that run beside
// it (Flux, Argo CD) keep their files and logs there.
func (cp *ControlPlane) Dir() string { return cp.dir }

// ServesNode reports whether the control plane was started with Options.Node, so that a
// real node (internal/testenv/node) can join it.
func (cp *ControlPlane) ServesNode() bool { return cp.node }

// StopAPIServer stops kube-apiserver (etcd keeps running), as in a control-plane
// restart or an outage. StartAPIServer brings it back on the same address and
// certificates; users and tokens stay valid.
func (cp *ControlPlane) StopAPIServer() error { return cp.env.ControlPlane.APIServer.Stop() }

// StartAPIServer starts kube-apiserver again after StopAPIServer.
func (cp *ControlPlane) StartAPIServer() error { return cp.hold(cp.env.ControlPlane.APIServer.Start) }

// AddUser creates a user authenticated by client certificate, in the given groups, and
// returns its client config. RBAC decides what it may do.
func (cp *ControlPlane) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := cp.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// UserKubeconfig writes a kubeconfig for a user created with the given name and groups.
func (cp *ControlPlane) UserKubeconfig(name string, groups ...string) (string, error) {
	u, err := cp.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return "", err
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(cp.dir, name+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

func (cp *ControlPlane) writeKubeconfig() error {
	path, err := cp.UserKubeconfig("admin", "system:masters")
	if err != nil {
		return fmt.Errorf("write admin kubeconfig: %w", err)
	}
	cp.Kubeconfig = path
	return nil
}

// Helm returns a command running the real Helm CLI against this control plane, with its
// own cache and config so that it never touches the user's.
func (cp *ControlPlane) Helm(args ...string) *exec.Cmd { return cp.helmCLI("helm", args) }

// helmCLI runs bin/NAME (a Helm CLI) with the control plane's kubeconfig and Helm home.
func (cp *ControlPlane) helmCLI(name string, args []string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(cp.Bin, name), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	childproc.Tie(cmd) // killed with the test binary, e.g. on its timeout
	home := filepath.Join(cp.dir, "helm")
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	return cmd
}

// kubeVersions is the one list of Kubernetes minors and versions the tests, hack/testbin.sh
// and the Makefile share.
//
//go:embed kube-versions
var kubeVersions string

// Minors are the Kubernetes minors `make testbin --kube all` builds and `make test-matrix`
// runs.
var Minors = kubeMinors()

// DefaultMinor is the Kubernetes minor the tests and the demo run on unless
// $UPGRADEGUARD_KUBE_VERSION names another: the newest at a GA version.
var DefaultMinor = kubeDefault()

func kubeMinors() []string { m, _ := parseKubeVersions(kubeVersions); return m }
func kubeDefault() string  { _, d := parseKubeVersions(kubeVersions); return d }

func parseKubeVersions(s string) (minors []string, def string) {
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		minors = append(minors, f[0])
		if !strings.Contains(f[1], "-") {
			def = f[0]
		}
	}
	return minors, def
}

// KubeMinor is the Kubernetes minor to run: $UPGRADEGUARD_KUBE_VERSION ("1.32", or "v1.32.13"
// reduced to its minor), else DefaultMinor.
func KubeMinor() (string, error) {
	v := strings.TrimPrefix(os.Getenv("UPGRADEGUARD_KUBE_VERSION"), "v")
	if v == "" {
		return DefaultMinor, nil
	}
	if parts := strings.Split(v, "."); len(parts) >= 2 {
		v = parts[0] + "." + parts[1]
	}
	if !slices.Contains(Minors, v) {
		return "", fmt.Errorf("UPGRADEGUARD_KUBE_VERSION=%s is not a tested Kubernetes minor: use one of %s", os.Getenv("UPGRADEGUARD_KUBE_VERSION"), strings.Join(Minors, ", "))
	}
	return v, nil
}

// BinDir finds bin/ (Helm, Flux, and the control planes under kube/).
func BinDir() (string, error) {
	if d := os.Getenv("UPGRADEGUARD_TESTBIN"); d != "" {
		return d, CheckBins(d, "helm")
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	d := filepath.Join(root, "bin")
	return d, CheckBins(d, "helm")
}

// KubeBinDir finds the control plane of KubeMinor: its minor number and bin/kube/MINOR.
func KubeBinDir() (int, string, error) {
	v, err := KubeMinor()
	if err != nil {
		return 0, "", err
	}
	bin, err := BinDir()
	if err != nil {
		return 0, "", err
	}
	minor, _ := strconv.Atoi(strings.TrimPrefix(v, "1."))
	d := filepath.Join(bin, "kube", v)
	if err := CheckBins(d, "kube-apiserver", "etcd"); err != nil {
		if v != DefaultMinor {
			return 0, "", fmt.Errorf("%w (for Kubernetes %s: ./hack/testbin.sh --kube %s)", err, v, v)
		}
		return 0, "", err
	}
	return minor, d, nil
}

// CheckBins fails, naming the make target, when one of the named files is missing from dir.
func CheckBins(dir string, names ...string) error {
	for _, b := range names {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("%s/%s is missing: run `make testbin` first", dir, b)
		}
	}
	return nil
}

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "cmd", "upgradeguard")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the upgradeguard repository root (no go.mod with cmd/upgradeguard above the working directory)")
		}
		dir = parent
	}
}

// Fixtures returns the fixtures directory: $UPGRADEGUARD_FIXTURES, or test/fixtures in
// the repository (real upstream CRDs and charts, checked against their SHA256SUMS).
func Fixtures() (string, error) {
	if d := os.Getenv("UPGRADEGUARD_FIXTURES"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "test", "fixtures"), nil
}

// RunTests is a test package's TestMain: unless -short, it starts one control plane for
// the package into *cp, runs the tests and stops it. node.RunTests is RunTests for a
// package whose tests run a real node.
func RunTests(m *testing.M, cp **ControlPlane, opts ...Options) int {
	return RunTestsWith(m, cp, nil, opts...)
}

// RunTestsWith is RunTests with a check of what the package's tests need besides the
// control plane (a sub-package's harness): run once the control plane has started, a
// non-nil error is printed and the package stops at once (exit 2), before any test.
func RunTestsWith(m *testing.M, cp **ControlPlane, ready func(*ControlPlane) error, opts ...Options) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	var err error
	if *cp, err = Start(opts...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if slices.ContainsFunc(opts, func(o Options) bool { return o.Node }) {
			fmt.Fprintln(os.Stderr, "A real node's tests need more than `make testbin`: `make e2e` (or `make e2e-ci`) installs and builds all of it.")
		}
		return 2
	}
	if ready != nil {
		if err := ready(*cp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			_ = (*cp).Stop()
			return 2
		}
	}
	code := m.Run()
	if err := (*cp).Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}
