package gate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// Migrator carries out the storage migrations a decision needs. The gate asks it each
// time it decides, so an implementation starts the work once and then reports on it.
type Migrator interface {
	// Migrate starts or continues migrating the named CRDs and says where it stands.
	// An error means the gate could not decide.
	Migrate(ctx context.Context, crds []string) (*Progress, error)
}

// MigrationState is where a migration stands.
type MigrationState string

const (
	// MigrationNotAllowed means nothing allows migrating these CRDs automatically (no
	// policy selects them); the upgrade is blocked until an operator migrates them.
	MigrationNotAllowed MigrationState = "NotAllowed"
	// MigrationRunning means the migration is under way; the upgrade is held.
	MigrationRunning MigrationState = "Running"
	// MigrationFailed means objects could not be migrated; the upgrade is blocked.
	MigrationFailed MigrationState = "Failed"
	// MigrationDone means every named CRD is migrated; the upgrade proceeds.
	MigrationDone MigrationState = "Done"
)

// Progress is what a Migrator reports.
type Progress struct {
	State MigrationState
	// Message says what happens, for the conditions and the caller's own messages.
	Message string
	// Name is the StorageMigration that carries the migration out, when one does;
	// Created says that this call created it.
	Name    string
	Created bool
	// NotAllowed are the CRDs nothing allows migrating, with MigrationNotAllowed.
	NotAllowed []string
	// Results are the in-process migrations' results.
	Results []*migrate.Result
}

// InProcess migrates in the caller's process, within a time budget per call: a reconcile
// loop that decides again goes on where the last call stopped.
type InProcess struct {
	// Target is the cluster to migrate. Its own client-side rate limit applies; a config
	// that sets none gets none (migrate.New): the concurrency in Options bounds the load
	// and the API server's Priority and Fairness paces it.
	Target *rest.Config
	// Budget bounds how long one call migrates (default 30s).
	Budget time.Duration
	// Options tune the migration (concurrency, Lease namespace and holder, and the
	// engine: the same client, builtin and auto engines as `upgradeguard migrate`).
	Options migrate.Options
}

// Migrate migrates the CRDs one after another until they are done or the budget ends.
func (m *InProcess) Migrate(ctx context.Context, crds []string) (*Progress, error) {
	budget := m.Budget
	if budget <= 0 {
		budget = 30 * time.Second
	}
	mig, err := migrate.New(m.Target)
	if err != nil {
		return nil, err
	}
	budgetCtx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	mo := m.Options
	mo.Deadline = budget
	p := &Progress{}
	for _, name := range crds {
		res, err := mig.Migrate(budgetCtx, migrate.Target{Name: name}, mo)
		switch {
		case migrate.IsMigratingElsewhere(err):
			// Another run (the CLI, another controller, a StorageVersionMigration made by
			// hand) is migrating it: wait for it.
			p.State, p.Message = MigrationRunning, err.Error()
			return p, nil
		case errors.As(err, new(*migrate.BuiltinNotRunningError)) || errors.As(err, new(*migrate.BuiltinNotServedError)):
			// The builtin engine cannot run here: no retry fixes that, an operator does.
			p.State, p.Message = MigrationFailed, err.Error()
			return p, nil
		case err != nil:
			return nil, err
		}
		p.Results = append(p.Results, res)
		switch {
		case res.FailedCount > 0:
			p.State, p.Message = MigrationFailed, fmt.Sprintf("%s: %d objects could not be migrated: %s", name, res.FailedCount, res.Message)
			return p, nil
		case res.BuiltinFailure != "" || res.FieldLossRefused:
			// A refusal for field loss wrote nothing and would refuse again: an operator
			// decides (keep the fields, or allow the loss).
			p.State, p.Message = MigrationFailed, name+": "+res.Message
			return p, nil
		}
		if res.Status == migrate.Incomplete {
			p.State = MigrationRunning
			p.Message = fmt.Sprintf("migrating %s: %d objects so far; the upgrade is held until it completes", name, res.Objects)
			return p, nil
		}
	}
	p.State, p.Message = MigrationDone, "storage migration completed: "+strings.Join(crds, ", ")
	return p, nil
}
