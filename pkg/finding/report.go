package finding

// Report is one run of a check as CI reads it: every case it judged, grouped (by cluster,
// by ref range; one group when Group is empty), and what each case found. A case without
// findings passed. JUnit, SARIF, a pull-request comment and workflow annotations are all
// rendered from this one shape, so every command that maps its result onto a Report
// speaks every CI format.
type Report struct {
	// Tool is the command that judged: "slots", "audit".
	Tool string `json:"tool"`
	// Cases are what was judged, in the order to show them.
	Cases []Case `json:"cases"`
	// Notes say what the verdicts rest on that a reader must know: a cluster judged from
	// a snapshot, and its age.
	Notes []string `json:"notes,omitempty"`
}

// Case is one thing judged: a release, a slot, a CRD.
type Case struct {
	// Group is what the case belongs to, a cluster for example; "" when the report has one.
	Group string `json:"group,omitempty"`
	// Name says what was judged, as Finding.Subject does.
	Name     string    `json:"name"`
	Findings []Finding `json:"findings,omitempty"`
}

// Worst is the most severe of the case's findings that are not acknowledged, "" when it
// has none.
func (c Case) Worst() Severity {
	var w Severity
	for _, f := range c.Findings {
		if !f.Acknowledged && rank(f.Severity) > rank(w) {
			w = f.Severity
		}
	}
	return w
}

// Failed says whether the case holds a finding that fails a CI job.
func (c Case) Failed() bool { return c.Worst().Fails() }

// Failed says whether any case failed: what fails a CI job.
func (r Report) Failed() bool {
	for _, c := range r.Cases {
		if c.Failed() {
			return true
		}
	}
	return false
}

// Fails says whether a finding of this severity fails a CI job: it loses data or stops the
// operation.
func (s Severity) Fails() bool { return rank(s) >= rank(Danger) }

// Findings are every case's findings, in order.
func (r Report) Findings() []Finding {
	var out []Finding
	for _, c := range r.Cases {
		out = append(out, c.Findings...)
	}
	return out
}

// Groups are the cases' groups in their first order.
func (r Report) Groups() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range r.Cases {
		if !seen[c.Group] {
			seen[c.Group] = true
			out = append(out, c.Group)
		}
	}
	return out
}

func rank(s Severity) int {
	switch s {
	case Info:
		return 1
	case Warning:
		return 2
	case Danger:
		return 3
	case Blocking:
		return 4
	}
	return 0
}
