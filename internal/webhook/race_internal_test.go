package webhook

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
)

// TestMigrationSucceededDuringDecision: a StorageMigration that succeeds while the gate
// predicts (between its CRD reads and its migration step) is returned, not replaced by
// one for CRDs that its own run has just migrated; one that had succeeded before the
// decision started is replaced, as a new migration is needed. (The race behind the
// occasional TestRemediationRollbackNotNeeded failure in test/fluxgate.)
func TestMigrationSucceededDuringDecision(t *testing.T) {
	for _, tc := range []struct {
		name         string
		phaseBefore  v1alpha1.Phase // when the decision starts
		wantReplaced bool
	}{
		{"succeeds during the decision", v1alpha1.PhaseRunning, false},
		{"had succeeded before", v1alpha1.PhaseSucceeded, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runtime.NewScheme()
			if err := v1alpha1.AddToScheme(s); err != nil {
				t.Fatal(err)
			}
			old := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "hr-ns-app", UID: "old"},
				Spec: v1alpha1.StorageMigrationSpec{Resources: []string{"a.example.io", "b.example.io"}}}
			old.Status.Phase = tc.phaseBefore
			c := fake.NewClientBuilder().WithScheme(s).WithObjects(old).WithStatusSubresource(old).Build()
			g := &Gate{reader: c, writer: c}
			m := &storageMigrations{g: g, name: old.Name}
			m.readBefore(t.Context())

			// The migration's last CRD is pruned: it succeeds before the gate asks.
			var now v1alpha1.StorageMigration
			if err := c.Get(t.Context(), client.ObjectKey{Name: old.Name}, &now); err != nil {
				t.Fatal(err)
			}
			now.Status.Phase = v1alpha1.PhaseSucceeded
			if err := c.Status().Update(t.Context(), &now); err != nil {
				t.Fatal(err)
			}
			policy := &v1alpha1.StorageMigrationPolicy{}
			sm, created, err := g.ensureMigration(t.Context(), m, []string{"b.example.io"}, policy)
			if err != nil {
				t.Fatal(err)
			}
			var stored v1alpha1.StorageMigration
			if err := c.Get(t.Context(), client.ObjectKey{Name: old.Name}, &stored); err != nil {
				t.Fatal(err)
			}
			replaced := len(stored.Spec.Resources) == 1
			if created != tc.wantReplaced || replaced != tc.wantReplaced || sm == nil {
				t.Errorf("created %v, stored resources %v, want replaced %v", created, stored.Spec.Resources, tc.wantReplaced)
			}
		})
	}
}
