package gate_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// fixedMigrator reports one state and records what it was asked to migrate.
type fixedMigrator struct {
	state gate.MigrationState
	asked []string
}

func (m *fixedMigrator) Migrate(_ context.Context, crds []string) (*gate.Progress, error) {
	m.asked = crds
	return &gate.Progress{State: m.state, Message: "progress " + string(m.state), NotAllowed: crds}, nil
}

func report(verdicts map[string]predict.Verdict) *check.Report {
	rep := &check.Report{Safe: true, NextSteps: []string{"step one", "step two"}}
	for name, v := range verdicts {
		rep.CRDs = append(rep.CRDs, check.CRDReport{Decision: predict.Decision{Name: name, Verdict: v, Reason: "because"}})
		rep.Safe = rep.Safe && v == predict.OK
	}
	return rep
}

type status struct {
	Required, InProgress, Failed metav1.ConditionStatus
	RequiredReason, Progress     string
}

// TestJudge is the one mapping from verdicts and migration state to outcome and
// conditions, as every front end gets it.
func TestJudge(t *testing.T) {
	mig := map[string]predict.Verdict{"a.example.io": predict.Migrate, "b.example.io": predict.OK}
	for name, tc := range map[string]struct {
		verdicts  map[string]predict.Verdict
		migrator  *fixedMigrator
		outcome   gate.Outcome
		want      status
		toMigrate []string
	}{
		"safe": {verdicts: map[string]predict.Verdict{"a.example.io": predict.OK}, migrator: &fixedMigrator{state: gate.MigrationDone},
			outcome: gate.Proceed, want: status{"False", "False", "False", gate.ReasonNotRequired, gate.ReasonIdle}},
		"bridge": {verdicts: map[string]predict.Verdict{"a.example.io": predict.Bridge, "c.example.io": predict.Migrate}, migrator: &fixedMigrator{state: gate.MigrationDone},
			outcome: gate.Blocked, want: status{"True", "False", "False", gate.ReasonBridgeRequired, gate.ReasonIdle}, toMigrate: []string{"c.example.io"}},
		"delete": {verdicts: map[string]predict.Verdict{"a.example.io": predict.Delete}, migrator: &fixedMigrator{state: gate.MigrationDone},
			outcome: gate.Blocked, want: status{"True", "False", "False", gate.ReasonCRDDeletion, gate.ReasonIdle}},
		"no migrator": {verdicts: mig,
			outcome: gate.Blocked, want: status{"True", "False", "False", gate.ReasonMigrationRequired, gate.ReasonAutoMigrationOff}, toMigrate: []string{"a.example.io"}},
		"not allowed": {verdicts: mig, migrator: &fixedMigrator{state: gate.MigrationNotAllowed},
			outcome: gate.Blocked, want: status{"True", "False", "False", gate.ReasonMigrationRequired, gate.ReasonAutoMigrationOff}, toMigrate: []string{"a.example.io"}},
		"running": {verdicts: mig, migrator: &fixedMigrator{state: gate.MigrationRunning},
			outcome: gate.Migrating, want: status{"True", "True", "False", gate.ReasonMigrationRequired, gate.ReasonMigrating}, toMigrate: []string{"a.example.io"}},
		"failed": {verdicts: mig, migrator: &fixedMigrator{state: gate.MigrationFailed},
			outcome: gate.Blocked, want: status{"True", "False", "True", gate.ReasonMigrationRequired, gate.ReasonMigrationFailed}, toMigrate: []string{"a.example.io"}},
		"done": {verdicts: mig, migrator: &fixedMigrator{state: gate.MigrationDone},
			outcome: gate.Proceed, want: status{"False", "False", "False", gate.ReasonMigrated, gate.ReasonMigrated}, toMigrate: []string{"a.example.io"}},
	} {
		t.Run(name, func(t *testing.T) {
			o := gate.Options{ObservedGeneration: 4}
			if tc.migrator != nil {
				o.Migrator = tc.migrator
			}
			d, err := gate.Judge(t.Context(), report(tc.verdicts), o)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != tc.outcome {
				t.Errorf("outcome %s, want %s (%s)", d.Outcome, tc.outcome, d.Message)
			}
			cond := func(typ string) metav1.Condition {
				c := meta.FindStatusCondition(d.Conditions, typ)
				if c == nil {
					t.Fatalf("no %s condition", typ)
				}
				if c.ObservedGeneration != 4 {
					t.Errorf("%s observedGeneration %d, want 4", typ, c.ObservedGeneration)
				}
				return *c
			}
			req, prog, fail := cond(gate.ConditionRequired), cond(gate.ConditionInProgress), cond(gate.ConditionFailed)
			got := status{req.Status, prog.Status, fail.Status, req.Reason, prog.Reason}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.toMigrate, d.ToMigrate); diff != "" {
				t.Errorf("ToMigrate (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"step one", "step two"}, d.NextSteps()); diff != "" {
				t.Errorf("next steps (-want +got):\n%s", diff)
			}
			if len(d.Unfixable) > 0 && tc.migrator != nil && tc.migrator.asked != nil {
				t.Errorf("a migration was started for a decision nothing fixes: %v", tc.migrator.asked)
			}
		})
	}
}

// TestJudgeDeletion: a deletion is its own decision, proceed or blocked, with sentences
// of a deletion and the report's next steps; Judge, the upgrade's decision, refuses it.
func TestJudgeDeletion(t *testing.T) {
	for name, tc := range map[string]struct {
		verdicts map[string]predict.Verdict
		outcome  gate.Outcome
		message  string
		held     []string
	}{
		"holds objects": {verdicts: map[string]predict.Verdict{"a.example.io": predict.Delete}, outcome: gate.Blocked,
			message: gate.WhyDeleteCRD + ": a.example.io: because", held: []string{"a.example.io: because"}},
		"holds none":     {verdicts: map[string]predict.Verdict{"a.example.io": predict.OK}, outcome: gate.Proceed, message: gate.WhyDeletionSafe + ": a.example.io: because"},
		"deletes no CRD": {verdicts: map[string]predict.Verdict{}, outcome: gate.Proceed, message: gate.WhyNothingDeleted},
	} {
		t.Run(name, func(t *testing.T) {
			rep := report(tc.verdicts)
			rep.Operation = predict.DeleteCRD
			d := gate.JudgeDeletion(rep)
			if d.Outcome != tc.outcome || d.Message != tc.message {
				t.Errorf("JudgeDeletion() = %s %q, want %s %q", d.Outcome, d.Message, tc.outcome, tc.message)
			}
			if diff := cmp.Diff(tc.held, d.Held); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"step one", "step two"}, d.NextSteps()); diff != "" {
				t.Errorf("next steps (-want +got):\n%s", diff)
			}
			if _, err := gate.Judge(t.Context(), rep, gate.Options{}); err == nil {
				t.Error("Judge decided a deletion as an upgrade")
			}
		})
	}
}
