package webhook

import (
	"net/http"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/gate"
)

// TestKindOf: the engine's five decisions map to the gate's five answers, unfixable
// findings first whatever the migration's state.
func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		gd   gate.Decision
		want kind
	}{
		{"proceed", gate.Decision{Outcome: gate.Proceed}, kindAdmitted},
		{"proceed after a migration", gate.Decision{Outcome: gate.Proceed, Migration: &gate.Progress{State: gate.MigrationDone}}, kindAdmitted},
		{"unfixable", gate.Decision{Outcome: gate.Blocked, Unfixable: []string{"a: bridge"}}, kindUnfixable},
		{"unfixable while migrating", gate.Decision{Outcome: gate.Blocked, Unfixable: []string{"a: bridge"},
			Migration: &gate.Progress{State: gate.MigrationRunning}}, kindUnfixable},
		{"no policy", gate.Decision{Outcome: gate.Blocked, Migration: &gate.Progress{State: gate.MigrationNotAllowed}}, kindNoPolicy},
		{"migration failed", gate.Decision{Outcome: gate.Blocked, Migration: &gate.Progress{State: gate.MigrationFailed}}, kindMigrationFailed},
		{"migrating", gate.Decision{Outcome: gate.Migrating, Migration: &gate.Progress{State: gate.MigrationRunning}}, kindHeld},
	} {
		if got := kindOf(&tc.gd); got != tc.want {
			t.Errorf("%s: kindOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestRespond: every answer becomes the admission response its kind says, with the
// message, the warnings, the HTTP code and the outcome label.
func TestRespond(t *testing.T) {
	warnings := []string{"a warning"}
	for _, tc := range []struct {
		kind    kind
		allowed bool
		code    int32
		outcome string
	}{
		{kindAdmitted, true, http.StatusOK, OutcomeAdmitted},
		{kindNotChecked, true, http.StatusOK, OutcomeAdmitted},
		{kindErrorAdmitted, true, http.StatusOK, OutcomeError},
		{kindUnfixable, false, http.StatusForbidden, OutcomeBlocked},
		{kindNoPolicy, false, http.StatusForbidden, OutcomeBlocked},
		{kindMigrationFailed, false, http.StatusForbidden, OutcomeBlocked},
		{kindInvalid, false, http.StatusForbidden, OutcomeBlocked},
		{kindHeld, false, http.StatusForbidden, OutcomeMigrating},
		{kindErrorDenied, false, http.StatusForbidden, OutcomeError},
	} {
		r := respond(decision{kind: tc.kind, message: "the message", warnings: warnings})
		if r.Allowed != tc.allowed || r.Result == nil || r.Result.Code != tc.code || r.Result.Message != "the message" {
			t.Errorf("kind %d: allowed %v, result %+v; want allowed %v, code %d and the message", tc.kind, r.Allowed, r.Result, tc.allowed, tc.code)
		}
		if !tc.allowed && r.Result.Reason != metav1.StatusReasonForbidden {
			t.Errorf("kind %d: reason %q, want %q", tc.kind, r.Result.Reason, metav1.StatusReasonForbidden)
		}
		if !slices.Equal(r.Warnings, warnings) {
			t.Errorf("kind %d: warnings %q, want %q", tc.kind, r.Warnings, warnings)
		}
		if got := tc.kind.outcome(); got != tc.outcome {
			t.Errorf("kind %d: outcome %q, want %q", tc.kind, got, tc.outcome)
		}
	}
}

// TestWordConditions: every door words the three conditions the same way for an answer.
func TestWordConditions(t *testing.T) {
	gd := &gate.Decision{ToMigrate: []string{"a.example.io"}, Migration: &gate.Progress{Message: "a.example.io: 3 objects failed"}}
	req := required(gd)
	for _, tc := range []struct {
		kind                    kind
		required, progress, why string
	}{
		{kindAdmitted, "msg", "", ""},
		{kindUnfixable, "msg", "", ""},
		{kindNoPolicy, req, "", ""},
		{kindMigrationFailed, req, "", "a.example.io: 3 objects failed"},
		{kindHeld, req, "msg", ""},
	} {
		d := decision{kind: tc.kind, message: "msg", conditions: make([]metav1.Condition, 3)}
		d.wordConditions(gd)
		got := []string{d.conditions[0].Message, d.conditions[1].Message, d.conditions[2].Message}
		if want := []string{tc.required, tc.progress, tc.why}; !slices.Equal(got, want) {
			t.Errorf("kind %d: messages %q, want %q", tc.kind, got, want)
		}
	}
}
