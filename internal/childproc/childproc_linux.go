package childproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Tie asks the kernel to SIGKILL cmd (not yet started) when the thread that starts it
// exits, which is at the latest when this process dies. Start it with Start, Run or
// inside Hold; started otherwise (a caller's cmd.Run), it is still tied, with the caveat
// of the package doc.
func Tie(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// TieGroup is Tie for a command that starts children of its own (`go build` runs the
// compiler and linker): cmd runs in a process group of its own, and a cancelled context
// (exec.CommandContext) kills the whole group, not only cmd. When this process dies the
// kernel kills cmd; its children finish the step they are on and exit.
func TieGroup(cmd *exec.Cmd) {
	Tie(cmd)
	cmd.SysProcAttr.Setpgid = true
	if cmd.Cancel != nil {
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	}
}

// tieSuffix names the file beside a TiedPath link that holds the real binary and the
// parent's process id.
const tieSuffix = ".tie"

// TiedPath writes into dir an executable path that runs bin tied to this process, for
// code that builds and starts the command itself (envtest's etcd and kube-apiserver),
// where Tie cannot reach the exec.Cmd. The path is a symbolic link to this program's own
// executable: started through it, this program sets its parent-death signal, checks
// that its parent is still this process and replaces itself with bin (same process id,
// arguments and environment), before any other code of this program runs. Start the
// path inside Hold.
func TiedPath(dir, bin string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("tie %s to this process: %w", bin, err)
	}
	link := filepath.Join(dir, filepath.Base(bin))
	if err := os.Symlink(self, link); err != nil {
		return "", fmt.Errorf("tie %s to this process: %w", bin, err)
	}
	spec := bin + "\n" + strconv.Itoa(os.Getpid()) + "\n"
	if err := os.WriteFile(link+tieSuffix, []byte(spec), 0o600); err != nil {
		return "", fmt.Errorf("tie %s to this process: %w", bin, err)
	}
	return link, nil
}

// init runs first in a program started through a TiedPath link, and never returns there.
func init() {
	spec, err := os.ReadFile(os.Args[0] + tieSuffix)
	if err != nil {
		return
	}
	if err := execTied(string(spec)); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[0], err)
		os.Exit(127)
	}
}

func execTied(spec string) error {
	bin, pid, ok := strings.Cut(strings.TrimSpace(spec), "\n")
	parent, err := strconv.Atoi(pid)
	if !ok || err != nil {
		return fmt.Errorf("malformed %s", os.Args[0]+tieSuffix)
	}
	// The signal is the calling thread's attribute and execve keeps it: set it and exec
	// on one thread.
	runtime.LockOSThread()
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); errno != 0 {
		return fmt.Errorf("set the parent-death signal: %w", errno)
	}
	if os.Getppid() != parent {
		return errors.New("the process that started this one has exited")
	}
	args := append([]string{bin}, os.Args[1:]...)
	return syscall.Exec(bin, args, os.Environ())
}
