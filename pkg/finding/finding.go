// Package finding owns the one shape of a finding that upgradeguard's checks report: what
// it is about (Subject, "Kind/namespace/name" where it is an object), which check found
// it, how bad it is, what is wrong and what to do (with the operation's input that does
// it, for each front end to word as its own flag or field). The uninstall pre-flight, the
// chart migration plan, the audit and the slots check all report this shape, and check,
// plan, the apply and rollback pre-flights and the failed-upgrade diff map their results
// onto a Report, so a caller renders, filters or counts findings one way.
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
	// Remediation is the next action, when there is one. It never names a front end's
	// flag: where the action is an input of the operation, Input names it.
	Remediation string `json:"remediation,omitempty"`
	// Input is the operation's input that the Message or Remediation advises, when there
	// is one.
	Input *Input `json:"input,omitempty"`
	// Location is where the finding points in a repository, when it points at a file:
	// what a pull request's annotations and SARIF show it on.
	Location *Location `json:"location,omitempty"`
	// Acknowledged says that someone accepted it on purpose (AckKey names it): it is still
	// shown, marked, and no longer fails a run.
	Acknowledged bool `json:"acknowledged,omitempty"`
}

// Fails says whether the finding fails a CI job: it loses data or stops the operation,
// and nobody acknowledged it.
func (f Finding) Fails() bool { return !f.Acknowledged && f.Severity.Fails() }

// AckKey is how an acknowledgement names the finding: CHECK/SUBJECT, for example
// delete/leaderworkersets.leaderworkerset.x-k8s.io.
func (f Finding) AckKey() string { return f.Check + "/" + f.Subject }

// Location is a place in a repository's files.
type Location struct {
	// File is the path from the repository's root, with forward slashes.
	File string `json:"file"`
	// Line is the 1-based line the finding is about; 0 means the file as a whole.
	Line int `json:"line,omitempty"`
}

// Input is an input of the operation that reported a finding, in the library's terms:
// the option that takes it and the value to give. Each front end words it as its own (the
// CLI as the flag that sets the option), so a library message never names a flag.
type Input struct {
	// Option names the option, as the reporting package declares it (for example
	// chartmigrate.OptionMapPVC).
	Option string `json:"option"`
	// Value is the value to give, placeholders in capitals ("data=NEW-CLAIM"); empty when
	// the finding cannot say.
	Value string `json:"value,omitempty"`
}

// Blocks says whether the finding stops the operation.
func (f Finding) Blocks() bool { return f.Severity == Blocking }
