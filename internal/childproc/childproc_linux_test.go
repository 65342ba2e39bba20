package childproc

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes this test binary play the parent whose death is under test.
const helperEnv = "CHILDPROC_TEST_PARENT"

// TestChildDiesWithParent starts a parent process (this test binary again) that starts
// `sleep` the two ways the harness does, kills the parent with SIGKILL (no clean-up
// runs) and waits for the sleep to be gone.
func TestChildDiesWithParent(t *testing.T) {
	if mode := os.Getenv(helperEnv); mode != "" {
		parent(t, mode)
		return
	}
	for _, mode := range []string{"start", "tied-path"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestChildDiesWithParent$", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), helperEnv+"="+mode)
			stdin, err := cmd.StdinPipe() // the parent exits at EOF, should this test die first
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := readPID(t, stdout)
			// Through a TiedPath the child is this test binary until it execs sleep.
			sleep, _ := exec.LookPath("sleep")
			if err := waitExe(pid, mustEval(t, sleep), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if err := waitGone(pid, 30*time.Second); err != nil {
				t.Error(err)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
	}
}

// parent starts `sleep 600` as mode says, prints its pid and waits for stdin to close.
func parent(t *testing.T, mode string) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("sleep (coreutils) is missing: %v", err)
	}
	var pid int
	switch mode {
	case "start":
		p, err := Start(exec.Command(sleep, "600"))
		if err != nil {
			t.Fatal(err)
		}
		pid = p.Cmd.Process.Pid
	case "tied-path":
		path, err := TiedPath(t.TempDir(), sleep)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(path, "600")
		if _, err := Hold(cmd.Start); err != nil {
			t.Fatal(err)
		}
		pid = cmd.Process.Pid
	}
	fmt.Printf("pid %d\n", pid)
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

func readPID(t *testing.T, r io.Reader) int {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "pid "); ok {
			pid, err := strconv.Atoi(s)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("the parent printed no pid (%v)", sc.Err())
	return 0
}

func mustEval(t *testing.T, path string) string {
	t.Helper()
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitExe polls until pid runs exe.
func waitExe(pid int, exe string, timeout time.Duration) error {
	return poll(timeout, func() (bool, error) {
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			return false, fmt.Errorf("child %d: %w", pid, err)
		}
		return got == exe, nil
	}, fmt.Sprintf("child %d does not run %s", pid, exe))
}

// waitGone polls until pid has exited (gone, or a zombie nobody reaped yet).
func waitGone(pid int, timeout time.Duration) error {
	return poll(timeout, func() (bool, error) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true, nil
		}
		// The state follows the parenthesised command name.
		i := bytes.LastIndexByte(stat, ')')
		return i > 0 && len(stat) > i+2 && (stat[i+2] == 'Z' || stat[i+2] == 'X'), nil
	}, fmt.Sprintf("process %d still runs after its parent was killed", pid))
}

// poll calls done every 50ms until it returns true or an error, or timeout passes.
func poll(timeout time.Duration, done func() (bool, error), what string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for {
		if ok, err := done(); ok || err != nil {
			return err
		}
		select {
		case <-deadline:
			return fmt.Errorf("%s (waited %s)", what, timeout)
		case <-tick.C:
		}
	}
}
