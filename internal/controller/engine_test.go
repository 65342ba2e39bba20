package controller_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
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

// TestStorageMigrationBuiltinRerun: the CRD changes (a description added to its schema)
// while the built-in migrator works through its objects, so the migrator skips pruning
// storedVersions. The controller's builtin engine re-runs it: the StorageMigration ends
// Succeeded with storedVersions [v1], its message names the migration whose prune was
// skipped, and a BuiltinMigrationRerun event says so.
func TestStorageMigrationBuiltinRerun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	if cp.Minor < 37 {
		t.Logf("1.%d serves no StorageVersionMigrations by default: TestStorageMigrationBuiltinEngine covers the failure", cp.Minor)
		return
	}
	e := storedAtV1beta2(t, 300)
	if err := cp.StartControllerManager("garbage-collector-controller", "storage-version-migrator-controller"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.StopControllerManager() })
	changed := make(chan error, 1)
	go func() {
		changed <- wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, helmrepos, metav1.GetOptions{})
			if err != nil || !slices.ContainsFunc(crd.Status.Conditions, func(c apiextv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextv1.StorageMigrating && c.Status == apiextv1.ConditionTrue
			}) {
				return false, nil
			}
			for i := range crd.Spec.Versions {
				if s := crd.Spec.Versions[i].Schema; s != nil && s.OpenAPIV3Schema != nil {
					s.OpenAPIV3Schema.Description += " (described during the migration)"
				}
			}
			_, err = e.crds.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{})
			return err == nil, nil
		})
	}()
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "builtin-rerun"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Engine: v1alpha1.EngineBuiltin}}
	if err := e.c.Create(e.ctx, sm); err != nil {
		t.Fatal(err)
	}
	startController(t, "ug-builtin-rerun", controller.Options{})
	waitFor(t, 5*time.Minute, "the StorageMigration to end", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: "builtin-rerun"}, sm)
		return err == nil && terminalPhase(sm.Status.Phase), err
	})
	if err := <-changed; err != nil {
		t.Fatalf("changing the CRD mid-run: %v", err)
	}
	rp := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseSucceeded || !slices.Equal(rp.StoredVersionsAfter, []string{"v1"}) ||
		!strings.Contains(rp.Message, "skipped the prune after StorageVersionMigration") {
		t.Fatalf("phase %s, %+v; want Succeeded with storedVersions [v1] and a message naming the skipped prune", sm.Status.Phase, rp)
	}
	if got := helmreposStoredVersions(t, e); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	waitFor(t, 10*time.Second, "the BuiltinMigrationRerun event", func() (bool, error) {
		evs, err := kubernetes.NewForConfigOrDie(cp.Config).EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == "builtin-rerun" && ev.Reason == controller.EventRerun && strings.Contains(ev.Note, "generation")
		}), nil
	})
}
