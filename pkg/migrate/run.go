package migrate

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// MaxRestarts bounds how often Run starts a CRD over because it changed during the run
// (a chart upgrade applied meanwhile).
const MaxRestarts = 2

// Run migrates each target in turn. A CRD that changed under its run (Result.Restart) is
// started over from the first object, at most MaxRestarts times; Options.Restarting hears
// of each restart. An error means a target could not be started (see Migrate); the
// results of the targets before it are returned with it.
func (m *Migrator) Run(ctx context.Context, targets []Target, o Options) ([]*Result, error) {
	results := make([]*Result, 0, len(targets))
	for _, t := range targets {
		res, err := m.Migrate(ctx, t, o)
		for restarts := 0; err == nil && res.Restart && restarts < MaxRestarts; restarts++ {
			if o.Restarting != nil {
				o.Restarting(res, restarts+1)
			}
			res, err = m.Migrate(ctx, t, o)
		}
		if err != nil {
			return results, err
		}
		results = append(results, res)
	}
	return results, nil
}

// AllTargets is every live CRD whose storedVersions is not exactly [storageVersion], by
// name.
func (m *Migrator) AllTargets(ctx context.Context) ([]Target, error) {
	list, err := m.crds.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	var out []Target
	for i := range list.Items {
		if NeedsMigration(&list.Items[i]) {
			out = append(out, Target{Name: list.Items[i].Name})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// AnyIncomplete says whether any result is not finished.
func AnyIncomplete(results []*Result) bool {
	return slices.ContainsFunc(results, func(r *Result) bool { return r.Status == Incomplete })
}

// TargetsFor turns a check report into what a migration can fix, by each finding's fix
// (predict.FixFor): FixMigrate is a target, and FixStorageSwitch is a target that switches
// first (it needs Options.AllowStorageSwitch unless it is a dry run). FixSteppingStone is
// returned in blocked: no migration fixes it. The other fixes (keep, schema) are no
// migration's to make and are left out of both.
func TargetsFor(rep *check.Report, o Options) (targets []Target, blocked []check.CRDReport, err error) {
	for _, c := range rep.CRDs {
		switch predict.FixFor(c.Decision) {
		case predict.FixMigrate:
			targets = append(targets, Target{Name: c.Name})
		case predict.FixStorageSwitch:
			if !o.AllowStorageSwitch && !o.DryRun {
				return nil, nil, &StorageSwitchError{CRD: c.Name, From: c.LiveStorageVersion, To: c.StorageSwitchTo}
			}
			targets = append(targets, Target{Name: c.Name, StorageVersion: c.StorageSwitchTo})
		case predict.FixSteppingStone:
			blocked = append(blocked, c)
		}
	}
	return targets, blocked, nil
}
