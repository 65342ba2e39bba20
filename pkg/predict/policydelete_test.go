package predict

import (
	"strings"
	"testing"
)

// TestWithDeletionDenied: a policy's denial of a deletion owns the verdict (policy, what
// the deletion said after "also:"), but for Helm 3's upgrade and rollback, which log the
// refusal and go on (ok, the CRD left in place); Helm 3's uninstall fails on it.
func TestWithDeletionDenied(t *testing.T) {
	const denial = "ValidatingAdmissionPolicy p (binding b) denies the deletion: no"
	deleted := Decision{Name: "widgets.example.com", Verdict: Delete, Reason: "Helm deletes the CRD and all 3 Widget objects"}
	empty := Decision{Name: "widgets.example.com", Verdict: OK, Reason: "Helm deletes the CRD; nothing is lost"}
	for _, tc := range []struct {
		name    string
		op      Operation
		d       Deployer
		f       Decision
		verdict Verdict
		says    []string
	}{
		{"helm 4 upgrade, objects", Upgrade, Helm4, deleted, PolicyDenied, []string{denial, "the upgrade fails at the deletion", "also: " + deleted.Reason}},
		{"newest helm rollback, empty", Rollback, nil, empty, PolicyDenied, []string{denial, "the rollback fails at the deletion", "also: " + empty.Reason}},
		{"helm 3 upgrade", Upgrade, Helm3, deleted, OK, []string{denial, "Helm 3 logs the refused deletion and goes on", deleted.Reason}},
		{"helm 3.18 rollback", Rollback, HelmDeployer{Version: "3.18"}, empty, OK, []string{"Helm 3 logs"}},
		{"helm 3 uninstall", Uninstall, Helm3, deleted, PolicyDenied, []string{"the uninstall fails at the deletion"}},
		{"argo cd sync", Upgrade, ArgoCDDeployer{}, deleted, PolicyDenied, []string{denial}},
	} {
		got := WithDeletionDenied(tc.op, tc.d, tc.f, denial)
		if got.Verdict != tc.verdict || got.Name != tc.f.Name {
			t.Errorf("%s: %s %q, want %s", tc.name, got.Verdict, got.Reason, tc.verdict)
		}
		for _, s := range tc.says {
			if !strings.Contains(got.Reason, s) {
				t.Errorf("%s: reason %q does not say %q", tc.name, got.Reason, s)
			}
		}
		if fix := FixFor(got); (fix == FixPolicy) != (tc.verdict == PolicyDenied) {
			t.Errorf("%s: fix %q", tc.name, fix)
		}
	}
}
