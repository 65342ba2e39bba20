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

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
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

	rep := res.Report
	d := decision{operation: res.Operation, chart: res.Chart + "@" + res.Version, warnings: append(lastAttemptWarnings(hr), remediationWarnings(res)...)}
	d.warnings = append(d.warnings, schemaWarnings(rep)...)
	what := describeChange(hr, res, valuesOnly)

	target := ""
	if res.Remote {
		target = fmt.Sprintf(" (against the cluster of the kubeConfig Secret %s/%s)", hr.Namespace, hr.Spec.KubeConfig.SecretRef.Name)
	}
	sms.live = res.LiveCRDs
	sms.holds = fmt.Sprintf("holds the %s of HelmRelease %s/%s until the stored versions are migrated; the next apply of the change is admitted then", what, hr.Namespace, hr.Name)
	name := sms.name
	gd, err := gate.Judge(ctx, rep, gate.Options{Migrator: sms, ObservedGeneration: hr.Generation,
		PlanCommand: predict.Command{Kind: predict.CommandPlanHelmRelease, Release: hr.Name, Namespace: hr.Namespace, ChartVersion: rep.ChartVersion}.String()})
	if err != nil {
		return g.errored(hr, subjectHR, change, err)
	}
	d.conditions, d.kind = gd.Conditions, kindOf(gd)
	steps := strings.Join(gd.NextSteps(), "; then ")
	switch d.kind {
	case kindAdmitted:
		if sm, _ := storagemigration.Get(ctx, g.reader, name); sm != nil && storagemigration.Succeeded(sm) {
			d.conditions[0].Reason, d.migration = gate.ReasonMigrated, sm.Name
		}
		d.reason = ReasonChartChangeAdmitted
		d.message = fmt.Sprintf("upgradeguard admitted the %s: every CRD of the incoming chart is accepted by the target's API server", what)
	case kindUnfixable:
		d.reason = ReasonChartChangeBlocked
		d.message = fmt.Sprintf("upgradeguard denied the %s before anything was applied: %s, and no automatic migration fixes it. %s. Next steps%s: %s; then re-apply the change (Flux retries on its next reconcile)",
			what, strings.Join(gd.Why, ", and "), strings.Join(gd.Unfixable, "; "), target, steps)
		if gd.Plan != "" {
			d.message += ". The whole safe path: " + gd.Plan
		}
	case kindNoPolicy:
		d.reason = ReasonChartChangeBlocked
		d.message = fmt.Sprintf("upgradeguard denied the %s before anything was applied: %s, and no StorageMigrationPolicy with autoMigrate selects %s. Run%s: %s, then re-apply (Flux retries on its next reconcile); or create a StorageMigrationPolicy with autoMigrate: true that selects them",
			what, required(gd), strings.Join(gd.Migration.NotAllowed, ", "), target, steps)
	case kindMigrationFailed:
		d.migration, d.reason = name, ReasonMigrationFailed
		d.message = fmt.Sprintf("upgradeguard denied the %s: %s, but StorageMigration %s failed: %s. Fix the cause, then delete it (kubectl delete storagemigration %s) so the gate starts a new one on Flux's next retry, or run%s: %s",
			what, required(gd), name, gd.Migration.Message, name, target, steps)
	default:
		d.migration, d.created, d.reason = name, gd.Migration.Created, ReasonChartChangeHeld
		switch {
		case dryRun:
			d.message = fmt.Sprintf("upgradeguard would hold the %s: %s; StorageMigration %s would be created to migrate them (dry run: nothing was created)",
				what, required(gd), name)
		case d.created:
			d.reason = ReasonMigrationStarted
			d.message = fmt.Sprintf("upgradeguard is holding the %s: %s. StorageMigration %s was created to migrate them; the upgrade is held until StorageMigration %s completes, and Flux's retries of this change will then succeed (follow it with kubectl get storagemigration %s)",
				what, required(gd), name, name, name)
		default:
			d.message = fmt.Sprintf("upgradeguard is holding the %s: %s, and StorageMigration %s is in progress; the upgrade is held until StorageMigration %s completes, and Flux's retries of this change will then succeed (follow it with kubectl get storagemigration %s)",
				what, required(gd), name, name, name)
		}
	}
	d.wordConditions(gd)
	return d
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

// required is the admission wording of the StorageMigrationRequired message.
func required(d *gate.Decision) string {
	return fmt.Sprintf("stored versions of %s are dropped by the incoming chart and must be migrated first", strings.Join(d.ToMigrate, ", "))
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
		return &gate.Progress{State: gate.MigrationNotAllowed, NotAllowed: unselected,
			Message: "no StorageMigrationPolicy with autoMigrate selects " + strings.Join(unselected, ", ")}, nil
	}
	sm, created, err := m.g.ensureMigration(ctx, m, crds, policy)
	if err != nil {
		return nil, err
	}
	if sm != nil && storagemigration.Failed(sm) {
		return &gate.Progress{State: gate.MigrationFailed, Name: m.name, Message: storagemigration.FailureMessage(sm)}, nil
	}
	return &gate.Progress{State: gate.MigrationRunning, Name: m.name, Created: created,
		Message: fmt.Sprintf("StorageMigration %s migrates %s", m.name, strings.Join(crds, ", "))}, nil
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
// CRD, or nil and the names no such policy selects.
func (g *Gate) policyFor(ctx context.Context, live map[string]*apiextv1.CustomResourceDefinition, names []string) (*v1alpha1.StorageMigrationPolicy, []string, error) {
	var list v1alpha1.StorageMigrationPolicyList
	if err := g.reader.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list StorageMigrationPolicies: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.StorageMigrationPolicy) int { return strings.Compare(a.Name, b.Name) })
	var chosen *v1alpha1.StorageMigrationPolicy
	var unselected []string
	for _, n := range names {
		crd := live[n]
		found := false
		for i := range list.Items {
			p := &list.Items[i]
			if !p.AutoMigrates() || crd == nil {
				continue
			}
			ok, err := p.Selects(crd)
			if err != nil {
				return nil, nil, err
			}
			if ok {
				found = true
				if chosen == nil {
					chosen = p
				}
				break
			}
		}
		if !found {
			unselected = append(unselected, n)
		}
	}
	if len(unselected) > 0 {
		return nil, unselected, nil
	}
	return chosen, nil, nil
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
		ReplaceSucceeded: func(existing *v1alpha1.StorageMigration) bool {
			return m.succeededBefore != "" && existing.UID == m.succeededBefore
		}})
}

// labelValue is v as a label value: shortened with a hash when it is too long.
func labelValue(v string) string { return kubename.Shorten(v, kubename.MaxLabelValue, v) }
