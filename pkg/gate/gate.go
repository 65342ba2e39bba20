// Package gate owns the one call a controller makes before it applies a new chart
// version: Decide says proceed, migrating or blocked, and returns standard conditions the
// caller sets on its own resource. When automatic migration is allowed, Decide also moves
// the migration forward within a time budget, so a reconcile loop that calls it again
// converges: migrating, migrating, proceed.
package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
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

// Condition types the caller sets on its own resource.
const (
	ConditionRequired   = "StorageMigrationRequired"
	ConditionInProgress = "StorageMigrationInProgress"
)

// Condition reasons.
const (
	ReasonNotRequired       = "NoMigrationRequired"
	ReasonMigrationRequired = "MigrationRequired"
	ReasonBridgeRequired    = "BridgeRequired"
	ReasonCRDDeletion       = "CRDWouldBeDeleted"
	ReasonMigrating         = "Migrating"
	ReasonMigrated          = "Migrated"
	ReasonMigrationFailed   = "MigrationFailed"
	ReasonAutoMigrationOff  = "AutomaticMigrationDisabled"
	ReasonIdle              = "Idle"
)

// Options tune Decide.
type Options struct {
	// AutoMigrate lets Decide run migrate verdicts' migrations itself.
	AutoMigrate bool
	// Budget bounds how long one Decide call migrates (default 30s); the next call goes on.
	Budget time.Duration
	// Migrate tunes the migration (rate, concurrency, Lease namespace and holder).
	Migrate migrate.Options
	// Policy says which CRDs the deployment applies (helm or create-replace).
	Policy check.CRDPolicy
	// Current are the CRDs the deployment applies today, to find CRDs the new chart drops.
	Current []chartcrds.CRD
	// ObservedGeneration is copied into the conditions.
	ObservedGeneration int64
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
	Conditions []metav1.Condition
	Message    string
}

// Decide checks the incoming CRDs against the target cluster and, when allowed, moves the
// needed migrations forward. An error means it could not decide (cluster unreachable,
// RBAC); the caller should retry and not upgrade.
func Decide(ctx context.Context, target *rest.Config, incoming []chartcrds.CRD, o Options) (*Decision, error) {
	if o.Budget <= 0 {
		o.Budget = 30 * time.Second
	}
	cluster, err := check.NewKubeCluster(target)
	if err != nil {
		return nil, err
	}
	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: incoming, Current: o.Current, Policy: o.Policy})
	if err != nil {
		return nil, err
	}
	d := &Decision{Report: rep}
	if rep.Safe {
		d.Outcome, d.Message = Proceed, "every CRD of the incoming chart is accepted by the API server"
		d.set(o, ConditionRequired, metav1.ConditionFalse, ReasonNotRequired, d.Message)
		d.set(o, ConditionInProgress, metav1.ConditionFalse, ReasonIdle, "no storage migration is needed")
		return d, nil
	}

	var toMigrate []string
	var unfixable []string
	reason := ReasonMigrationRequired
	for _, c := range rep.Findings() {
		switch c.Verdict {
		case predict.Migrate:
			toMigrate = append(toMigrate, c.Name)
		case predict.Bridge:
			unfixable, reason = append(unfixable, c.Name+": "+c.Reason), ReasonBridgeRequired
		case predict.Delete:
			unfixable, reason = append(unfixable, c.Name+": "+c.Reason), ReasonCRDDeletion
		}
	}
	if len(unfixable) > 0 {
		d.Outcome, d.Message = Blocked, "the upgrade cannot be made safe automatically: "+strings.Join(unfixable, "; ")
		d.set(o, ConditionRequired, metav1.ConditionTrue, reason, d.Message)
		d.set(o, ConditionInProgress, metav1.ConditionFalse, ReasonIdle, "no automatic migration applies")
		return d, nil
	}
	required := fmt.Sprintf("stored versions dropped by the incoming chart must be migrated first: %s", strings.Join(toMigrate, ", "))
	d.set(o, ConditionRequired, metav1.ConditionTrue, ReasonMigrationRequired, required)
	if !o.AutoMigrate {
		d.Outcome, d.Message = Blocked, required+" (automatic migration is off: run upgradeguard migrate)"
		d.set(o, ConditionInProgress, metav1.ConditionFalse, ReasonAutoMigrationOff, d.Message)
		return d, nil
	}

	if o.BeforeMigrate != nil {
		d.set(o, ConditionInProgress, metav1.ConditionTrue, ReasonMigrating,
			fmt.Sprintf("migrating %s; the upgrade is held until it completes", strings.Join(toMigrate, ", ")))
		if err := o.BeforeMigrate(ctx, slices.Clone(d.Conditions)); err != nil {
			return nil, fmt.Errorf("before migrating %s: %w", strings.Join(toMigrate, ", "), err)
		}
	}
	m, err := migrate.New(target)
	if err != nil {
		return nil, err
	}
	budgetCtx, cancel := context.WithTimeout(ctx, o.Budget)
	defer cancel()
	mo := o.Migrate
	mo.Deadline = o.Budget
	for _, name := range toMigrate {
		res, err := m.Migrate(budgetCtx, migrate.Target{Name: name}, mo)
		var held *migrate.LeaseHeldError
		if errors.As(err, &held) {
			// Another run (the CLI, another controller) is migrating it: wait for it.
			d.Outcome, d.Message = Migrating, err.Error()
			d.set(o, ConditionInProgress, metav1.ConditionTrue, ReasonMigrating, d.Message)
			return d, nil
		}
		if err != nil {
			return nil, err
		}
		d.Migrations = append(d.Migrations, res)
		if res.FailedCount > 0 {
			d.Outcome = Blocked
			d.Message = fmt.Sprintf("%s: %d objects could not be migrated: %s", name, res.FailedCount, res.Message)
			d.set(o, ConditionInProgress, metav1.ConditionFalse, ReasonMigrationFailed, d.Message)
			return d, nil
		}
		if res.Status == migrate.Incomplete {
			d.Outcome = Migrating
			d.Message = fmt.Sprintf("migrating %s: %d objects so far; the upgrade is held until it completes", name, res.Objects)
			d.set(o, ConditionInProgress, metav1.ConditionTrue, ReasonMigrating, d.Message)
			return d, nil
		}
	}
	d.Outcome, d.Message = Proceed, "storage migration completed: "+strings.Join(toMigrate, ", ")
	d.set(o, ConditionRequired, metav1.ConditionFalse, ReasonMigrated, d.Message)
	d.set(o, ConditionInProgress, metav1.ConditionFalse, ReasonMigrated, d.Message)
	return d, nil
}

func (d *Decision) set(o Options, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&d.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: o.ObservedGeneration})
}
