package output_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/internal/output/sariftest"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// report has two groups (clusters), a passing case, a failing one with two findings, one
// with a warning only, and text that markdown, XML and workflow commands must escape.
func report() finding.Report {
	return finding.Report{Tool: "review", Cases: []finding.Case{
		{Group: "prod-eu", Name: "HelmRelease/flux-system/flux2", Findings: []finding.Finding{
			{Check: "stored-version-dropped", Subject: "CustomResourceDefinition/helmreleases.helm.toolkit.fluxcd.io", Severity: finding.Blocking,
				Message: "v2beta1 is dropped, and storedVersions still holds it | 120 objects", Remediation: "upgradeguard migrate --chart flux2",
				Location: &finding.Location{File: "clusters/prod-eu/flux.yaml", Line: 12}},
			{Check: "crd-deleted", Subject: "CustomResourceDefinition/leaderworkersets.leaderworkerset.x-k8s.io", Severity: finding.Danger,
				Message: "the upgrade deletes the CRD,\nand 3 objects with it: 100% lost", Location: &finding.Location{File: "clusters/prod-eu/lws.yaml"}},
		}},
		{Group: "prod-eu", Name: "HelmRelease/apps/podinfo"},
		{Group: "staging", Name: "HelmRelease/flux-system/flux2", Findings: []finding.Finding{
			{Check: "schema-warning", Subject: "CustomResourceDefinition/buckets.source.toolkit.fluxcd.io", Severity: finding.Warning,
				Message: "a new rule may refuse 2 objects at their next write"},
			{Check: "delete", Subject: "leaderworkersets.leaderworkerset.x-k8s.io", Severity: finding.Blocking,
				Message: "the upgrade deletes the CRD and 3 objects", Acknowledged: true},
		}},
	}}
}

func render(t *testing.T, format string, rep finding.Report) string {
	t.Helper()
	var buf bytes.Buffer
	text := func(io.Writer) error { t.Errorf("-o %s rendered text", format); return nil }
	if err := output.WriteReport(&buf, format, rep, text, func() finding.Report { return rep }); err != nil {
		t.Fatalf("-o %s: %v", format, err)
	}
	return buf.String()
}

// TestSARIF: the log validates against the published SARIF 2.1.0 schema (testdata, from
// the OASIS SARIF specification repository), and says each finding's check, level and place.
func TestSARIF(t *testing.T) {
	for _, rep := range map[string]finding.Report{"findings": report(), "none": {Tool: "review"}} {
		sariftest.Validate(t, render(t, output.SARIF, rep))
	}

	var log struct {
		Runs []struct {
			Tool struct {
				Driver struct {
					Rules []struct{ ID string } `json:"rules"`
				} `json:"driver"`
			} `json:"tool"`
			Results []struct {
				RuleID       string `json:"ruleId"`
				RuleIndex    int    `json:"ruleIndex"`
				Level        string `json:"level"`
				Suppressions []struct {
					Kind string `json:"kind"`
				} `json:"suppressions"`
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct{ URI string }     `json:"artifactLocation"`
						Region           *struct{ StartLine int } `json:"region"`
					} `json:"physicalLocation"`
				} `json:"locations"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(render(t, output.SARIF, report())), &log); err != nil || len(log.Runs) != 1 {
		t.Fatalf("%v %+v", err, log)
	}
	run := log.Runs[0]
	var got []string
	for _, r := range run.Results {
		place := "-"
		if len(r.Locations) == 1 {
			l := r.Locations[0].PhysicalLocation
			place = l.ArtifactLocation.URI
			if l.Region != nil {
				place += ":" + strconv.Itoa(l.Region.StartLine)
			}
		}
		line := fmt.Sprintf("%s %s %s rule=%s", r.RuleID, r.Level, place, run.Tool.Driver.Rules[r.RuleIndex].ID)
		if len(r.Suppressions) == 1 && r.Suppressions[0].Kind == "external" {
			line += " suppressed"
		}
		got = append(got, line)
	}
	want := []string{
		"stored-version-dropped error clusters/prod-eu/flux.yaml:12 rule=stored-version-dropped",
		"crd-deleted error clusters/prod-eu/lws.yaml rule=crd-deleted",
		"schema-warning warning - rule=schema-warning",
		"delete error - rule=delete suppressed",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
}

// TestJUnit: the XML parses as JUnit, a suite per cluster and a case per release; a case
// fails on a danger or blocking finding only.
func TestJUnit(t *testing.T) {
	var suites struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Suites   []struct {
			Name     string `xml:"name,attr"`
			Tests    int    `xml:"tests,attr"`
			Failures int    `xml:"failures,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Type string `xml:"type,attr"`
					Text string `xml:",chardata"`
				} `xml:"failure"`
				SystemOut string `xml:"system-out"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	out := render(t, output.JUnit, report())
	if err := xml.Unmarshal([]byte(out), &suites); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got []string
	for _, s := range suites.Suites {
		got = append(got, fmt.Sprintf("suite %s %d/%d", s.Name, s.Failures, s.Tests))
		for _, c := range s.Cases {
			line := "  " + c.Name
			if c.Failure != nil {
				line += " FAIL " + c.Failure.Type + " " + strconv.Itoa(strings.Count(c.Failure.Text, "\n")+1)
			}
			if c.SystemOut != "" {
				line += " out"
			}
			got = append(got, line)
		}
	}
	want := []string{
		"suite prod-eu 1/2",
		"  HelmRelease/flux-system/flux2 FAIL stored-version-dropped,crd-deleted 3",
		"  HelmRelease/apps/podinfo",
		"suite staging 0/1",
		"  HelmRelease/flux-system/flux2 out",
	}
	if diff := cmp.Diff(want, got); diff != "" || suites.Tests != 3 || suites.Failures != 1 {
		t.Errorf("%d/%d (-want +got):\n%s\n%s", suites.Failures, suites.Tests, diff, out)
	}
}

// TestMarkdown: the pull-request comment, against testdata/report.md (-update rewrites it).
func TestMarkdown(t *testing.T) {
	out := render(t, output.Markdown, report())
	if !strings.HasPrefix(out, output.MarkdownMarker+"review -->\n") {
		t.Errorf("no marker: %q", out)
	}
	golden := filepath.Join("testdata", "report.md")
	if *update {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), out); diff != "" {
		t.Errorf("%s (-want +got):\n%s", golden, diff)
	}
}

// TestGitHub: a workflow command per finding, escaped so the runner reads each back whole.
func TestGitHub(t *testing.T) {
	want := "::error file=clusters/prod-eu/flux.yaml,line=12,title=stored-version-dropped%3A CustomResourceDefinition/helmreleases.helm.toolkit.fluxcd.io::" +
		"v2beta1 is dropped, and storedVersions still holds it | 120 objects Fix: upgradeguard migrate --chart flux2\n" +
		"::error file=clusters/prod-eu/lws.yaml,title=crd-deleted%3A CustomResourceDefinition/leaderworkersets.leaderworkerset.x-k8s.io::" +
		"the upgrade deletes the CRD,%0Aand 3 objects with it: 100%25 lost\n" +
		"::warning title=schema-warning%3A CustomResourceDefinition/buckets.source.toolkit.fluxcd.io::a new rule may refuse 2 objects at their next write\n" +
		"::notice title=delete%3A leaderworkersets.leaderworkerset.x-k8s.io::(acknowledged) the upgrade deletes the CRD and 3 objects\n"
	if diff := cmp.Diff(want, render(t, output.GitHub, report())); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestReportFlag: the CI formats are offered where a command renders findings, and only
// there.
func TestReportFlag(t *testing.T) {
	var format string
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	output.AddReportFlag(fs, &format)
	if err := fs.Parse([]string{"-o", "sarif"}); err != nil || format != output.SARIF {
		t.Errorf("report flag: %q %v", format, err)
	}
	err := fs.Parse([]string{"-o", "yaml"})
	if err == nil || !strings.Contains(err.Error(), "use -o text, -o json, -o markdown, -o sarif, -o junit or -o github") {
		t.Errorf("report flag, yaml: %v", err)
	}
	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	output.AddFlag(fs, &format)
	if err := fs.Parse([]string{"-o", "sarif"}); err == nil {
		t.Error("a command without findings took -o sarif")
	}
}
