package registry

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

func TestEmbeddedRegistryIsValid(t *testing.T) {
	r, err := Parse("charts.yaml", embedded)
	if err != nil {
		t.Fatal(err)
	}
	// The charts the epic lists as needing coverage are all known.
	for _, name := range []string{"flux2", "kyverno", "velero", "crossplane", "external-secrets", "kro", "cert-manager", "landscaper", "ocm", "provider-btp"} {
		if _, ok := r.Lookup(name); !ok {
			t.Errorf("chart %s is not in the registry", name)
		}
	}
	if c, ok := r.Lookup("ocm-controller"); !ok || c.Name != "ocm" {
		t.Errorf("alias ocm-controller: got %v, %v", c, ok)
	}
}

func TestParseRejectsBadInput(t *testing.T) {
	cases := []struct {
		name, data, want string
	}{
		{"unknown field", "charts:\n- name: x\n  confidence: seed\n  hooks: [pre-upgrade]\n", "field hooks not found"},
		{"unknown mechanism field", "charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    hooks: [pre-upgrade]\n    action: migrates-objects\n    enabledBy: [{key: a.b, default: false}]\n    enabeldBy: []\n", "field enabeldBy not found"},
		{"bad semver", "charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    versions: \">=two\"\n    hooks: [pre-upgrade]\n    action: migrates-objects\n    enabledBy: [{key: a.b, default: false}]\n", `versions ">=two" is not a semver constraint`},
		{"bad hook", "charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    hooks: [before-upgrade]\n    action: migrates-objects\n    enabledBy: [{key: a.b, default: false}]\n", `hook "before-upgrade": use one of pre-install`},
		{"bad action", "charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    hooks: [pre-upgrade]\n    action: migrate\n    enabledBy: [{key: a.b, default: false}]\n", `action "migrate": use one of applies-crds`},
		{"no enabledBy", "charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    hooks: [pre-upgrade]\n    action: migrates-objects\n", "enabledBy: name the value"},
		{"bad key", "charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    hooks: [pre-upgrade]\n    action: migrates-objects\n    enabledBy: [{key: .a, default: false}]\n", `key ".a"`},
		{"no name", "charts:\n- confidence: seed\n", "name is required"},
		{"bad confidence", "charts:\n- name: x\n  confidence: sure\n", `confidence "sure"`},
		{"duplicate", "charts:\n- name: x\n  confidence: seed\n- name: y\n  aliases: [x]\n  confidence: seed\n", `"x" is claimed by both x and y`},
		{"empty", "", "is empty"},
		{"two documents", "charts: []\n---\ncharts: []\n", "more than one YAML document"},
		{"wrong type", "charts:\n- name: [x]\n", "line 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("mine.yaml", []byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "mine.yaml") {
				t.Errorf("error %v; want one naming mine.yaml and containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadMergesByName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.yaml")
	data := `charts:
  - name: flux2
    confidence: upstream
    mechanisms:
      - name: my-migrate
        versions: ">=2.0.0"
        hooks: [pre-upgrade, pre-rollback]
        action: migrates-objects
        enabledBy: [{key: migrate.enabled, default: true}]
  - name: in-house
    aliases: [in-house-operator]
    confidence: upstream
`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	flux, _ := r.Lookup("flux2")
	if got := []string{flux.Mechanisms[0].Name}; !slices.Equal(got, []string{"my-migrate"}) || len(flux.Mechanisms) != 1 {
		t.Errorf("flux2 mechanisms after override: %v", got)
	}
	if _, ok := r.Lookup("in-house-operator"); !ok {
		t.Error("added chart not found by alias")
	}
	if _, ok := r.Lookup("kyverno"); !ok {
		t.Error("built-in kyverno lost by the merge")
	}
	if len(r.Charts) != len(Default().Charts)+1 {
		t.Errorf("%d charts after merge, want %d", len(r.Charts), len(Default().Charts)+1)
	}

	clash := filepath.Join(t.TempDir(), "clash.yaml")
	if err := os.WriteFile(clash, []byte("charts:\n- name: mine\n  aliases: [kyverno]\n  confidence: seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(clash); err == nil || !strings.Contains(err.Error(), `"kyverno" is claimed by both kyverno and mine`) {
		t.Errorf("alias clash with a built-in chart: %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "read registry") {
		t.Errorf("missing file: %v", err)
	}
}

func TestExistsIn(t *testing.T) {
	r := Default()
	flux, _ := r.Lookup("flux2")
	m := &flux.Mechanisms[0]
	cases := []struct {
		version      string
		exists, sure bool
	}{
		{"2.18.2", false, true},
		{"2.18.3", true, true},
		{"2.19.0-rc.1", true, true},
		{"2.18.3-rc.1", true, true},
		{"2.x", true, false},
		{"", true, false},
	}
	for _, tc := range cases {
		exists, sure := m.ExistsIn(tc.version)
		if exists != tc.exists || sure != tc.sure {
			t.Errorf("ExistsIn(%q) = %v, %v; want %v, %v", tc.version, exists, sure, tc.exists, tc.sure)
		}
	}
}

func TestTruthy(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "false": false, "0": false, "1": true, `""`: false, `"x"`: true, "{}": false, "{a: 1}": true, "[]": false, "null": false} {
		var x any
		if err := yaml.Unmarshal([]byte(v), &x); err != nil {
			t.Fatal(err)
		}
		if Truthy(x) != want {
			t.Errorf("Truthy(%s) = %v", v, !want)
		}
	}
}

// noMechanism are fixture charts that ship no storage-migration mechanism: they are
// fixtures for other transitions (lws: its CRD moves from templates/ to crds/).
var noMechanism = map[string]bool{"lws": true}

// TestRegistryMatchesFixtureCharts checks every mechanism of a chart in test/fixtures
// against the chart's real values.yaml and hook template: in each fixture version the
// constraint admits, every key exists with the stated default and the template carries
// the stated hooks; in each version it excludes, the first enabling key is absent. So the
// fixtures pin both the defaults and the lower version bound.
func TestRegistryMatchesFixtureCharts(t *testing.T) {
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob(filepath.Join(fx, "charts", "*"))
	if err != nil {
		t.Fatal(err)
	}
	r := Default()
	checked := map[string]int{}
	for _, dir := range dirs {
		var meta struct{ Name, Version string }
		readYAML(t, filepath.Join(dir, "Chart.yaml"), &meta)
		c, ok := r.Lookup(meta.Name)
		if !ok && noMechanism[meta.Name] {
			continue
		}
		if !ok {
			t.Errorf("fixture chart %s is not in the registry", meta.Name)
			continue
		}
		if c.Confidence != Fixture {
			t.Errorf("chart %s is checked against fixtures here: mark it confidence: fixture", c.Name)
		}
		var values map[string]any
		readYAML(t, filepath.Join(dir, "values.yaml"), &values)
		for _, m := range c.Mechanisms {
			exists, sure := m.ExistsIn(meta.Version)
			if !sure {
				t.Fatalf("fixture %s has a non-semver version %q", dir, meta.Version)
			}
			if !exists {
				if v, ok := ValueAt(values, m.EnabledBy[0].Key); ok {
					t.Errorf("%s %s: %s = %v exists, but the registry says %s only exists in %s", meta.Name, meta.Version, m.EnabledBy[0].Key, v, m.Name, m.Versions)
				}
				if m.Template != "" {
					if _, err := os.Stat(filepath.Join(dir, m.Template)); err == nil {
						t.Errorf("%s %s has %s, but the registry says %s only exists in %s", meta.Name, meta.Version, m.Template, m.Name, m.Versions)
					}
				}
				continue
			}
			checked[meta.Name]++
			for _, k := range m.Keys() {
				v, ok := ValueAt(values, k.Key)
				if !ok {
					t.Errorf("%s %s: values.yaml has no %s (registry mechanism %s)", meta.Name, meta.Version, k.Key, m.Name)
					continue
				}
				if diff := cmp.Diff(k.Default, v); diff != "" {
					t.Errorf("%s %s: default of %s (-registry +values.yaml):\n%s", meta.Name, meta.Version, k.Key, diff)
				}
			}
			if m.Template == "" {
				t.Errorf("%s: mechanism %s has no template to check", meta.Name, m.Name)
				continue
			}
			tpl, err := os.ReadFile(filepath.Join(dir, m.Template))
			if err != nil {
				t.Errorf("%s %s: %v", meta.Name, meta.Version, err)
				continue
			}
			for _, k := range m.EnabledBy {
				if !strings.Contains(string(tpl), ".Values."+k.Key) {
					t.Errorf("%s %s: %s does not test .Values.%s", meta.Name, meta.Version, m.Template, k.Key)
				}
			}
			if got := templateHooks(string(tpl)); !slices.Equal(got, m.Hooks) {
				t.Errorf("%s %s: %s runs on %v, registry says %v", meta.Name, meta.Version, m.Template, got, m.Hooks)
			}
		}
	}
	// Both flux2 2.18.3 and kyverno 3.2.8/3.3.7 were checked positively.
	if checked["flux2"] != 1 || checked["kyverno"] != 2 {
		t.Errorf("fixture versions checked: %v; want flux2 1 and kyverno 2", checked)
	}
}

// templateHooks returns the distinct hook events named in a template's helm.sh/hook
// annotations.
func templateHooks(tpl string) []Hook {
	var out []Hook
	for line := range strings.SplitSeq(tpl, "\n") {
		line = strings.TrimSpace(line)
		_, v, ok := strings.Cut(line, "helm.sh/hook:")
		if !ok {
			_, v, ok = strings.Cut(line, `"helm.sh/hook":`)
		}
		if !ok {
			continue
		}
		for h := range strings.SplitSeq(strings.Trim(strings.TrimSpace(v), `"`), ",") {
			if hk := Hook(strings.TrimSpace(h)); !slices.Contains(out, hk) {
				out = append(out, hk)
			}
		}
	}
	return out
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
