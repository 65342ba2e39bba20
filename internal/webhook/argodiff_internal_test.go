package webhook

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
)

// TestRefreshDue: Argo CD is asked to compare again once, when the migration its diff
// waited for succeeded after its last comparison or in its second.
func TestRefreshDue(t *testing.T) {
	done := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	succeeded := &v1alpha1.StorageMigration{Status: v1alpha1.StorageMigrationStatus{
		Phase: v1alpha1.PhaseSucceeded, CompletionTime: &metav1.Time{Time: done}}}
	running := &v1alpha1.StorageMigration{Status: v1alpha1.StorageMigrationStatus{Phase: v1alpha1.PhaseRunning}}
	app := func(reconciledAt string, annotations map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		if reconciledAt != "" {
			u.Object["status"] = map[string]any{"reconciledAt": reconciledAt}
		}
		u.SetAnnotations(annotations)
		return u
	}
	for _, tc := range []struct {
		name string
		app  *unstructured.Unstructured
		sm   *v1alpha1.StorageMigration
		want bool
	}{
		{"compared before the migration succeeded", app("2026-12-05T09:59:59Z", nil), succeeded, true},
		{"never compared", app("", nil), succeeded, true},
		// Both are whole seconds: a comparison in the migration's second may have come first.
		{"compared in the same second", app("2026-12-05T10:00:00Z", nil), succeeded, true},
		{"compared since", app("2026-12-05T10:00:01Z", nil), succeeded, false},
		{"asked already", app("2026-12-05T09:00:00Z", map[string]string{argoRefreshAnnotation: "normal"}), succeeded, false},
		{"migration running", app("2026-12-05T09:00:00Z", nil), running, false},
		{"no migration", app("2026-12-05T09:00:00Z", nil), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refreshDue(tc.app, tc.sm); got != tc.want {
				t.Errorf("refreshDue = %v, want %v", got, tc.want)
			}
		})
	}
}
