// Package citest reads back what the CI formats wrote, for the tests of every command that
// writes them: the SARIF log validated against the 2.1.0 schema, the JUnit XML parsed.
// Each comes back as short lines a test compares with cmp.Diff.
package citest

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/output/sariftest"
)

// SARIF validates log against the SARIF 2.1.0 schema and returns each result as
// "RULE LEVEL SUBJECT".
func SARIF(t testing.TB, log string) []string {
	t.Helper()
	sariftest.Validate(t, log)
	var l struct {
		Runs []struct {
			Results []struct {
				RuleID     string `json:"ruleId"`
				Level      string `json:"level"`
				Properties struct {
					Subject string `json:"subject"`
				} `json:"properties"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(log), &l); err != nil || len(l.Runs) != 1 {
		t.Fatalf("SARIF: %v, %d runs\n%s", err, len(l.Runs), log)
	}
	out := []string{}
	for _, r := range l.Runs[0].Results {
		out = append(out, fmt.Sprintf("%s %s %s", r.RuleID, r.Level, r.Properties.Subject))
	}
	return out
}

// JUnit parses out as JUnit XML and returns each case as "SUITE: CASE", with " FAIL
// CHECKS" when it fails and " out" when it has findings that do not fail it.
func JUnit(t testing.TB, out string) []string {
	t.Helper()
	var suites struct {
		XMLName xml.Name `xml:"testsuites"`
		Suites  []struct {
			Name  string `xml:"name,attr"`
			Cases []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Type string `xml:"type,attr"`
				} `xml:"failure"`
				SystemOut string `xml:"system-out"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal([]byte(out), &suites); err != nil {
		t.Fatalf("JUnit: %v\n%s", err, out)
	}
	lines := []string{}
	for _, s := range suites.Suites {
		for _, c := range s.Cases {
			line := s.Name + ": " + c.Name
			if c.Failure != nil {
				line += " FAIL " + c.Failure.Type
			}
			if c.SystemOut != "" {
				line += " out"
			}
			lines = append(lines, line)
		}
	}
	return lines
}
