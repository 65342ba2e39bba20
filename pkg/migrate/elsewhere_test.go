package migrate

import (
	"errors"
	"fmt"
	"testing"
)

// TestIsMigratingElsewhere: a held Lease and someone else's StorageVersionMigration are
// "someone else is migrating", wrapped or not; other failures are not.
func TestIsMigratingElsewhere(t *testing.T) {
	held := &LeaseHeldError{CRD: "a.example.io", Holder: "cli/host"}
	svm := &InProgressError{CRD: "a.example.io", StorageVersionMigrations: []string{"by-hand"}}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"held Lease", held, true},
		{"StorageVersionMigration of someone else", svm, true},
		{"wrapped", fmt.Errorf("waiting for %w: %w", held, errors.New("deadline")), true},
		{"joined", errors.Join(errors.New("other"), svm), true},
		{"nil", nil, false},
		{"another failure", &CRDNotFoundError{Name: "a.example.io"}, false},
	} {
		if got := IsMigratingElsewhere(tc.err); got != tc.want {
			t.Errorf("%s: IsMigratingElsewhere = %v, want %v", tc.name, got, tc.want)
		}
	}
}
