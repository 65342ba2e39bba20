package chartmigrate

import (
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// handled are the uninstall pre-flight's checks the migration itself takes care of: it
// retains the volumes, re-binds the claims and restores the Secrets. A live-only keep
// changes nothing either: the object is in the plan's delete list. Every other check
// blocks, including ones added later.
var handled = map[string]bool{
	uninstall.CheckPVCDeleted:   true,
	uninstall.CheckPVDelete:     true,
	uninstall.CheckSecret:       true,
	uninstall.CheckLiveOnlyKeep: true,
}

// FromUninstall turns the uninstall pre-flight's report into what the plan needs: the
// delete list, what stays, and its findings, blocking unless the migration handles them.
func FromUninstall(rep *uninstall.Report) Preflight {
	pf := Preflight{Deletes: []string{}, Kept: []string{}}
	for _, o := range rep.Objects {
		switch o.Action {
		case uninstall.Delete:
			pf.Deletes = append(pf.Deletes, o.Subject)
		case uninstall.Absent:
		default:
			pf.Kept = append(pf.Kept, o.Subject)
		}
	}
	for _, f := range rep.Findings {
		pf.Findings = append(pf.Findings, Finding{Check: "uninstall/" + f.Check, Subject: f.Subject, Message: f.Message,
			Remediation: f.Remediation, Severity: preflightSeverity(handled[f.Check])})
	}
	return pf
}

// preflightSeverity: a pre-flight finding the migration takes care of itself is a note;
// any other blocks.
func preflightSeverity(handled bool) finding.Severity {
	if handled {
		return finding.Info
	}
	return finding.Blocking
}
