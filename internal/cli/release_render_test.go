package cli

import (
	"bytes"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// goldenApplyCheck is the seed's incident: kubectl patch owns the jobs-manager CPU limit,
// in the middle of the apply order.
func goldenApplyCheck() *applyCheckOutput {
	conflict := `conflict occurred while applying object tenant-d/client-jobs-manager apps/v1, Kind=Deployment: Apply failed with 1 conflict: ` +
		`conflict with "kubectl-patch" using apps/v1: .spec.template.spec.containers[name="api"].resources.limits.cpu`
	return &applyCheckOutput{
		command: []string{"client", "./chart", "-n", "tenant-d"},
		Prediction: &applycheck.Prediction{ReleaseReport: &applycheck.ReleaseReport{Release: "client", Namespace: "tenant-d", From: 2,
			Mode: applycheck.ResolveMode(applycheck.OpUpgrade, applycheck.Flags{}, 2, applycheck.MethodSSA),
			Apply: &applycheck.Report{
				HelmVersions: applycheck.HelmVersions, Operation: applycheck.OpUpgrade, Method: applycheck.MethodSSA, FieldManager: "helm", Result: applycheck.Fails,
				Objects: []applycheck.Object{
					{Object: "Secret/tenant-d/client-secrets", Step: applycheck.Apply, Outcome: applycheck.Unchanged},
					{Object: "ConfigMap/tenant-d/client-settings", Step: applycheck.Apply, Outcome: applycheck.Updated},
					{Object: "Deployment/tenant-d/client-jobs-manager", Step: applycheck.Apply, Outcome: applycheck.Conflict, Error: conflict,
						Conflicts: []applycheck.FieldConflict{{Field: `.spec.template.spec.containers[name="api"].resources.limits.cpu`, Manager: "kubectl-patch"}}},
					{Object: "StatefulSet/tenant-d/client-mysql", Step: applycheck.Apply, Outcome: applycheck.Updated},
					{Object: "CronJob/tenant-d/client-backup", Step: applycheck.Create, Outcome: applycheck.Created},
					{Object: "CronJob/tenant-d/client-image-refresh", Step: applycheck.Apply, Outcome: applycheck.Unchanged},
					{Object: "ConfigMap/tenant-d/client-legacy", Step: applycheck.Delete, Outcome: applycheck.NotDeleted,
						Note: "Helm deletes dropped objects only when every apply and create succeeded"},
				},
				Failing:   []string{"Deployment/tenant-d/client-jobs-manager"},
				Landed:    []string{"ConfigMap/tenant-d/client-settings", "StatefulSet/tenant-d/client-mysql", "CronJob/tenant-d/client-backup"},
				NotLanded: []string{"Deployment/tenant-d/client-jobs-manager", "ConfigMap/tenant-d/client-legacy"},
				Error:     conflict,
				Record: applycheck.Record{Revision: 5, Status: "failed", Description: `Upgrade "client" failed: ` + conflict, Previous: 4,
					PreviousStatus: "deployed"},
				PreUpgradeHooks: []string{"Job/client-migrate"}, PostUpgradeHooks: []string{"Job/client-smoke-test"},
			}},
			CRDCheck: &check.Report{Operation: predict.Upgrade, Safe: true, Release: "client", Namespace: "tenant-d", Chart: "client",
				ChartVersion: "1.1.0", FromRevision: 4, CRDs: []check.CRDReport{}, NextSteps: []string{}},
		},
	}
}

func TestRenderApplyCheckGolden(t *testing.T) {
	safe := &applyCheckOutput{
		command: []string{"web", "./chart", "-n", "web"},
		Prediction: &applycheck.Prediction{ReleaseReport: &applycheck.ReleaseReport{Release: "web", Namespace: "web", From: 2,
			Mode: applycheck.ResolveMode(applycheck.OpUpgrade, applycheck.Flags{}, 2, applycheck.MethodSSA),
			Apply: &applycheck.Report{
				HelmVersions: applycheck.HelmVersions, Operation: applycheck.OpUpgrade, Method: applycheck.MethodSSA, FieldManager: "helm-controller", Force: true, Safe: true, Result: applycheck.Succeeds,
				Objects: []applycheck.Object{
					{Object: "ConfigMap/web/settings", Step: applycheck.Apply, Outcome: applycheck.Updated},
					{Object: "ConfigMap/web/old", Step: applycheck.Delete, Outcome: applycheck.Deleted},
					{Object: "PersistentVolumeClaim/web/data", Step: applycheck.Delete, Outcome: applycheck.Kept, Note: "the live object carries helm.sh/resource-policy: keep"},
				},
				Failing: []string{}, Landed: []string{}, NotLanded: []string{}, PreUpgradeHooks: []string{}, PostUpgradeHooks: []string{},
				Record: applycheck.Record{Revision: 3, Status: "deployed", Previous: 2, PreviousStatus: "superseded"},
			}},
			CRDCheck: &check.Report{Operation: predict.Upgrade, Safe: true, Release: "web", Namespace: "web", Chart: "web",
				ChartVersion: "2.0.0", FromRevision: 2, CRDs: []check.CRDReport{}, NextSteps: []string{}},
			Safe: true,
		},
	}
	refused := &applyCheckOutput{
		command: []string{"web", "./chart", "-n", "web"},
		Prediction: &applycheck.Prediction{ReleaseReport: &applycheck.ReleaseReport{Release: "web", Namespace: "web", From: 2,
			Mode: applycheck.ResolveMode(applycheck.OpUpgrade, applycheck.Flags{}, 2, applycheck.MethodSSA),
			Apply: &applycheck.Report{
				HelmVersions: applycheck.HelmVersions, Operation: applycheck.OpUpgrade, Method: applycheck.MethodSSA, FieldManager: "helm", Result: applycheck.Refused,
				Objects: []applycheck.Object{{Object: "ConfigMap/web/b", Step: applycheck.Create, Outcome: applycheck.CannotImport,
					Error: `ConfigMap "b" in namespace "web" exists and cannot be imported into the current release: invalid ownership metadata; ` +
						`label validation error: missing key "app.kubernetes.io/managed-by": must be set to "Helm"`}},
				Failing: []string{"ConfigMap/web/b"}, Landed: []string{}, NotLanded: []string{}, PreUpgradeHooks: []string{}, PostUpgradeHooks: []string{},
				Error: `unable to continue with update: ConfigMap "b" in namespace "web" exists and cannot be imported into the current release: ` +
					`invalid ownership metadata; label validation error: missing key "app.kubernetes.io/managed-by": must be set to "Helm"`,
				Record: applycheck.Record{Previous: 2, PreviousStatus: "deployed"},
			}},
			CRDCheck: &check.Report{Operation: predict.Upgrade, Safe: true, Release: "web", Namespace: "web", Chart: "web",
				ChartVersion: "2.0.0", FromRevision: 2, CRDs: []check.CRDReport{}, NextSteps: []string{}},
		},
	}
	cases := []struct {
		name   string
		format string
		rep    *applyCheckOutput
	}{
		{"apply-check-fails.txt", "text", goldenApplyCheck()},
		{"apply-check-fails.json", "json", goldenApplyCheck()},
		{"apply-check-safe.txt", "text", safe},
		{"apply-check-refused.txt", "text", refused},
		{"apply-check-client-side-flag-error.txt", "text", goldenClientSideFlagError()},
		{"rollback-check-not-reverted.txt", "text", goldenRollback()},
		{"rollback-check-not-reverted.json", "json", goldenRollback()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := output.Write(&buf, tc.format, tc.rep, tc.rep.text); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name, buf.String())
		})
	}
}

// goldenClientSideFlagError is kubermatic#16209: --force-conflicts on a release Helm 3
// installed, with the server-side prediction of the move.
func goldenClientSideFlagError() *applyCheckOutput {
	flags := applycheck.Flags{ForceConflicts: true}
	mode := applycheck.ResolveMode(applycheck.OpUpgrade, flags, 1, "")
	notReached := func(o string, dry applycheck.Outcome) applycheck.Object {
		return applycheck.Object{Object: o, Step: applycheck.Apply, Outcome: applycheck.NotReached, DryRun: dry,
			Note: "Helm stops at the flag error before it applies anything"}
	}
	return &applyCheckOutput{
		command: []string{"web", "./chart", "-n", "web"},
		Prediction: &applycheck.Prediction{ReleaseReport: &applycheck.ReleaseReport{Release: "web", Namespace: "web", From: 1, Mode: mode,
			Apply: &applycheck.Report{HelmVersions: applycheck.HelmVersions, Operation: applycheck.OpUpgrade, Method: applycheck.MethodCSA, FieldManager: "helm",
				Result: applycheck.Fails, Error: mode.FlagError,
				Objects: []applycheck.Object{notReached("ConfigMap/web/settings", applycheck.Updated), notReached("Deployment/web/web", applycheck.Failed)},
				Failing: []string{}, Landed: []string{}, NotLanded: []string{"ConfigMap/web/settings", "Deployment/web/web"},
				Record:          applycheck.Record{Revision: 2, Status: "failed", Description: `Upgrade "web" failed: ` + mode.FlagError, Previous: 1, PreviousStatus: "deployed"},
				PreUpgradeHooks: []string{}, PostUpgradeHooks: []string{}},
			ServerSide: &applycheck.Report{HelmVersions: applycheck.HelmVersions, Operation: applycheck.OpUpgrade, Method: applycheck.MethodSSA, FieldManager: "helm",
				Result: applycheck.Fails,
				Error:  `conflict occurred while applying object web/settings /v1, Kind=ConfigMap: Apply failed with 1 conflict: conflict with "kubectl-patch" using v1: .data.mode`,
				Objects: []applycheck.Object{{Object: "ConfigMap/web/settings", Step: applycheck.Apply, Outcome: applycheck.Conflict,
					Conflicts: []applycheck.FieldConflict{{Field: ".data.mode", Manager: "kubectl-patch"}}, TakenOver: []string{".data.note"}}}},
		},
			CRDCheck: &check.Report{Operation: predict.Upgrade, Safe: true, Release: "web", Namespace: "web", Chart: "web",
				ChartVersion: "2.0.0", FromRevision: 1, CRDs: []check.CRDReport{}, NextSteps: []string{}},
		},
	}
}

// goldenRollback is rancher/fleet#4879: a server-side rollback leaves a field another
// manager took; and the object it deletes was taken over by another release.
func goldenRollback() *applyCheckOutput {
	return &applyCheckOutput{
		command: []string{"app", "1", "-n", "apps"},
		Prediction: &applycheck.Prediction{ReleaseReport: &applycheck.ReleaseReport{Release: "app", Namespace: "apps", From: 2, To: 1,
			Mode: applycheck.ResolveMode(applycheck.OpRollback, applycheck.Flags{}, 1, applycheck.MethodSSA),
			Apply: &applycheck.Report{HelmVersions: applycheck.HelmVersions, Operation: applycheck.OpRollback, Method: applycheck.MethodSSA, FieldManager: "helm",
				Safe: true, Result: applycheck.Succeeds,
				Objects: []applycheck.Object{
					{Object: "ConfigMap/apps/cfg", Step: applycheck.Apply, Outcome: applycheck.Unchanged,
						NotReverted: []applycheck.FieldConflict{{Field: ".data.extra", Manager: "kubectl-patch"}}},
					{Object: "ConfigMap/apps/shared", Step: applycheck.Delete, Outcome: applycheck.Deleted},
				},
				Failing: []string{}, Landed: []string{}, NotLanded: []string{}, PreUpgradeHooks: []string{}, PostUpgradeHooks: []string{},
				Record: applycheck.Record{Revision: 3, Status: "deployed", Previous: 2, PreviousStatus: "superseded"}},
			Prune: &uninstall.Report{Release: "app", Namespace: "apps", HelmVersion: uninstall.PruneHelmVersions,
				Objects: []uninstall.Object{{Subject: "ConfigMap/apps/shared", APIVersion: "v1", Kind: "ConfigMap", Namespace: "apps", Name: "shared",
					Action: uninstall.Delete, Reason: "the new manifest no longer renders it and the live object does not carry helm.sh/resource-policy: keep", Live: true}},
				Findings: []uninstall.Finding{{Check: uninstall.CheckTakenOver, Subject: "ConfigMap/apps/shared", Severity: finding.Danger,
					Message:     "release apps/other has taken it over (its live metadata names that release), but the rollback of app deletes it anyway",
					Remediation: "annotate the live object with helm.sh/resource-policy=keep before the rollback"}},
				Hooks: []string{}, LeftBehind: []string{}},
		},
			CRDCheck: &check.Report{Operation: predict.Rollback, Safe: true, Release: "app", Namespace: "apps", Chart: "app",
				ChartVersion: "1.0.0", FromRevision: 2, ToRevision: 1, CRDs: []check.CRDReport{}, NextSteps: []string{}},
		},
	}
}
