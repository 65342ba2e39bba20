package testenv

import "testing"

// TestControllersBuilt reads kube-controller-manager's /healthz?verbose answers: before
// its controllers are built it lists only "ping", after them their own checks.
func TestControllersBuilt(t *testing.T) {
	for _, tc := range []struct {
		verbose string
		want    bool
	}{
		{"[+]ping ok\nhealthz check passed\n", false},
		{"", false},
		{"[+]namespace-controller ok\n[+]garbage-collector-controller ok\nhealthz check passed\n", true},
		{"[-]garbage-collector-controller failed: reason withheld\nhealthz check failed\n", false},
	} {
		if got := controllersBuilt(tc.verbose); got != tc.want {
			t.Errorf("controllersBuilt(%q) = %v, want %v", tc.verbose, got, tc.want)
		}
	}
}
