package cli

import (
	"bytes"
	"io"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/releasediff"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

// goldenCase is one command's output for one result, in both formats: NAME.txt and
// NAME.json in testdata/ (go test ./internal/cli -run TestGolden -update rewrites them).
type goldenCase struct {
	name string
	v    any
	text func(io.Writer) error
}

func TestGolden(t *testing.T) {
	var cases []goldenCase
	for _, f := range []func() []goldenCase{migrateGolden, diffFailedGolden, releaseMigrateGolden, slotsGolden, rbacGolden, versionGolden, crdGolden} {
		cases = append(cases, f()...)
	}
	for _, tc := range cases {
		for _, format := range []string{output.Text, output.JSON} {
			file := tc.name + map[string]string{output.Text: ".txt", output.JSON: ".json"}[format]
			t.Run(file, func(t *testing.T) {
				var buf bytes.Buffer
				if err := output.Write(&buf, format, tc.v, tc.text); err != nil {
					t.Fatal(err)
				}
				checkGolden(t, file, buf.String())
			})
		}
	}
}

func migrateGolden() []goldenCase {
	done := &migrateOutput{CRDs: []*migrate.Result{
		{Name: "helmrepositories.source.toolkit.fluxcd.io", Status: migrate.Migrated, StorageVersion: "v1",
			StoredVersionsBefore: []string{"v1beta2", "v1"}, StoredVersionsAfter: []string{"v1"}, Objects: 120, Rewritten: 118,
			AlreadyCurrent: 1, Deleted: 1, Failed: []migrate.ObjectError{}, DurationSeconds: 1.2345},
		{Name: "buckets.source.toolkit.fluxcd.io", Status: migrate.Incomplete, StorageVersion: "v1",
			StoredVersionsBefore: []string{"v1beta2", "v1"}, StoredVersionsAfter: []string{"v1beta2", "v1"}, Objects: 3, Rewritten: 2,
			Failed: []migrate.ObjectError{{Object: "apps/cache", Error: "rejected as invalid (422): spec.interval: Required value"}}, FailedCount: 1,
			DurationSeconds: 0.5, Resumed: true,
			Message: "1 objects could not be migrated: storedVersions untouched; fix them and run again"},
		{Name: "gadgets.example.com", Status: migrate.Incomplete, StorageVersion: "v1", StorageSwitchedFrom: "v2",
			StoredVersionsBefore: []string{"v1", "v2"}, StoredVersionsAfter: []string{"v1", "v2"}, Failed: []migrate.ObjectError{},
			Forbidden: true, Message: "stopped: not allowed to patch gadgets.example.com: storedVersions untouched"},
	}, Blocked: []check.CRDReport{{Decision: predict.Decision{Name: "compositions.apiextensions.crossplane.io", Verdict: predict.Bridge,
		Reason: "the live storage version v1alpha1 is dropped"}, Action: "upgrade to chart version 1.14.0 first"}}}
	dry := &migrateOutput{CRDs: []*migrate.Result{{Name: "externalsecrets.external-secrets.io", Status: migrate.WouldMigrate, StorageVersion: "v1beta1",
		StoredVersionsBefore: []string{"v1alpha1", "v1beta1"}, StoredVersionsAfter: []string{"v1alpha1", "v1beta1"}, Objects: 20000,
		Failed: []migrate.ObjectError{}, EstimatedSeconds: 200}}}
	none := &migrateOutput{CRDs: []*migrate.Result{}}
	builtin := &migrateOutput{CRDs: []*migrate.Result{
		{Name: "helmrepositories.source.toolkit.fluxcd.io", Status: migrate.Migrated, StorageVersion: "v1",
			StoredVersionsBefore: []string{"v1beta2", "v1"}, StoredVersionsAfter: []string{"v1"}, Objects: 120, Failed: []migrate.ObjectError{},
			DurationSeconds: 4.5, Engine: migrate.EngineBuiltin,
			EngineReason:            "auto: may not patch helmrepositories.source.toolkit.fluxcd.io but may create StorageVersionMigrations (storagemigration.k8s.io/v1; SelfSubjectAccessReview)",
			StorageVersionMigration: "upgradeguard-helmrepositories.source.toolkit.fluxcd.io-x7k2q", PrunedBy: migrate.PrunedByServer,
			Message: "the built-in migrator re-persisted every object; the server pruned storedVersions"},
		{Name: "widgets.example.com", Status: migrate.Incomplete, StorageVersion: "v1",
			StoredVersionsBefore: []string{"v1alpha1", "v1"}, StoredVersionsAfter: []string{"v1alpha1", "v1"}, Failed: []migrate.ObjectError{},
			DurationSeconds: 61, Engine: migrate.EngineBuiltin, EngineReason: "asked for (--engine builtin); storagemigration.k8s.io/v1 served",
			StorageVersionMigration: "upgradeguard-widgets.example.com-p4m9d",
			BuiltinFailure:          "Failed=True, reason StorageVersionMigrationFailed: migration encountered unhandled error: resource does not exist in GC",
			Message: "the built-in migrator failed: StorageVersionMigration upgradeguard-widgets.example.com-p4m9d condition Failed=True, reason " +
				"StorageVersionMigrationFailed: migration encountered unhandled error: resource does not exist in GC; widgets.example.com converts between " +
				"versions with a conversion webhook (service widgets/converter), which every object stored at another version goes through: check that it " +
				"answers: storedVersions left as they were (the server had pruned them to [v1] although the migration failed; upgradeguard restored " +
				"[v1alpha1 v1]); fix the cause and run again"},
	}}
	refused, allowed := fieldLossGolden()
	return []goldenCase{{"migrate", done, done.text}, {"migrate-dry-run", dry, dry.text}, {"migrate-nothing", none, none.text},
		{"migrate-builtin", builtin, builtin.text}, {"migrate-field-loss-refused", refused, refused.text}, {"migrate-field-loss-allowed", allowed, allowed.text}}
}

// fieldLossGolden are a migration refused for the fields it would drop (the Flux
// helm-controller v0.37.4 -> v1.0.0 case) and the same one run with --allow-field-loss.
func fieldLossGolden() (refused, allowed *migrateOutput) {
	const hr = "helmreleases.helm.toolkit.fluxcd.io"
	loss := func() *crdschema.Report {
		return &crdschema.Report{Reads: []crdschema.Read{{ReadAt: "v2beta2", Against: "v2"}}, Objects: 12, Pruned: []crdschema.PathCount{
			{Path: "spec.chart.spec.valuesFile", Version: "v2", Objects: 5, Examples: []string{"apps/api", "apps/web", "team-a/cache"}},
			{Path: "status.lastAppliedRevision", Version: "v2", Objects: 1, Examples: []string{"apps/web"}},
		}}
	}
	refused = &migrateOutput{CRDs: []*migrate.Result{{Name: hr, Status: migrate.Incomplete, StorageVersion: "v2",
		StoredVersionsBefore: []string{"v2beta2", "v2"}, StoredVersionsAfter: []string{"v2beta2", "v2"}, Failed: []migrate.ObjectError{},
		DurationSeconds: 0.05, FieldLoss: loss(), FieldLossRefused: true,
		Message: "refused: re-writing the objects stored at v2beta2 as v2 would permanently drop fields the v2 schema does not declare: " +
			"spec.chart.spec.valuesFile (5 objects, e.g. apps/api, apps/web, team-a/cache); status.lastAppliedRevision (1 objects, e.g. apps/web). " +
			"Nothing was written and storedVersions is untouched. To keep the fields, add them to the v2 schema of the CRD (or mark their parent " +
			"x-kubernetes-preserve-unknown-fields) and migrate again; if losing them is intended, migrate again allowing the loss, " +
			"or annotate the CRD upgradeguard.io/allow-field-loss=true. See " + migrate.FieldLossRunbook}}}
	allowed = &migrateOutput{CRDs: []*migrate.Result{{Name: hr, Status: migrate.Migrated, StorageVersion: "v2",
		StoredVersionsBefore: []string{"v2beta2", "v2"}, StoredVersionsAfter: []string{"v2"}, Objects: 12, Rewritten: 12, Failed: []migrate.ObjectError{},
		DurationSeconds: 0.4, Engine: migrate.EngineClient, EngineReason: "asked for (--engine client)", FieldLoss: loss()}}}
	return refused, allowed
}

func diffFailedGolden() []goldenCase {
	yes, no := true, false
	rep := &releasediff.Report{Release: "app", Namespace: "apps", FailedRevision: 3, FailedStatus: "failed", PreviousRevision: 2,
		Objects: []releasediff.Object{
			{Object: "ConfigMap/apps/settings", Change: releasediff.Changed, Verdict: releasediff.Failed, Landed: &yes},
			{Object: "Deployment/apps/web", Change: releasediff.Changed, Verdict: releasediff.Previous, Landed: &no,
				Differs: []string{"spec.template.spec.containers[name=web].resources.limits.cpu"}},
			{Object: "Service/apps/web", Change: releasediff.Same, Verdict: releasediff.Unchanged},
			{Object: "Secret/apps/token", Change: releasediff.Added, Verdict: releasediff.Missing},
		},
		Landed: []string{"ConfigMap/apps/settings"}, NotLanded: []string{"Deployment/apps/web"}, Drifted: []string{"Secret/apps/token"}, Mixed: true,
		StoredVersionsRejected: []crdversions.StoredVersionRejection{}}
	text := func(w io.Writer) error { return renderDiffFailed(w, rep) }
	// The Flux incident on Kubernetes 1.32: the API server refuses the CRD that drops
	// v1beta2, in the wording up to 1.32; the rest of the upgrade landed.
	const buckets = "buckets.source.toolkit.fluxcd.io"
	rej := crdversions.StoredVersionRejection{CRD: buckets, Version: "v1beta2", Wording: crdversions.WordingMustAppear,
		Message: `status.storedVersions[0]: Invalid value: "v1beta2": must appear in spec.versions`}
	rejected := &releasediff.Report{Release: "flux", Namespace: "flux-system", FailedRevision: 3, FailedStatus: "failed", PreviousRevision: 2,
		Objects: []releasediff.Object{
			{Object: "CustomResourceDefinition/" + buckets, Change: releasediff.Changed, Verdict: releasediff.Previous, Landed: &no,
				Rejected: []crdversions.StoredVersionRejection{rej}},
			{Object: "Deployment/flux-system/source-controller", Change: releasediff.Changed, Verdict: releasediff.Failed, Landed: &yes},
		},
		Landed: []string{"Deployment/flux-system/source-controller"}, NotLanded: []string{"CustomResourceDefinition/" + buckets}, Drifted: []string{},
		Mixed: true, StoredVersionsRejected: []crdversions.StoredVersionRejection{rej}}
	rejectedText := func(w io.Writer) error { return renderDiffFailed(w, rejected) }
	return []goldenCase{{"diff-failed-mixed", rep, text}, {"diff-failed-storedversions", rejected, rejectedText}}
}

func releaseMigrateGolden() []goldenCase {
	plan := &chartmigrate.Plan{Release: "db", Namespace: "data", Revision: 4, OldChart: "olddb-1.2.0", NewRelease: "newdb", NewChart: "newdb",
		NewChartVersion: "2.1.0",
		Volumes: []chartmigrate.Volume{{OldPVC: "data-db-0", NewPVC: "data-newdb-0", PV: "pv-1", PVUID: "1111", Source: "csi:disk-1",
			ReclaimPolicy: "Delete", StorageClass: "standard", Capacity: "10Gi",
			OldStatefulSet: &chartmigrate.STSRef{Name: "db", Template: "data", Ordinal: 0}, NewStatefulSet: &chartmigrate.STSRef{Name: "newdb", Template: "data", Ordinal: 0}}},
		Secrets:   []chartmigrate.Secret{{Old: "db-credentials", New: "newdb-credentials", Type: "Opaque", Keys: []string{"password", "username"}}},
		FreshPVCs: []string{"newdb-wal"}, ClaimDeletes: []string{"PersistentVolumeClaim/data/data-db-0"},
		Deletes: []string{"StatefulSet/data/db", "Secret/data/db-credentials"}, Kept: []string{"ConfigMap/data/db-settings"},
		Findings: []chartmigrate.Finding{{Check: chartmigrate.CheckStorageClass, Subject: "PersistentVolumeClaim/data/data-db-0",
			Message: "the new claim asks for class fast", Remediation: "set the new chart's storage class to standard", Severity: finding.Blocking}},
		Steps: []string{"1. backup Secret db-credentials, PVC data-db-0 and PV pv-1 to the backup directory", "2. patch PV pv-1 to reclaimPolicy Retain"}}
	blocked := &releaseMigrateOutput{Plan: plan}
	safePlan := *plan
	safePlan.Findings, safePlan.Safe = []chartmigrate.Finding{}, true
	planned := &releaseMigrateOutput{Plan: &safePlan}
	result := &releaseMigrateOutput{Plan: &safePlan, Result: &chartmigrate.Result{Plan: &safePlan,
		Steps: []chartmigrate.StepResult{{Step: chartmigrate.StepBackup, Status: "skipped", Detail: "done in an earlier run"},
			{Step: chartmigrate.StepInstall, Status: "done", Detail: "release newdb installed"}},
		Volumes: []chartmigrate.VolumeCheck{{PVC: "data-newdb-0", PV: "pv-1", PVUID: "1111", Source: "csi:disk-1", Bound: true, SameUID: true, SameData: true,
			StatefulSet: "newdb", StatefulSetUses: true}},
		Secrets: []chartmigrate.SecretCheck{{Secret: "newdb-credentials", SameData: true}}, Done: true}}
	return []goldenCase{{"release-migrate-plan-blocked", blocked, blocked.text}, {"release-migrate-plan", planned, planned.text},
		{"release-migrate-executed", result, result.text}}
}

func slotsGolden() []goldenCase {
	refs := []slots.Ref{
		{Ref: "release-1.5", Commit: "0123456789abcdef0123456789abcdef01234567", TargetVersion: 46, Slots: map[int]string{44: "aa", 45: "bb"}},
		{Ref: "release-1.6", Commit: "fedcba9876543210fedcba9876543210fedcba98", TargetVersion: 54, Slots: map[int]string{44: "aa", 45: "cc", 46: "dd"}},
	}
	claimed := &slots.Report{Refs: refs, LowestTarget: 46, Findings: []slots.Misalignment{{Finding: finding.Finding{Check: string(slots.Claimed), Subject: "slot 45", Severity: finding.Danger,
		Message: "release-1.5 raised targetVersion to 46, claiming slot 45, which release-1.6 uses for a different migration"}, Slot: 45,
		Hashes: map[string]string{"release-1.5": "bb00000000000000000000", "release-1.6": "cc00000000000000000000"}}}}
	aligned := &slots.Report{Refs: refs, LowestTarget: 45, Findings: []slots.Misalignment{}}
	return []goldenCase{
		{"slots-claimed", claimed, func(w io.Writer) error { return renderSlots(w, claimed) }},
		{"slots-aligned", aligned, func(w io.Writer) error { return renderSlots(w, aligned) }},
	}
}

func rbacGolden() []goldenCase {
	crd := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "helmrepositories.source.toolkit.fluxcd.io"},
		Spec: apiextv1.CustomResourceDefinitionSpec{Group: "source.toolkit.fluxcd.io", Names: apiextv1.CustomResourceDefinitionNames{Plural: "helmrepositories"}}}
	p := migrate.RBAC("upgradeguard-migrate", "flux-system", []*apiextv1.CustomResourceDefinition{crd}, false)
	out := &rbacOutput{policy: p, crds: 1, leaseNamespace: "flux-system"}
	b := migrate.BuiltinRBAC("upgradeguard-migrate", "flux-system", []*apiextv1.CustomResourceDefinition{crd}, false)
	bout := &rbacOutput{policy: b, crds: 1, leaseNamespace: "flux-system", engine: migrate.EngineBuiltin}
	return []goldenCase{{"rbac", p, out.text}, {"rbac-builtin", b, bout.text}}
}

func versionGolden() []goldenCase {
	v := BuildInfo{Version: "v1.2.3", Commit: "0123456789abcdef0123456789abcdef01234567",
		BuildDate: "2026-12-01T12:00:00Z", GoVersion: "go1.26.8", Platform: "linux/amd64"}
	return []goldenCase{{"version", v, v.text}}
}
