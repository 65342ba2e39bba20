package webhook_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// startController would register the StorageMigration reconciler; until it is on this
// branch, completeMigration stands in for it.
func startController(manager.Manager) error { return nil }

// completeMigration runs the StorageMigration's CRDs through pkg/migrate on the local
// cluster and records success in its status, as the reconciler does.
func completeMigration(t *testing.T, name string) {
	t.Helper()
	ctx := t.Context()
	var sm v1alpha1.StorageMigration
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &sm); err != nil {
		t.Fatal(err)
	}
	m, err := migrate.New(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sm.Spec.Resources {
		res, err := m.Migrate(ctx, migrate.Target{Name: r}, migrate.Options{LeaseNamespace: "default"})
		if err != nil {
			t.Fatalf("migrate %s: %v", r, err)
		}
		if res.Status != migrate.Migrated && res.Status != migrate.AlreadyMigrated {
			t.Fatalf("migrate %s: %s %s", r, res.Status, res.Message)
		}
	}
	sm.Status.Phase = v1alpha1.PhaseSucceeded
	meta.SetStatusCondition(&sm.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionSucceeded, Status: metav1.ConditionTrue, Reason: "Migrated", Message: "done"})
	if err := s.c.Status().Update(ctx, &sm); err != nil {
		t.Fatal(err)
	}
}
