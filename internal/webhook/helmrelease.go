package webhook

import (
	"context"
	"errors"
	"fmt"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Labels on a StorageMigration the gate creates, naming its HelmRelease.
const (
	LabelHelmReleaseNamespace = v1alpha1.LabelHelmReleaseNamespace
	LabelHelmReleaseName      = v1alpha1.LabelHelmReleaseName
)

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
			PlanCommand: cmdline.PlanHelmRelease{Name: hr.Name, Namespace: hr.Namespace, Version: res.Report.ChartVersion}.String()}}
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
			strings.Join(res.RemediationRisk, ", "), cmdline.ReverseMigration{Release: res.Release, Namespace: res.StorageNamespace}))
	}
	if len(res.UninstallRisk) > 0 {
		warnings = append(warnings, fmt.Sprintf("if this upgrade fails, helm-controller's uninstall remediation (spec.upgrade.remediation.strategy: uninstall) deletes %s and every object of their types; annotate them helm.sh/resource-policy=keep in the chart, or use the rollback strategy",
			strings.Join(res.UninstallRisk, ", ")))
	}
	return warnings
}

// hrMigrations is the Migrator for a HelmRelease's chart change.
func hrMigrations(g *Gate, hr *helmv2.HelmRelease, dryRun bool) *storageMigrations {
	m := &storageMigrations{g: g, name: MigrationName(hr.Namespace, hr.Name), dryRun: dryRun,
		labels: map[string]string{LabelHelmReleaseNamespace: hr.Namespace, LabelHelmReleaseName: labelValue(hr.Name)}}
	if kc := hr.Spec.KubeConfig; kc != nil && kc.SecretRef != nil {
		m.kubeConfig = &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: hr.Namespace, Name: kc.SecretRef.Name, Key: kc.SecretRef.Key}}
	}
	return m
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

// MigrationName is the StorageMigration the gate creates for a HelmRelease:
// hr-<namespace>-<name>, shortened with a hash when it is too long.
func MigrationName(namespace, name string) string {
	return migrationName("hr-", namespace, name)
}
