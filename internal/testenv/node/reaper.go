package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
)

// The reaper cleans up a node whose test binary died without Node.Stop: killed by
// SIGKILL, on its -timeout panic, or exited without running its clean-ups. The node's
// daemons die with the test binary (internal/childproc), but containerd's shims and their
// containers are re-parented and keep running, and the iptables chains, the Pods' network
// namespaces, the mounts, the bridge and the node's directory stay.
//
// Start starts it first: the test binary itself again, with reaperEnv set, which makes
// this package's init run the reaper instead of the tests. It is not tied to the test
// binary and runs in a session of its own. Its standard input is a pipe whose write end
// only the test binary holds: the test binary writes the process id of each daemon it
// starts, and Stop, once it has cleaned up, writes "stopped" and closes it, and the
// reaper exits without doing anything. End of input without "stopped" means the test
// binary has died: the reaper kills the daemons (the kernel may not have yet), starts the
// node's containerd again on its own state to kill and delete the tasks as Stop does,
// kills any shim still running on the node's socket with its containers and deletes with
// runc what containerd left of their tasks (should containerd not have come up), and then
// removes what Stop removes (host.clean).
const reaperEnv = "UPGRADEGUARD_NODE_REAPER"

// reaper is the test binary's end of a node's reaper.
type reaper struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	w   *os.File // the pipe to its standard input
}

// startReaper starts the reaper of the node h describes. Its log is reaper.log in the node's
// directory, gone with it; if its clean-up fails, it writes what failed to
// DIR.reaper.log beside the directory.
func startReaper(h host) (*reaper, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start the node's reaper: %w", err)
	}
	spec, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(h.Dir, "reaper.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer func() { _ = pr.Close() }()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), reaperEnv+"="+string(spec))
	// Its output goes to the log: were it the test binary's, `go test` would wait for
	// the reaper to close it.
	cmd.Stdin, cmd.Stdout, cmd.Stderr, cmd.Dir = pr, logFile, logFile, "/"
	// Not tied to this process (childproc) but in a session of its own: it must outlive
	// this process, and a signal to this process's group must not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		_ = pw.Close()
		return nil, fmt.Errorf("start the node's reaper: %w", err)
	}
	return &reaper{cmd: cmd, w: pw}, nil
}

// watch tells the reaper about a daemon of the node, for it to kill.
func (r *reaper) watch(pid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = fmt.Fprintf(r.w, "pid %d\n", pid)
}

// release tells the reaper that Stop has cleaned up, and waits for it to exit.
func (r *reaper) release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := io.WriteString(r.w, "stopped\n")
	err = errors.Join(err, r.w.Close())
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case werr := <-done:
		if werr != nil {
			err = errors.Join(err, fmt.Errorf("the node's reaper: %w", werr))
		}
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		err = errors.Join(err, fmt.Errorf("the node's reaper did not exit within 30s of Stop and was killed: %w", <-done))
	}
	return err
}

// init runs the reaper when this program was started as one, and never returns then.
func init() {
	spec, ok := os.LookupEnv(reaperEnv)
	if !ok {
		return
	}
	os.Exit(reap(spec))
}

// reap is the reaper: it reads its standard input until "stopped" (exit 0, nothing
// done) or its end, and then cleans up.
func reap(spec string) int {
	_ = os.Unsetenv(reaperEnv) // not for the commands it runs
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	var h host
	if err := json.Unmarshal([]byte(spec), &h); err != nil || h.Dir == "" {
		fmt.Fprintf(os.Stderr, "reaper: bad %s %q: %v\n", reaperEnv, spec, err)
		return 2
	}
	var daemons []proc
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		word, arg, _ := strings.Cut(sc.Text(), " ")
		switch word {
		case "stopped":
			return 0
		case "pid":
			pid, err := strconv.Atoi(arg)
			if err != nil {
				continue
			}
			if p, err := readProc(pid); err == nil {
				daemons = append(daemons, p)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "reaper: the test binary exited without stopping the node (%v): cleaning up %s\n", sc.Err(), h.Dir)
	if err := h.reap(daemons); err != nil {
		fmt.Fprintf(os.Stderr, "reaper: %v\n", err)
		_ = os.WriteFile(h.Dir+".reaper.log", fmt.Appendf(nil, "cleaning up the node in %s after its test binary died: %v\n", h.Dir, err), 0o600)
		return 1
	}
	fmt.Fprintln(os.Stderr, "reaper: done")
	return 0
}

// reap cleans up the node after its test binary died: its daemons, its containers and
// their shims, then what Stop removes.
func (h host) reap(daemons []proc) error {
	var errs []error
	for _, p := range daemons {
		p.kill(true)
	}
	errs = append(errs, waitGone(daemons, 30*time.Second))
	netns, err := h.killTasks()
	errs = append(errs, err)
	// Should containerd not have come up: the shims and containers by hand.
	errs = append(errs, killShims(h.Containerd))
	more, err := h.deleteBundles()
	errs = append(errs, err)
	errs = append(errs, h.clean(append(netns, more...)))
	return errors.Join(errs...)
}

// killTasks starts the node's containerd again on its own configuration and state
// (a node that died before containerd was configured has nothing to kill), which
// reconnects to the shims still running, and kills and deletes their tasks as Stop does.
// It returns the Pods' network namespaces.
func (h host) killTasks() ([]string, error) {
	config := filepath.Join(h.Dir, "containerd.toml")
	if !fileExists(config) {
		return nil, nil
	}
	logFile, err := os.Create(filepath.Join(h.Dir, "containerd-reaper.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command("containerd", "--config", config)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start containerd again: %w", err)
	}
	d := &nodeProc{name: "containerd", proc: p, log: logFile.Name()}
	defer func() { _ = d.stop(20 * time.Second) }()
	if err := d.waitFor(context.Background(), "socket", time.Minute, func() bool {
		_, err := ctr(h.Containerd, "version")
		return err == nil
	}); err != nil {
		return nil, err
	}
	return killTasks(h.Containerd), nil
}

// killShims kills every containerd shim serving the containerd socket address, with its
// containers (its descendants), until none is left or 30s have passed.
func killShims(address string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		shims, err := findShims(address)
		if err != nil {
			return err
		}
		if len(shims) == 0 {
			return nil
		}
		var all []proc
		for _, s := range shims {
			below, _ := descendants(s.pid)
			all = append(append(all, s), below...)
		}
		for _, p := range all {
			p.kill(false)
		}
		if err := waitGone(all, time.Until(deadline)); err != nil {
			return err
		}
	}
}

// taskBundles holds, below the node's directory, a bundle per task containerd has not
// deleted: NAMESPACE/ID/, with the container's config.json and the shim's address.
const taskBundles = "containerd/state/io.containerd.runtime.v2.task"

// deleteBundles deletes with runc what containerd left of its tasks once their shims are
// gone: each container (its runc state in /run/containerd and its cgroups) and its shim's
// socket. It returns the containers' network namespaces.
func (h host) deleteBundles() ([]string, error) {
	bundles, err := filepath.Glob(filepath.Join(h.Dir, taskBundles, "*", "*"))
	if err != nil {
		return nil, err
	}
	var netns []string
	var errs []error
	for _, b := range bundles {
		id, ns := filepath.Base(b), filepath.Base(filepath.Dir(b))
		// The runc shim's default root, which the node's containerd configuration keeps.
		root := filepath.Join("/run/containerd/runc", ns)
		if fileExists(filepath.Join(root, id)) {
			if out, err := exec.Command("runc", "--root", root, "delete", "--force", id).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("runc delete %s: %w: %s", id, err, out))
			}
		}
		if addr, err := os.ReadFile(filepath.Join(b, "address")); err == nil {
			sock := strings.TrimPrefix(strings.TrimSpace(string(addr)), "unix://")
			if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		var spec struct {
			Linux struct{ Namespaces []struct{ Type, Path string } }
		}
		if data, err := os.ReadFile(filepath.Join(b, "config.json")); err == nil && json.Unmarshal(data, &spec) == nil {
			for _, n := range spec.Linux.Namespaces {
				if n.Type == "network" && strings.HasPrefix(n.Path, "/var/run/netns/") && !slices.Contains(netns, n.Path) {
					netns = append(netns, n.Path)
				}
			}
		}
	}
	return netns, errors.Join(errs...)
}

// findShims lists the living containerd shims that serve the containerd socket address
// (started with `-address ADDRESS`).
func findShims(address string) ([]proc, error) {
	procs, err := allProcs()
	if err != nil {
		return nil, err
	}
	var shims []proc
	for _, p := range procs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == address &&
			strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			shims = append(shims, p)
		}
	}
	return shims, nil
}

// proc is a living process, as /proc shows it.
type proc struct {
	pid, ppid int
	exe       string // the executable's base name
	// start is its start time in clock ticks since boot, so that a reused pid is not
	// taken for it.
	start string
}

// readProc reads a living process from /proc/PID: an error if it is gone or a zombie.
func readProc(pid int) (proc, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, err
	}
	// The fields after the parenthesised command name: state ppid ... starttime (22nd).
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return proc{}, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return proc{}, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	if f[0] == "Z" || f[0] == "X" {
		return proc{}, fmt.Errorf("process %d has exited", pid)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return proc{}, err
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return proc{pid: pid, ppid: ppid, exe: filepath.Base(exe), start: f[19]}, nil
}

// alive reports whether p still runs: not gone, not a zombie, its pid not reused.
func (p proc) alive() bool {
	now, err := readProc(p.pid)
	return err == nil && now.start == p.start
}

// kill sends SIGKILL to p, or to its process group, if it still runs.
func (p proc) kill(group bool) {
	if !p.alive() {
		return
	}
	if group {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
}

// allProcs lists every living process.
func allProcs() ([]proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := readProc(pid); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// descendants lists every living process below root.
func descendants(root int) ([]proc, error) {
	procs, err := allProcs()
	if err != nil {
		return nil, err
	}
	children := map[int][]proc{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []proc
	for queue := []int{root}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out, nil
}

// waitGone polls until none of procs runs, and fails naming those that still do when
// timeout passes.
func waitGone(procs []proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for _, p := range procs {
			if p.alive() {
				left = append(left, fmt.Sprintf("%s (pid %d)", p.exe, p.pid))
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still running %s after SIGKILL: %s", timeout, strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
