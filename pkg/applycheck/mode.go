package applycheck

import (
	"fmt"
	"strings"
)

// Operation is the Helm operation a release check predicts.
type Operation string

const (
	// OpUpgrade is `helm upgrade`.
	OpUpgrade Operation = "upgrade"
	// OpRollback is `helm rollback`.
	OpRollback Operation = "rollback"
)

// Apply methods as Helm 4 records them in a release's apply_method.
const (
	MethodSSA = "ssa"
	MethodCSA = "csa"
)

// Flags are the apply flags of `helm upgrade` and `helm rollback`.
type Flags struct {
	// ServerSide is --server-side: auto (the default, also when empty), true or false.
	ServerSide string `json:"serverSide"`
	// ForceConflicts is --force-conflicts.
	ForceConflicts bool `json:"forceConflicts"`
	// ForceReplace is --force-replace (or the deprecated --force).
	ForceReplace bool `json:"forceReplace"`
	// TakeOwnership is helm upgrade --take-ownership.
	TakeOwnership bool `json:"takeOwnership,omitempty"`
}

// FlagErrorStage says when Helm meets a flag error.
type FlagErrorStage string

const (
	// BeforeRecord means Helm stops before it records a revision or runs a hook.
	BeforeRecord FlagErrorStage = "beforeRecord"
	// AfterHooks means Helm has recorded the new revision and run the pre-upgrade (pre-rollback)
	// hooks; the error marks the new revision failed and nothing is applied.
	AfterHooks FlagErrorStage = "afterHooks"
)

// Alternative is a set of flags that works, and what choosing it means.
type Alternative struct {
	Flags []string `json:"flags"`
	Why   string   `json:"why"`
}

// Mode is the apply method an operation will use, resolved as Helm 4.3.1 resolves it
// (getUpgradeServerSideValue in pkg/action/upgrade.go, shared by rollback.go), and the
// flag errors Helm would meet.
type Mode struct {
	Operation Operation `json:"operation"`
	Flags     Flags     `json:"flags"`
	// ServerSide is the resolved method: true for server-side apply.
	ServerSide bool   `json:"serverSide"`
	Method     string `json:"method"`
	// DecidingRevision is the revision whose apply_method --server-side=auto follows: the
	// last revision for an upgrade, the target revision for a rollback. RecordedMethod is
	// what that revision recorded ("" for a revision written by Helm 3, which is
	// client-side).
	DecidingRevision int    `json:"decidingRevision"`
	RecordedMethod   string `json:"recordedMethod"`
	Reason           string `json:"reason"`
	// TakesOverClientSide is true when Helm first moves the fields its client-side
	// applies own (manager "helm", operation Update) to its server-side apply: a
	// server-side upgrade from a client-side revision (the deployed revision it starts
	// from; CheckRelease sets it from that one), and every server-side rollback.
	TakesOverClientSide bool `json:"takesOverClientSide"`
	// FlagError is the error Helm stops with, empty when the flags work; FlagErrorStage
	// says whether Helm has recorded a revision by then.
	FlagError      string         `json:"flagError,omitempty"`
	FlagErrorStage FlagErrorStage `json:"flagErrorStage,omitempty"`
	// Alternatives are flag sets that work, when FlagError is set or the release is
	// client-side (the second one then moves it to server-side on purpose).
	Alternatives []Alternative `json:"alternatives,omitempty"`
}

// Error strings of Helm 4.3.1, verbatim.
const (
	errForceConflictsCSA = "invalid client update option(s): forceConflicts enabled when serverSideApply disabled"
	errSSAForceReplace   = "invalid operation: cannot use server-side apply and force replace together"
	errBothForces        = "if any flags in the group [force-replace force-conflicts] are set none of the others can be; [force-conflicts force-replace] were all set"
)

// ResolveMode resolves the apply method of an upgrade or rollback from its flags and the
// apply_method recorded by the deciding revision (the last revision for an upgrade, the
// target revision for a rollback), and predicts Helm's flag errors.
func ResolveMode(op Operation, f Flags, decidingRevision int, recordedMethod string) Mode {
	if f.ServerSide == "" {
		f.ServerSide = "auto"
	}
	m := Mode{Operation: op, Flags: f, DecidingRevision: decidingRevision, RecordedMethod: recordedMethod}
	which := "the last revision"
	if op == OpRollback {
		which = "the target revision"
	}
	recorded := fmt.Sprintf("%s (%d) recorded apply_method %q", which, decidingRevision, recordedMethod)
	if recordedMethod == "" {
		recorded = fmt.Sprintf("%s (%d) recorded no apply_method (written by Helm 3 or helm-controller before v1.5: client-side)", which, decidingRevision)
	}
	switch f.ServerSide {
	case "auto":
		m.ServerSide = recordedMethod == MethodSSA
		m.Reason = "--server-side=auto follows " + recorded
	case "true", "false":
		m.ServerSide = f.ServerSide == "true"
		m.Reason = "--server-side=" + f.ServerSide + " is given (" + recorded + ")"
	default:
		m.FlagError, m.FlagErrorStage = "invalid/unknown release server-side apply method: "+f.ServerSide, BeforeRecord
		m.Alternatives = []Alternative{{Flags: []string{"--server-side=auto"}, Why: "--server-side takes auto, true or false"}}
		return m
	}
	m.Method = MethodCSA
	if m.ServerSide {
		m.Method = MethodSSA
	}
	m.TakesOverClientSide = m.ServerSide && (op == OpRollback || recordedMethod != MethodSSA)
	if op == OpUpgrade && m.ServerSide && recordedMethod != MethodSSA {
		m.Reason += "; Helm moves the release to server-side apply, first moving the fields its client-side applies own to its server-side apply"
	}
	base := []string{}
	if f.TakeOwnership {
		base = append(base, "--take-ownership")
	}
	if f.ServerSide != "auto" {
		base = append(base, "--server-side="+f.ServerSide)
	}
	switch {
	case f.ForceConflicts && f.ForceReplace:
		m.FlagError, m.FlagErrorStage = errBothForces, BeforeRecord
		m.Alternatives = []Alternative{
			{Flags: append(slicesClone(base), "--force-conflicts"), Why: "keep --force-conflicts (server-side apply only) and drop --force-replace"},
			{Flags: append(slicesClone(base), "--force-replace"), Why: "keep --force-replace (client-side apply only) and drop --force-conflicts"},
		}
	case f.ForceConflicts && !m.ServerSide:
		m.FlagError, m.FlagErrorStage = errForceConflictsCSA, AfterHooks
		m.Alternatives = []Alternative{
			{Flags: nilIfEmpty(base), Why: "drop --force-conflicts: the " + string(op) + " stays client-side, which overwrites fields other managers hold without conflicts"},
			{Flags: append(without(base, "--server-side=false"), "--server-side=true", "--force-conflicts"), Why: "move the release to server-side apply on purpose and take every conflicting field (see the server-side prediction for who loses which field)"},
		}
	case f.ForceReplace && m.ServerSide:
		m.FlagError, m.FlagErrorStage = errSSAForceReplace, AfterHooks
		m.Alternatives = []Alternative{
			{Flags: nilIfEmpty(base), Why: "drop --force-replace: server-side apply needs no replace"},
			{Flags: append(without(base, "--server-side=true"), "--server-side=false", "--force-replace"), Why: "replace objects client-side (the release then records csa)"},
		}
	case !m.ServerSide:
		m.Alternatives = []Alternative{
			{Flags: nilIfEmpty(base), Why: "as it is: client-side, the three-way merge overwrites fields other managers hold, without conflicts"},
			{Flags: append(without(base, "--server-side=false"), "--server-side=true"), Why: "move the release to server-side apply on purpose: Helm's fields move to its server-side apply, and fields other managers hold become conflicts (listed in the server-side prediction)"},
		}
	}
	return m
}

// Command returns `helm <op> ...` with the given flags; args are the operation's
// positional arguments and other flags (release, chart or revision, -n).
func (m Mode) Command(args []string, flags []string) string {
	return strings.Join(append(append([]string{"helm", string(m.Operation)}, args...), flags...), " ")
}

func without(s []string, drop string) []string {
	out := []string{}
	for _, v := range s {
		if v != drop {
			out = append(out, v)
		}
	}
	return out
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return []string{}
	}
	return s
}

func slicesClone(s []string) []string { return append([]string{}, s...) }

// HelmPrints is the error line the Helm CLI prints for the report's error: `helm upgrade`
// prefixes "UPGRADE FAILED: ", `helm rollback` prints it as it is, and a flag-group error
// stops cobra before either runs. Empty when there is no error.
func (r *Report) HelmPrints() string {
	switch {
	case r.Error == "":
		return ""
	case r.Operation == OpRollback || strings.HasPrefix(r.Error, "if any flags in the group"):
		return "Error: " + r.Error
	}
	return "Error: UPGRADE FAILED: " + r.Error
}
