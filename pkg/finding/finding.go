// Package finding owns the one shape of a finding that upgradeguard's checks report: what
// it is about (Subject, "Kind/namespace/name" where it is an object), which check found
// it, how bad it is, what is wrong and what to do. The uninstall pre-flight, the chart
// migration plan, the audit and the slots check all report this shape, so a caller
// renders, filters or counts findings one way.
package finding

// Severity says how much a finding matters.
type Severity string

// Severities, least first.
const (
	// Info is worth knowing; nothing is at risk.
	Info Severity = "info"
	// Warning is a setting or state that weakens a protection.
	Warning Severity = "warning"
	// Danger is a state that loses data or breaks an operation if left as it is.
	Danger Severity = "danger"
	// Blocking stops an operation from going ahead until it is fixed or overridden.
	Blocking Severity = "blocking"
)

// Finding is one problem found by one check.
type Finding struct {
	// Check is the ID of the check that found it (stable, for filters and docs).
	Check string `json:"check"`
	// Subject is what it is about: an object as Kind/namespace/name, a release, a slot.
	Subject  string   `json:"subject"`
	Severity Severity `json:"severity"`
	Message  string   `json:"message"`
	// Remediation is the next action, when there is one.
	Remediation string `json:"remediation,omitempty"`
}

// Blocks says whether the finding stops the operation.
func (f Finding) Blocks() bool { return f.Severity == Blocking }
