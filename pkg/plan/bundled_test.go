package plan

import (
	"context"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// chartSource is a source that loads whole chart versions (check.ChartHistory): each
// renders the widgets CRD and the StorageVersionMigrations named for it.
type chartSource struct {
	source
	svms map[string][]string
}

func (s *chartSource) Chart(ctx context.Context, v string) (*check.Chart, error) {
	crds, err := s.CRDs(ctx, v)
	if err != nil {
		return nil, err
	}
	ch := &check.Chart{Version: v, CRDs: crds}
	for _, name := range s.svms[v] {
		ch.Migrations = append(ch.Migrations, chartcrds.Migration{Name: name, APIVersion: "storagemigration.k8s.io/v1", Group: "example.com", Resource: "widgets"})
	}
	return ch, nil
}

// liveSVMs is a cluster that also has StorageVersionMigrations.
type liveSVMs struct {
	cluster
	names map[string]svm.Existing
}

func (c liveSVMs) ExistingMigrations(context.Context) (map[string]svm.Existing, bool, error) {
	return c.names, true, nil
}

// TestPlanBundledMigrations: each upgrade step's check judges the StorageVersionMigrations
// that step's chart renders, on the state the steps before it leave. A chart that bundles
// a fixed name one version ahead of the drop: at the step to 2.0.0 it runs (it is new on
// the cluster); the plan still migrates before 3.0.0 (nothing waits for it), and at the
// step to 3.0.0 the same name was applied by the step before, so it will not run again.
// A name the live cluster already has will not run at the first step either.
func TestPlanBundledMigrations(t *testing.T) {
	src := &chartSource{
		source: source{charts: map[string][]string{"1.0.0": {"v1beta1*"}, "2.0.0": {"v1beta1", "v1*"}, "3.0.0": {"v1*"}}},
		svms:   map[string][]string{"2.0.0": {"widgets-migration", "old-migration"}, "3.0.0": {"widgets-migration"}},
	}
	live := liveSVMs{cluster: cluster{crd([]string{"v1beta1"}, "v1beta1*")},
		names: map[string]svm.Existing{"old-migration": {Name: "old-migration", CRD: "widgets.example.com", State: svm.StateSucceeded}}}
	p, err := Run(t.Context(), Request{Cluster: live, Versions: src, Target: "3.0.0", Release: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(steps(p), ", "); got != "upgrade 2.0.0, migrate, upgrade 3.0.0" {
		t.Fatalf("steps %s, want the migration before 3.0.0 although 2.0.0 bundles one", got)
	}
	verdicts := func(s Step) map[string]predict.BundledMigration {
		out := map[string]predict.BundledMigration{}
		for _, c := range s.Check.CRDs {
			for _, b := range c.BundledMigrations {
				out[b.Name] = b
			}
		}
		return out
	}
	first, last := verdicts(p.Steps[0]), verdicts(p.Steps[2])
	if b := first["widgets-migration"]; b.Verdict != predict.BundledWillRun || !strings.Contains(b.Reason, "stored at v1beta1 to v1") {
		t.Errorf("step to 2.0.0: widgets-migration %+v, want will-run migrating v1beta1", b)
	}
	if b := first["old-migration"]; b.Verdict != predict.BundledWillNotRun || !strings.Contains(b.Reason, "(succeeded") {
		t.Errorf("step to 2.0.0: old-migration %+v, want will-not-run (the live cluster has it)", b)
	}
	if b := last["widgets-migration"]; b.Verdict != predict.BundledWillNotRun || !strings.Contains(b.Reason, "applied by the upgrade to 2.0.0 earlier in this plan") {
		t.Errorf("step to 3.0.0: widgets-migration %+v, want will-not-run (applied at the step to 2.0.0)", b)
	}
	if len(src.loads) != 3 {
		t.Errorf("loads %v, want each version once", src.loads)
	}
}
