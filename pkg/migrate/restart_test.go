package migrate_test

import (
	"sync"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// TestAPIServerRestart stops kube-apiserver after the first page and starts it again
// while the run goes on. The run retries through the outage and completes; until it
// does, storedVersions is untouched.
func TestAPIServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	own := testenv.ForTest(t) // its own control plane: this test takes it down
	ctx := t.Context()
	e := env{ctx: ctx, crds: apiextclient.NewForConfigOrDie(own.Config), dyn: dynamic.NewForConfigOrDie(own.Config)}
	for _, f := range []string{"crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml"} {
		crds, err := testenv.ReadCRDs(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.ApplyCRD(ctx, e.crds, crds[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := testenv.CreateObjects(ctx, own.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"a"}, PerNS: 40, Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	apply(t, e, "charts/flux2-2.17.2/rendered/crds.yaml")

	o := opts()
	o.Deadline = 3 * time.Minute
	var once sync.Once
	var wg sync.WaitGroup
	var startErr error
	o.Progress = func(migrate.Progress) {
		once.Do(func() {
			if got := storedVersions(t, e, helmrepos); len(got) != 2 {
				t.Errorf("storedVersions %v mid-run, want untouched", got)
			}
			if err := own.StopAPIServer(); err != nil {
				t.Error(err)
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				startErr = own.StartAPIServer()
			}()
		})
	}
	res, err := newMigrator(t, own.Config).Migrate(ctx, migrate.Target{Name: helmrepos}, o)
	wg.Wait()
	if startErr != nil {
		t.Fatalf("restart kube-apiserver: %v", startErr)
	}
	if err != nil || res.Status != migrate.Migrated || res.Rewritten != 40 || res.FailedCount != 0 {
		t.Fatalf("after a restart mid-run: %v %+v", err, res)
	}
	if got := storedVersions(t, e, helmrepos); len(got) != 1 || got[0] != "v1" {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
}
