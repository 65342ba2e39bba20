package node

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// pauseImage is the sandbox image the node's containerd runs every Pod in.
const pauseImage = "upgradeguard.test/pause:1"

// buildPause builds ./internal/testenv/node/pause and packs it as a one-layer image archive.
func (n *Node) buildPause() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(n.dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./internal/testenv/node/pause")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	childproc.TieGroup(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the pause image: %w\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(data); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Entrypoint: []string{"/pause"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	tag, err := name.NewTag(pauseImage)
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.dir, "pause.docker.tar")
	return path, tarball.WriteToFile(path, tag, img)
}

// Stop drains the node (the kubelet stops their containers and tears
// down their networks through the CRI, as on a drained node), stops the node's daemons,
// deletes the Node object, and removes kube-proxy's iptables rules, the node's mounts and
// bridge, and its files. Last it lets the reaper go, which has then nothing to do.
func (n *Node) Stop() error {
	var errs []error
	if n.kubeletRunning() {
		errs = append(errs, n.drain(90*time.Second))
	}
	// Whatever the kubelet left (it did not run, or did not finish): kill it directly.
	netns := killTasks(n.Containerd)
	for i := len(n.procs) - 1; i >= 0; i-- {
		errs = append(errs, n.procs[i].stop(20*time.Second))
	}
	n.procs = nil
	// The Node object goes too (its kubelet is stopped, so nothing registers it again): a
	// later node of the same name on this control plane would otherwise find it cordoned
	// by the drain and never be schedulable.
	errs = append(errs, n.deleteNodeObject())
	errs = append(errs, n.host().clean(netns), n.cp.StopControllerManager())
	if n.reaper != nil {
		errs = append(errs, n.reaper.release())
		n.reaper = nil
	}
	return errors.Join(errs...)
}

// host is what the node has put on the host, for clean and the reaper.
type host struct {
	// Dir is the node's directory, Bridge its bridge, Containerd its containerd's
	// socket and KubeBin where its kube-proxy is.
	Dir, Bridge, Containerd, KubeBin string
}

func (n *Node) host() host {
	return host{Dir: n.dir, Bridge: n.bridge, Containerd: n.Containerd, KubeBin: n.cp.KubeBin}
}

// killTasks kills and deletes every task the containerd at address runs, and returns
// the network namespaces of its Pod sandboxes (read first) for clean.
func killTasks(address string) []string {
	netns := sandboxNetns(address)
	if out, err := ctr(address, "tasks", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_, _ = ctr(address, "tasks", "kill", "--all", "--signal", "SIGKILL", id)
			_, _ = ctr(address, "tasks", "delete", "--force", id)
		}
	}
	return netns
}

// clean removes, once the node's daemons and containers have stopped, kube-proxy's and
// the kubelet's iptables chains, the network namespaces netns, every mount under the
// node's directory, its bridge and the directory.
func (h host) clean(netns []string) error {
	var errs []error
	if proxy := filepath.Join(h.KubeBin, "kube-proxy"); fileExists(proxy) {
		cmd := exec.Command(proxy, "--cleanup", "--proxy-mode=iptables")
		childproc.Tie(cmd)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy --cleanup: %w\n%s", err, out))
		}
	}
	errs = append(errs, removeKubeChains(), removeNetns(netns), unmountUnder(h.Dir))
	if _, err := os.Stat("/sys/class/net/" + h.Bridge); err == nil {
		if out, err := exec.Command("ip", "link", "delete", h.Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w\n%s", h.Bridge, err, out))
		}
	}
	return errors.Join(append(errs, os.RemoveAll(h.Dir))...)
}

func (n *Node) deleteNodeObject() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(n.cp.Config)
	if err != nil {
		return err
	}
	if err := cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Node %s: %w", n.Name, err)
	}
	return nil
}

func (n *Node) kubeletRunning() bool {
	for _, p := range n.procs {
		if p.name == "kubelet" {
			select {
			case <-p.proc.Done():
				return false
			default:
				return true
			}
		}
	}
	return false
}

// drain cordons the node, deletes the Pods bound to it at once and waits until containerd runs no
// task: the kubelet has killed their containers and stopped their sandboxes.
func (n *Node) drain(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cs, err := kubernetes.NewForConfig(n.cp.Config)
	if err != nil {
		return err
	}
	// Cordoned first, so that controllers' replacement Pods stay Pending.
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("drain: cordon %s: %w", n.Name, err)
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", n.Name).String()})
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	zero := int64(0)
	for _, p := range pods.Items {
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("drain: delete pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(context.Context) (bool, error) {
		out, err := n.Ctr("tasks", "ls", "-q")
		return err == nil && len(bytes.TrimSpace(out)) == 0, nil
	})
	if err != nil {
		out, _ := n.Ctr("tasks", "ls")
		return fmt.Errorf("drain: containers still run %s after their Pods were deleted:\n%s", timeout, out)
	}
	return nil
}

// stop sends SIGTERM to the daemon's process group and SIGKILL after timeout.
func (p *nodeProc) stop(timeout time.Duration) error {
	pid := p.proc.Cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.proc.Done():
		return nil
	case <-time.After(timeout):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-p.proc.Done()
		return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, timeout)
	}
}

// unmountUnder detaches every mount below dir (the kubelet's volumes, containerd's
// snapshots and shm), deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// sandboxNetns lists the network namespaces (bind mounts under /var/run/netns) of the
// Pod sandboxes of the containerd at address: containerd leaves them until a sandbox is
// removed, which the kubelet does only minutes after a Pod has gone.
func sandboxNetns(address string) []string {
	out, err := ctr(address, "containers", "ls", "--quiet")
	if err != nil {
		return nil
	}
	var paths []string
	for _, id := range strings.Fields(string(out)) {
		info, err := ctr(address, "containers", "info", id)
		if err != nil {
			continue
		}
		var c struct {
			Spec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string }
				}
			}
		}
		if json.Unmarshal(info, &c) != nil {
			continue
		}
		for _, ns := range c.Spec.Linux.Namespaces {
			if ns.Type == "network" && strings.HasPrefix(ns.Path, "/var/run/netns/") && !slices.Contains(paths, ns.Path) {
				paths = append(paths, ns.Path)
			}
		}
	}
	return paths
}

// removeNetns unmounts and removes network namespaces: with the last reference gone the
// kernel destroys them and the Pods' veth interfaces with them.
func removeNetns(paths []string) error {
	var errs []error
	for _, p := range paths {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeKubeChains removes the iptables chains the kubelet creates (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) and any kube-proxy left, with the rules
// that jump to them, for IPv4 and IPv6. `kube-proxy --cleanup` removes only its own.
func removeKubeChains() error {
	var errs []error
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		for _, table := range []string{"filter", "nat", "mangle"} {
			errs = append(errs, removeKubeChainsIn(bin, table))
		}
	}
	return errors.Join(errs...)
}

func removeKubeChainsIn(bin, table string) error {
	out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil // the table does not exist here
	}
	var chains []string
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		f := splitRule(line)
		switch {
		case len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-"):
			chains = append(chains, f[1])
		case len(f) > 2 && f[0] == "-A" && !strings.HasPrefix(f[1], "KUBE-") && slices.Contains(f, "-j") &&
			strings.HasPrefix(f[slices.Index(f, "-j")+1], "KUBE-"):
			// The rule spec as -S prints it is what -D takes.
			args := append([]string{"-w", "-t", table, "-D"}, f[1:]...)
			if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, out))
			}
		}
	}
	for _, c := range chains {
		_ = exec.Command(bin, "-w", "-t", table, "-F", c).Run()
	}
	for _, c := range chains {
		if out, err := exec.Command(bin, "-w", "-t", table, "-X", c).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", bin, table, c, err, out))
		}
	}
	return errors.Join(errs...)
}

// splitRule splits a rule as `iptables -S` prints it into arguments: words, and
// double-quoted strings (comments) as one argument without their quotes.
func splitRule(line string) []string {
	var out []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
			}
			inWord = false
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}
