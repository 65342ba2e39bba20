package gate

import (
	"strings"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Deletion is the decision on a deletion: of a CRD itself, by any client, or of the CRDs
// an uninstall deletes. It is not an upgrade's Decision: nothing migrates a deletion
// right, so it has no migration, no plan and no conditions. A deletion proceeds when no
// CRD it deletes takes objects with it unasked, and is blocked otherwise.
type Deletion struct {
	// Outcome is Proceed or Blocked, never Migrating.
	Outcome Outcome
	Report  *check.Report
	// Message says what was decided and why: the library's sentence, which every front
	// end shows as it is (the admission gate puts it in its answer, after what its door
	// adds).
	Message string
	// Held are the CRDs whose deletion is refused because they hold objects, as
	// "name: reason".
	Held []string
}

// Why a deletion proceeds or is blocked.
const (
	// WhyDeleteCRD is why the deletion of a CRD that holds objects is blocked.
	WhyDeleteCRD = "deleting a CRD deletes every object of its type"
	// WhyDeletionSafe is why a deletion proceeds: each CRD it deletes holds no objects,
	// or says that they may go with it.
	WhyDeletionSafe = "no CRD it deletes takes objects with it unasked"
	// WhyNothingDeleted is why a deletion that deletes no CRD proceeds (an uninstall of a
	// release that renders none).
	WhyNothingDeleted = "it deletes no CRD"
)

// NextSteps are the report's next steps: how to back up the CRDs and let them go.
func (d *Deletion) NextSteps() []string {
	if d.Report == nil {
		return nil
	}
	return d.Report.NextSteps
}

// JudgeDeletion turns the report of a deletion (predict.DecideDeleted's verdict for each
// CRD it deletes) into the gate's decision: proceed when every verdict is ok, blocked
// otherwise. It writes the sentence every front end shows, Deletion.Message.
func JudgeDeletion(rep *check.Report) *Deletion {
	d := &Deletion{Report: rep, Outcome: Proceed}
	var fine []string
	for _, c := range rep.CRDs {
		if c.Verdict == predict.OK {
			fine = append(fine, c.Name+": "+c.Reason)
			continue
		}
		d.Held = append(d.Held, c.Name+": "+c.Reason)
	}
	switch {
	case len(d.Held) > 0:
		d.Outcome, d.Message = Blocked, WhyDeleteCRD+": "+strings.Join(d.Held, "; ")
	case len(fine) > 0:
		d.Message = WhyDeletionSafe + ": " + strings.Join(fine, "; ")
	default:
		d.Message = WhyNothingDeleted
	}
	return d
}
