// Package registry owns the data about known charts and their CRD-migration mechanisms:
// which values switch an upstream hook on, which Helm hook it is, what it does and in which
// chart versions it exists. The data is a YAML file embedded in the binary (charts.yaml),
// which users extend or override with their own file. The audit reads it; nothing here
// looks at a cluster.
package registry

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"go.yaml.in/yaml/v3"
)

//go:embed charts.yaml
var embedded []byte

// Hook is a Helm hook event, as spelled in the helm.sh/hook annotation.
type Hook string

// The Helm hook events a mechanism can run on.
const (
	PreInstall   Hook = "pre-install"
	PostInstall  Hook = "post-install"
	PreUpgrade   Hook = "pre-upgrade"
	PostUpgrade  Hook = "post-upgrade"
	PreRollback  Hook = "pre-rollback"
	PostRollback Hook = "post-rollback"
	PreDelete    Hook = "pre-delete"
	PostDelete   Hook = "post-delete"
)

var hooks = []Hook{PreInstall, PostInstall, PreUpgrade, PostUpgrade, PreRollback, PostRollback, PreDelete, PostDelete}

// Action is what a mechanism's hook does to CRDs and their objects.
type Action string

// Actions. Only MigratesObjects can protect an upgrade or rollback from a storedVersions
// rejection; AppliesCRDs keeps the CRD specs current but leaves stored objects and
// status.storedVersions alone; DeletesCRDs destroys every object of the chart's types.
const (
	AppliesCRDs     Action = "applies-crds"
	MigratesObjects Action = "migrates-objects"
	DeletesCRDs     Action = "deletes-crds"
)

var actions = []Action{AppliesCRDs, MigratesObjects, DeletesCRDs}

// Confidence says where an entry's facts come from.
type Confidence string

// Confidence levels.
const (
	// Fixture: checked by a test against the real chart files in test/fixtures.
	Fixture Confidence = "fixture"
	// Upstream: read in the upstream chart source named in Source.
	Upstream Confidence = "upstream"
	// Seed: taken from the epic's audit table, not re-checked.
	Seed Confidence = "seed"
)

var confidences = []Confidence{Fixture, Upstream, Seed}

// Registry is the list of known charts.
type Registry struct {
	Charts []Chart `yaml:"charts" json:"charts"`
}

// Chart is one known chart.
type Chart struct {
	// Name is the chart name (Chart.yaml name).
	Name string `yaml:"name" json:"name"`
	// Aliases are other chart names that are the same chart (forks, renames).
	Aliases []string `yaml:"aliases,omitempty" json:"aliases,omitempty"`
	// Source is the upstream repository and path of the chart.
	Source string `yaml:"source,omitempty" json:"source,omitempty"`
	// Confidence says how the facts were checked.
	Confidence Confidence `yaml:"confidence" json:"confidence"`
	// Notes are for people: what the chart does with CRDs.
	Notes string `yaml:"notes,omitempty" json:"notes,omitempty"`
	// Mechanisms are the chart's CRD hooks. None means the chart has no upstream
	// protection.
	Mechanisms []Mechanism `yaml:"mechanisms,omitempty" json:"mechanisms,omitempty"`
}

// Mechanism is one hook of a chart that touches CRDs or their objects.
type Mechanism struct {
	Name        string `yaml:"name" json:"name"`
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	// Versions is a semver constraint on the chart version where the mechanism exists.
	// Empty: every version (no bound recorded).
	Versions string `yaml:"versions,omitempty" json:"versions,omitempty"`
	// Hooks are the Helm hook events the mechanism runs on.
	Hooks []Hook `yaml:"hooks" json:"hooks"`
	// Action is what the hook does.
	Action Action `yaml:"action" json:"action"`
	// Template is the chart file that renders the hook, to find it among a stored
	// release's hooks.
	Template string `yaml:"template,omitempty" json:"template,omitempty"`
	// EnabledBy are values that must all be true (Helm's truthiness) for the hook to render.
	EnabledBy []Key `yaml:"enabledBy" json:"enabledBy"`
	// DisabledBy are values any of which, when true, stops the hook from rendering.
	DisabledBy []Key `yaml:"disabledBy,omitempty" json:"disabledBy,omitempty"`

	constraint *semver.Constraints
}

// Key is a chart value and its default in the chart's values.yaml.
type Key struct {
	// Key is the dotted path, as --set spells it (crds.migration.enabled).
	Key     string `yaml:"key" json:"key"`
	Default any    `yaml:"default" json:"default"`
}

// Has reports whether the mechanism runs on hook h.
func (m *Mechanism) Has(h Hook) bool { return slices.Contains(m.Hooks, h) }

// Keys returns EnabledBy then DisabledBy.
func (m *Mechanism) Keys() []Key { return append(slices.Clone(m.EnabledBy), m.DisabledBy...) }

// ExistsIn reports whether the mechanism exists in a chart version. ok is false when the
// version is not an exact semantic version (then exists is true: it cannot be ruled out).
func (m *Mechanism) ExistsIn(version string) (exists, ok bool) {
	if m.constraint == nil {
		return true, true
	}
	v, err := semver.NewVersion(version)
	if err != nil {
		return true, false
	}
	// A pre-release of a later version (2.19.0-rc.1) is in ">=2.18.3".
	if v.Prerelease() != "" {
		base, _ := v.SetPrerelease("")
		return m.constraint.Check(&base), true
	}
	return m.constraint.Check(v), true
}

// Default returns the embedded registry.
func Default() *Registry {
	r, err := Parse("embedded charts.yaml", embedded)
	if err != nil {
		panic(err) // a test keeps the embedded file valid
	}
	return r
}

// Load returns the embedded registry, extended and overridden by the file at path when
// path is not empty.
func Load(path string) (*Registry, error) {
	r := Default()
	if path == "" {
		return r, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read registry: %w", err)
	}
	user, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	return r.Merge(user)
}

// Parse decodes and validates a registry file strictly: unknown fields, bad semver
// constraints, unknown hooks or actions, and duplicate names are errors naming the file,
// the chart and the field.
func Parse(name string, data []byte) (*Registry, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var r Registry
	if err := dec.Decode(&r); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("registry %s is empty: it needs a top-level `charts:` list (see docs/registry.md)", name)
		}
		return nil, fmt.Errorf("registry %s: %w (see docs/registry.md for the format)", name, err)
	}
	var rest yaml.Node
	if err := dec.Decode(&rest); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("registry %s: more than one YAML document: put every chart in the one `charts:` list", name)
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("registry %s: %w", name, err)
	}
	return &r, nil
}

func (r *Registry) validate() error {
	var errs []error
	for i := range r.Charts {
		c := &r.Charts[i]
		at := fmt.Sprintf("charts[%d]", i)
		if c.Name != "" {
			at = fmt.Sprintf("chart %s", c.Name)
		}
		if c.Name == "" {
			errs = append(errs, fmt.Errorf("%s: name is required", at))
		}
		if !slices.Contains(confidences, c.Confidence) {
			errs = append(errs, fmt.Errorf("%s: confidence %q: use one of %s", at, c.Confidence, joinAny(confidences)))
		}
		for j := range c.Mechanisms {
			if err := c.Mechanisms[j].validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s: mechanisms[%d]: %w", at, j, err))
			}
		}
	}
	if err := r.checkNames(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (m *Mechanism) validate() error {
	var errs []error
	if m.Name == "" {
		errs = append(errs, errors.New("name is required"))
	}
	if m.Versions != "" {
		c, err := semver.NewConstraint(m.Versions)
		if err != nil {
			errs = append(errs, fmt.Errorf("versions %q is not a semver constraint (for example \">=2.18.3\"): %w", m.Versions, err))
		}
		m.constraint = c
	}
	if len(m.Hooks) == 0 {
		errs = append(errs, fmt.Errorf("hooks: name at least one of %s", joinAny(hooks)))
	}
	for _, h := range m.Hooks {
		if !slices.Contains(hooks, h) {
			errs = append(errs, fmt.Errorf("hook %q: use one of %s", h, joinAny(hooks)))
		}
	}
	if !slices.Contains(actions, m.Action) {
		errs = append(errs, fmt.Errorf("action %q: use one of %s", m.Action, joinAny(actions)))
	}
	if len(m.EnabledBy) == 0 {
		errs = append(errs, errors.New("enabledBy: name the value that switches the hook on"))
	}
	for _, k := range m.Keys() {
		if k.Key == "" || strings.HasPrefix(k.Key, ".") || strings.HasSuffix(k.Key, ".") || strings.Contains(k.Key, "..") {
			errs = append(errs, fmt.Errorf("key %q: use a dotted values path such as crds.migration.enabled", k.Key))
		}
	}
	if len(errs) > 0 && m.Name != "" {
		return fmt.Errorf("%s: %w", m.Name, errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// checkNames makes sure no chart name or alias is claimed twice.
func (r *Registry) checkNames() error {
	owner := map[string]string{}
	var errs []error
	for _, c := range r.Charts {
		for _, n := range append([]string{c.Name}, c.Aliases...) {
			if n == "" {
				continue
			}
			if prev, ok := owner[n]; ok {
				errs = append(errs, fmt.Errorf("chart name %q is claimed by both %s and %s: keep it in one entry", n, prev, c.Name))
				continue
			}
			owner[n] = c.Name
		}
	}
	return errors.Join(errs...)
}

// Merge returns r with the entries of override added, an override entry replacing the
// entry of r with the same name as a whole.
func (r *Registry) Merge(override *Registry) (*Registry, error) {
	out := &Registry{}
	replaced := map[string]bool{}
	for _, o := range override.Charts {
		replaced[o.Name] = true
	}
	for _, c := range r.Charts {
		if !replaced[c.Name] {
			out.Charts = append(out.Charts, c)
		}
	}
	out.Charts = append(out.Charts, override.Charts...)
	if err := out.checkNames(); err != nil {
		return nil, fmt.Errorf("merge registry: %w (an entry in your file replaces the built-in entry of the same name; drop or move the alias)", err)
	}
	return out, nil
}

// Lookup returns the chart with this name or alias.
func (r *Registry) Lookup(chart string) (*Chart, bool) {
	for i := range r.Charts {
		c := &r.Charts[i]
		if c.Name == chart || slices.Contains(c.Aliases, chart) {
			return c, true
		}
	}
	return nil, false
}

// Marshal writes the registry as YAML, the format Parse reads.
func (r *Registry) Marshal() ([]byte, error) { return yaml.Marshal(r) }

func joinAny[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// ValueAt returns the value at a dotted key in Helm values.
func ValueAt(values map[string]any, key string) (any, bool) {
	var cur any = values
	for part := range strings.SplitSeq(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// Truthy is Helm's (Go template's) truth for `{{ if .Values.x }}`: false, 0, "", nil and
// empty maps and lists are false.
func Truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case int:
		return x != 0
	case int64:
		return x != 0
	case float64:
		return x != 0
	case map[string]any:
		return len(x) > 0
	case []any:
		return len(x) > 0
	}
	return true
}
