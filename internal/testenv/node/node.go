package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// podSubnet is the test node's Pod network, on a bridge of its own.
const podSubnet = "10.244.0.0/24"

// Deps are the host's packages a node needs, as hack/node-deps.sh installs them:
// executables on $PATH, and the CNI plugins in cniBinDir.
var Deps = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "conntrack", "ip"}

const cniBinDir = "/usr/lib/cni"

// Options configure Start.
type Options struct {
	// Images are image archives (`docker save` tarballs or OCI archives, as `make image`
	// writes) to import: the node pulls nothing, so Pods use imagePullPolicy Never or
	// IfNotPresent with one of these.
	Images []string
}

// Node is a real Kubernetes node for the tests: containerd, runc and the CNI plugins of
// the host (hack/node-deps.sh), and the control plane minor's kubelet, kube-proxy and
// kube-scheduler, registered to a control plane started with testenv.Options.Node. It runs Pods as
// a cluster does: scheduled, on a bridge network, with ServiceAccount tokens, Service IPs
// (kube-proxy's iptables rules) and probes.
type Node struct {
	// Name is the Node object's name.
	Name string
	// IP is the node's address (testenv.HostIP).
	IP string
	// Containerd is the CRI socket, for `ctr --address`.
	Containerd string

	cp     *testenv.ControlPlane
	dir    string
	bridge string
	procs  []*nodeProc // in start order; stopped in reverse
	reaper *reaper     // cleans up if the test binary dies before Stop
}

// nodeProc is one daemon of a node.
type nodeProc struct {
	name string
	proc *childproc.Process
	log  string
}

// Start starts a node on the control plane cp, which must run with testenv.Options.Node
// (RunTests starts it so), and stops and cleans it up when the test ends: its
// containers, mounts, iptables rules and bridge included. It needs root and the packages hack/node-deps.sh installs, and fails
// naming what is missing.
func Start(t testing.TB, cp *testenv.ControlPlane, opts Options) *Node {
	t.Helper()
	n, err := start(t.Context(), cp, opts)
	if n != nil {
		t.Cleanup(func() {
			if err := n.Stop(); err != nil {
				t.Errorf("stop node: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	return n
}

// Missing says what this machine lacks to run a node on cp, or "" when nothing.
func Missing(cp *testenv.ControlPlane) string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (containerd and the kubelet run as root)")
	}
	for _, name := range Deps {
		if _, err := exec.LookPath(name); err != nil {
			missing = append(missing, name)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, "the CNI plugin "+p)
		}
	}
	var bins []string
	for _, b := range []string{"kubelet", "kube-proxy", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(cp.KubeBin, b)); err != nil {
			bins = append(bins, b)
		}
	}
	msg := ""
	if len(missing) > 0 {
		msg = "missing " + strings.Join(missing, ", ") + ": run `sudo hack/node-deps.sh` (apt-get install containerd runc containernetworking-plugins iptables conntrack)"
	}
	if len(bins) > 0 {
		msg = strings.TrimPrefix(msg+"; ", "; ") + fmt.Sprintf("%s not built in %s: run `./hack/testbin.sh --node`", strings.Join(bins, ", "), cp.KubeBin)
	}
	return msg
}

func start(ctx context.Context, cp *testenv.ControlPlane, opts Options) (*Node, error) {
	if !cp.ServesNode() {
		return nil, errors.New("the control plane was started without testenv.Options.Node: a node's Pods could not reach it")
	}
	if msg := Missing(cp); msg != "" {
		return nil, errors.New(msg)
	}
	ip, err := testenv.HostIP()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ugnode-")
	if err != nil {
		return nil, err
	}
	n := &Node{Name: "node-1", IP: ip.String(), cp: cp, dir: dir, Containerd: filepath.Join(dir, "containerd.sock"),
		bridge: "ug" + strconv.Itoa(os.Getpid()%100000)}
	if n.reaper, err = startReaper(n.host()); err != nil {
		return n, err
	}
	if err := n.start(ctx, opts); err != nil {
		return n, err
	}
	return n, nil
}

func (n *Node) start(ctx context.Context, opts Options) error {
	if err := n.cp.StartControllerManager(Controllers...); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	pause, err := n.buildPause()
	if err != nil {
		return err
	}
	for _, img := range append([]string{pause}, opts.Images...) {
		if out, err := n.Ctr("images", "import", "--all-platforms", img); err != nil {
			return fmt.Errorf("import %s into the node: %w\n%s", filepath.Base(img), err, out)
		}
	}
	if err := n.startScheduler(); err != nil {
		return err
	}
	if err := n.startProxy(); err != nil {
		return err
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	return n.waitReady(ctx, 2*time.Minute)
}

// Controllers are testenv.DefaultControllers and what Pods on a node need besides:
// EndpointSlices for Services, the kube-root-ca.crt ConfigMap that every ServiceAccount
// token volume mounts, the node lifecycle controller (it lifts the not-ready taint the
// kubelet registers with), the pod garbage collector, and the disruption controller
// (without it a PodDisruptionBudget never allows a disruption, so every eviction, a
// drain's included, is refused).
var Controllers = append(append([]string{}, testenv.DefaultControllers...),
	"endpointslice-controller", "root-ca-certificate-publisher-controller", "node-lifecycle-controller",
	"pod-garbage-collector-controller", "disruption-controller")

// run starts one daemon of the node, its output in DIR/NAME.log.
func (n *Node) run(name string, args ...string) (*nodeProc, error) {
	logPath := filepath.Join(n.dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	bin := name
	if p := filepath.Join(n.cp.KubeBin, name); fileExists(p) {
		bin = p
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	proc, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &nodeProc{name: name, proc: proc, log: logPath}
	n.procs = append(n.procs, p)
	n.reaper.watch(proc.Cmd.Process.Pid)
	return p, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// waitFor polls cond until it holds, the daemon exits or the timeout passes.
func (p *nodeProc) waitFor(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		select {
		case <-p.proc.Done():
			return false, fmt.Errorf("%s exited: %w", p.name, p.proc.Err())
		default:
		}
		return cond(), nil
	})
	if err != nil {
		return fmt.Errorf("%s: %s: %w\n%s", p.name, what, err, testenv.Tail(p.log, 30))
	}
	return nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	cniConf := filepath.Join(n.dir, "cni")
	if err := os.MkdirAll(cniConf, 0o700); err != nil {
		return err
	}
	conflist := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "upgradeguard-test", "plugins": [{
  "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}}]}
`, n.bridge, podSubnet, filepath.Join(n.dir, "ipam"))
	if err := os.WriteFile(filepath.Join(cniConf, "10-bridge.conflist"), []byte(conflist), 0o600); err != nil {
		return err
	}
	// restrict_oom_score_adj: without CAP_SYS_RESOURCE in the bounding set (a container
	// host) runc cannot lower a sandbox's oom_score_adj and every sandbox fails.
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
`, filepath.Join(n.dir, "containerd", "root"), filepath.Join(n.dir, "containerd", "state"), n.Containerd,
		n.Containerd+".ttrpc", filepath.Join(n.dir, "containerd", "opt"), pauseImage, cniBinDir, cniConf)
	path := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return err
	}
	p, err := n.run("containerd", "--config", path)
	if err != nil {
		return err
	}
	return p.waitFor(ctx, "socket", time.Minute, func() bool {
		_, err := n.Ctr("version")
		return err == nil
	})
}

// Ctr runs containerd's CLI on the node's socket, in the CRI's namespace, and returns
// its combined output.
func (n *Node) Ctr(args ...string) ([]byte, error) { return ctr(n.Containerd, args...) }

// ctr runs containerd's CLI on the socket address, in the CRI's namespace.
func ctr(address string, args ...string) ([]byte, error) {
	cmd := exec.Command("ctr", append([]string{"--address", address, "--namespace", "k8s.io"}, args...)...)
	childproc.Tie(cmd)
	return cmd.CombinedOutput()
}

func (n *Node) startScheduler() error {
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	_, err = n.run("kube-scheduler", "--kubeconfig="+n.cp.Kubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--v=2")
	return err
}

// startProxy runs kube-proxy in iptables mode: Pods reach kube-apiserver through the
// `kubernetes` Service IP as in-cluster clients do, and kube-apiserver reaches webhook
// Services through their cluster IPs.
func (n *Node) startProxy() error {
	health, err := testenv.FreePort()
	if err != nil {
		return err
	}
	metrics, err := testenv.FreePort()
	if err != nil {
		return err
	}
	_, err = n.run("kube-proxy", "--kubeconfig="+n.cp.Kubeconfig, "--hostname-override="+n.Name,
		"--proxy-mode=iptables", "--cluster-cidr="+podSubnet,
		// A container host may not let it raise the conntrack table size.
		"--conntrack-max-per-core=0",
		"--healthz-bind-address=127.0.0.1:"+strconv.Itoa(health),
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(metrics), "--v=2")
	return err
}

func (n *Node) startKubelet() error {
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	health, err := testenv.FreePort()
	if err != nil {
		return err
	}
	// A test node: cgroup v1 allowed (KEP-5573), no swap check, cgroupfs without QoS
	// cgroups, anonymous access to its API (no kubelet client certificate on the
	// control plane).
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
containerRuntimeEndpoint: unix://%s
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
clusterDomain: cluster.local
podLogsDir: %s
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
`, n.Containerd, n.IP, port, health, filepath.Join(n.dir, "pod-logs"))
	path := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return err
	}
	_, err = n.run("kubelet", "--config="+path, "--kubeconfig="+n.cp.Kubeconfig,
		"--root-dir="+filepath.Join(n.dir, "kubelet"), "--hostname-override="+n.Name,
		"--node-ip="+n.IP, "--v=2")
	return err
}

// waitReady waits for the Node object to say Ready, with no taint that keeps Pods off.
func (n *Node) waitReady(ctx context.Context, timeout time.Duration) error {
	cs, err := kubernetes.NewForConfig(n.cp.Config)
	if err != nil {
		return err
	}
	kubelet := n.procs[len(n.procs)-1]
	return kubelet.waitFor(ctx, "node Ready", timeout, func() bool {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, t := range node.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
				return false
			}
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	})
}

// Log is the tail of one of the node's daemons' logs (containerd, kubelet,
// kube-proxy, kube-scheduler), for a test's failure message.
func (n *Node) Log(name string, lines int) string {
	return testenv.Tail(filepath.Join(n.dir, name+".log"), lines)
}

// RunTests is the TestMain of a package whose tests run a node: testenv.RunTests with
// testenv.Options.Node, which first checks what a node needs (Missing) and stops at once,
// naming the install steps, if anything is missing.
func RunTests(m *testing.M, cp **testenv.ControlPlane) int {
	return testenv.RunTestsWith(m, cp, func(cp *testenv.ControlPlane) error {
		if msg := Missing(cp); msg != "" {
			return errors.New("node: " + msg)
		}
		return nil
	}, testenv.Options{Node: true})
}
