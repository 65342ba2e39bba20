package migrate_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestTargetsFor: each finding becomes what its fix (predict.FixFor) says a migration can
// do: a target, a storage-switch target, a blocked bridge, or nothing.
func TestTargetsFor(t *testing.T) {
	crd := func(name string, v predict.Verdict, switchTo string) check.CRDReport {
		return check.CRDReport{Decision: predict.Decision{Name: name, Verdict: v, LiveStorageVersion: "v1", StorageSwitchTo: switchTo}}
	}
	rep := &check.Report{CRDs: []check.CRDReport{
		crd("ok.x", predict.OK, ""),
		crd("migrate.x", predict.Migrate, ""),
		crd("switch.x", predict.Bridge, "v2"),
		crd("stone.x", predict.Bridge, ""),
		crd("delete.x", predict.Delete, ""),
		crd("loss.x", predict.DataLoss, ""),
	}}
	for _, tc := range []struct {
		name        string
		o           migrate.Options
		wantTargets []migrate.Target
		wantBlocked []string
		wantSwitch  bool
	}{
		{name: "storage switch allowed", o: migrate.Options{AllowStorageSwitch: true},
			wantTargets: []migrate.Target{{Name: "migrate.x"}, {Name: "switch.x", StorageVersion: "v2"}}, wantBlocked: []string{"stone.x"}},
		{name: "dry run", o: migrate.Options{DryRun: true},
			wantTargets: []migrate.Target{{Name: "migrate.x"}, {Name: "switch.x", StorageVersion: "v2"}}, wantBlocked: []string{"stone.x"}},
		{name: "storage switch not allowed", wantSwitch: true},
	} {
		targets, blocked, err := migrate.TargetsFor(rep, tc.o)
		var sw *migrate.StorageSwitchError
		if got := errors.As(err, &sw); got != tc.wantSwitch {
			t.Fatalf("%s: error %v, want a StorageSwitchError: %v", tc.name, err, tc.wantSwitch)
		}
		if tc.wantSwitch {
			if want := (migrate.StorageSwitchError{CRD: "switch.x", From: "v1", To: "v2"}); *sw != want {
				t.Errorf("%s: error %+v, want %+v", tc.name, *sw, want)
			}
			continue
		}
		if diff := cmp.Diff(tc.wantTargets, targets); diff != "" {
			t.Errorf("%s: targets (-want +got):\n%s", tc.name, diff)
		}
		var names []string
		for _, b := range blocked {
			names = append(names, b.Name)
		}
		if diff := cmp.Diff(tc.wantBlocked, names); diff != "" {
			t.Errorf("%s: blocked (-want +got):\n%s", tc.name, diff)
		}
	}
}
