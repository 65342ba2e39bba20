//go:build e2e

package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// killedEnv makes this test binary play a test whose binary is killed while its node runs.
const killedEnv = "UPGRADEGUARD_NODE_KILLED"

// TestNodeCleanedUpAfterKill runs a control plane and a node with one Pod in a child test
// binary (this one again), records what the node has put on the host (containerd's shims
// and the containers below them, the Pod's network namespace, the iptables chains, the
// bridge, the mounts under the node's directory and the directory), checks that each
// exists, kills the child with SIGKILL, so that no clean-up of its own runs, and waits
// until the node's reaper has removed every one of them.
func TestNodeCleanedUpAfterKill(t *testing.T) {
	if os.Getenv(killedEnv) != "" {
		runKilledNode(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeCleanedUpAfterKill$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), killedEnv+"=1")
	stdin, err := cmd.StdinPipe() // the child stops at EOF, should this test die first
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close() }()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child prints "KEY VALUE" lines, then "node ready".
	said := map[string][]string{}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "node ready" {
		out.WriteString(sc.Text() + "\n")
		if k, v, ok := strings.Cut(sc.Text(), " "); ok {
			said[k] = append(said[k], v)
		}
	}
	if sc.Text() != "node ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the node did not start:\n%s%s", out.String(), stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	one := func(k string) string {
		if len(said[k]) != 1 {
			t.Fatalf("the child said %s %q, want one:\n%s", k, said[k], out.String())
		}
		return said[k][0]
	}
	h := host{Dir: one("dir"), Bridge: one("bridge"), Containerd: one("containerd"), KubeBin: one("kubebin")}
	t.Cleanup(func() { _ = os.RemoveAll(one("cpdir")) }) // the control plane's, which stays (testenv)
	var reaperPID int
	if _, err := fmt.Sscan(one("reaper"), &reaperPID); err != nil {
		t.Fatal(err)
	}

	// What the node has put on the host, each checked to be there now.
	before := snapshot(t, h, said["netns"], said["file"])
	reaperProc, err := readProc(reaperPID)
	if err != nil {
		t.Fatalf("the node's reaper (pid %d) does not run: %v", reaperPID, err)
	}
	before.mustHold(t, h, said["netns"], said["file"], "the kill")
	if t.Failed() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.FailNow() // the child's clean-up never ran: the reaper's did
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	start := time.Now()
	var left state
	err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		left = before.left(h)
		return left.empty() && !reaperProc.alive(), nil
	})
	if err != nil {
		log, _ := os.ReadFile(h.Dir + ".reaper.log")
		t.Errorf("2m after the test binary was killed, its node left %s (the reaper runs: %v)\n%s", left, reaperProc.alive(), log)
		// Tidy the machine up for the next test all the same, without the reaper's code.
		for _, p := range append(left.procs, reaperProc) {
			p.kill(false)
		}
		_ = waitGone(append(left.procs, reaperProc), 30*time.Second) // then their cgroups can go
		for _, f := range left.files {
			if strings.HasPrefix(f, "/sys/fs/cgroup/") {
				_ = syscall.Rmdir(f)
			} else {
				_ = os.RemoveAll(f)
			}
		}
		_ = removeNetns(left.netns)
		_ = h.clean(nil)
	} else {
		t.Logf("the reaper cleaned up in %s", time.Since(start).Round(100*time.Millisecond))
	}
	if fileExists(h.Dir + ".reaper.log") {
		t.Errorf("the reaper wrote %s.reaper.log", h.Dir)
		_ = os.Remove(h.Dir + ".reaper.log")
	}
}

// TestNodeStopLeavesNothing stops a node that runs a Pod with Stop, as a test's clean-up
// does: every thing TestNodeCleanedUpAfterKill checks is gone when Stop returns, and the
// reaper has exited.
func TestNodeStopLeavesNothing(t *testing.T) {
	_, n := podNode(t)
	h, netns, files := n.host(), sandboxNetns(n.Containerd), taskFiles(t, n)
	before := snapshot(t, h, netns, files)
	before.mustHold(t, h, netns, files, "Stop")
	if t.Failed() {
		t.FailNow()
	}
	reaper := n.reaper.cmd
	if err := n.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if left := before.left(h); !left.empty() {
		t.Errorf("after Stop, the node left %s", left)
	}
	if reaper.ProcessState == nil || !reaper.ProcessState.Success() {
		t.Errorf("after Stop, the reaper has not exited with 0: %v", reaper.ProcessState)
	}
	if fileExists(h.Dir + ".reaper.log") {
		t.Errorf("the reaper wrote %s.reaper.log", h.Dir)
		_ = os.Remove(h.Dir + ".reaper.log")
	}
}

// runKilledNode is the child: a control plane, a node and a Pod on it; it prints what the
// parent needs and waits for the parent's SIGKILL (or for stdin to close, should the
// parent die first).
func runKilledNode(t *testing.T) {
	cp, n := podNode(t)
	fmt.Printf("dir %s\nbridge %s\ncontainerd %s\nkubebin %s\ncpdir %s\nreaper %d\n",
		n.dir, n.bridge, n.Containerd, cp.KubeBin, cp.Dir(), n.reaper.cmd.Process.Pid)
	for _, ns := range sandboxNetns(n.Containerd) {
		fmt.Printf("netns %s\n", ns)
	}
	for _, f := range taskFiles(t, n) {
		fmt.Printf("file %s\n", f)
	}
	fmt.Println("node ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// podNode starts a control plane for the test, a node on it and a Pod running the pause
// image on the node.
func podNode(t *testing.T) (*testenv.ControlPlane, *Node) {
	cp := testenv.ForTest(t, testenv.Options{Node: true})
	if msg := Missing(cp); msg != "" {
		t.Fatal(msg)
	}
	n := Start(t, cp, Options{})
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	ctx := t.Context()
	// Created once the ServiceAccount controller has made the namespace's default one.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("create the Pod: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("the Pod does not run: %v\n%s", err, n.Log("kubelet", 30))
	}
	return cp, n
}

// taskFiles lists what each of the node's tasks has outside the node's directory, which
// goes only when the task is deleted: its shim's socket, its runc state and its cgroups.
func taskFiles(t *testing.T, n *Node) []string {
	t.Helper()
	out, err := n.Ctr("tasks", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, id := range strings.Fields(string(out)) {
		bundle := filepath.Join(n.dir, taskBundles, "k8s.io", id)
		addr, err := os.ReadFile(filepath.Join(bundle, "address"))
		if err != nil {
			t.Fatal(err)
		}
		// A Pod's containers share their sandbox's shim.
		if sock := strings.TrimPrefix(strings.TrimSpace(string(addr)), "unix://"); !slices.Contains(files, sock) {
			files = append(files, sock)
		}
		files = append(files, filepath.Join("/run/containerd/runc/k8s.io", id))
		// cgroupfs: a directory per hierarchy of cgroup v1, or one of cgroup v2.
		config, err := os.ReadFile(filepath.Join(bundle, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var spec struct{ Linux struct{ CgroupsPath string } }
		if err := json.Unmarshal(config, &spec); err != nil || spec.Linux.CgroupsPath == "" {
			t.Fatalf("task %s: no cgroupsPath in its bundle (%v)", id, err)
		}
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", spec.Linux.CgroupsPath))
		if d := filepath.Join("/sys/fs/cgroup", spec.Linux.CgroupsPath); fileExists(d) {
			dirs = append(dirs, d)
		}
		if len(dirs) == 0 {
			t.Fatalf("task %s: no cgroup %s under /sys/fs/cgroup", id, spec.Linux.CgroupsPath)
		}
		files = append(files, dirs...)
	}
	return files
}

// state is what a node has put on the host.
type state struct {
	procs       []proc   // its shims and every process below them
	chains      []string // "iptables TABLE CHAIN" of every KUBE- chain
	netns       []string // the Pods' network namespaces
	files       []string // its tasks' shim sockets, runc state and cgroups
	mounts      []string // mount points under its directory
	bridge, dir bool
}

// snapshot reads what the node h has put on the host, of the network namespaces and
// files those that exist.
func snapshot(t *testing.T, h host, netns, files []string) state {
	t.Helper()
	var s state
	shims, err := findShims(h.Containerd)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shims {
		below, err := descendants(sh.pid)
		if err != nil {
			t.Fatal(err)
		}
		s.procs = append(append(s.procs, sh), below...)
	}
	s.chains = kubeChains()
	s.netns = existing(netns)
	s.files = existing(files)
	s.mounts = mountsUnder(h.Dir)
	s.bridge = fileExists("/sys/class/net/" + h.Bridge)
	s.dir = fileExists(h.Dir)
	return s
}

// mustHold fails the test unless s, read before when, holds each kind of thing a node
// with a Pod puts on the host: netns and files are what the node said it has.
func (s state) mustHold(t *testing.T, h host, netns, files []string, when string) {
	t.Helper()
	var exes []string
	for _, p := range s.procs {
		exes = append(exes, p.exe)
	}
	for _, c := range []struct {
		what string
		ok   bool
	}{
		{"containerd shim serving the node's socket", slices.ContainsFunc(s.procs, func(p proc) bool { return strings.HasPrefix(p.exe, "containerd-shim") })},
		{"container of the Pod (pause) below a shim", slices.Contains(exes, "pause")},
		{"KUBE-SERVICES chain of kube-proxy (iptables nat)", slices.Contains(s.chains, "iptables nat KUBE-SERVICES")},
		{"KUBE-KUBELET-CANARY chain of the kubelet (iptables mangle)", slices.Contains(s.chains, "iptables mangle KUBE-KUBELET-CANARY")},
		{"network namespace of the Pod", len(netns) > 0 && len(s.netns) == len(netns)},
		{"shim socket, runc state or cgroup of a task", len(files) > 0 && len(s.files) == len(files)},
		{"mount under the node's directory", len(s.mounts) > 0},
		{"bridge " + h.Bridge, s.bridge},
		{"node directory", s.dir},
	} {
		if !c.ok {
			t.Errorf("before %s, no %s: %s", when, c.what, s)
		}
	}
}

// left is what of s is still there.
func (s state) left(h host) state {
	var l state
	for _, p := range s.procs {
		if p.alive() {
			l.procs = append(l.procs, p)
		}
	}
	// Shims started since (there should be none) count too.
	if shims, err := findShims(h.Containerd); err == nil {
		for _, sh := range shims {
			if !slices.Contains(l.procs, sh) {
				l.procs = append(l.procs, sh)
			}
		}
	}
	now := kubeChains()
	for _, c := range s.chains {
		if slices.Contains(now, c) {
			l.chains = append(l.chains, c)
		}
	}
	l.netns = existing(s.netns)
	l.files = existing(s.files)
	l.mounts = mountsUnder(h.Dir)
	l.bridge = fileExists("/sys/class/net/" + h.Bridge)
	l.dir = fileExists(h.Dir)
	return l
}

func (s state) empty() bool {
	return len(s.procs) == 0 && len(s.chains) == 0 && len(s.netns) == 0 && len(s.files) == 0 &&
		len(s.mounts) == 0 && !s.bridge && !s.dir
}

func (s state) String() string {
	var procs []string
	for _, p := range s.procs {
		procs = append(procs, fmt.Sprintf("%s (pid %d)", p.exe, p.pid))
	}
	mounts := s.mounts
	if len(mounts) > 3 {
		mounts = append(mounts[:3:3], "...")
	}
	return fmt.Sprintf("processes %v; iptables chains %v; network namespaces %v; shim sockets, runc state and cgroups %v; %d mounts under the directory %v; bridge: %v; directory: %v",
		procs, s.chains, s.netns, s.files, len(s.mounts), mounts, s.bridge, s.dir)
}

// kubeChains lists the KUBE- chains of iptables and ip6tables, as "BIN TABLE CHAIN".
func kubeChains() []string {
	var out []string
	for _, bin := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			rules, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(rules), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") {
					out = append(out, bin+" "+table+" "+f[1])
				}
			}
		}
	}
	return out
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

func existing(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}
