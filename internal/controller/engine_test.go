package controller_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
)

// TestStorageMigrationBuiltinEngine: a StorageMigration with engine builtin is carried
// out by kube-controller-manager's built-in migrator where the server serves
// StorageVersionMigrations: it succeeds, says which engine ran, and storedVersions ends
// [v1]. Where the API is not served it fails saying so.
func TestStorageMigrationBuiltinEngine(t *testing.T) {
	e := storedAtV1beta2(t, 5)
	if cp.Minor >= 37 {
		if err := cp.StartControllerManager("garbage-collector-controller", "storage-version-migrator-controller"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cp.StopControllerManager() })
	}
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "builtin"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Engine: v1alpha1.EngineBuiltin}}
	if err := e.c.Create(e.ctx, sm); err != nil {
		t.Fatal(err)
	}
	startController(t, "ug-builtin", controller.Options{})
	waitFor(t, 4*time.Minute, "the StorageMigration to end", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: "builtin"}, sm)
		return err == nil && (sm.Status.Phase == v1alpha1.PhaseSucceeded || sm.Status.Phase == v1alpha1.PhaseFailed), err
	})
	rp := sm.Status.Resources[0]
	if cp.Minor < 37 {
		if sm.Status.Phase != v1alpha1.PhaseFailed || !strings.Contains(rp.Message, "not served on this server") {
			t.Fatalf("on 1.%d: phase %s, %+v; want Failed saying StorageVersionMigrations are not served", cp.Minor, sm.Status.Phase, rp)
		}
		return
	}
	if sm.Status.Phase != v1alpha1.PhaseSucceeded || rp.Engine != v1alpha1.EngineBuiltin || !strings.HasPrefix(rp.EngineReason, "asked for") ||
		!slices.Equal(rp.StoredVersionsAfter, []string{"v1"}) {
		t.Fatalf("phase %s, %+v; want Succeeded by the builtin engine with storedVersions [v1]", sm.Status.Phase, rp)
	}
	if got := helmreposStoredVersions(t, e); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
}
