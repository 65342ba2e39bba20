package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// serverNames are the control plane's processes as /proc/PID/comm names them (at most 15
// characters): what -pin keeps on the server's core.
var serverNames = map[string]bool{"kube-apiserver": true, "etcd": true, "kube-controller": true}

// pinCPUs is -pin: "SERVER,CLIENT" processor numbers, empty when nothing is pinned.
var pinCPUs string

// pinner keeps the control plane on one processor and this process (the probe, and the
// clients it starts, which inherit it) on another, so that a client's CPU is not the API
// server's: each of the two measures what the other leaves it. Every thread of a process
// is pinned (taskset -a); threads created later inherit their creator's processor.
type pinner struct {
	server, client string
	mu             sync.Mutex
	pinned         map[int]bool
}

// startPinning pins this process to the client's processor and, until ctx ends, every
// control-plane process below it to the server's, as they appear (kube-controller-manager
// starts with its case).
func startPinning(ctx context.Context, spec string) (*pinner, error) {
	server, client, ok := strings.Cut(spec, ",")
	if !ok {
		return nil, fmt.Errorf("-pin %q: want SERVER,CLIENT processors, as 0,1", spec)
	}
	p := &pinner{server: server, client: client, pinned: map[int]bool{}}
	if err := taskset(client, os.Getpid()); err != nil {
		return nil, err
	}
	if err := p.sweep(); err != nil {
		return nil, err
	}
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := p.sweep(); err != nil {
					fmt.Fprintln(os.Stderr, "pin:", err)
				}
			}
		}
	}()
	return p, nil
}

// sweep pins the control-plane processes below this one that are not pinned yet.
func (p *pinner) sweep() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pid := range descendants(os.Getpid()) {
		if p.pinned[pid] {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || !serverNames[strings.TrimSpace(string(comm))] {
			continue
		}
		if err := taskset(p.server, pid); err != nil {
			return err
		}
		p.pinned[pid] = true
	}
	return nil
}

// describe says where what runs, for the report.
func (p *pinner) describe() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("control plane (%d processes: kube-apiserver, etcd, kube-controller-manager when it runs) on processor %s; the bench, its probe and the migrating clients on processor %s",
		len(p.pinned), p.server, p.client)
}

// taskset pins every thread of pid to cpu.
func taskset(cpu string, pid int) error {
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpu, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset -a -p -c %s %d: %w: %s", cpu, pid, err, out)
	}
	return nil
}

// descendants are the processes below pid, read from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		data, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(data), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		child, _ := strconv.Atoi(filepath.Base(filepath.Dir(s)))
		children[ppid] = append(children[ppid], child)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		for _, k := range children[c] {
			out = append(out, k)
			queue = append(queue, k)
		}
	}
	return out
}
