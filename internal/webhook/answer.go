package webhook

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
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

// kind is the gate's answer to one change, typed: the five answers the one engine's
// decision maps to (kindOf; a deletion's two, admitted and unfixable, in
// deletionDoor.answer), and those the gate gives without a decision. Every door answers
// with one of them, its answer method alone words it, and respond alone turns it into
// the admission response.
type kind int

const (
	// kindAdmitted: every CRD of the change is accepted.
	kindAdmitted kind = iota + 1
	// kindUnfixable: denied; no automatic migration fixes it (an upgrade), or it would
	// delete objects (a deletion).
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
// either way. A denial carries the cause v1alpha1.CauseGateDenied (with the event reason):
// a dry run that check makes recognises it as the gate's own answer.
func respond(d decision) admission.Response {
	if d.kind.allowed() {
		return admission.Allowed(d.message).WithWarnings(d.warnings...)
	}
	r := admission.Denied(d.message).WithWarnings(d.warnings...)
	r.Result.Details = &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: v1alpha1.CauseGateDenied, Message: d.reason}}}
	return r
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
	// ReasonUninstallBlocked: the release-record gate denied the uninstalling mark of a
	// release whose uninstall would delete a CRD that holds objects.
	ReasonUninstallBlocked = "UninstallBlocked"

	// The CRD deletion guard (CRDDeletePath), on the CRD and, when helm-controller
	// applies it, on its HelmRelease.
	ReasonCRDDeletionBlocked  = "CRDDeletionBlocked"
	ReasonCRDDeletionAdmitted = "CRDDeletionAdmitted"

	// Every door.
	ReasonMigrationFailed = "StorageMigrationFailed"
	ReasonGateError       = "GateError"
)

// ReasonNotChecked is the StorageMigrationRequired condition's reason (Unknown) for a
// change the gate did not check; pkg/gate holds the other condition reasons.
const ReasonNotChecked = "NotChecked"

// door is what every door of the gate adds to the library's decision when it answers:
// the HelmRelease chart change (hrDoor), the release record and the CRD update
// (owner.door), the CRD deletion (owner.deletionDoor) and the uninstall
// (owner.uninstallDoor). Everything else a user reads is the library's: gate.Judge's or
// gate.JudgeDeletion's Message, the conditions, and the report's next steps. A door
// whose change a migration can fix is an upgradeDoor, with the part that holds it; a
// deletion, which nothing migrates right, is a deletionDoor. A new door is one more such
// value, answered by its answer method.
type door struct {
	// change names the change under admission: "upgrade of release NS/NAME from chart C
	// 1.0.0 to 2.0.0".
	change string
	// before says when the door denies, for a denial that leaves everything as it was
	// (beforeApplied); "" when the deployer may have applied other objects already.
	before string
	// target names the cluster the next steps run against, when it is not the local one:
	// " (against the cluster of the kubeConfig Secret NS/NAME)".
	target string
	// again says how the deployer applies the change again once the next steps are done:
	// "then re-apply the change (Flux retries on its next reconcile)".
	again string
	// admittedReason and blockedReason are the door's event reasons; a failed migration
	// is ReasonMigrationFailed at every door.
	admittedReason, blockedReason string
}

// upgradeDoor is a door whose change a storage migration can fix: an upgrade, a
// rollback, a values change, a CRD update. It holds the change while a StorageMigration
// migrates what the change needs.
type upgradeDoor struct {
	door
	// held names what a StorageMigration the door creates holds, for its annotation
	// AnnotationHolds.
	held string
	// retry says how the held change is retried once its StorageMigration has succeeded.
	retry string
	// heldReason is the event reason of a held change, startedReason that of a held
	// change whose StorageMigration the answer created.
	heldReason, startedReason string
	// migrations is the Migrator of the door's change: the StorageMigration it creates,
	// and whether the change is a dry run, which creates nothing.
	migrations *storageMigrations
	// options are how the door asks the engine (gate.Judge): the plan command a bridge
	// names, the generation the conditions observe. judge sets the Migrator.
	options gate.Options
	// crd is the CRD whose update the door judges (the CRD gate's door), "" at other
	// doors: a dry run it would hold carries MarkDryRunHeld(crd), by which argoDiffs
	// finds the CRD in Argo CD's conditions.
	crd string
}

// deletionDoor is a door whose change deletes CRDs: the CRD deletion itself, or the
// uninstall that would delete them. It never holds, and its client (Helm) prints the
// warnings of a refused request but not the refusal: every denial is also a warning.
type deletionDoor struct {
	door
	// seeAlso ends the warning of a denial in place of the next steps: where the rest of
	// the answer is ("kubectl delete crd NAME --dry-run=server shows the next steps"). ""
	// makes the warning the whole answer.
	seeAlso string
}

// beforeApplied is what a door that denies before the deployer applies anything (the
// HelmRelease and the release record) says of its denials.
const beforeApplied = " before anything was applied"

// holds is the value of AnnotationHolds on a StorageMigration the door creates.
func (dr upgradeDoor) holds() string {
	return fmt.Sprintf("holds the %s until the stored versions are migrated; %s", dr.held, dr.retry)
}

// MarkDryRunHeld is the mark in the CRD gate's answer to a dry run of an update of CRD it
// would hold: "[upgradeguard.io/dry-run-held=NAME]", before the sentence. It is for
// programs, as a condition's Reason is: Argo CD quotes the answer in an Application's
// conditions, and argoDiffs finds the CRD by the mark (dryRunHeldCRDs), however the
// sentence around it is worded.
func MarkDryRunHeld(crd string) string { return "[" + markDryRunHeld + "=" + crd + "]" }

const markDryRunHeld = "upgradeguard.io/dry-run-held"

// dryRunHeldMarks finds MarkDryRunHeld's marks in a text.
var dryRunHeldMarks = regexp.MustCompile(`\[` + regexp.QuoteMeta(markDryRunHeld) + `=([a-z0-9][a-z0-9.-]*[a-z0-9])\]`)

// dryRunHeldCRDs are the CRDs that MarkDryRunHeld marks in text, in order.
func dryRunHeldCRDs(text string) []string {
	var out []string
	for _, m := range dryRunHeldMarks.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// judge runs the one gate engine (gate.Judge) on a prediction for the door and answers.
// An error is a decision the engine could not make: each door says what follows from it.
func (g *Gate) judge(ctx context.Context, dr upgradeDoor, rep *check.Report) (decision, error) {
	dr.migrations.holds = dr.holds()
	o := dr.options
	o.Migrator = dr.migrations
	gd, err := gate.Judge(ctx, rep, o)
	if err != nil {
		return decision{}, err
	}
	migrated := ""
	if gd.Outcome == gate.Proceed {
		migrated = g.succeeded(ctx, dr.migrations.name)
	}
	return dr.answer(gd, migrated), nil
}

// succeeded is name when that StorageMigration has succeeded, else "". A read that
// fails is logged and reads as "": it only decides whether an admitted change reports
// Migrated or NoMigrationRequired.
func (g *Gate) succeeded(ctx context.Context, name string) string {
	sm, err := storagemigration.Get(ctx, g.reader, name)
	if err != nil {
		log.FromContext(ctx).Error(err, "could not tell whether the change was admitted after a migration; its StorageMigrationRequired condition says NoMigrationRequired", "storageMigration", name)
		return ""
	}
	if sm != nil && storagemigration.Succeeded(sm) {
		return sm.Name
	}
	return ""
}

// admitted, denied and next are the sentences every door's answer is made of: what the
// gate did with the change and the library's message, and the report's next steps with
// how the deployer goes on.
func (dr door) admitted(message string) string {
	return fmt.Sprintf("upgradeguard admitted the %s: %s", dr.change, message)
}

func (dr door) denied(message string) string {
	return fmt.Sprintf("upgradeguard denied the %s%s: %s", dr.change, dr.before, message)
}

func (dr door) next(steps []string) string {
	return fmt.Sprintf("Next steps%s: %s; %s", dr.target, strings.Join(steps, "; then "), dr.again)
}

// answer words the engine's decision gd for the door: the one place an upgrade's
// decision becomes the text a user reads (the admission message, the event, the gate
// annotation). It puts the library's Message as it is after what the door adds (the
// change, when it is denied), and then the door's advice: the report's next steps, and
// how the deployer applies the change again. The conditions are the library's; migrated
// names a StorageMigration that has succeeded for an admitted change ("" for none),
// which the StorageMigrationRequired condition then reports as Migrated.
func (dr upgradeDoor) answer(gd *gate.Decision, migrated string) decision {
	d := decision{kind: kindOf(gd), conditions: gd.Conditions}
	steps := dr.next(gd.NextSteps())
	denied := dr.denied(gd.Message)
	switch d.kind {
	case kindAdmitted:
		d.reason = dr.admittedReason
		d.message = dr.admitted(gd.Message)
		if migrated != "" && len(d.conditions) > 0 {
			d.conditions = slices.Clone(d.conditions)
			d.conditions[0].Reason, d.migration = gate.ReasonMigrated, migrated
		}
	case kindUnfixable:
		d.reason = dr.blockedReason
		d.message = denied + ". " + steps
	case kindNoPolicy:
		d.reason = dr.blockedReason
		d.message = denied + ". " + steps + ". Or create a StorageMigrationPolicy with autoMigrate: true that selects these CRDs"
	case kindMigrationFailed:
		name := gd.Migration.Name
		d.migration, d.reason = name, ReasonMigrationFailed
		if name == "" {
			// Refused before a StorageMigration was created: the message says why and
			// the ways on; there is nothing to delete or wait for.
			d.message = denied + ". " + steps
			break
		}
		d.message = fmt.Sprintf("%s. Fix the cause, then delete StorageMigration %s (%s) so that the next attempt starts a new one; or migrate by hand. %s",
			denied, name, cmdline.Delete{Resource: "storagemigration", Name: name}, steps)
	default:
		name := gd.Migration.Name
		d.migration, d.created, d.reason = name, gd.Migration.Created, dr.heldReason
		mark := ""
		if dr.migrations.dryRun && dr.crd != "" {
			mark = MarkDryRunHeld(dr.crd) + " "
		}
		switch {
		case dr.migrations.dryRun && d.created:
			// A dry run (kubectl --dry-run=server, Argo CD's server-side diff) creates
			// nothing, so nothing migrates them unless someone does.
			d.message = fmt.Sprintf("%supgradeguard would hold the %s: %s. This was a dry run, so no StorageMigration was created: applying the change creates it (for an Argo CD server-side diff, the controller creates it once the Application reports this denial), or migrate by hand. %s",
				mark, dr.change, gd.Message, steps)
			return d
		case d.created && !dr.migrations.dryRun:
			d.reason = dr.startedReason
		}
		verb, before := "is holding", dr.before
		if dr.migrations.dryRun {
			verb, before = "would hold", ""
		}
		d.message = fmt.Sprintf("%supgradeguard %s the %s%s: %s. The change is held until StorageMigration %s completes (follow it with %s); %s",
			mark, verb, dr.change, before, gd.Message, name, cmdline.Get{Resource: "storagemigration", Name: name}, dr.retry)
	}
	return d
}

// answer words the library's decision on a deletion for the door: admitted, or denied
// with the next steps, and the denial again as a warning (seeAlso). A deletion has no
// conditions: it leaves a HelmRelease's StorageMigration conditions as they are.
func (dr deletionDoor) answer(gd *gate.Deletion) decision {
	if gd.Outcome == gate.Proceed {
		return decision{kind: kindAdmitted, reason: dr.admittedReason, message: dr.admitted(gd.Message)}
	}
	d := decision{kind: kindUnfixable, reason: dr.blockedReason, message: dr.denied(gd.Message) + ". " + dr.next(gd.NextSteps())}
	warning := d.message
	if dr.seeAlso != "" {
		warning = dr.denied(gd.Message) + "; " + dr.seeAlso
	}
	d.warnings = []string{warning}
	return d
}
