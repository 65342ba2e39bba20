package crdschema

import (
	"fmt"
	"slices"
	"strings"

	apiextinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
)

// FieldPath is one field path that stored objects hold, with how many hold it and never
// a value: what a snapshot keeps of a CRD's objects, so that a Judge can judge pruning
// later without them (Skeletons).
type FieldPath struct {
	// Path are the property names from the object's root; ListItem steps into a list's
	// items.
	Path []string `json:"path"`
	// Leaf is the JSON type the path ends at: a scalar's schema type (string, integer,
	// number, boolean), LeafMap for an object whose keys are not declared (a map under
	// additionalProperties, or preserved unknown fields: the keys can be data, so the path
	// stops there), LeafList for an empty list; "" for a value the schema gives no type.
	Leaf    string `json:"leaf,omitempty"`
	Objects int64  `json:"objects"`
}

// The steps and leaves of a FieldPath that are not property names or scalar types.
const (
	ListItem = "[]"
	LeafMap  = "map"
	LeafList = "list"
)

// String is the path as a report words it: spec.template[*].name.
func (p FieldPath) String() string {
	return strings.ReplaceAll(strings.Join(p.Path, "."), "."+ListItem, "[*]")
}

// FieldCounter counts the field paths of a CRD's objects, read at one version each, as
// its live schema of that version declares them.
type FieldCounter struct {
	schemas map[string]*structuralschema.Structural
	counts  map[string]map[string]*FieldPath
}

// NewFieldCounter compiles the structural schema of every version of crd.
func NewFieldCounter(crd *apiextv1.CustomResourceDefinition) (*FieldCounter, error) {
	f := &FieldCounter{schemas: map[string]*structuralschema.Structural{}, counts: map[string]map[string]*FieldPath{}}
	for _, v := range crd.Spec.Versions {
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		internal := &apiextinternal.JSONSchemaProps{}
		if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, internal, nil); err != nil {
			return nil, fmt.Errorf("%s version %s: %w", crd.Name, v.Name, err)
		}
		s, err := structuralschema.NewStructural(internal)
		if err != nil {
			return nil, fmt.Errorf("%s version %s: not a structural schema: %w", crd.Name, v.Name, err)
		}
		f.schemas[v.Name] = s
	}
	return f, nil
}

// Add counts the paths of one object read at version.
func (f *FieldCounter) Add(version string, obj map[string]any) {
	seen := map[string]FieldPath{}
	s := f.schemas[version]
	for k, v := range obj {
		if k == "apiVersion" || k == "kind" || k == "metadata" {
			continue
		}
		walk(v, property(s, k), []string{k}, seen)
	}
	m := f.counts[version]
	if m == nil {
		m = map[string]*FieldPath{}
		f.counts[version] = m
	}
	for key, p := range seen {
		if c := m[key]; c != nil {
			c.Objects++
			continue
		}
		p.Objects = 1
		m[key] = &p
	}
}

// Paths are the counted paths of the objects read at version, sorted.
func (f *FieldCounter) Paths(version string) []FieldPath {
	out := []FieldPath{}
	for _, p := range f.counts[version] {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b FieldPath) int { return strings.Compare(pathKey(a), pathKey(b)) })
	return out
}

func pathKey(p FieldPath) string { return strings.Join(p.Path, "\x00") + "\x01" + p.Leaf }

func property(s *structuralschema.Structural, name string) *structuralschema.Structural {
	if s == nil {
		return nil
	}
	if p, ok := s.Properties[name]; ok {
		return &p
	}
	return nil
}

// walk records the paths under v, which the schema s declares (nil: not declared).
func walk(v any, s *structuralschema.Structural, path []string, seen map[string]FieldPath) {
	add := func(leaf string) {
		p := FieldPath{Path: slices.Clone(path), Leaf: leaf}
		seen[pathKey(p)] = p
	}
	switch x := v.(type) {
	case map[string]any:
		if s == nil || len(s.Properties) == 0 {
			add(LeafMap)
			return
		}
		declared := true
		for k, item := range x {
			p, ok := s.Properties[k]
			if !ok {
				declared = false
				continue
			}
			walk(item, &p, append(path, k), seen)
		}
		if !declared || len(x) == 0 {
			add(LeafMap)
		}
	case []any:
		if len(x) == 0 || s == nil || s.Items == nil {
			add(LeafList)
			return
		}
		for _, item := range x {
			walk(item, s.Items, append(path, ListItem), seen)
		}
	default:
		t := ""
		if s != nil {
			t = s.Type
		}
		add(t)
	}
}

// Skeletons are n objects of apiVersion and kind that hold the paths, each path in the
// first Objects of them, with a placeholder of its type and no name: what Scan judges
// pruning on with ScanOptions.Skeletons. A field stripped of its values prunes as the
// field did, since pruning depends on the path alone.
func Skeletons(apiVersion, kind string, n int64, paths []FieldPath) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{}}
	}
	for _, p := range paths {
		for i := int64(0); i < p.Objects && i < n; i++ {
			out[i] = set(out[i], p.Path, p.Leaf).(map[string]any)
		}
	}
	return out
}

// set puts the placeholder of leaf at path under v and returns v.
func set(v any, path []string, leaf string) any {
	if len(path) == 0 {
		if v != nil {
			return v // a map or list its children already built
		}
		switch leaf {
		case LeafMap:
			return map[string]any{}
		case LeafList:
			return []any{}
		case "string":
			return ""
		case "integer":
			return int64(0)
		case "number":
			return float64(0)
		case "boolean":
			return false
		}
		return nil
	}
	if path[0] == ListItem {
		l, _ := v.([]any)
		var item any
		if len(l) > 0 {
			item = l[0]
		}
		return []any{set(item, path[1:], leaf)}
	}
	m, _ := v.(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	m[path[0]] = set(m[path[0]], path[1:], leaf)
	return m
}
