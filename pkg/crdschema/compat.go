package crdschema

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// The checks Compare reports, by stable ID (for filters, acknowledgements and docs).
const (
	CheckFieldRemoved           = "field-removed"
	CheckTypeChanged            = "type-changed"
	CheckRequiredAdded          = "required-added"
	CheckEnumNarrowed           = "enum-narrowed"
	CheckBoundTightened         = "bound-tightened"
	CheckPatternChanged         = "pattern-changed"
	CheckCELRuleAdded           = "cel-rule-added"
	CheckScopeChanged           = "scope-changed"
	CheckConversionRemoved      = "conversion-removed"
	CheckStorageSwitchUnbridged = "storage-switch-unbridged"
	CheckVersionRemoved         = "version-removed"
)

// Severity says how much a schema Change matters. It is finding's severity, so a caller
// turns a Change into a finding.Finding without a second scale.
type Severity = finding.Severity

// The severities of a Change.
const (
	// Breaking: whatever the objects hold, the change loses data or refuses what clients
	// of base send (a removed field, a changed type, a new required field, a value removed
	// from an enum, a scope change, a conversion removed, a storage switch nothing can
	// bridge). It fails a CI run (finding.Danger).
	Breaking Severity = finding.Danger
	// Risky: the change refuses some values base accepted (a tightened bound or pattern, a
	// new enum, a new CEL rule); whether any object or client holds one is known only
	// from the objects. The API server ratchets an update that leaves such a value as it
	// was; it refuses a create, and an update that changes the field to another value
	// the new rule refuses. It is shown and does not fail a run (finding.Warning).
	Risky Severity = finding.Warning
	// Info: worth knowing, judged elsewhere (a served version removed: whether users
	// still store it is the storage history's question).
	Info Severity = finding.Info
)

// Change is one incompatibility between a CRD's base (the last release) and its head.
type Change struct {
	// Check is the stable ID of the rule (CheckFieldRemoved, ...).
	Check    string   `json:"check"`
	Severity Severity `json:"severity"`
	// Version is the CRD version whose schema changed; for a CRD-wide change, the version
	// it concerns (the removed version, the new storage version) or "" (scope).
	Version string `json:"version,omitempty"`
	// Path is the field's JSON path from the object's root (".spec.foo.bar"; list items
	// as [*], map values as .*); "" for a CRD-wide change.
	Path string `json:"path,omitempty"`
	// Message is one sentence for a person: what changed and why it matters.
	Message string `json:"message"`
}

// Compare reports what makes head incompatible with base, statically (no objects are
// read): per version both serve, the schema rules (removed fields, type changes, new
// required fields, narrowed enums, tightened bounds and patterns, new CEL rules), and for
// the CRD as a whole the scope, the conversion webhook, the storage version and the
// served versions. Descriptions, examples, annotations and additive changes (a new
// optional field, a wider enum, a looser bound) are no Change. The order is
// deterministic: CRD-wide changes first, then per version in head's order, by path.
// A nil CRD on either side (a new or a deleted CRD) is no Change.
func Compare(base, head *apiextv1.CustomResourceDefinition) []Change {
	if base == nil || head == nil {
		return nil
	}
	var out []Change
	if base.Spec.Scope != head.Spec.Scope {
		out = append(out, Change{Check: CheckScopeChanged, Severity: Breaking,
			Message: fmt.Sprintf("the scope changes from %s to %s: the API server cannot serve the existing objects at their old paths, and every client's requests change", base.Spec.Scope, head.Spec.Scope)})
	}
	for _, v := range base.Spec.Versions {
		if v.Served && !apihelpers.HasServedCRDVersion(head, v.Name) {
			out = append(out, Change{Check: CheckVersionRemoved, Severity: Info, Version: v.Name,
				Message: fmt.Sprintf("version %s is no longer served: clients that use it fail, and whether objects are still stored at it is for the storage history to judge", v.Name)})
		}
	}
	if c, ok := storageUnbridged(base, head); ok {
		out = append(out, c)
	}
	if c, ok := conversionDropped(base, head); ok {
		out = append(out, c)
	}
	for _, v := range head.Spec.Versions {
		if !v.Served || !apihelpers.HasServedCRDVersion(base, v.Name) {
			continue
		}
		bs, _ := apihelpers.GetSchemaForVersion(base, v.Name)
		hs, _ := apihelpers.GetSchemaForVersion(head, v.Name)
		if bs == nil || hs == nil || bs.OpenAPIV3Schema == nil || hs.OpenAPIV3Schema == nil {
			continue
		}
		w := &walker{version: v.Name}
		w.node("", bs.OpenAPIV3Schema, hs.OpenAPIV3Schema)
		slices.SortStableFunc(w.out, func(a, b Change) int {
			return strings.Compare(a.Path+"\x00"+a.Check+"\x00"+a.Message, b.Path+"\x00"+b.Check+"\x00"+b.Message)
		})
		out = append(out, w.out...)
	}
	return out
}

// storageUnbridged: the storage version moves and no version is served by both base and
// head, so no client or migration can read an object across the upgrade at a version
// both sides know.
func storageUnbridged(base, head *apiextv1.CustomResourceDefinition) (Change, bool) {
	bs, _ := apihelpers.GetCRDStorageVersion(base)
	hs, _ := apihelpers.GetCRDStorageVersion(head)
	if bs == "" || hs == "" || bs == hs {
		return Change{}, false
	}
	for _, v := range base.Spec.Versions {
		if v.Served && apihelpers.HasServedCRDVersion(head, v.Name) {
			return Change{}, false
		}
	}
	return Change{Check: CheckStorageSwitchUnbridged, Severity: Breaking, Version: hs,
		Message: fmt.Sprintf("the storage version moves from %s to %s and no version is served both before and after the upgrade: no client or storage migration can read the stored objects at a version both releases serve", bs, hs)}, true
}

// conversionDropped: head removes base's conversion webhook while head serves versions
// whose schemas differ from its storage version's, so objects are relabelled, not
// converted. The stored versions are not known statically; the served ones stand in for
// them (conversionRemoved judges the live CRD's storedVersions with the same rule).
func conversionDropped(base, head *apiextv1.CustomResourceDefinition) (Change, bool) {
	if noConversion(base) || !noConversion(head) {
		return Change{}, false
	}
	var served []string
	for _, v := range head.Spec.Versions {
		if v.Served {
			served = append(served, v.Name)
		}
	}
	if len(served) < 2 {
		return Change{}, false
	}
	storage, differ := unconverted(head, served, head)
	if len(differ) == 0 {
		return Change{}, false
	}
	return Change{Check: CheckConversionRemoved, Severity: Breaking,
		Message: fmt.Sprintf("the conversion webhook is removed while %s are served: objects are then relabelled between versions, not converted, so reads at %s show %s's fields and the next write keeps only what its schema declares",
			strings.Join(served, ", "), strings.Join(differ, ", "), storage)}, true
}

// unconverted are the versions of from (of versions) whose schema differs from the storage
// version's schema in next: without a conversion webhook an object stored at one of them
// is served at another by relabelling it, unconverted. It returns next's storage version
// too.
func unconverted(from *apiextv1.CustomResourceDefinition, versions []string, next *apiextv1.CustomResourceDefinition) (string, []string) {
	storage, _ := apihelpers.GetCRDStorageVersion(next)
	var differ []string
	for _, v := range versions {
		if v != storage && !sameSchema(from, v, next, storage) {
			differ = append(differ, v)
		}
	}
	return storage, differ
}

// walker compares one version's schema of base and head, node by node.
type walker struct {
	version string
	out     []Change
}

func (w *walker) add(check string, sev Severity, path, format string, args ...any) {
	w.out = append(w.out, Change{Check: check, Severity: sev, Version: w.version, Path: path, Message: fmt.Sprintf(format, args...)})
}

// rootFields are the fields of an object's root that the API server keeps whatever the
// schema says.
var rootFields = []string{"apiVersion", "kind", "metadata"}

func (w *walker) node(path string, b, h *apiextv1.JSONSchemaProps) {
	at := path
	if at == "" {
		at = "the object"
	}
	if typeNarrowed(b, h) {
		w.add(CheckTypeChanged, Breaking, path, "%s changes type from %s to %s: clients that send the old type are refused, and so is an update of a stored object that changes a value of the old type", at, typeName(b), typeName(h))
		return // what lies below a changed type is a different field
	}
	w.required(at, path, b, h)
	w.enum(at, path, b, h)
	w.bounds(at, path, b, h)
	if h.Pattern != "" && h.Pattern != b.Pattern {
		if b.Pattern == "" {
			w.add(CheckPatternChanged, Risky, path, "%s must now match the pattern %q: values that do not are refused at create, and at an update that changes them", at, h.Pattern)
		} else {
			w.add(CheckPatternChanged, Risky, path, "%s's pattern changes from %q to %q: values only the old one matches are refused at create, and at an update that changes them", at, b.Pattern, h.Pattern)
		}
	}
	w.cel(at, path, b, h)

	keepsUnknown := h.XPreserveUnknownFields != nil && *h.XPreserveUnknownFields
	if b.XPreserveUnknownFields != nil && *b.XPreserveUnknownFields && !keepsUnknown {
		w.add(CheckFieldRemoved, Breaking, path, "%s no longer preserves unknown fields: the API server prunes the fields its schema does not declare from every stored object when it reads it, and the next write loses them", at)
	}
	for _, name := range slices.Sorted(maps.Keys(b.Properties)) {
		bp := b.Properties[name]
		hp, ok := h.Properties[name]
		switch {
		case ok:
			w.node(path+"."+name, &bp, &hp)
		case keepsUnknown || (path == "" && slices.Contains(rootFields, name)):
		default:
			w.add(CheckFieldRemoved, Breaking, path+"."+name, "%s.%s is removed from the schema: the API server prunes it from every stored object when it reads it, and the next write loses it", path, name)
		}
	}
	if b.Items != nil && b.Items.Schema != nil && h.Items != nil && h.Items.Schema != nil {
		w.node(path+"[*]", b.Items.Schema, h.Items.Schema)
	}
	if b.AdditionalProperties != nil && b.AdditionalProperties.Schema != nil {
		switch {
		case h.AdditionalProperties != nil && h.AdditionalProperties.Schema != nil:
			w.node(path+".*", b.AdditionalProperties.Schema, h.AdditionalProperties.Schema)
		case keepsUnknown || (h.AdditionalProperties != nil && h.AdditionalProperties.Allows):
		default:
			w.add(CheckFieldRemoved, Breaking, path+".*", "%s no longer holds arbitrary keys: the API server prunes every entry from stored objects when it reads them, and the next write loses them", at)
		}
	}
}

// typeNarrowed: head's type accepts less than base's. An empty type (any) or int-or-string
// in head is a widening.
func typeNarrowed(b, h *apiextv1.JSONSchemaProps) bool {
	if h.XIntOrString || h.Type == "" {
		return false
	}
	if b.XIntOrString {
		return true
	}
	return b.Type != h.Type && (b.Type != "integer" || h.Type != "number")
}

func typeName(s *apiextv1.JSONSchemaProps) string {
	switch {
	case s.XIntOrString:
		return "int-or-string"
	case s.Type == "":
		return "any"
	}
	return s.Type
}

func (w *walker) required(at, path string, b, h *apiextv1.JSONSchemaProps) {
	for _, name := range h.Required {
		if slices.Contains(b.Required, name) {
			continue
		}
		if p, ok := h.Properties[name]; ok && p.Default != nil {
			continue // the API server defaults it before it validates: nothing is refused
		}
		w.add(CheckRequiredAdded, Breaking, path+"."+name, "%s.%s becomes required: clients that do not set it are refused at create, and a stored object without it at an update that changes %s", path, name, at)
	}
}

func (w *walker) enum(at, path string, b, h *apiextv1.JSONSchemaProps) {
	if len(h.Enum) == 0 {
		return
	}
	if len(b.Enum) == 0 {
		w.add(CheckEnumNarrowed, Risky, path, "%s is now limited to %s: other values are refused at create, and at an update that changes them", at, enumList(h.Enum))
		return
	}
	var removed []apiextv1.JSON
	for _, v := range b.Enum {
		if !slices.ContainsFunc(h.Enum, func(x apiextv1.JSON) bool { return bytes.Equal(x.Raw, v.Raw) }) {
			removed = append(removed, v)
		}
	}
	if len(removed) > 0 {
		w.add(CheckEnumNarrowed, Breaking, path, "%s no longer accepts %s: clients that send it are refused, and stored objects that hold it at an update that changes the field", at, enumList(removed))
	}
}

func enumList(vs []apiextv1.JSON) string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, string(v.Raw))
	}
	return strings.Join(out, ", ")
}

// bounds reports each bound head tightens or adds.
func (w *walker) bounds(at, path string, b, h *apiextv1.JSONSchemaProps) {
	tight := func(keyword, was, now string) {
		if was == "" {
			w.add(CheckBoundTightened, Risky, path, "%s gains %s %s: values outside it are refused at create, and at an update that changes them", at, keyword, now)
			return
		}
		w.add(CheckBoundTightened, Risky, path, "%s's %s tightens from %s to %s: values outside it are refused at create, and at an update that changes them", at, keyword, was, now)
	}
	float := func(f *float64, exclusive bool) string {
		if f == nil {
			return ""
		}
		s := strconv.FormatFloat(*f, 'g', -1, 64)
		if exclusive {
			s += " (exclusive)"
		}
		return s
	}
	if h.Maximum != nil && (b.Maximum == nil || *h.Maximum < *b.Maximum || (*h.Maximum == *b.Maximum && h.ExclusiveMaximum && !b.ExclusiveMaximum)) {
		tight("maximum", float(b.Maximum, b.ExclusiveMaximum), float(h.Maximum, h.ExclusiveMaximum))
	}
	if h.Minimum != nil && (b.Minimum == nil || *h.Minimum > *b.Minimum || (*h.Minimum == *b.Minimum && h.ExclusiveMinimum && !b.ExclusiveMinimum)) {
		tight("minimum", float(b.Minimum, b.ExclusiveMinimum), float(h.Minimum, h.ExclusiveMinimum))
	}
	ints := []struct {
		keyword string
		b, h    *int64
		max     bool
	}{
		{"maxLength", b.MaxLength, h.MaxLength, true},
		{"minLength", b.MinLength, h.MinLength, false},
		{"maxItems", b.MaxItems, h.MaxItems, true},
		{"minItems", b.MinItems, h.MinItems, false},
		{"maxProperties", b.MaxProperties, h.MaxProperties, true},
		{"minProperties", b.MinProperties, h.MinProperties, false},
	}
	for _, c := range ints {
		if c.h == nil {
			continue
		}
		was := int64(0) // an absent minimum is 0
		if c.b != nil {
			was = *c.b
		}
		switch {
		case c.max && (c.b == nil || *c.h < was), !c.max && *c.h > was:
			s := ""
			if c.b != nil {
				s = strconv.FormatInt(*c.b, 10)
			}
			tight(c.keyword, s, strconv.FormatInt(*c.h, 10))
		}
	}
}

// cel reports each x-kubernetes-validations rule of head that base does not have.
func (w *walker) cel(at, path string, b, h *apiextv1.JSONSchemaProps) {
	for _, r := range h.XValidations {
		if slices.ContainsFunc(b.XValidations, func(x apiextv1.ValidationRule) bool { return x.Rule == r.Rule }) {
			continue
		}
		w.add(CheckCELRuleAdded, Risky, path, "%s gains the rule %q: objects that fail it are refused at create, and stored ones at an update that changes %s (the API server lets an update through that leaves it as it was)", at, r.Rule, at)
	}
}

// Covers says whether path, a field path the live judgement reports (Report.Pruned's or
// Report.Invalid's, as "spec.items[*].old"), lies at or under the Change's path: a
// value there is what the Change reaches. A CRD-wide Change covers nothing.
func (c Change) Covers(path string) bool {
	if c.Path == "" {
		return false
	}
	want, got := segments(c.Path), segments("."+path)
	if len(got) < len(want) {
		return false
	}
	for i, w := range want {
		listItem := w == "[*]" && index.MatchString(got[i])
		if w != got[i] && w != "*" && !listItem {
			return false
		}
	}
	return true
}

// segments splits ".a.b[*].c" into a, b, [*], c.
func segments(path string) []string {
	var out []string
	for _, part := range strings.Split(strings.TrimPrefix(path, "."), ".") {
		for {
			i := strings.Index(part, "[")
			if i < 0 {
				break
			}
			if i > 0 {
				out = append(out, part[:i])
			}
			j := strings.Index(part[i:], "]")
			if j < 0 {
				break
			}
			out = append(out, part[i:i+j+1])
			part = part[i+j+1:]
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// Holders are the live judgement's findings a Change reaches: for a field removal, the
// fields the scanned objects hold that it prunes; for a tightened rule, the failures
// objects would meet. The same schema change judged with objects (a Scan of the live
// cluster) says which objects each static Change concerns, and none is a Change no
// object reaches.
func (r *Report) Holders(c Change) (pruned []PathCount, invalid []RuleCount) {
	if r == nil {
		return nil, nil
	}
	if c.Check == CheckFieldRemoved {
		for _, p := range r.Pruned {
			if p.Version == c.Version && c.Covers(p.Path) {
				pruned = append(pruned, p)
			}
		}
		return pruned, nil
	}
	for _, i := range r.Invalid {
		if i.Version == c.Version && c.Covers(i.Path) {
			invalid = append(invalid, i)
		}
	}
	return nil, invalid
}
