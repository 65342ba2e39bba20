package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
)

// Process is a binary (a controller, a server) run for a test, in its own process group and
// tied to the test binary (childproc), with its output in a log file.
type Process struct {
	name string
	cmd  *exec.Cmd
	proc *childproc.Process
	log  string
}

// StartProcess starts cmd with its output in logPath, in its own process group, killed if
// the test binary dies without stopping it. name is the process's name in errors.
func StartProcess(cmd *exec.Cmd, name, logPath string) (*Process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }() // the child process keeps its own descriptor
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and killed if the test binary dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	proc, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Process{name: name, cmd: cmd, proc: proc, log: logPath}
	return p, nil
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.proc.Done() }

// Err is what the process's Wait returned; read it after Done is closed.
func (p *Process) Err() error { return p.proc.Err() }

// WaitHealthy polls url (an HTTP health endpoint) until it answers 200 OK, and fails when
// the process exits first or timeout passes, with the tail of its log.
func (p *Process) WaitHealthy(ctx context.Context, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.proc.Done():
			return false, fmt.Errorf("%s exited during start-up (%w)", p.name, p.proc.Err())
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("%s not healthy at %s: %w:\n%s", p.name, url, err, Tail(p.log, 20))
	}
	return nil
}

// Stop sends SIGTERM and, after grace, SIGKILL.
func (p *Process) Stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.proc.Done():
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.proc.Done()
		return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, grace)
	}
}

// FreePorts returns n distinct free loopback ports.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			return FreePorts(n)
		}
		seen[p] = true
	}
	return ports, nil
}

// FreePort returns a free loopback port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// Tail returns the last n lines of a file, for start-up errors and failure messages.
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
