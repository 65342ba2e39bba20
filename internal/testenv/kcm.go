package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
)

// DefaultControllers are the kube-controller-manager controllers a release-safety
// scenario needs: PV/PVC binding and the protection finalizers that hold a PVC in
// Terminating while a pod uses it, garbage collection (owner references, cascading
// deletes), namespace cleanup, and the workload controllers that turn a Deployment, a
// StatefulSet or a Job into pods. Controllers that need a cloud, a kubelet, a scheduler
// or service-account signing keys are left out: there are none here. The pod garbage
// collector is left out on purpose, so a pod bound to a node that does not exist stays
// and keeps using its volumes, as a running pod does.
var DefaultControllers = []string{
	"persistentvolume-binder-controller",
	"persistentvolume-protection-controller",
	"persistentvolumeclaim-protection-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"deployment-controller",
	"replicaset-controller",
	"statefulset-controller",
	"job-controller",
	"cronjob-controller",
	"serviceaccount-controller",
}

// controllerManager is a running kube-controller-manager.
type controllerManager struct {
	cmd  *exec.Cmd
	proc *childproc.Process
	log  string
}

// StartControllerManager runs the real kube-controller-manager (bin/kube/MINOR, built by
// `make testbin`) against this control plane with the given
// controllers, or DefaultControllers when none are given. It returns once the
// controller manager reports healthy; Stop stops it with the control plane.
func (cp *ControlPlane) StartControllerManager(controllers ...string) error {
	if cp.kcm != nil {
		return errors.New("kube-controller-manager is already running on this control plane")
	}
	bin := filepath.Join(cp.KubeBin, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s is missing: run `make testbin` first", bin)
	}
	if len(controllers) == 0 {
		controllers = DefaultControllers
	}
	port, err := FreePort()
	if err != nil {
		return fmt.Errorf("kube-controller-manager: find a free port: %w", err)
	}
	dir := filepath.Join(cp.dir, "kube-controller-manager")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The CA that root-ca-certificate-publisher-controller publishes as kube-root-ca.crt.
	rootCA := filepath.Join(dir, "root-ca.crt")
	if err := os.WriteFile(rootCA, cp.Config.CAData, 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "kube-controller-manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }() // the child process keeps its own descriptor
	cmd := exec.Command(bin,
		"--kubeconfig="+cp.Kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+dir,
		"--use-service-account-credentials=false",
		"--root-ca-file="+rootCA,
		// Resync quickly so a PVC binds within a second or two of its PV appearing.
		"--pvclaimbinder-sync-period=1s",
		"--v=2",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and killed if the test binary dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	proc, err := childproc.Start(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	k := &controllerManager{cmd: cmd, proc: proc, log: logPath}
	cp.kcm = k
	if err := k.waitHealthy(port, time.Minute); err != nil {
		_ = cp.StopControllerManager()
		return err
	}
	return nil
}

// ControllerManagerPID is the process id of the running kube-controller-manager (0 when
// none runs), for benchmarks that read its CPU time and memory from /proc.
func (cp *ControlPlane) ControllerManagerPID() int {
	if cp.kcm == nil {
		return 0
	}
	return cp.kcm.cmd.Process.Pid
}

// StopControllerManager stops kube-controller-manager if it runs. Stop calls it.
func (cp *ControlPlane) StopControllerManager() error {
	k := cp.kcm
	if k == nil {
		return nil
	}
	cp.kcm = nil
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.proc.Done():
		return nil
	case <-time.After(15 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.proc.Done()
		return errors.New("kube-controller-manager did not stop within 15s of SIGTERM and was killed")
	}
}

func (k *controllerManager) waitHealthy(port int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The serving certificate is self-signed in the cert dir; /healthz needs no credentials.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		// A loopback test process with a self-signed certificate: nothing to verify against.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	// /healthz answers before the controllers are built, and a controller being built
	// can still exit the process: the namespace controller exits when it cannot list
	// the API's resources, so a kube-apiserver stopped right after start-up took
	// kube-controller-manager with it. The controllers' own checks join the verbose
	// list (in place of the lone "ping") once every one of them is built; wait for them.
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz?verbose", port)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-k.proc.Done():
			return fmt.Errorf("kube-controller-manager exited during start-up (%w):\n%s", k.proc.Err(), Tail(k.log, 20))
		case <-ctx.Done():
			return fmt.Errorf("kube-controller-manager not healthy within %s:\n%s", timeout, Tail(k.log, 20))
		case <-tick.C:
			resp, err := client.Get(url)
			if err != nil {
				continue
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK && controllersBuilt(string(body)) {
				return nil
			}
		}
	}
}

// controllersBuilt reports whether a /healthz?verbose answer lists a controller's check
// ("[+]namespace-controller ok"), not only the "ping" it serves before.
func controllersBuilt(verbose string) bool {
	for line := range strings.Lines(verbose) {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "[+]")
		if ok && !strings.HasPrefix(name, "ping ") {
			return true
		}
	}
	return false
}

// ControllerManagerForTest runs kube-controller-manager for the rest of the test and
// stops it when the test ends.
func (cp *ControlPlane) ControllerManagerForTest(t testing.TB) {
	t.Helper()
	if err := cp.StartControllerManager(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.StopControllerManager(); err != nil {
			t.Error(err)
		}
	})
}
