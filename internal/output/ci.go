package output

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// MarkdownMarker opens every pull-request comment body: a CI job finds its earlier comment
// by it and updates that one instead of adding another. The tool's name follows it, so
// two commands in one job keep a comment each.
const MarkdownMarker = "<!-- upgradeguard:"

// WriteMarkdown writes rep as a pull-request comment: the marker, a one-line summary, then
// a table per group of every case (with what inside it each finding is about), its
// verdict, what was found and the fix.
func WriteMarkdown(w io.Writer, rep finding.Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%s -->\n", MarkdownMarker, rep.Tool)
	fmt.Fprintf(&b, "**upgradeguard %s**: %s\n", rep.Tool, summary(rep))
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "\n> %s\n", strings.Join(strings.Fields(n), " "))
	}
	for _, g := range rep.Groups() {
		if g != "" {
			fmt.Fprintf(&b, "\n#### %s\n", cell(g))
		}
		b.WriteString("\n| | Subject | Check | Finding | Fix |\n|---|---|---|---|---|\n")
		for _, c := range rep.Cases {
			if c.Group != g {
				continue
			}
			if len(c.Findings) == 0 {
				fmt.Fprintf(&b, "| ✅ | %s | | no finding | |\n", cell(c.Name))
			}
			for _, f := range c.Findings {
				fmt.Fprintf(&b, "| %s | %s | `%s` | %s | %s |\n", mark(f), cell(rowSubject(c, f)), f.Check, cell(f.Message), cell(f.Remediation))
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// rowSubject is what a markdown row is about: the case, and the finding's own subject
// when it names something inside the case (a CRD of a release, an object of a rollback)
// rather than the case itself.
func rowSubject(c finding.Case, f finding.Finding) string {
	if f.Subject == "" || strings.HasPrefix(c.Name, f.Subject) {
		return c.Name
	}
	return c.Name + ": " + f.Subject
}

// summary is the report in one line: how many cases, how many failed, how many findings.
func summary(rep finding.Report) string {
	failed, found := 0, 0
	for _, c := range rep.Cases {
		found += len(c.Findings)
		if c.Failed() {
			failed++
		}
	}
	switch {
	case len(rep.Cases) == 0:
		return "nothing to judge."
	case found == 0:
		return fmt.Sprintf("%s judged, no finding.", plural(len(rep.Cases), "subject"))
	case failed == 0:
		return fmt.Sprintf("%s judged, none fails; %s to read.", plural(len(rep.Cases), "subject"), plural(found, "finding"))
	}
	verb := "fail"
	if failed == 1 {
		verb = "fails"
	}
	return fmt.Sprintf("%s judged: %d %s; %s.", plural(len(rep.Cases), "subject"), failed, verb, plural(found, "finding"))
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func mark(f finding.Finding) string {
	if f.Acknowledged {
		return "☑️ acknowledged " + string(f.Severity)
	}
	return map[string]string{"error": "❌ ", "warning": "⚠️ ", "note": "ℹ️ "}[sarifLevel(f.Severity)] + string(f.Severity)
}

// cell keeps text inside one markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// WriteGitHub writes one GitHub Actions workflow command per finding: an error for what
// fails the job, a warning or a notice for the rest, on the finding's file and line when
// it has one.
func WriteGitHub(w io.Writer, rep finding.Report) error {
	var b strings.Builder
	for _, f := range rep.Findings() {
		props := []string{}
		if f.Location != nil {
			props = append(props, "file="+ghProperty(f.Location.File))
			if f.Location.Line > 0 {
				props = append(props, fmt.Sprintf("line=%d", f.Location.Line))
			}
		}
		props = append(props, "title="+ghProperty(f.Check+": "+f.Subject))
		level, msg := map[string]string{"error": "error", "warning": "warning", "note": "notice"}[sarifLevel(f.Severity)], text(f)
		if f.Acknowledged {
			level, msg = "notice", "(acknowledged) "+msg
		}
		fmt.Fprintf(&b, "::%s %s::%s\n", level, strings.Join(props, ","), ghData(msg))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ghData escapes a workflow command's message as the runner reads it back.
func ghData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// ghProperty escapes a workflow command's property value.
func ghProperty(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(s)
}

// text is a finding as one message: what is wrong, then what to do.
func text(f finding.Finding) string {
	if f.Remediation == "" {
		return f.Message
	}
	return f.Message + " Fix: " + f.Remediation
}

// The JUnit XML shape that CI systems (GitLab, Jenkins, the test-report actions) read.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes rep as JUnit XML: a suite per group (the tool's name for the one group
// of a report without groups), a case per judged subject. A case fails on a danger or
// blocking finding; the findings that do not fail it are its system-out.
func WriteJUnit(w io.Writer, rep finding.Report) error {
	out := junitSuites{Name: "upgradeguard " + rep.Tool}
	for _, g := range rep.Groups() {
		s := junitSuite{Name: g}
		if g == "" {
			s.Name = rep.Tool
		}
		for _, c := range rep.Cases {
			if c.Group != g {
				continue
			}
			s.Cases = append(s.Cases, junitCaseOf(s.Name, c))
			s.Tests++
			if c.Failed() {
				s.Failures++
			}
		}
		out.Tests += s.Tests
		out.Failures += s.Failures
		out.Suites = append(out.Suites, s)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func junitCaseOf(suite string, c finding.Case) junitCase {
	jc := junitCase{Name: c.Name, ClassName: suite}
	var failing, other, checks []string
	for _, f := range c.Findings {
		line := fmt.Sprintf("%s %s: %s", f.Severity, f.Check, text(f))
		if f.Acknowledged {
			line = "acknowledged " + line
		}
		if !f.Fails() {
			other = append(other, line)
			continue
		}
		if jc.Failure == nil {
			jc.Failure = &junitFailure{Message: f.Message}
		}
		failing = append(failing, line)
		if !slices.Contains(checks, f.Check) {
			checks = append(checks, f.Check)
		}
	}
	if jc.Failure != nil {
		jc.Failure.Type, jc.Failure.Text = strings.Join(checks, ","), strings.Join(failing, "\n")
	}
	jc.SystemOut = strings.Join(other, "\n")
	return jc
}

// SARIFSchema is the schema the SARIF output declares: SARIF 2.1.0 as OASIS publishes it.
const SARIFSchema = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"

// InformationURI is where the SARIF output says its tool is documented.
const InformationURI = "https://github.com/upgradeguard/upgradeguard"

type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool    sarifTool     `json:"tool"`
	Results []sarifResult `json:"results"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	InformationURI string      `json:"informationUri"`
	Rules          []sarifRule `json:"rules"`
}

type sarifRule struct {
	ID               string       `json:"id"`
	ShortDescription sarifMessage `json:"shortDescription"`
}

type sarifMessage struct {
	Text string `json:"text"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	RuleIndex int             `json:"ruleIndex"`
	Level     string          `json:"level"`
	Message   sarifMessage    `json:"message"`
	Locations []sarifLocation `json:"locations,omitempty"`
	// Suppressions mark an acknowledged finding: reported, and not a failure.
	Suppressions []sarifSuppression `json:"suppressions,omitempty"`
	Properties   map[string]any     `json:"properties,omitempty"`
}

type sarifSuppression struct {
	Kind          string `json:"kind"`
	Justification string `json:"justification"`
}

type sarifLocation struct {
	PhysicalLocation sarifPhysical `json:"physicalLocation"`
}

type sarifPhysical struct {
	ArtifactLocation sarifArtifact `json:"artifactLocation"`
	Region           *sarifRegion  `json:"region,omitempty"`
}

type sarifArtifact struct {
	URI string `json:"uri"`
}

type sarifRegion struct {
	StartLine int `json:"startLine"`
}

// WriteSARIF writes rep as a SARIF 2.1.0 log: one run, a rule per check ID (the ruleId),
// a result per finding at its file and line when it has one.
func WriteSARIF(w io.Writer, rep finding.Report) error {
	run := sarifRun{
		Tool:    sarifTool{Driver: sarifDriver{Name: "upgradeguard", InformationURI: InformationURI, Rules: []sarifRule{}}},
		Results: []sarifResult{},
	}
	index := map[string]int{}
	for _, c := range rep.Cases {
		for _, f := range c.Findings {
			i, ok := index[f.Check]
			if !ok {
				i = len(run.Tool.Driver.Rules)
				index[f.Check] = i
				run.Tool.Driver.Rules = append(run.Tool.Driver.Rules, sarifRule{ID: f.Check, ShortDescription: sarifMessage{Text: rep.Tool + " check " + f.Check}})
			}
			r := sarifResult{RuleID: f.Check, RuleIndex: i, Level: sarifLevel(f.Severity), Message: sarifMessage{Text: text(f)},
				Properties: map[string]any{"subject": f.Subject, "severity": string(f.Severity)}}
			if c.Group != "" {
				r.Properties["group"] = c.Group
			}
			if f.Acknowledged {
				r.Suppressions = []sarifSuppression{{Kind: "external", Justification: "acknowledged as " + f.AckKey()}}
			}
			if f.Location != nil {
				loc := sarifLocation{PhysicalLocation: sarifPhysical{ArtifactLocation: sarifArtifact{URI: f.Location.File}}}
				if f.Location.Line > 0 {
					loc.PhysicalLocation.Region = &sarifRegion{StartLine: f.Location.Line}
				}
				r.Locations = []sarifLocation{loc}
			}
			run.Results = append(run.Results, r)
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(sarifLog{Schema: SARIFSchema, Version: "2.1.0", Runs: []sarifRun{run}})
}

// sarifLevel is a severity as SARIF's level, the one mapping every CI format starts from:
// error for what fails a job, warning, and note for information.
func sarifLevel(s finding.Severity) string {
	switch {
	case s.Fails():
		return "error"
	case s == finding.Warning:
		return "warning"
	}
	return "note"
}
