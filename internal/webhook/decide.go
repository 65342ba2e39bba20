package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Labels on a StorageMigration the gate creates, naming its HelmRelease.
const (
	LabelHelmReleaseNamespace = v1alpha1.LabelHelmReleaseNamespace
	LabelHelmReleaseName      = v1alpha1.LabelHelmReleaseName
)

// decision is one answer with what the event, annotation and metric need.
type decision struct {
	kind       kind
	message    string
	warnings   []string
	reason     string // event reason
	migration  string
	created    bool
	operation  predict.Operation
	chart      string
	conditions []metav1.Condition
	noState    bool // leave the conditions as they are (the gate could not decide)
}

func (g *Gate) decide(ctx context.Context, hr *helmv2.HelmRelease, dryRun, valuesOnly bool) decision {
	sms := hrMigrations(g, hr, dryRun)
	sms.readBefore(ctx)
	res, err := runWithin(ctx, func(ctx context.Context) (*fluxrelease.Result, error) {
		return fluxrelease.Check(ctx, fluxrelease.Request{HelmRelease: hr, Reader: g.reader, Local: g.local, Settings: g.settings, Cache: g.cache, Clusters: g.clusters,
			NoObjectCounts: true})
	})
	subjectHR := fmt.Sprintf("HelmRelease %s/%s", hr.Namespace, hr.Name)
	change := "chart change"
	if valuesOnly {
		change = "values change"
	}
	var unsupported *fluxrelease.UnsupportedError
	var values *fluxrelease.ValuesError
	switch {
	case errors.As(err, &values):
		// helm-controller would fail the release with ValuesError: the change cannot
		// succeed as it stands, whether or not the gate runs with AllowOnError.
		msg := fmt.Sprintf("upgradeguard denied the %s of %s (%s): its values cannot be composed as helm-controller composes them. %v; then re-apply the change (Flux retries on its next reconcile)",
			change, subjectHR, fluxrelease.Describe(hr), err)
		return decision{kind: kindInvalid, message: msg, reason: ReasonValuesError, chart: fluxrelease.Describe(hr), noState: true}
	case errors.As(err, &unsupported):
		msg := fmt.Sprintf("upgradeguard did not check the %s of %s: %s", change, subjectHR, unsupported.Reason)
		return decision{kind: kindNotChecked, message: msg, warnings: []string{msg}, reason: ReasonChartChangeNotChecked,
			chart: fluxrelease.Describe(hr), conditions: gate.Unknown(ReasonNotChecked, msg, hr.Generation)}
	case err != nil:
		return g.errored(hr, subjectHR, change, err)
	}

	sms.live = res.LiveCRDs
	d, err := g.judge(ctx, hrDoor(hr, res, valuesOnly, sms), res.Report)
	if err != nil {
		return g.errored(hr, subjectHR, change, err)
	}
	d.operation, d.chart = res.Operation, res.Chart+"@"+res.Version
	d.warnings = append(append(lastAttemptWarnings(hr), remediationWarnings(res)...), schemaWarnings(res.Report)...)
	return d
}

// hrDoor is the door of a HelmRelease's chart (or values) change, predicted as res. The
// HelmRelease update is denied before anything was applied, Flux retries it on its own,
// and a bridge names the HelmRelease's plan command.
func hrDoor(hr *helmv2.HelmRelease, res *fluxrelease.Result, valuesOnly bool, sms *storageMigrations) upgradeDoor {
	what := describeChange(hr, res, valuesOnly)
	dr := upgradeDoor{door: door{change: what, before: beforeApplied, again: "then re-apply the change (Flux retries on its next reconcile)",
		admittedReason: ReasonChartChangeAdmitted, blockedReason: ReasonChartChangeBlocked},
		held:       fmt.Sprintf("%s of HelmRelease %s/%s", what, hr.Namespace, hr.Name),
		retry:      "Flux's retries of this change will then succeed",
		heldReason: ReasonChartChangeHeld, startedReason: ReasonMigrationStarted,
		migrations: sms,
		options: gate.Options{ObservedGeneration: hr.Generation,
			PlanCommand: predict.Command{Kind: predict.CommandPlanHelmRelease, Release: hr.Name, Namespace: hr.Namespace, ChartVersion: res.Report.ChartVersion}.String()}}
	if res.Remote {
		dr.target = fmt.Sprintf(" (against the cluster of the kubeConfig Secret %s/%s)", hr.Namespace, hr.Spec.KubeConfig.SecretRef.Name)
	}
	return dr
}

// describeChange says what the update does to the release, for the messages.
func describeChange(hr *helmv2.HelmRelease, res *fluxrelease.Result, valuesOnly bool) string {
	what := fmt.Sprintf("%s of release %s/%s to chart %s %s", opName(res.Operation), res.StorageNamespace, res.Release, res.Chart, res.Version)
	if res.CurrentVersion != "" {
		what = fmt.Sprintf("%s of release %s/%s from chart %s %s to %s", opName(res.Operation), res.StorageNamespace, res.Release, res.Chart, res.CurrentVersion, res.Version)
	}
	if valuesOnly {
		what = fmt.Sprintf("values change of release %s/%s (chart %s %s)", res.StorageNamespace, res.Release, res.Chart, res.Version)
	}
	if len(hr.Spec.ValuesFrom) > 0 {
		what += " (rendered with values from " + fluxrelease.ValuesSources(hr) + ")"
	}
	return what
}

// lastAttemptWarnings reads helm-controller's conditions on the HelmRelease. When its
// last release or remediation attempt was rejected on status.storedVersions (in either of
// the API server's wordings: up to 1.32 or from 1.33), the warning says so and names the
// CRDs and versions, so the operator knows the change under admission follows a
// rejected one.
func lastAttemptWarnings(hr *helmv2.HelmRelease) []string {
	for _, t := range []string{helmv2.ReleasedCondition, helmv2.RemediatedCondition, "Ready"} {
		c := meta.FindStatusCondition(hr.Status.Conditions, t)
		if c == nil || c.Status != metav1.ConditionFalse {
			continue
		}
		rs := crdversions.StoredVersionRejections(c.Message)
		if len(rs) == 0 {
			continue
		}
		what := make([]string, 0, len(rs))
		for _, r := range rs {
			what = append(what, r.String())
		}
		return []string{fmt.Sprintf("helm-controller's last attempt was rejected by the API server on status.storedVersions (condition %s): %s; this change is checked against the live CRDs as they are now",
			t, strings.Join(what, "; "))}
	}
	return nil
}

// remediationWarnings are the risks of helm-controller's remediation if the upgrade fails.
func remediationWarnings(res *fluxrelease.Result) []string {
	var warnings []string
	if len(res.RemediationRisk) > 0 {
		warnings = append(warnings, fmt.Sprintf("if this upgrade fails after applying its CRDs, helm-controller's rollback remediation would be rejected on %s (the older chart lacks the new storage version); consider spec.upgrade.remediation.retries: 0 for this upgrade, and a reverse migration (%s) before any rollback",
			strings.Join(res.RemediationRisk, ", "), predict.Command{Kind: predict.CommandReverseMigration, Release: res.Release, Namespace: res.StorageNamespace}))
	}
	if len(res.UninstallRisk) > 0 {
		warnings = append(warnings, fmt.Sprintf("if this upgrade fails, helm-controller's uninstall remediation (spec.upgrade.remediation.strategy: uninstall) deletes %s and every object of their types; annotate them helm.sh/resource-policy=keep in the chart, or use the rollback strategy",
			strings.Join(res.UninstallRisk, ", ")))
	}
	return warnings
}

// storageMigrations is the gate's Migrator for HelmReleases: a StorageMigration the
// controller runs, when a StorageMigrationPolicy with autoMigrate selects every CRD.
type storageMigrations struct {
	g    *Gate
	name string
	// labels name what the StorageMigration holds (a HelmRelease or a Helm release);
	// kubeConfig is the target, nil for the local cluster.
	labels     map[string]string
	kubeConfig *v1alpha1.KubeConfigReference
	// holds says what is held until the migration completes, and why (the annotation
	// AnnotationHolds on the StorageMigration).
	holds  string
	live   map[string]*apiextv1.CustomResourceDefinition
	dryRun bool
	// succeededBefore is the UID of the StorageMigration if it had already succeeded
	// when the decision started, before the prediction read the CRDs (readBefore).
	succeededBefore types.UID
}

// readBefore notes whether m's StorageMigration has already succeeded, before the
// prediction reads the CRDs. Only such a one may be replaced by a new migration: one
// that succeeds while the prediction reads (its last CRD pruned between the CRD reads
// and now) has done what the prediction, made partly before it, asks again. Replacing it
// would start a migration of CRDs that need none and hold a safe upgrade; returning it
// holds the change once more, and the retry is decided on the migrated CRDs.
func (m *storageMigrations) readBefore(ctx context.Context) {
	if sm, err := storagemigration.Get(ctx, m.g.reader, m.name); err == nil && sm != nil && storagemigration.Succeeded(sm) {
		m.succeededBefore = sm.UID
	}
}

// AnnotationHolds on a StorageMigration the gate created says what it holds and why:
// the release or HelmRelease whose upgrade waits for it, and what happens next.
const AnnotationHolds = "upgradeguard.io/holds"

// hrMigrations is the Migrator for a HelmRelease's chart change.
func hrMigrations(g *Gate, hr *helmv2.HelmRelease, dryRun bool) *storageMigrations {
	m := &storageMigrations{g: g, name: MigrationName(hr.Namespace, hr.Name), dryRun: dryRun,
		labels: map[string]string{LabelHelmReleaseNamespace: hr.Namespace, LabelHelmReleaseName: labelValue(hr.Name)}}
	if kc := hr.Spec.KubeConfig; kc != nil && kc.SecretRef != nil {
		m.kubeConfig = &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: hr.Namespace, Name: kc.SecretRef.Name, Key: kc.SecretRef.Key}}
	}
	return m
}

func (m *storageMigrations) Migrate(ctx context.Context, crds []string) (*gate.Progress, error) {
	policy, unselected, err := m.g.policyFor(ctx, m.live, crds)
	if err != nil {
		return nil, err
	}
	if policy == nil {
		return m.notAllowed(unselected), nil
	}
	if p, err := m.refusedForFieldLoss(ctx, crds, policy); p != nil || err != nil {
		return p, err
	}
	sm, created, err := m.g.ensureMigration(ctx, m, crds, policy)
	if err != nil {
		return nil, err
	}
	if sm != nil && storagemigration.Failed(sm) {
		return m.failed(m.name, storagemigration.FailureMessage(sm)), nil
	}
	return m.running(crds, created), nil
}

// refusedForFieldLoss judges, before a StorageMigration is created or named, whether the
// migration would drop fields that objects hold and nothing accepts the loss (the
// policy's allowFieldLoss, the CRD's annotation): such a migration is refused, writes
// nothing and would be refused again, so the change must not wait for it. The answer
// then names the fields and the ways on, and no StorageMigration. Only the local
// cluster's objects are read here; a remote target's StorageMigration reports the refusal.
func (m *storageMigrations) refusedForFieldLoss(ctx context.Context, crds []string, policy *v1alpha1.StorageMigrationPolicy) (*gate.Progress, error) {
	if m.kubeConfig != nil || policy.Spec.AllowFieldLoss {
		return nil, nil
	}
	var lister crdschema.Lister
	var refusals []string
	for _, name := range crds {
		crd := m.live[name]
		if crd == nil || migrate.FieldLossAllowed(crd, migrate.Options{}) {
			continue
		}
		if lister == nil {
			dyn, err := dynamic.NewForConfig(m.g.local)
			if err != nil {
				return nil, err
			}
			lister = crdschema.DynamicLister{Client: dyn}
		}
		storage := crdversions.StorageVersion(crd)
		rep, err := migrate.FieldLoss(ctx, lister, crd, storage, 0)
		if err != nil {
			return nil, err
		}
		if rep != nil {
			refusals = append(refusals, name+": a migration would be "+migrate.FieldLossRefusal(storage, rep))
		}
	}
	if len(refusals) == 0 {
		return nil, nil
	}
	return m.failed("", strings.Join(refusals, " ")), nil
}

// notAllowed, failed and running are where m's migration stands, in the words the
// conditions and the answer carry (gate.Decision.Message ends with them).
func (m *storageMigrations) notAllowed(unselected []string) *gate.Progress {
	return &gate.Progress{State: gate.MigrationNotAllowed, NotAllowed: unselected,
		Message: "no StorageMigrationPolicy with autoMigrate selects " + strings.Join(unselected, ", ")}
}

// failed is a StorageMigration name that failed, or, with name "", a migration refused
// before one was created.
func (m *storageMigrations) failed(name, why string) *gate.Progress {
	if name == "" {
		return &gate.Progress{State: gate.MigrationFailed, Message: why}
	}
	return &gate.Progress{State: gate.MigrationFailed, Name: name, Message: fmt.Sprintf("StorageMigration %s failed: %s", name, why)}
}

func (m *storageMigrations) running(crds []string, created bool) *gate.Progress {
	msg := fmt.Sprintf("StorageMigration %s is in progress, migrating %s", m.name, countCRDs(crds))
	switch {
	case created && m.dryRun:
		msg = fmt.Sprintf("StorageMigration %s would be created to migrate %s", m.name, countCRDs(crds))
	case created:
		msg = fmt.Sprintf("StorageMigration %s was created to migrate %s", m.name, countCRDs(crds))
	}
	return &gate.Progress{State: gate.MigrationRunning, Name: m.name, Created: created, Message: msg}
}

// countCRDs is "1 CRD" or "N CRDs": Required names them.
func countCRDs(crds []string) string {
	if len(crds) == 1 {
		return "1 CRD"
	}
	return fmt.Sprintf("%d CRDs", len(crds))
}

func (g *Gate) errored(hr *helmv2.HelmRelease, subject, change string, err error) decision {
	msg := fmt.Sprintf("upgradeguard could not check the %s of %s (%s): %v. ", change, subject, fluxrelease.Describe(hr), err)
	if g.opts.AllowOnError {
		msg += "It is admitted unchecked (the gate runs with AllowOnError)"
	} else {
		msg += "It is denied until the check can run: fix the cause, and Flux's next retry is checked again (runbook: docs/operator-guide.md, \"Runbook: a blocked HelmRelease\")"
	}
	d := decision{kind: kindErrorDenied, message: msg, reason: ReasonGateError, chart: fluxrelease.Describe(hr), noState: true}
	if g.opts.AllowOnError {
		d.kind = kindErrorAdmitted
		d.warnings = []string{msg}
	}
	return d
}

func opName(op predict.Operation) string {
	if op == predict.Rollback {
		return "rollback (a move back to an older chart version)"
	}
	return "upgrade"
}

// policyFor returns a StorageMigrationPolicy with autoMigrate that selects every named
// CRD (the one v1alpha1.Select chooses for the first), or nil and the names no such
// policy selects.
func (g *Gate) policyFor(ctx context.Context, live map[string]*apiextv1.CustomResourceDefinition, names []string) (*v1alpha1.StorageMigrationPolicy, []string, error) {
	var list v1alpha1.StorageMigrationPolicyList
	if err := g.reader.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list StorageMigrationPolicies: %w", err)
	}
	crds := make([]*apiextv1.CustomResourceDefinition, 0, len(names))
	for _, n := range names {
		if crd := live[n]; crd != nil {
			crds = append(crds, crd)
		}
	}
	selected, err := v1alpha1.Select(list.Policies(), crds, (*v1alpha1.StorageMigrationPolicy).AutoMigrates)
	if err != nil {
		return nil, nil, err
	}
	var unselected []string
	for _, n := range names {
		if selected[n] == nil {
			unselected = append(unselected, n)
		}
	}
	if len(unselected) > 0 || len(names) == 0 {
		return nil, unselected, nil
	}
	return selected[names[0]], nil, nil
}

// MigrationName is the StorageMigration the gate creates for a HelmRelease:
// hr-<namespace>-<name>, shortened with a hash when it is too long.
func MigrationName(namespace, name string) string {
	return migrationName("hr-", namespace, name)
}

// migrationName is prefix<namespace>-<name>, shortened with a hash when it is too long
// (kubename.Shorten).
func migrationName(prefix, namespace, name string) string {
	n := prefix + name
	if namespace != "" {
		n = prefix + namespace + "-" + name
	}
	return kubename.Shorten(n, kubename.MaxName, namespace+"/"+name)
}

// ensureMigration returns the StorageMigration of m, creating it when there is none, or
// replacing it when it succeeded earlier and a new migration is needed. A running or
// failed one is returned as it is: a failed one waits for an operator to delete it.
func (g *Gate) ensureMigration(ctx context.Context, m *storageMigrations, crds []string,
	policy *v1alpha1.StorageMigrationPolicy) (*v1alpha1.StorageMigration, bool, error) {
	want := &v1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: m.name, Labels: m.labels},
		Spec: v1alpha1.StorageMigrationSpec{Resources: slices.Sorted(slices.Values(crds)), Rate: policy.Spec.Rate, Deadline: policy.Spec.Deadline,
			KubeConfig: m.kubeConfig, Engine: policy.Spec.Engine, AllowFieldLoss: policy.Spec.AllowFieldLoss},
	}
	if m.holds != "" {
		want.Annotations = map[string]string{AnnotationHolds: truncate(m.holds, 4000)}
	}
	return storagemigration.Ensure(ctx, g.reader, g.writer, want, storagemigration.Options{DryRun: m.dryRun,
		ReplaceSucceeded: func(existing *v1alpha1.StorageMigration) (bool, error) {
			return m.succeededBefore != "" && existing.UID == m.succeededBefore, nil
		}})
}

// labelValue is v as a label value: shortened with a hash when it is too long.
func labelValue(v string) string { return kubename.Shorten(v, kubename.MaxLabelValue, v) }
