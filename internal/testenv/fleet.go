package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
)

// Fleet is K control planes sharing one etcd: each kube-apiserver has its own
// --etcd-prefix (/c0, /c1, ...), port and certificates, so each is a separate cluster
// (objects created through one are not served by another), at the cost of one etcd.
type Fleet struct {
	// Clusters are the control planes, in order. Each supports what a ControlPlane from
	// Start does (users, kubeconfigs, StopAPIServer/StartAPIServer) except the
	// controller manager and webhooks.
	Clusters []*ControlPlane

	etcd *envtest.Etcd
	dir  string
	// release frees the thread that started etcd (childproc.Hold).
	release func()
}

// StartFleet starts k kube-apiservers on one etcd. The binaries come from BinDir.
func StartFleet(k int) (*Fleet, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	minor, kubeBin, err := KubeBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "upgradeguard-fleet-")
	if err != nil {
		return nil, err
	}
	apiserver, etcd, err := tiedBinaries(dir, kubeBin)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	f := &Fleet{dir: dir, etcd: &envtest.Etcd{
		Path: etcd, DataDir: filepath.Join(dir, "etcd"), StartTimeout: 2 * time.Minute, StopTimeout: time.Minute,
	}}
	if f.release, err = childproc.Hold(f.etcd.Start); err != nil {
		_ = f.etcd.Stop()
		f.release()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start the fleet's etcd from %s: %w", kubeBin, err)
	}
	f.Clusters = make([]*ControlPlane, k)
	var mu sync.Mutex
	// A few at a time: 30 kube-apiservers starting at once on two cores each take
	// longer than their start timeout.
	var g errgroup.Group
	g.SetLimit(2 * runtime.NumCPU())
	for i := range k {
		g.Go(func() error {
			cp, err := f.startAPIServer(bin, kubeBin, apiserver, minor, i)
			mu.Lock()
			f.Clusters[i] = cp
			mu.Unlock()
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, errors.Join(err, f.Stop())
	}
	return f, nil
}

func (f *Fleet) startAPIServer(bin, kubeBin, apiserver string, minor, i int) (*ControlPlane, error) {
	dir := filepath.Join(f.dir, fmt.Sprintf("c%d", i))
	api := &envtest.APIServer{
		Path:         apiserver,
		CertDir:      filepath.Join(dir, "apiserver"),
		EtcdURL:      f.etcd.URL,
		StartTimeout: 2 * time.Minute,
		StopTimeout:  time.Minute,
	}
	if err := os.MkdirAll(api.CertDir, 0o700); err != nil {
		return nil, err
	}
	api.Configure().Set("etcd-prefix", fmt.Sprintf("/c%d", i))
	env := &envtest.Environment{ControlPlane: envtest.ControlPlane{APIServer: api}}
	cp := &ControlPlane{Bin: bin, KubeBin: kubeBin, Minor: minor, env: env, dir: dir}
	if err := cp.hold(api.Start); err != nil {
		_ = api.Stop()
		cp.release()
		return nil, fmt.Errorf("start kube-apiserver %d of the fleet: %w", i, err)
	}
	admin, err := cp.AddUser("admin", "system:masters")
	if err != nil {
		_ = api.Stop()
		return nil, err
	}
	admin.WarningHandler = rest.NoWarnings{}
	cp.Config = admin
	if err := cp.writeKubeconfig(); err != nil {
		_ = api.Stop()
		return nil, err
	}
	return cp, nil
}

// Stop stops every kube-apiserver, then etcd, and removes their files.
func (f *Fleet) Stop() error {
	var err error
	for _, cp := range f.Clusters {
		if cp != nil {
			err = errors.Join(err, cp.env.ControlPlane.APIServer.Stop())
			cp.release()
		}
	}
	err = errors.Join(err, f.etcd.Stop(), os.RemoveAll(f.dir))
	f.release()
	return err
}

// FleetForTest starts a fleet of k control planes for one test and stops it at cleanup.
func FleetForTest(t testing.TB, k int) *Fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	f, err := StartFleet(k)
	if err != nil {
		t.Fatalf("fleet of %d control planes: %v", k, err)
	}
	t.Cleanup(func() {
		if err := f.Stop(); err != nil {
			t.Errorf("stop the fleet: %v", err)
		}
	})
	return f
}
