// Package gate owns the one call a controller makes before it applies a new chart
// version: Decide says proceed, migrating or blocked, and returns standard conditions the
// caller sets on its own resource. A deletion (of a CRD, or of the CRDs an uninstall
// deletes) is a decision of its own, JudgeDeletion's: proceed or blocked, with nothing
// to migrate. When automatic migration is allowed, Decide also moves
// the migration forward within a time budget, so a reconcile loop that calls it again
// converges: migrating, migrating, proceed. Judge writes the decision's sentences
// (Decision.Message and the conditions' messages) for every front end: the admission
// gate shows them as they are, after what its door adds.
package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Outcome is what the caller should do now.
type Outcome string

const (
	// Proceed means the incoming chart's CRDs are accepted: apply it.
	Proceed Outcome = "Proceed"
	// Migrating means a storage migration is under way: hold the upgrade and call Decide
	// again (requeue).
	Migrating Outcome = "Migrating"
	// Blocked means the upgrade would fail or destroy data and no automatic step fixes
	// it: hold the upgrade and surface the conditions.
	Blocked Outcome = "Blocked"
)

// Condition types the caller sets on its own resource: the API's names, declared once
// (api/v1alpha1 holds the contract), for every front end of the gate.
const (
	ConditionRequired   = v1alpha1.ConditionStorageMigrationRequired
	ConditionInProgress = v1alpha1.ConditionStorageMigrationInProgress
	ConditionFailed     = v1alpha1.ConditionStorageMigrationFailed
)

// Condition reasons: the API's (api/v1alpha1 declares them once for every writer).
const (
	ReasonNotRequired       = v1alpha1.ReasonNoMigrationRequired
	ReasonMigrationRequired = v1alpha1.ReasonMigrationRequired
	ReasonBridgeRequired    = v1alpha1.ReasonBridgeRequired
	ReasonCRDDeletion       = v1alpha1.ReasonCRDWouldBeDeleted
	ReasonDataLoss          = v1alpha1.ReasonFieldsWouldBeLost
	ReasonRefused           = v1alpha1.ReasonCRDRefused
	ReasonMigrating         = v1alpha1.ReasonMigrating
	ReasonMigrated          = v1alpha1.ReasonMigrated
	ReasonMigrationFailed   = v1alpha1.ReasonMigrationFailed
	ReasonAutoMigrationOff  = v1alpha1.ReasonAutomaticMigrationDisabled
	ReasonIdle              = v1alpha1.ReasonIdle
)

// Options tune Decide.
type Options struct {
	// AutoMigrate lets Decide run migrate verdicts' migrations itself, in process
	// (InProcess), unless Migrator says how they are carried out.
	AutoMigrate bool
	// Migrator carries out the migrations a decision needs: InProcess within a time
	// budget, or a front end's own (the HelmRelease gate creates a StorageMigration).
	// Nil with AutoMigrate false: migrations are left to the operator.
	Migrator Migrator
	// Budget bounds how long one Decide call migrates (default 30s); the next call goes on.
	Budget time.Duration
	// Migrate tunes the migration (rate, concurrency, Lease namespace and holder), and
	// Migrate.Engine chooses the engine (auto, client or builtin) as `migrate --engine` does.
	Migrate migrate.Options
	// Policy says which CRDs the deployment applies (helm or create-replace).
	Policy check.CRDPolicy
	// Current are the CRDs the deployment applies today, to find CRDs the new chart drops.
	Current []chartcrds.CRD
	// ObservedGeneration is copied into the conditions.
	ObservedGeneration int64
	// PlanCommand is the command that computes the whole safe path, for a decision
	// blocked by a bridge (the HelmRelease gate: upgradeguard plan --helmrelease NS/NAME).
	// Empty: one is written from the report (upgradeguard plan --release ...), unless
	// NoPlan.
	PlanCommand string
	// NoPlan says that no plan command can be named: the report's chart is not one plan
	// can search (a lone CRD write that no release, HelmRelease or Application claims).
	NoPlan bool
	// BeforeMigrate, when set, is called once with the conditions of a migration that is
	// about to start (Required True, InProgress True), before Decide spends its budget on
	// it, so that the caller can publish them on its resource first: customers then see
	// why the upgrade is held while it is held. An error stops Decide.
	BeforeMigrate func(ctx context.Context, conditions []metav1.Condition) error
}

// Decision is the answer for one incoming chart.
type Decision struct {
	Outcome    Outcome
	Report     *check.Report
	Migrations []*migrate.Result
	// Conditions are StorageMigrationRequired, InProgress and Failed, in that order.
	// Required's message is a part of Message, and so are InProgress's and Failed's once
	// a Migrator has reported: what is required, and where the migration stands.
	Conditions []metav1.Condition
	// Message says what was decided and why: the library's sentence, which every front
	// end shows as it is (the admission gate puts it in its answer, after what its door
	// adds). A decision that migrates says Required, then where the migration stands.
	Message string
	// Reason is the StorageMigrationRequired condition's reason.
	Reason string
	// ToMigrate are the CRDs whose stored versions must be migrated first.
	ToMigrate []string
	// Unfixable are the findings no automatic migration fixes, as "name: reason".
	Unfixable []string
	// Why says, once per kind, why the unfixable findings block the upgrade.
	Why []string
	// Migration is where the migration stands, when one was asked for.
	Migration *Progress
	// Plan is, when a bridge blocks the upgrade, the command that computes the whole
	// safe path (stepping stones and the migrations between them).
	Plan string
}

// NextSteps are the report's next steps: the commands to run, in order, stepping stones
// included.
func (d *Decision) NextSteps() []string {
	if d.Report == nil {
		return nil
	}
	return d.Report.NextSteps
}

// Why the unfixable verdicts block an upgrade.
const (
	WhyBridge   = "the API server would reject it"
	WhyDelete   = "Helm would delete CRDs and every object of their types"
	WhyDataLoss = "the incoming schema would drop fields that stored objects hold"
	WhyRefused  = "the API server refuses the incoming CRD itself"
	WhyMove     = "CRDs move between Helm releases: keep them and move their ownership first, or Helm deletes them or refuses them"
	WhyPolicy   = "an admission policy of the cluster denies a CRD write or deletion the operation makes"
)

// Decide checks the incoming CRDs against the target cluster and, when allowed, moves the
// needed migrations forward. An error means it could not decide (cluster unreachable,
// RBAC); the caller should retry and not upgrade.
func Decide(ctx context.Context, target *rest.Config, incoming []chartcrds.CRD, o Options) (*Decision, error) {
	cluster, err := livecluster.NewKubeCluster(target)
	if err != nil {
		return nil, err
	}
	p, err := check.Predict(ctx, check.Sources{Cluster: cluster, Current: o.Current, Policy: o.Policy,
		Chart: func(context.Context, bool) (*check.Chart, error) { return &check.Chart{CRDs: incoming}, nil }})
	if err != nil {
		return nil, err
	}
	if o.Migrator == nil && o.AutoMigrate {
		o.Migrator = &InProcess{Target: target, Budget: o.Budget, Options: o.Migrate}
	}
	return Judge(ctx, p.Report, o)
}

// Judge turns a prediction into the gate's decision: proceed when it is safe, blocked
// when no automatic step fixes it, and otherwise what o.Migrator reports of the
// migration it carries out. It is the one mapping from verdicts to outcomes, conditions
// and next steps, for every front end, and it writes the sentences every front end shows:
// Decision.Message and the conditions' messages (the admission gate shows them as they
// are, and adds only what its door adds around Message).
func Judge(ctx context.Context, rep *check.Report, o Options) (*Decision, error) {
	if rep.Operation == predict.DeleteCRD {
		return nil, errors.New("gate: the deletion of a CRD is judged by JudgeDeletion, not as an upgrade")
	}
	d := &Decision{Report: rep, Reason: ReasonNotRequired}
	if rep.Safe {
		d.Outcome, d.Message = Proceed, "every CRD of the incoming chart is accepted by the API server"
		d.conditions(o, metav1.ConditionFalse, ReasonIdle, metav1.ConditionFalse, ReasonIdle, metav1.ConditionFalse)
		d.Conditions[1].Message = "no storage migration is needed"
		return d, nil
	}
	d.Reason = ReasonMigrationRequired
	for _, c := range rep.Findings() {
		fix, why := predict.FixFor(c.Decision), ""
		switch {
		case fix.Automatic():
			d.ToMigrate = append(d.ToMigrate, c.Name)
		case fix == predict.FixStorageSwitch || fix == predict.FixSteppingStone:
			d.Reason, why = ReasonBridgeRequired, WhyBridge
			d.Plan = planCommand(rep, o)
		case fix == predict.FixKeep:
			d.Reason, why = ReasonCRDDeletion, WhyDelete
		case fix == predict.FixMove:
			d.Reason, why = ReasonCRDDeletion, WhyMove
		case fix == predict.FixSchema:
			d.Reason, why = ReasonDataLoss, WhyDataLoss
		case fix == predict.FixChart:
			d.Reason, why = ReasonRefused, WhyRefused
		case fix == predict.FixPolicy:
			d.Reason, why = ReasonRefused, WhyPolicy
		}
		if why != "" {
			d.Unfixable = append(d.Unfixable, c.Name+": "+c.Reason)
			if !slices.Contains(d.Why, why) {
				d.Why = append(d.Why, why)
			}
		}
	}
	if len(d.Unfixable) > 0 {
		d.Outcome, d.Message = Blocked, d.unfixable()
		d.conditions(o, metav1.ConditionTrue, ReasonIdle, metav1.ConditionFalse, ReasonIdle, metav1.ConditionFalse)
		d.Conditions[1].Message = "no automatic migration applies"
		return d, nil
	}
	return d.migrate(ctx, o)
}

// unfixable is the Message of a decision that no automatic migration fixes: why, each
// finding with its reason, and the plan command when a bridge blocks it.
func (d *Decision) unfixable() string {
	msg := strings.Join(d.Why, ", and ") + ", and no automatic migration fixes it: " + strings.Join(d.Unfixable, "; ")
	if d.Plan != "" {
		msg += ". The whole safe path: " + d.Plan
	}
	return msg
}

// planCommand is the plan command a bridge denial names, or "".
func planCommand(rep *check.Report, o Options) string {
	if o.PlanCommand != "" || o.NoPlan {
		return o.PlanCommand
	}
	return cmdline.Plan{Release: rep.Release, Namespace: rep.Namespace, Chart: rep.Chart, Version: rep.ChartVersion}.String()
}

// Required is the StorageMigrationRequired message of a decision that migrates: the one
// wording of "must be migrated first", for every front end.
func (d *Decision) Required() string {
	return fmt.Sprintf("stored versions of %s are dropped by the incoming chart and must be migrated first", strings.Join(d.ToMigrate, ", "))
}

// migrating sets the Message of a decision that migrates: Required, then where the
// migration stands (the StorageMigrationInProgress message).
func (d *Decision) migrating(stands string) {
	d.Message = d.Required()
	if stands != "" {
		d.Message += "; " + stands
	}
}

func (d *Decision) migrate(ctx context.Context, o Options) (*Decision, error) {
	required := d.Required()
	if o.Migrator == nil {
		off := "automatic migration is off: run " + cmdline.Migrate{CRDs: d.ToMigrate}.String()
		d.Outcome = Blocked
		d.migrating(off)
		d.conditions(o, metav1.ConditionTrue, ReasonAutoMigrationOff, metav1.ConditionFalse, ReasonIdle, metav1.ConditionFalse)
		d.Conditions[0].Message, d.Conditions[1].Message = required, off
		return d, nil
	}
	if o.BeforeMigrate != nil {
		d.conditions(o, metav1.ConditionTrue, ReasonMigrating, metav1.ConditionTrue, ReasonIdle, metav1.ConditionFalse)
		d.Conditions[0].Message = required
		d.Conditions[1].Message = fmt.Sprintf("migrating %s; the upgrade is held until it completes", strings.Join(d.ToMigrate, ", "))
		if err := o.BeforeMigrate(ctx, slices.Clone(d.Conditions)); err != nil {
			return nil, fmt.Errorf("before migrating %s: %w", strings.Join(d.ToMigrate, ", "), err)
		}
	}
	p, err := o.Migrator.Migrate(ctx, d.ToMigrate)
	if err != nil {
		return nil, err
	}
	d.Migration, d.Migrations = p, p.Results
	d.migrating(p.Message)
	switch p.State {
	case MigrationNotAllowed:
		d.Outcome = Blocked
		d.conditions(o, metav1.ConditionTrue, ReasonAutoMigrationOff, metav1.ConditionFalse, ReasonIdle, metav1.ConditionFalse)
	case MigrationFailed:
		d.Outcome = Blocked
		d.conditions(o, metav1.ConditionTrue, ReasonMigrationFailed, metav1.ConditionFalse, ReasonMigrationFailed, metav1.ConditionTrue)
		d.Conditions[2].Message = p.Message
	case MigrationRunning:
		d.Outcome = Migrating
		d.conditions(o, metav1.ConditionTrue, ReasonMigrating, metav1.ConditionTrue, ReasonIdle, metav1.ConditionFalse)
	case MigrationDone:
		// Nothing is required any more: the message is the migration's.
		d.Outcome, d.Reason, d.Message = Proceed, ReasonMigrated, p.Message
		d.conditions(o, metav1.ConditionFalse, ReasonMigrated, metav1.ConditionFalse, ReasonMigrated, metav1.ConditionFalse)
	default:
		return nil, fmt.Errorf("migrator reported an unknown state %q", p.State)
	}
	if d.Outcome != Proceed {
		d.Conditions[0].Message = required
	}
	d.Conditions[1].Message = p.Message
	return d, nil
}

// conditions sets the three conditions in the order Required, InProgress, Failed, with
// d.Reason and d.Message on Required.
func (d *Decision) conditions(o Options, req metav1.ConditionStatus, progReason string, prog metav1.ConditionStatus,
	failReason string, fail metav1.ConditionStatus) {
	gen := o.ObservedGeneration
	d.Conditions = []metav1.Condition{
		{Type: ConditionRequired, Status: req, Reason: d.Reason, Message: d.Message, ObservedGeneration: gen},
		{Type: ConditionInProgress, Status: prog, Reason: progReason, ObservedGeneration: gen},
		{Type: ConditionFailed, Status: fail, Reason: failReason, ObservedGeneration: gen},
	}
}

// Unknown are the conditions of a change the gate did not decide (a chart source it does
// not resolve): StorageMigrationRequired Unknown with reason and message.
func Unknown(reason, message string, generation int64) []metav1.Condition {
	d := &Decision{Reason: reason, Message: message}
	d.conditions(Options{ObservedGeneration: generation}, metav1.ConditionUnknown, reason, metav1.ConditionFalse, ReasonIdle, metav1.ConditionFalse)
	return d.Conditions
}
