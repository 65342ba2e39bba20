package cli

import (
	"bytes"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
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
				After:   []plan.CRDState{{Name: hr, StorageVersion: "v1", StoredVersions: []string{"v1"}}},
				Because: []plan.Cause{{CRD: hr, Verdict: "migrate", Reason: "stored v1beta2 dropped by the incoming CRD: migrate objects to v1 and prune storedVersions first"}}},
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
	p := goldenNoPath()
	if err := output.Write(&b, output.Text, p, planText(p, hr)); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "plan-nopath.txt", b.String())
}

// TestPlanGoldenDeniedByPolicy: a target only an admission policy blocks, and a rollback
// target the policy denies, each with the policy's message and way on.
func TestPlanGoldenDeniedByPolicy(t *testing.T) {
	p := goldenPolicyPlan()
	if !p.DeniedByPolicy() {
		t.Fatal("the plan is not denied by policy")
	}
	for _, f := range []string{"text", "json"} {
		var b bytes.Buffer
		if err := output.Write(&b, f, p, planText(p, nil)); err != nil {
			t.Fatal(err)
		}
		checkGolden(t, "plan-policy."+map[string]string{"text": "txt", "json": "json"}[f], b.String())
	}
}

// goldenPolicyPlan is a plan whose target only an admission policy blocks, with a rollback
// target the policy denies and one reachable after a step.
func goldenPolicyPlan() *plan.Plan {
	const policy, gw = "safe-upgrades.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io"
	d := admissionpolicy.Denial{Policy: policy, Binding: policy, Operation: admissionregistrationv1.Update, Reason: "Invalid",
		Message: "Installing CRDs with version before v1.5.0 is prohibited by default.",
		WayOn: admissionpolicy.WayOn{Kind: admissionpolicy.WayDocumented, Advice: "delete the policy first, then roll back",
			Command: "kubectl delete validatingadmissionpolicy " + policy, Source: "https://example.com/CHANGELOG.md"}}
	reason := "ValidatingAdmissionPolicy " + policy + " (binding " + policy + ") denies the write: " + d.Message
	return &plan.Plan{Release: "gw", Namespace: "gw", From: "1.0.0", Target: "2.0.0", Steps: []plan.Step{},
		Blocking: []plan.Blocker{{Version: "2.0.0", CRD: gw, Verdict: "policy", Reason: reason, Policies: []admissionpolicy.Denial{d}}},
		Rollbacks: []plan.Rollback{
			{Revision: 2, ChartVersion: "0.9.5", Status: "superseded", Reach: plan.ReachableAfterSteps,
				Steps: []string{cmdline.ReverseMigration{Release: "gw", Namespace: "gw", Revision: 2}.String(),
					cmdline.HelmRollback{Release: "gw", Namespace: "gw", Revision: 2}.String()}},
			{Revision: 1, ChartVersion: "0.9.0", Status: "superseded", Reach: plan.DeniedByPolicy,
				Denied: []string{gw}, Policies: []admissionpolicy.Denial{d}}},
		ChartLoads: 2, VersionsConsidered: 1,
	}
}

// goldenNoPath is a plan that finds no path: a bridge with no stepping stone.
func goldenNoPath() *plan.Plan {
	return &plan.Plan{Release: "flux-system-flux", Namespace: "flux-system", From: "2.12.0", Target: "2.18.2",
		Blocking: []plan.Blocker{{Version: "2.18.2", CRD: "buckets.source.toolkit.fluxcd.io", Verdict: "bridge", Reason: "live storage version v1beta2 is dropped",
			Action: "go through a chart version whose CRD serves v1beta2 and stores at one of [v1]: upgrade to it, migrate, then upgrade to 2.18.2"}}}
}
