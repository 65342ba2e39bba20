package applycheck_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
)

// TestResolveMode is getUpgradeServerSideValue and the update options of Helm 4.3.1
// (pkg/action/upgrade.go, rollback.go, pkg/kube/client.go Update); the error strings are
// Helm's own and are checked against the real CLI in the release tests.
func TestResolveMode(t *testing.T) {
	type want struct {
		serverSide bool
		method     string
		takeOver   bool
		flagError  string
		stage      applycheck.FlagErrorStage
		alts       int
	}
	cases := []struct {
		name     string
		op       applycheck.Operation
		flags    applycheck.Flags
		recorded string
		want     want
	}{
		{"helm 3 release, auto", applycheck.OpUpgrade, applycheck.Flags{}, "", want{method: "csa", alts: 2}},
		{"csa release, auto", applycheck.OpUpgrade, applycheck.Flags{ServerSide: "auto"}, "csa", want{method: "csa", alts: 2}},
		{"ssa release, auto", applycheck.OpUpgrade, applycheck.Flags{}, "ssa", want{serverSide: true, method: "ssa"}},
		{"helm 3 release moved", applycheck.OpUpgrade, applycheck.Flags{ServerSide: "true"}, "", want{serverSide: true, method: "ssa", takeOver: true}},
		{"ssa release forced client-side", applycheck.OpUpgrade, applycheck.Flags{ServerSide: "false"}, "ssa", want{method: "csa", alts: 2}},
		{"force conflicts on csa", applycheck.OpUpgrade, applycheck.Flags{ForceConflicts: true}, "",
			want{method: "csa", flagError: "invalid client update option(s): forceConflicts enabled when serverSideApply disabled", stage: applycheck.AfterHooks, alts: 2}},
		{"force conflicts on ssa", applycheck.OpUpgrade, applycheck.Flags{ForceConflicts: true}, "ssa", want{serverSide: true, method: "ssa"}},
		{"force replace on ssa", applycheck.OpUpgrade, applycheck.Flags{ForceReplace: true}, "ssa",
			want{serverSide: true, method: "ssa", flagError: "invalid operation: cannot use server-side apply and force replace together", stage: applycheck.AfterHooks, alts: 2}},
		{"force replace on csa", applycheck.OpUpgrade, applycheck.Flags{ForceReplace: true}, "", want{method: "csa", alts: 2}},
		{"both forces", applycheck.OpUpgrade, applycheck.Flags{ForceReplace: true, ForceConflicts: true}, "ssa",
			want{serverSide: true, method: "ssa", flagError: "if any flags in the group [force-replace force-conflicts] are set none of the others can be; [force-conflicts force-replace] were all set",
				stage: applycheck.BeforeRecord, alts: 2}},
		{"bad server-side", applycheck.OpUpgrade, applycheck.Flags{ServerSide: "yes"}, "ssa",
			want{flagError: "invalid/unknown release server-side apply method: yes", stage: applycheck.BeforeRecord, alts: 1}},
		{"rollback to ssa revision", applycheck.OpRollback, applycheck.Flags{}, "ssa", want{serverSide: true, method: "ssa", takeOver: true}},
		{"rollback to helm 3 revision", applycheck.OpRollback, applycheck.Flags{}, "", want{method: "csa", alts: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := applycheck.ResolveMode(tc.op, tc.flags, 3, tc.recorded)
			got := want{serverSide: m.ServerSide, method: m.Method, takeOver: m.TakesOverClientSide, flagError: m.FlagError, stage: m.FlagErrorStage, alts: len(m.Alternatives)}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s\nreason: %s", diff, m.Reason)
			}
		})
	}
}
