package cli

import (
	"bytes"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/internal/output/citest"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/releasediff"
)

// TestCIGolden: plan and the release pre-flights speak CI. Each result's pull-request
// comment against NAME.md in testdata/ (go test ./internal/cli -run TestCIGolden -update
// rewrites them); its SARIF is valid 2.1.0 with a result per finding, its ruleId the check
// ID; its JUnit parses with a case per subject judged, failing on what fails the run.
func TestCIGolden(t *testing.T) {
	const hr = "helmrepositories.source.toolkit.fluxcd.io"
	cases := []struct {
		name         string
		report       func() finding.Report
		sarif, junit []string
	}{
		{"plan-multistep", goldenPlan().FindingReport,
			[]string{"bridge warning " + hr, "migrate warning " + hr, "latest note chart version 2.18.2", "rollback-unreachable warning " + hr},
			[]string{"Release/flux-system/flux: 2.12.0 → 2.18.2 directly out", "Release/flux-system/flux: 2.12.0 → 2.17.2",
				"Release/flux-system/flux: 2.17.2 → 2.18.2 out", "Release/flux-system/flux: newest version 2.18.2 out",
				"Release/flux-system/flux: rollback to revision 1 (chart 2.11.0)",
				"Release/flux-system/flux: after the plan, rollback to revision 2 (chart 2.12.0) out"}},
		{"plan-policy", goldenPolicyPlan().FindingReport,
			[]string{"policy error gateways.gateway.networking.k8s.io", "rollback-reachable-after-steps warning Release/gw/gw",
				"rollback-denied-by-policy warning Release/gw/gw"},
			[]string{"Release/gw/gw: 1.0.0 → 2.0.0 FAIL policy", "Release/gw/gw: rollback to revision 2 (chart 0.9.5) out",
				"Release/gw/gw: rollback to revision 1 (chart 0.9.0) out"}},
		{"plan-nopath", goldenNoPath().FindingReport,
			[]string{"bridge error buckets.source.toolkit.fluxcd.io"},
			[]string{"Release/flux-system/flux-system-flux: 2.12.0 → 2.18.2 FAIL bridge"}},
		{"rollback-check-not-reverted", goldenRollback().FindingReport,
			[]string{"not-reverted error ConfigMap/apps/cfg", "taken-over-by-release error ConfigMap/apps/shared"},
			[]string{"rollback-check: Release/apps/app FAIL not-reverted,taken-over-by-release"}},
		{"apply-check-fails", goldenApplyCheck().FindingReport,
			[]string{"field-conflict error Deployment/tenant-d/client-jobs-manager"},
			[]string{"apply-check: Release/tenant-d/client FAIL field-conflict"}},
		{"apply-check-client-side-flag-error", goldenClientSideFlagError().FindingReport,
			[]string{"flag-error error Release/web/web"},
			[]string{"apply-check: Release/web/web FAIL flag-error"}},
		{"diff-failed-storedversions", diffFailedGolden()[1].v.(*releasediff.Report).FindingReport,
			[]string{"half-applied error Release/flux-system/flux", "storedversions-rejected error CustomResourceDefinition/buckets.source.toolkit.fluxcd.io"},
			[]string{"diff-failed: Release/flux-system/flux FAIL half-applied,storedversions-rejected"}},
		{"release-migrate-plan-blocked", releaseMigrateGolden()[0].v.(*releaseMigrateOutput).Plan.FindingReport,
			[]string{"storage-class-mismatch error PersistentVolumeClaim/data/data-db-0"},
			[]string{"release-migrate: Release/data/db FAIL storage-class-mismatch"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkGolden(t, tc.name+".md", ciRender(t, output.Markdown, tc.report))
			if diff := cmp.Diff(tc.sarif, citest.SARIF(t, ciRender(t, output.SARIF, tc.report))); diff != "" {
				t.Errorf("SARIF results (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.junit, citest.JUnit(t, ciRender(t, output.JUnit, tc.report))); diff != "" {
				t.Errorf("JUnit cases (-want +got):\n%s", diff)
			}
		})
	}
}

func ciRender(t *testing.T, format string, report func() finding.Report) string {
	t.Helper()
	var b bytes.Buffer
	text := func(io.Writer) error { t.Errorf("-o %s rendered text", format); return nil }
	if err := output.WriteReport(&b, format, nil, text, report); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
