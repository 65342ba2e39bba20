package webhook

import (
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/pkg/gate"
)

// kind is the gate's answer to one change, typed: the five answers the one engine's
// decision maps to (kindOf), and those the gate gives without a decision. Every door
// (chart change, release record, CRD update) answers with one of them, and respond
// alone turns it into the admission response.
type kind int

const (
	// kindAdmitted: every CRD of the change is accepted.
	kindAdmitted kind = iota + 1
	// kindUnfixable: denied before anything was applied; no automatic migration fixes it.
	kindUnfixable
	// kindNoPolicy: denied; a migration fixes it, but no StorageMigrationPolicy with
	// autoMigrate allows one.
	kindNoPolicy
	// kindMigrationFailed: denied; the StorageMigration that fixes it failed.
	kindMigrationFailed
	// kindHeld: denied while a StorageMigration migrates what the change needs; a retry
	// after it completes is admitted.
	kindHeld
	// kindNotChecked: admitted unchecked (a chart source the gate does not resolve).
	kindNotChecked
	// kindInvalid: denied; the change cannot succeed as it stands (its values cannot be
	// composed), whatever the gate's error policy.
	kindInvalid
	// kindErrorAdmitted: the gate could not check the change and admits it (it fails open).
	kindErrorAdmitted
	// kindErrorDenied: the gate could not check the change and denies it until it can.
	kindErrorDenied
)

// kindOf is the one mapping from the engine's decision to the gate's answer.
func kindOf(gd *gate.Decision) kind {
	switch {
	case gd.Outcome == gate.Proceed:
		return kindAdmitted
	case len(gd.Unfixable) > 0:
		return kindUnfixable
	case gd.Migration.State == gate.MigrationNotAllowed:
		return kindNoPolicy
	case gd.Migration.State == gate.MigrationFailed:
		return kindMigrationFailed
	default:
		return kindHeld
	}
}

// allowed says whether the API server is told to admit the change.
func (k kind) allowed() bool {
	return k == kindAdmitted || k == kindNotChecked || k == kindErrorAdmitted
}

// outcome is the answer's value of metrics.GateDecisions' outcome label and of State.Decision.
func (k kind) outcome() string {
	switch k {
	case kindAdmitted, kindNotChecked:
		return OutcomeAdmitted
	case kindHeld:
		return OutcomeMigrating
	case kindErrorAdmitted, kindErrorDenied:
		return OutcomeError
	default:
		return OutcomeBlocked
	}
}

// respond is the one place a decision becomes the admission response: allowed (HTTP
// 200) or denied (403, reason Forbidden) with the decision's message, and its warnings
// either way.
func respond(d decision) admission.Response {
	if d.kind.allowed() {
		return admission.Allowed(d.message).WithWarnings(d.warnings...)
	}
	return admission.Denied(d.message).WithWarnings(d.warnings...)
}

// Event reasons on a HelmRelease, for every door of the gate.
const (
	// The chart-change gate (Path).
	ReasonChartChangeAdmitted   = "ChartChangeAdmitted"
	ReasonChartChangeBlocked    = "ChartChangeBlocked"
	ReasonChartChangeHeld       = "ChartChangeHeld"
	ReasonChartChangeNotChecked = "ChartChangeNotChecked"
	// ReasonMigrationStarted: a chart change is held, and the gate created the
	// StorageMigration it waits for.
	ReasonMigrationStarted = "StorageMigrationStarted"
	// ReasonValuesError is the event reason when a spec.valuesFrom reference cannot be
	// resolved (helm-controller's own reason for that failure).
	ReasonValuesError = "ValuesError"

	// The release-record and CRD gates (ReleasePath, CRDPath).
	ReasonReleaseHeld     = "UpgradeHeld"
	ReasonReleaseBlocked  = "UpgradeBlocked"
	ReasonReleaseAdmitted = "UpgradeAdmitted"

	// Every door.
	ReasonMigrationFailed = "StorageMigrationFailed"
	ReasonGateError       = "GateError"
)

// ReasonNotChecked is the StorageMigrationRequired condition's reason (Unknown) for a
// change the gate did not check; pkg/gate holds the other condition reasons.
const ReasonNotChecked = "NotChecked"

// wordConditions words the gate's three conditions (StorageMigrationRequired,
// InProgress, Failed) for the HelmRelease's annotation, the same for every door: the
// required migration, what is in progress, and why it failed.
func (d *decision) wordConditions(gd *gate.Decision) {
	if len(d.conditions) < 3 {
		return
	}
	req, progress, failed := required(gd), "", ""
	switch d.kind {
	case kindAdmitted, kindUnfixable:
		req = d.message
	case kindMigrationFailed:
		failed = gd.Migration.Message
	case kindHeld:
		progress = d.message
	}
	d.conditions[0].Message, d.conditions[1].Message, d.conditions[2].Message = req, progress, failed
}
