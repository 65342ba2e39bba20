package cli_test

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/output/sariftest"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// These tests build chart repositories whose commits and tags are real upstream chart
// releases (the fixtures), and review a pull request to them as a chart maintainer's CI
// does: no cluster, only the repository.

// chartRepo is a chart repository in a real git repository: each commit of a chart puts
// a version's files in place of the previous one's.
type chartRepo struct {
	*servers.GitRepo
	t    *testing.T
	have map[string]map[string]string // chart folder -> its files
}

func newChartRepo(t *testing.T) *chartRepo {
	return &chartRepo{GitRepo: servers.NewGitRepo(t), t: t, have: map[string]map[string]string{}}
}

// commit puts files in the chart folder dir, in place of what it held.
func (r *chartRepo) commit(dir, msg string, files map[string]string) plumbing.Hash {
	r.t.Helper()
	change := map[string]string{}
	for p := range r.have[dir] {
		if _, ok := files[p]; !ok {
			change[filepath.ToSlash(filepath.Join(dir, p))] = ""
		}
	}
	for p, c := range files {
		change[filepath.ToSlash(filepath.Join(dir, p))] = c
	}
	r.have[dir] = files
	return r.Commit(msg, change)
}

// upstream commits a real chart release from the fixtures into dir, and tags it when
// tag is not empty.
func (r *chartRepo) upstream(dir, chart, version, tag string) plumbing.Hash {
	r.t.Helper()
	files, err := scenario.ChartFiles(chart, version)
	if err != nil {
		r.t.Fatal(err)
	}
	h := r.commit(dir, chart+" "+version, files)
	if tag != "" {
		r.Tag(tag, h)
	}
	return h
}

// reviewCharts runs review on the repository as JSON: the exit code and the charts.
func reviewCharts(t *testing.T, dir string, args ...string) (result, []review.ChartReview) {
	t.Helper()
	r := run(t, append([]string{"review", "--repo", dir, "-o", "json"}, args...)...)
	if r.code == cli.ExitCouldNot {
		t.Fatalf("review %v: exit 2\n%s%s", args, r.stdout, r.stderr)
	}
	var rep review.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("review %v: %v\n%s", args, err, r.stdout)
	}
	return r, rep.Charts
}

// findingsOf are "check subject" of every finding, or of those of the checks given.
func findingsOf(charts []review.ChartReview, checks ...string) []string {
	var out []string
	for _, c := range charts {
		for _, f := range c.Findings {
			if len(checks) == 0 || slices.Contains(checks, f.Check) {
				out = append(out, f.Check+" "+f.Subject)
			}
		}
	}
	return out
}

func findingOf(t *testing.T, charts []review.ChartReview, check, subject string) finding.Finding {
	t.Helper()
	for _, c := range charts {
		for _, f := range c.Findings {
			if f.Check == check && f.Subject == subject {
				return f
			}
		}
	}
	t.Fatalf("no %s finding on %s in %v", check, subject, findingsOf(charts))
	return finding.Finding{}
}

// flux218 are the findings on flux2 2.18 from 2.17.2: the CRDs whose v1beta2 (v2beta2)
// it drops, and a CEL rule HelmChart's v1 adds (crdschema.Compare: a warning).
var flux218 = append(slices.Clone(fluxDropped), "cel-rule-added helmcharts.source.toolkit.fluxcd.io")

// fluxDropped are the CRDs whose v1beta2 (v2beta2) flux2 2.18 drops.
var fluxDropped = []string{
	"stored-version-dropped buckets.source.toolkit.fluxcd.io",
	"stored-version-dropped gitrepositories.source.toolkit.fluxcd.io",
	"stored-version-dropped helmcharts.source.toolkit.fluxcd.io",
	"stored-version-dropped helmreleases.helm.toolkit.fluxcd.io",
	"stored-version-dropped helmrepositories.source.toolkit.fluxcd.io",
	"stored-version-dropped kustomizations.kustomize.toolkit.fluxcd.io",
	"stored-version-dropped ocirepositories.source.toolkit.fluxcd.io",
}

// TestReviewChartFlux2: the flux2 chart's own history. 2.17.2 → 2.18.2 drops v1beta2
// (v2beta2) that 2.17's users still store; 2.17.2 → 2.18.3 too, and the fix is the chart's
// own pre-upgrade hook, crds.migration.enabled=true, with which it passes; 2.18.2 → 2.18.3
// (a description changed) passes.
func TestReviewChartFlux2(t *testing.T) {
	g := newChartRepo(t)
	g.upstream("charts/flux2", "flux2", "2.17.2", "flux2-2.17.2")
	h2182 := g.upstream("charts/flux2", "flux2", "2.18.2", "flux2-2.18.2")
	h2183 := g.upstream("charts/flux2", "flux2", "2.18.3", "")

	r, charts := reviewCharts(t, g.Dir, "--base", "flux2-2.17.2", "--head", h2182.String())
	if r.code != cli.ExitFindings {
		t.Fatalf("2.17.2 → 2.18.2: exit %d, want 1\n%s", r.code, r.stdout)
	}
	if len(charts) != 1 || charts[0].Chart != "flux2" || len(charts[0].Baselines) != 1 || charts[0].Baselines[0].Version != "2.17.2" {
		t.Fatalf("want flux2 judged from 2.17.2, got %+v", charts)
	}
	if got := findingsOf(charts); !slices.Equal(got, flux218) {
		t.Fatalf("2.17.2 → 2.18.2 findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(flux218, "\n"))
	}
	if f := findingOf(t, charts, "cel-rule-added", "helmcharts.source.toolkit.fluxcd.io"); f.Severity != finding.Warning {
		t.Errorf("the new CEL rule is %s, want a warning", f.Severity)
	}
	f := findingOf(t, charts, review.CheckStoredVersionDropped, "helmrepositories.source.toolkit.fluxcd.io")
	for _, want := range []string{"drops v1beta2", "installing 2.17.2", "2.17.2 → the head (2.18.2)"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message lacks %q: %s", want, f.Message)
		}
	}
	if !strings.Contains(f.Remediation, "keep v1beta2 served in spec.versions") {
		t.Errorf("remediation: %s", f.Remediation)
	}

	// 2.18.3 has the hook; off by default, the fix names it.
	r, charts = reviewCharts(t, g.Dir, "--base", "flux2-2.17.2", "--head", h2183.String())
	if r.code != cli.ExitFindings || !slices.Equal(findingsOf(charts), flux218) {
		t.Fatalf("2.17.2 → 2.18.3: exit %d, findings %v", r.code, findingsOf(charts))
	}
	f = findingOf(t, charts, review.CheckStoredVersionDropped, "kustomizations.kustomize.toolkit.fluxcd.io")
	if f.Input == nil || f.Input.Value != "crds.migration.enabled=true" || !strings.Contains(f.Remediation, "set crds.migration.enabled=true in the chart's values.yaml") {
		t.Fatalf("2.17.2 → 2.18.3 does not name crds.migration.enabled=true: %+v %s", f.Input, f.Remediation)
	}
	text := run(t, "review", "--repo", g.Dir, "--base", "flux2-2.17.2", "--head", h2183.String())
	if !strings.Contains(text.stdout, "--set crds.migration.enabled=true") || !strings.Contains(text.stdout, "BLOCKED") {
		t.Errorf("text output:\n%s", text.stdout)
	}
	// With the hook on, it migrates before the CRDs are updated: it passes.
	r, charts = reviewCharts(t, g.Dir, "--base", "flux2-2.17.2", "--head", h2183.String(), "--set", "crds.migration.enabled=true")
	// What is left: the CEL rule, and the versions no longer served (for clients; info).
	if r.code != cli.ExitSafe || len(findingsOf(charts, review.CheckStoredVersionDropped)) != 0 || !slices.Contains(findingsOf(charts), "version-removed helmcharts.source.toolkit.fluxcd.io") {
		t.Fatalf("2.17.2 → 2.18.3 with crds.migration.enabled=true: exit %d, findings %v\n%s", r.code, findingsOf(charts), r.stdout)
	}

	// A safe bump: 2.18.2 → 2.18.3 changes one description.
	r, charts = reviewCharts(t, g.Dir, "--base", "flux2-2.18.2", "--head", h2183.String())
	if r.code != cli.ExitSafe || len(charts) != 1 || charts[0].Baselines[0].Version != "2.18.2" || len(findingsOf(charts)) != 0 {
		t.Fatalf("2.18.2 → 2.18.3: exit %d, %+v", r.code, charts)
	}
}

// TestReviewChartKyverno: kyverno 3.2.8 → 3.3.7 drops v2alpha1 that 3.2.8's users can
// store (kyverno#12633); its own migration hook runs after the upgrade, too late. The
// AdmissionReport CRDs leave the chart, and Helm deletes them.
func TestReviewChartKyverno(t *testing.T) {
	g := newChartRepo(t)
	g.upstream(".", "kyverno", "3.2.8", "kyverno-chart-3.2.8")
	head := g.upstream(".", "kyverno", "3.3.7", "")
	r, charts := reviewCharts(t, g.Dir, "--base", "kyverno-chart-3.2.8", "--head", head.String(), "--tag-pattern", "kyverno-chart-{version}")
	if r.code != cli.ExitFindings {
		t.Fatalf("exit %d, want 1\n%s", r.code, r.stdout)
	}
	got := findingsOf(charts)
	for _, want := range []string{"stored-version-dropped cleanuppolicies.kyverno.io", "stored-version-dropped policyexceptions.kyverno.io", "delete admissionreports.kyverno.io"} {
		if !slices.Contains(got, want) {
			t.Errorf("no %q in %v", want, got)
		}
	}
	f := findingOf(t, charts, review.CheckStoredVersionDropped, "policyexceptions.kyverno.io")
	if !strings.Contains(f.Message, "v2alpha1") || !strings.Contains(f.Remediation, "pre-upgrade hook Job") || f.Location == nil ||
		f.Location.File != "charts/crds/templates/kyverno.io_policyexceptions.yaml" {
		t.Errorf("finding: %+v", f)
	}
}

// TestReviewChartLWS: lws 0.8.0 moves its CRD from templates/ to crds/ (lws#880): the
// upgrade deletes it with every LeaderWorkerSet. Both Chart.yaml files say 0.1.0: the tags
// say the release. Acknowledged (a flag, or the chart's annotation), it passes.
func TestReviewChartLWS(t *testing.T) {
	g := newChartRepo(t)
	g.upstream(".", "lws", "0.7.0", "v0.7.0")
	head := g.upstream(".", "lws", "0.8.0", "")
	r, charts := reviewCharts(t, g.Dir, "--base", "v0.7.0", "--head", head.String(), "--tag-pattern", "v{version}")
	if r.code != cli.ExitFindings || !slices.Equal(findingsOf(charts), []string{"delete leaderworkersets.leaderworkerset.x-k8s.io"}) {
		t.Fatalf("exit %d, findings %v\n%s", r.code, findingsOf(charts), r.stdout)
	}
	if b := charts[0].Baselines; len(b) != 1 || b[0].Version != "0.7.0" || b[0].Ref != "v0.7.0" {
		t.Errorf("baselines %+v, want v0.7.0 as 0.7.0", b)
	}
	f := charts[0].Findings[0]
	if !strings.Contains(f.Message, "from templates/ to crds/") || !strings.Contains(f.Message, "Helm 3 and 4 delete") ||
		f.Location.File != "crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml" || f.Location.Line == 0 {
		t.Errorf("finding: %+v", f)
	}

	r, _ = reviewCharts(t, g.Dir, "--base", "v0.7.0", "--head", head.String(), "--acknowledge", "delete/leaderworkersets.leaderworkerset.x-k8s.io")
	if r.code != cli.ExitSafe {
		t.Errorf("acknowledged by flag: exit %d\n%s", r.code, r.stdout)
	}
	// The work tree: Chart.yaml acknowledges the deletion, not yet committed.
	chartYAML := filepath.Join(g.Dir, "Chart.yaml")
	data, err := os.ReadFile(chartYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(chartYAML, append(data, "annotations:\n  upgradeguard.io/acknowledge: delete/leaderworkersets.leaderworkerset.x-k8s.io\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	text := run(t, "review", "--repo", g.Dir, "--base", "v0.7.0")
	if text.code != cli.ExitSafe || !strings.Contains(text.stdout, "delete leaderworkersets.leaderworkerset.x-k8s.io (acknowledged)") {
		t.Errorf("acknowledged by Chart.yaml: exit %d\n%s%s", text.code, text.stdout, text.stderr)
	}
}

// widgetsChart is a chart with one CRD, widgets.example.com, rendered from templates/: its
// versions (storage last) and the description of its spec field.
func widgetsChart(version, description string, versions ...string) map[string]string {
	var vs strings.Builder
	for i, v := range versions {
		vs.WriteString("    - name: " + v + "\n      served: true\n      storage: " + map[bool]string{true: "true", false: "false"}[i == len(versions)-1] + "\n")
		vs.WriteString("      schema:\n        openAPIV3Schema:\n          type: object\n          properties:\n            spec:\n              type: object\n              description: " + description + "\n")
	}
	return map[string]string{
		"Chart.yaml":  "apiVersion: v2\nname: widgets\nversion: " + version + "\n",
		"values.yaml": "{}\n",
		"templates/crd.yaml": `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names:
    kind: Widget
    plural: widgets
  scope: Namespaced
  versions:
` + vs.String(),
	}
}

// TestReviewChartStorageHistory: storage moves v1alpha1 → v1beta1 → v1 over three
// releases, and the third drops v1alpha1. A cluster that installed 1.0.0 and followed the
// releases still stores v1alpha1: a finding from 1.0.0, by its path. One that installed
// 1.1.0 stores v1beta1 only: no finding from 1.1.0.
func TestReviewChartStorageHistory(t *testing.T) {
	g := newChartRepo(t)
	g.Tag("widgets-1.0.0", g.commit("charts/widgets", "1.0.0", widgetsChart("1.0.0", "spec", "v1alpha1")))
	g.Tag("widgets-1.1.0", g.commit("charts/widgets", "1.1.0", widgetsChart("1.1.0", "spec", "v1alpha1", "v1beta1")))
	head := g.commit("charts/widgets", "1.2.0", widgetsChart("1.2.0", "spec", "v1beta1", "v1"))

	r, charts := reviewCharts(t, g.Dir, "--base", "widgets-1.1.0", "--head", head.String(), "--baseline-tags", "widgets-*")
	if r.code != cli.ExitFindings || !slices.Equal(findingsOf(charts, review.CheckStoredVersionDropped), []string{"stored-version-dropped widgets.example.com"}) {
		t.Fatalf("exit %d, findings %v\n%s", r.code, findingsOf(charts), r.stdout)
	}
	// The schema says the same of 1.0.0 alone: its storage version moves to one it
	// shares no served version with.
	for _, f := range charts[0].Findings {
		if strings.Contains(f.Message, "1.1.0 and upgrading") || strings.Contains(f.Message, "from 1.1.0") {
			t.Errorf("a finding from 1.1.0: %s %s", f.Check, f.Message)
		}
	}
	if n := len(charts[0].Baselines); n != 2 {
		t.Fatalf("%d baselines, want 1.0.0 and 1.1.0", n)
	}
	f := findingOf(t, charts, review.CheckStoredVersionDropped, "widgets.example.com")
	if !strings.Contains(f.Message, "after installing 1.0.0 and upgrading") || strings.Contains(f.Message, "installing 1.0.0 or 1.1.0") ||
		!strings.Contains(f.Message, "1.0.0 → 1.1.0 → the head (1.2.0)") {
		t.Errorf("the finding is not from 1.0.0 alone, by its path: %s", f.Message)
	}
	if f.Location == nil || f.Location.File != "charts/widgets/templates/crd.yaml" || f.Location.Line != 11 {
		t.Errorf("location %+v, want charts/widgets/templates/crd.yaml:11 (versions:)", f.Location)
	}

	// Keeping v1alpha1 served one more release passes.
	head = g.commit("charts/widgets", "keep v1alpha1", widgetsChart("1.2.0", "spec", "v1alpha1", "v1beta1", "v1"))
	if r, _ := reviewCharts(t, g.Dir, "--base", "widgets-1.1.0", "--head", head.String(), "--baseline-tags", "widgets-*"); r.code != cli.ExitSafe {
		t.Errorf("v1alpha1 kept: exit %d\n%s", r.code, r.stdout)
	}
}

// TestReviewChartDescriptionOnly: a change to a CRD's description alone passes.
func TestReviewChartDescriptionOnly(t *testing.T) {
	g := newChartRepo(t)
	g.Tag("widgets-1.0.0", g.commit("charts/widgets", "1.0.0", widgetsChart("1.0.0", "the spec", "v1beta1", "v1")))
	head := g.commit("charts/widgets", "describe", widgetsChart("1.0.1", "what the widget should be", "v1beta1", "v1"))
	r, charts := reviewCharts(t, g.Dir, "--base", "widgets-1.0.0", "--head", head.String())
	if r.code != cli.ExitSafe || len(charts) != 1 || len(charts[0].Baselines) != 1 || len(findingsOf(charts)) != 0 {
		t.Fatalf("exit %d, %+v", r.code, charts)
	}
}

// TestReviewChartMonorepo: two charts; the change touches one, and only that one is
// judged, though the other's unreleased change would be a finding.
func TestReviewChartMonorepo(t *testing.T) {
	g := newChartRepo(t)
	g.Tag("widgets-1.0.0", g.commit("charts/widgets", "widgets 1.0.0", widgetsChart("1.0.0", "spec", "v1beta1", "v1")))
	g.commit("charts/widgets", "widgets: drop v1beta1", widgetsChart("1.1.0", "spec", "v1"))
	gadgets := map[string]string{"Chart.yaml": "apiVersion: v2\nname: gadgets\nversion: 2.0.0\n", "values.yaml": "replicas: 1\n",
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gadgets\ndata:\n  replicas: \"{{ .Values.replicas }}\"\n"}
	base := g.commit("charts/gadgets", "gadgets 2.0.0", gadgets)
	g.Tag("gadgets-2.0.0", base)
	gadgets = map[string]string{"Chart.yaml": "apiVersion: v2\nname: gadgets\nversion: 2.0.1\n", "values.yaml": "replicas: 2\n", "templates/cm.yaml": gadgets["templates/cm.yaml"]}
	head := g.commit("charts/gadgets", "gadgets: two replicas", gadgets)

	r, charts := reviewCharts(t, g.Dir, "--base", base.String(), "--head", head.String())
	if r.code != cli.ExitSafe || len(charts) != 1 || charts[0].Chart != "gadgets" || charts[0].Dir != "charts/gadgets" {
		t.Fatalf("exit %d, charts %+v", r.code, charts)
	}
	// The same repository, from before widgets' change: widgets is judged, and flagged.
	r, charts = reviewCharts(t, g.Dir, "--base", "widgets-1.0.0", "--head", head.String())
	if r.code != cli.ExitFindings || !slices.Equal(findingsOf(charts, review.CheckStoredVersionDropped), []string{"stored-version-dropped widgets.example.com"}) {
		t.Fatalf("from widgets-1.0.0: exit %d, findings %v", r.code, findingsOf(charts))
	}
}

// TestReviewChartOutputs: the flux2 2.17.2 → 2.18.2 review as SARIF validates against the
// SARIF 2.1.0 schema, and each result points at the CRD's file, at its versions: line;
// JUnit parses; github annotates the same places.
func TestReviewChartOutputs(t *testing.T) {
	g := newChartRepo(t)
	g.upstream("charts/flux2", "flux2", "2.17.2", "flux2-2.17.2")
	head := g.upstream("charts/flux2", "flux2", "2.18.2", "")
	args := []string{"review", "--repo", g.Dir, "--base", "flux2-2.17.2", "--head", head.String()}

	r := run(t, append(args, "-o", "sarif")...)
	if r.code != cli.ExitFindings {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	sariftest.Validate(t, r.stdout)
	var log struct {
		Runs []struct {
			Results []struct {
				RuleID    string `json:"ruleId"`
				Message   struct{ Text string }
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct{ URI string }    `json:"artifactLocation"`
						Region           struct{ StartLine int } `json:"region"`
					} `json:"physicalLocation"`
				} `json:"locations"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &log); err != nil || len(log.Runs) != 1 {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if n := len(log.Runs[0].Results); n != len(flux218) {
		t.Fatalf("%d results, want %d", n, len(flux218))
	}
	for _, res := range log.Runs[0].Results {
		if len(res.Locations) != 1 {
			t.Fatalf("%s: %d locations", res.RuleID, len(res.Locations))
		}
		l := res.Locations[0].PhysicalLocation
		crd, _, _ := strings.Cut(res.Message.Text, " ")
		crd = strings.TrimSuffix(crd, ",")
		data, err := os.ReadFile(filepath.Join(g.Dir, filepath.FromSlash(l.ArtifactLocation.URI)))
		if err != nil {
			t.Fatalf("%s: %v", crd, err)
		}
		lines := strings.Split(string(data), "\n")
		// A dropped version points at versions:, a schema change at its version's entry.
		want := "versions:"
		if res.RuleID == "cel-rule-added" {
			want = "name: v1"
		}
		if l.Region.StartLine < 1 || l.Region.StartLine > len(lines) || strings.TrimPrefix(strings.TrimSpace(lines[l.Region.StartLine-1]), "- ") != want {
			t.Errorf("%s %s points at %s:%d, not at %q", res.RuleID, crd, l.ArtifactLocation.URI, l.Region.StartLine, want)
			continue
		}
		// The line is in the CRD's own document.
		doc := lines[:l.Region.StartLine]
		start := len(doc) - 1
		for start > 0 && strings.TrimSpace(doc[start]) != "---" {
			start--
		}
		if !strings.Contains(strings.Join(doc[start:], "\n"), "name: "+crd) {
			t.Errorf("%s: %s:%d is in another CRD's document", crd, l.ArtifactLocation.URI, l.Region.StartLine)
		}
	}

	r = run(t, append(args, "-o", "junit")...)
	var suites struct {
		XMLName xml.Name `xml:"testsuites"`
	}
	if err := xml.Unmarshal([]byte(r.stdout), &suites); err != nil || r.code != cli.ExitFindings {
		t.Errorf("junit: exit %d, %v\n%s", r.code, err, r.stdout)
	}
	r = run(t, append(args, "-o", "github")...)
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "::error file=charts/flux2/templates/source-controller.crds.yaml,line=") {
		t.Errorf("github: exit %d\n%s", r.code, r.stdout)
	}
	r = run(t, append(args, "-o", "markdown")...)
	if !strings.Contains(r.stdout, "stored-version-dropped") {
		t.Errorf("markdown:\n%s", r.stdout)
	}
}
