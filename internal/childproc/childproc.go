// Package childproc ties the processes that the test harness (internal/testenv) and the
// build helpers (hack/dist) start to the life of the process that starts them. On Linux
// each such child gets SIGKILL from the kernel when its parent dies, however it dies: a
// test binary killed on its -timeout panic, by SIGKILL or by a crash runs no clean-up,
// and without this its etcd, kube-apiserver or `go build` would keep running. Elsewhere
// the functions start processes the ordinary way and nothing ties them.
//
// Linux sends the parent-death signal when the thread that started the child exits, not
// the process (see syscall.SysProcAttr.Pdeathsig and go.dev/issue/27505). Go ends a
// thread only when a goroutine locked to it returns without unlocking, so a child started
// from an arbitrary goroutine could be killed early if some later goroutine locked that
// thread and returned. Start, Run and Hold therefore start children from a goroutine
// that stays locked to its thread for as long as the child runs.
package childproc

import (
	"os/exec"
	"runtime"
	"sync"
)

// Process is a child started by Start.
type Process struct {
	// Cmd is the started command; Cmd.Process.Pid is its process id.
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Done is closed when the process has exited and Err holds the result of its Wait.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is what Wait returned; read it after Done is closed.
func (p *Process) Err() error { return p.err }

// Start ties cmd to this process (Tie) and starts it from a goroutine locked to its OS
// thread, which waits for it and holds the thread until it exits.
func Start(cmd *exec.Cmd) (*Process, error) {
	Tie(cmd)
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Run is cmd.Run for a command tied with Start: set Stdout and Stderr first to collect
// its output.
func Run(cmd *exec.Cmd) error {
	p, err := Start(cmd)
	if err != nil {
		return err
	}
	<-p.Done()
	return p.Err()
}

// Hold runs start on a goroutine locked to its OS thread and keeps that goroutine, and
// so the thread, until release is called. It is for code that starts processes itself
// (envtest starts etcd and kube-apiserver inside its Start): every process that start
// launches from its own goroutine (with Pdeathsig set, see TiedPath) lives until release
// without being killed by an early thread exit. Call release once those processes have
// stopped; it is safe to call more than once. Hold returns start's error and release
// even when start fails, since start may have left processes running.
func Hold(start func() error) (release func(), err error) {
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		errc <- start()
		<-done
	}()
	return sync.OnceFunc(func() { close(done) }), <-errc
}
