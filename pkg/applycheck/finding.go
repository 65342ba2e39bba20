package applycheck

import (
	"fmt"
	"strings"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Check IDs of the replay's findings. The CRD check's findings keep its verdicts as their
// IDs, and the objects an operation deletes keep the uninstall pre-flight's.
const (
	// CheckFlagError: Helm stops at its own flags (FlagError), before it applies anything.
	CheckFlagError = "flag-error"
	// CheckFieldConflict: fields another manager owns fail an object's server-side apply
	// (Conflict); Helm goes on, and the operation fails half-applied.
	CheckFieldConflict = "field-conflict"
	// CheckRejected: the API server rejects an object's apply, create or delete (Failed):
	// validation, an immutable field, admission, storedVersions.
	CheckRejected = "apply-rejected"
	// CheckCannotImport: an object the chart adds exists without this release's ownership
	// metadata (CannotImport); Helm refuses the operation.
	CheckCannotImport = "cannot-import"
	// CheckNotServed: the cluster does not serve an object's kind (NotServed); Helm refuses
	// the operation.
	CheckNotServed = "kind-not-served"
	// CheckNotReverted: a server-side rollback leaves fields other managers own
	// (Object.NotReverted): it succeeds, and is not a revert.
	CheckNotReverted = "not-reverted"
)

// objectChecks are the outcomes that fail or refuse the operation, with their check and
// what fixes them.
var objectChecks = map[Outcome]struct{ check, fix string }{
	Conflict: {CheckFieldConflict, "settle the field's owner: stop the other manager from writing it, or take it back with a one-off " +
		"apply that forces conflicts after reading the whole list; then check again"},
	Failed: {CheckRejected, "change the chart (an immutable field changes only by deleting and re-creating the object); " +
		"a CRD rejected on status.storedVersions needs its objects migrated off the dropped versions first (the CRD check names how)"},
	CannotImport: {CheckCannotImport, "give the object this release's ownership metadata, delete it, or let the operation take ownership"},
	NotServed:    {CheckNotServed, "install the CRDs the chart needs before the operation"},
}

// FindingReport is the prediction as CI reads it: a case for the release's replay (the
// flag error Helm stops at, each object that fails or refuses the operation, the fields a
// rollback does not revert, and what deleting the dropped objects loses, with the
// uninstall pre-flight's checks), then check's case per CRD (check.Report.FindingReport).
// What fails the operation is blocking; what it loses or leaves unreverted is a danger.
func (p *Prediction) FindingReport() finding.Report {
	rep := finding.Report{Tool: toolOf(p.Mode.Operation), Cases: []finding.Case{}}
	subject := manifest.SubjectOf("Release", p.Namespace, p.Release)
	c := finding.Case{Name: subject}
	if e := p.Mode.FlagError; e != "" {
		c.Findings = append(c.Findings, finding.Finding{Check: CheckFlagError, Subject: subject, Severity: finding.Blocking,
			Message: "Helm stops: " + e, Remediation: alternatives(p.Mode.Alternatives)})
	}
	if p.Apply != nil {
		for _, o := range p.Apply.Objects {
			if oc, ok := objectChecks[o.Outcome]; ok {
				c.Findings = append(c.Findings, finding.Finding{Check: oc.check, Subject: o.Object, Severity: finding.Blocking,
					Message: objectMessage(o), Remediation: oc.fix})
			}
			if len(o.NotReverted) > 0 {
				c.Findings = append(c.Findings, finding.Finding{Check: CheckNotReverted, Subject: o.Object, Severity: finding.Danger,
					Message:     "the rollback leaves fields other managers own as they are: " + FieldOwners(o.NotReverted, " by "),
					Remediation: "roll back with client-side apply (its three-way merge removes them), or remove them by hand after the rollback"})
			}
		}
	}
	if p.Prune != nil {
		c.Findings = append(c.Findings, p.Prune.Findings...)
	}
	rep.Cases = append(rep.Cases, c)
	rep.Cases = append(rep.Cases, crdCases(p.CRDCheck)...)
	return rep
}

// FindingReport is, when the replay was not asked, the CRD check that blocks the
// operation anyway, with a note that says why the replay is missing.
func (e *ReplayNotAsked) FindingReport(op Operation) finding.Report {
	return finding.Report{Tool: toolOf(op), Cases: crdCases(e.CRDCheck),
		Notes: []string{"The replay of the operation was not asked (its server-side dry runs are authorized as writes): " + e.Err.Error()}}
}

func crdCases(r *check.Report) []finding.Case {
	if r == nil {
		return nil
	}
	return r.FindingReport().Cases
}

func toolOf(op Operation) string {
	if op == OpRollback {
		return "rollback-check"
	}
	return "apply-check"
}

func objectMessage(o Object) string {
	if len(o.Conflicts) > 0 {
		return fmt.Sprintf("%s fails: %s", o.Step, FieldOwners(o.Conflicts, " is owned by "))
	}
	if o.Error != "" {
		return fmt.Sprintf("%s fails: %s", o.Step, o.Error)
	}
	return fmt.Sprintf("%s fails: %s", o.Step, o.Outcome)
}

// FieldOwners words fields with their managers, each as FIELD SEP "MANAGER", for a
// person: the findings' messages and a front end's table say them alike.
func FieldOwners(fs []FieldConflict, sep string) string {
	parts := make([]string, 0, len(fs))
	for _, c := range fs {
		parts = append(parts, fmt.Sprintf("%s%s%q", c.Field, sep, c.Manager))
	}
	return strings.Join(parts, "; ")
}

func alternatives(alts []Alternative) string {
	if len(alts) == 0 {
		return "change the flags"
	}
	parts := make([]string, 0, len(alts))
	for _, a := range alts {
		flags := strings.Join(a.Flags, " ")
		if flags == "" {
			flags = "no apply flag"
		}
		parts = append(parts, fmt.Sprintf("with %s (%s)", flags, a.Why))
	}
	return "run it " + strings.Join(parts, "; or ")
}
