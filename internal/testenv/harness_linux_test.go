package testenv_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// harnessEnv makes this test binary play a test whose binary is killed mid-run.
const harnessEnv = "UPGRADEGUARD_TESTENV_HARNESS"

// TestHarnessDiesWithTestBinary runs the harness in a child test binary (this one again):
// a control plane with kube-controller-manager, its kube-apiserver restarted, and a fleet
// of one. It kills that binary with SIGKILL, so that no clean-up runs, as on a -timeout
// panic or a CI job killed, and checks that every process the harness started has gone.
func TestHarnessDiesWithTestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	if os.Getenv(harnessEnv) != "" {
		runHarness(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHarnessDiesWithTestBinary$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), harnessEnv+"=1")
	stdin, err := cmd.StdinPipe() // the child stops at EOF, should this test die first
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var out strings.Builder
	for sc.Scan() && sc.Text() != "harness ready" {
		out.WriteString(sc.Text() + "\n")
	}
	if sc.Text() != "harness ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the harness did not start:\n%s%s", out.String(), stderr.String())
	}

	procs, err := descendants(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range procs {
		names = append(names, p.exe)
	}
	slices.Sort(names)
	want := []string{"etcd", "etcd", "kube-apiserver", "kube-apiserver", "kube-controller-manager"}
	if !slices.Equal(names, want) {
		t.Errorf("the harness runs %v, want %v", names, want)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, p := range procs {
		if err := waitExited(t.Context(), p, time.Minute); err != nil {
			t.Error(err)
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// runHarness is the child: it starts the harness, says so and waits for its parent's
// SIGKILL (or for stdin to close, should the parent die first).
func runHarness(t *testing.T) {
	cp := testenv.ForTest(t, testenv.Options{ControllerManager: true})
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	testenv.FleetForTest(t, 1)
	fmt.Println("harness ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString(0)
}

// proc is a process found under /proc.
type proc struct {
	pid int
	exe string // base name of the executable
	// start is the start time in clock ticks since boot, so a reused pid is not taken
	// for the process.
	start string
}

// stat reads pid's parent, state and start time from /proc/PID/stat.
func stat(pid int) (ppid int, state byte, start string, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, "", err
	}
	// The fields after the parenthesised command name: state ppid ... starttime (22nd).
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, "", fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, 0, "", fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], f[19], err
}

// descendants lists every living process below root.
func descendants(root int) ([]proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, start, err := stat(pid)
		if err != nil || state == 'Z' {
			continue // gone meanwhile, or exited
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		children[ppid] = append(children[ppid], proc{pid: pid, exe: filepath.Base(exe), start: start})
	}
	var out []proc
	queue := []int{root}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
		queue = queue[1:]
	}
	return out, nil
}

// waitExited polls until p has exited: gone, a zombie no one reaped yet, or its pid
// taken by another process.
func waitExited(ctx context.Context, p proc, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		_, state, start, err := stat(p.pid)
		return err != nil || state == 'Z' || state == 'X' || start != p.start, nil
	})
	if err != nil {
		return fmt.Errorf("%s (pid %d) still runs %s after the test binary that started it was killed", p.exe, p.pid, timeout)
	}
	return nil
}
