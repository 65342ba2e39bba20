package storagemigration_test

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
)

var errDecide = errors.New("the CRD could not be read")

// TestEnsure: which existing StorageMigration Ensure keeps and which it replaces, and
// that a dry run writes nothing. (The keep-or-replace rule is ours; the API server's
// part, create and delete, is exercised by the gate's and the controller's tests.)
func TestEnsure(t *testing.T) {
	const name = "hr-ns-app"
	existing := func(phase v1alpha1.Phase, cond string) *v1alpha1.StorageMigration {
		sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"old": "true"}}}
		sm.Status.Phase = phase
		if cond != "" {
			meta.SetStatusCondition(&sm.Status.Conditions, metav1.Condition{Type: cond, Status: metav1.ConditionTrue, Reason: "R"})
		}
		return sm
	}
	failedAgain := func(*v1alpha1.StorageMigration) bool { return true }
	for _, tc := range []struct {
		name        string
		existing    *v1alpha1.StorageMigration
		o           storagemigration.Options
		wantCreated bool
		wantNew     bool  // the StorageMigration standing afterwards is the wanted one
		wantErr     error // Ensure's error wraps it
	}{
		{"none", nil, storagemigration.Options{}, true, true, nil},
		{"running is kept", existing(v1alpha1.PhaseRunning, ""), storagemigration.Options{}, false, false, nil},
		{"failed is kept", existing(v1alpha1.PhaseFailed, ""), storagemigration.Options{}, false, false, nil},
		{"failed is replaced when Replace says so", existing(v1alpha1.PhaseFailed, ""), storagemigration.Options{Replace: failedAgain}, true, true, nil},
		{"succeeded is replaced", existing(v1alpha1.PhaseSucceeded, ""), storagemigration.Options{}, true, true, nil},
		{"succeeded by condition is replaced", existing("", v1alpha1.ConditionSucceeded), storagemigration.Options{}, true, true, nil},
		{"succeeded during the decision is kept", existing(v1alpha1.PhaseSucceeded, ""),
			storagemigration.Options{ReplaceSucceeded: func(*v1alpha1.StorageMigration) (bool, error) { return false, nil }}, false, false, nil},
		{"succeeded before the decision is replaced", existing(v1alpha1.PhaseSucceeded, ""),
			storagemigration.Options{ReplaceSucceeded: func(*v1alpha1.StorageMigration) (bool, error) { return true, nil }}, true, true, nil},
		{"succeeded is kept when the decision fails", existing(v1alpha1.PhaseSucceeded, ""),
			storagemigration.Options{ReplaceSucceeded: func(*v1alpha1.StorageMigration) (bool, error) { return true, errDecide }}, false, false, errDecide},
		{"dry run creates nothing", nil, storagemigration.Options{DryRun: true}, true, false, nil},
		{"dry run replaces nothing", existing(v1alpha1.PhaseSucceeded, ""), storagemigration.Options{DryRun: true}, true, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runtime.NewScheme()
			if err := v1alpha1.AddToScheme(s); err != nil {
				t.Fatal(err)
			}
			b := fake.NewClientBuilder().WithScheme(s)
			if tc.existing != nil {
				b = b.WithObjects(tc.existing)
			}
			c := b.Build()
			want := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"new": "true"}},
				Spec: v1alpha1.StorageMigrationSpec{Resources: []string{"a.example.io"}}}
			sm, created, err := storagemigration.Ensure(t.Context(), c, c, want, tc.o)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Ensure returned %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if created != tc.wantCreated {
				t.Errorf("created %v, want %v", created, tc.wantCreated)
			}
			var stored v1alpha1.StorageMigration
			err = c.Get(t.Context(), client.ObjectKey{Name: name}, &stored)
			switch {
			case tc.existing == nil && !tc.wantNew:
				if err == nil {
					t.Errorf("a dry run created %s", name)
				}
			case err != nil:
				t.Fatal(err)
			case tc.wantNew != (stored.Labels["new"] == "true"):
				t.Errorf("stored labels %v, want the new one: %v", stored.Labels, tc.wantNew)
			}
			if !tc.o.DryRun && (sm == nil || sm.Name != name) {
				t.Errorf("returned %v, want %s", sm, name)
			}
		})
	}
}
