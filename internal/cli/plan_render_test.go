package cli

import (
	"bytes"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
)

func goldenPlan() *plan.Plan {
	const hr = "helmrepositories.source.toolkit.fluxcd.io"
	return &plan.Plan{
		Release: "flux", Namespace: "flux-system", Chart: "flux2", From: "2.12.0", Target: "2.18.2", Reachable: true,
		Steps: []plan.Step{
			{Kind: plan.Upgrade, ChartVersion: "2.17.2", CRDs: []string{hr},
				Commands: []string{"helm upgrade flux flux2 --repo https://charts.example.com --version 2.17.2 -n flux-system"},
				After:    []plan.CRDState{{Name: hr, StorageVersion: "v1", StoredVersions: []string{"v1beta2", "v1"}}}},
			{Kind: plan.Migrate, CRDs: []string{hr}, Objects: 143, Commands: []string{"upgradeguard migrate --crd " + hr},
				After: []plan.CRDState{{Name: hr, StorageVersion: "v1", StoredVersions: []string{"v1"}}}},
			{Kind: plan.Upgrade, ChartVersion: "2.18.2", CRDs: []string{hr},
				Commands: []string{"helm upgrade flux flux2 --repo https://charts.example.com --version 2.18.2 -n flux-system"},
				After:    []plan.CRDState{{Name: hr, StorageVersion: "v1", StoredVersions: []string{"v1"}}}},
		},
		Blocking: []plan.Blocker{{Version: "2.18.2", CRD: hr, Verdict: "bridge", Reason: "live storage version v1beta2 is dropped by the incoming CRD ([v1])"}},
		Latest: &plan.Latest{Newest: "2.18.2", DirectlySafe: "2.17.2", Blocked: []plan.Blocker{
			{Version: "2.18.2", CRD: hr, Verdict: "bridge", Reason: "live storage version v1beta2 is dropped by the incoming CRD ([v1])"}}},
		Rollbacks: []plan.Rollback{{Revision: 1, ChartVersion: "2.11.0", Status: "superseded", Reach: plan.ReachableNow, Steps: []string{"helm rollback flux 1 -n flux-system"}}},
		KeepsRollback: &plan.Rollback{Revision: 2, ChartVersion: "2.12.0", Status: "deployed", Reach: plan.Unreachable,
			Why: []string{hr + ": live storage version v1 is dropped by the incoming CRD ([v1beta1 v1beta2])"}},
		ChartLoads: 6, VersionsConsidered: 5,
	}
}

func TestPlanGolden(t *testing.T) {
	for _, f := range []string{"text", "json"} {
		var b bytes.Buffer
		p := goldenPlan()
		if err := output.Write(&b, f, p, planText(p, nil)); err != nil {
			t.Fatal(err)
		}
		checkGolden(t, "plan-multistep."+map[string]string{"text": "txt", "json": "json"}[f], b.String())
	}
	var b bytes.Buffer
	hr := &plan.HelmRelease{Name: "flux", Namespace: "flux-system", Release: "flux-system-flux"}
	p := &plan.Plan{Release: "flux-system-flux", Namespace: "flux-system", From: "2.12.0", Target: "2.18.2",
		Blocking: []plan.Blocker{{Version: "2.18.2", CRD: "buckets.source.toolkit.fluxcd.io", Verdict: "bridge", Reason: "live storage version v1beta2 is dropped"}}}
	if err := output.Write(&b, output.Text, p, planText(p, hr)); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "plan-nopath.txt", b.String())
}
