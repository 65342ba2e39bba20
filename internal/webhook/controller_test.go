package webhook_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
)

// waitMigration waits until the controller's StorageMigration reconciler has run the
// StorageMigration to Succeeded, and fails on Failed.
func waitMigration(t *testing.T, name string) *v1alpha1.StorageMigration {
	t.Helper()
	var sm v1alpha1.StorageMigration
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &sm); err != nil {
			return false, err
		}
		if sm.Status.Phase == v1alpha1.PhaseFailed {
			t.Fatalf("StorageMigration %s failed: %+v", name, sm.Status)
		}
		return sm.Status.Phase == v1alpha1.PhaseSucceeded, nil
	})
	if err != nil {
		t.Fatalf("StorageMigration %s did not succeed: %v (status %+v)", name, err, sm.Status)
	}
	return &sm
}
