// Package crdschema owns the question "will the objects already stored survive this CRD's
// schema?". A CRD update that narrows a schema loses data quietly: the API server prunes
// fields the new structural schema does not declare when it reads an object from etcd,
// and the next write (a controller's status update, or a storage migration) makes the
// loss permanent. Objects that break a new validation rule keep working until an update
// touches the field, and then every such update is rejected. A conversion webhook removed
// while objects are stored at several versions serves them unconverted.
//
// The judgement is the API server's own code from k8s.io/apiextensions-apiserver: the
// structural schema, pruning, defaulting, embedded-object metadata coercion, and the
// custom resource strategy's validation (OpenAPI, list-type invariants, CEL rules within
// their cost limits). Nothing here re-implements a rule. Where the target server's minor
// words a failure differently, the report uses its words (ScanOptions.ServerMinor), and
// whether the server accepts the incoming CRD itself is asked of the server (Admit).
//
// A Judge compiles one schema change (the live CRD and the CRD about to replace it, or the
// CRD a migration writes under). Judge.Reads says which live objects to read, at which
// version, and against which schema; Scan reads them page by page and returns a Report of
// field paths and counts, never values.
//
// Compare answers the chart maintainer's question without objects: what a CRD's head
// release makes incompatible with its base release, rule by rule (compat.go). Where
// objects are at hand, Report.Holders says which of the live judgement's findings each
// static Change reaches.
package crdschema

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// Read is one pass over the live objects of a CRD: list them at version ReadAt (as the
// live API server serves them) and judge each against the schema of version Against in
// the CRD that will be in force.
type Read struct {
	ReadAt  string `json:"readAt"`
	Against string `json:"against"`
	// Validate says whether the pass judges validation too. Pruning is judged on every
	// pass; validation only where the object keeps its version (ReadAt == Against), since
	// that is the version clients update it at.
	Validate bool `json:"validate"`
}

// Judge is one compiled schema change: the CRD whose schema is in force now (Live) and the
// CRD that will be (Next). Build it with New.
type Judge struct {
	live, next *apiextv1.CustomResourceDefinition
	nextRules  map[string]*rules
	liveRules  map[string]*rules
	reads      []Read
	conversion *ConversionRemoval
}

// rules are the API server's machinery for one version of one CRD. The CEL programs are
// compiled at the first object validated: they are most of a compile's cost, and a read
// often finds no objects at all (cel.NewValidator reports no errors of its own; a rule
// that does not compile fails at validation, as in the API server).
type rules struct {
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
	cel        func() *cel.Validator
}

// validate is the custom resource strategy's create validation (k8s.io/apiextensions-
// apiserver/pkg/registry/customresource, strategy.go), in its order, from the same
// packages: the OpenAPI schema, embedded resources' metadata, list-type invariants, then
// the CEL rules within the runtime cost budget when nothing before blocks them. An update
// meets the same rules, ratcheted: the API server lets an update through that leaves an
// invalid value as it was, so what the next schema newly refuses is met only by an update
// that touches it (Outcome.Invalid).
func (r *rules) validate(ctx context.Context, obj map[string]any) field.ErrorList {
	errs := apiservervalidation.ValidateCustomResource(nil, obj, r.validator)
	errs = append(errs, schemaobjectmeta.Validate(ctx, nil, obj, r.structural, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, r.structural, obj)...)
	if blocking(errs) {
		return errs
	}
	validator := r.cel()
	if validator == nil {
		return errs
	}
	celErrs, _ := validator.Validate(ctx, nil, r.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

// blocking mirrors the strategy: CEL rules are not run over values of the wrong type.
func blocking(errs field.ErrorList) bool {
	return slices.ContainsFunc(errs, func(e *field.Error) bool { return e.Type == field.ErrorTypeTypeInvalid })
}

// New compiles the change from live (the CRD as it is on the cluster) to next (the CRD an
// upgrade or rollback applies, or the live CRD itself with the storage version a
// migration writes at). A nil live CRD means next is new: nothing is stored, nothing is
// judged.
func New(live, next *apiextv1.CustomResourceDefinition) (*Judge, error) {
	j := &Judge{live: live, next: next, nextRules: map[string]*rules{}, liveRules: map[string]*rules{}}
	if live == nil || next == nil {
		return j, nil
	}
	j.reads = plan(live, next)
	// Only the schemas the reads judge against are compiled (with their CEL programs):
	// the next one of each read, and the live one of each read that validates.
	nextVersions, liveVersions := map[string]bool{}, map[string]bool{}
	for _, r := range j.reads {
		nextVersions[r.Against] = true
		if r.Validate {
			liveVersions[r.ReadAt] = true
		}
	}
	var err error
	if j.nextRules, err = compile(next, nextVersions); err != nil {
		return nil, fmt.Errorf("compile the schema of the incoming CRD %s: %w", next.Name, err)
	}
	if j.liveRules, err = compile(live, liveVersions); err != nil {
		return nil, fmt.Errorf("compile the schema of the live CRD %s: %w", live.Name, err)
	}
	j.conversion = conversionRemoved(live, next)
	return j, nil
}

// ForMigration compiles what a storage migration of crd does to its objects: every object
// is re-written at storage (the live storage version when empty), so an object stored at
// another version keeps only what storage's schema declares. Without a conversion webhook
// that is a relabelling, so objects are read at each other stored version the CRD serves
// and judged against storage's schema. With a webhook, what survives is the webhook's
// doing: nothing is read.
func ForMigration(crd *apiextv1.CustomResourceDefinition, storage string) (*Judge, error) {
	if storage == "" {
		storage, _ = apihelpers.GetCRDStorageVersion(crd)
	}
	rules, err := compile(crd, nil)
	if err != nil {
		return nil, fmt.Errorf("compile the schema of CRD %s: %w", crd.Name, err)
	}
	j := &Judge{live: crd, next: crd, nextRules: rules, liveRules: rules}
	if !noConversion(crd) {
		return j, nil
	}
	for _, v := range crd.Status.StoredVersions {
		if v != storage && apihelpers.HasServedCRDVersion(crd, v) && !sameSchema(crd, v, crd, storage) {
			j.reads = append(j.reads, Read{ReadAt: v, Against: storage})
		}
	}
	return j, nil
}

// Changed says whether replacing live with next can change what stored objects keep or
// pass: a schema of a version both declare differs, the storage version moves, or the
// conversion strategy changes. Without it, New would plan no reads and find nothing.
func Changed(live, next *apiextv1.CustomResourceDefinition) bool {
	if live == nil || next == nil {
		return false
	}
	ls, _ := apihelpers.GetCRDStorageVersion(live)
	ns, _ := apihelpers.GetCRDStorageVersion(next)
	if ls != ns || noConversion(live) != noConversion(next) {
		return true
	}
	for _, v := range next.Spec.Versions {
		declared := slices.ContainsFunc(live.Spec.Versions, func(x apiextv1.CustomResourceDefinitionVersion) bool { return x.Name == v.Name })
		if declared && !sameSchema(live, v.Name, next, v.Name) {
			return true
		}
	}
	return false
}

// Reads are the passes over live objects this change needs; none when no schema that
// stored or served objects meet changes (the caller then reads nothing).
func (j *Judge) Reads() []Read { return slices.Clone(j.reads) }

// ConversionRemoved is the conversion finding of this change, nil when there is none. It
// needs no objects: it is decided from the two CRDs and storedVersions.
func (j *Judge) ConversionRemoved() *ConversionRemoval { return j.conversion }

// Outcome is what the change does to one object.
type Outcome struct {
	// Pruned are the field paths the next schema drops (list indices written as [*]).
	Pruned []string
	// Invalid are the validation errors the object would meet on its next update that it
	// does not meet under the live schema (the API server ratchets them until then).
	Invalid field.ErrorList
}

// Object judges one object read at r.ReadAt. It does not modify obj.
func (j *Judge) Object(ctx context.Context, r Read, obj map[string]any) Outcome {
	next := j.nextRules[r.Against]
	if next == nil {
		return Outcome{}
	}
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)}
	if r.ReadAt != r.Against {
		u.SetAPIVersion(schema.GroupVersion{Group: j.next.Spec.Group, Version: r.Against}.String())
	}
	out := Outcome{Pruned: prune(u.Object, next.structural)}
	if !r.Validate {
		return out
	}
	structuraldefaulting.Default(u.Object, next.structural)
	errs := next.validate(ctx, u.Object)
	if len(errs) == 0 {
		return out
	}
	var before field.ErrorList
	if live := j.liveRules[r.ReadAt]; live != nil {
		before = live.validate(ctx, obj)
	}
	for _, e := range errs {
		if !slices.ContainsFunc(before, func(b *field.Error) bool { return sameError(b, e) }) {
			out.Invalid = append(out.Invalid, e)
		}
	}
	return out
}

func sameError(a, b *field.Error) bool {
	return a.Type == b.Type && a.Field == b.Field && a.Detail == b.Detail
}

var index = regexp.MustCompile(`\[\d+\]`)

// prune drops from x what the structural schema does not declare, as the API server does
// on every read from etcd, and returns the dropped paths with list indices folded.
func prune(x map[string]any, s *structuralschema.Structural) []string {
	paths := structuralpruning.PruneWithOptions(x, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(x, s)
	// Embedded resources' metadata is coerced, dropping unknown and malformed fields.
	if _, more := schemaobjectmeta.CoerceWithOptions(nil, x, s, false,
		schemaobjectmeta.CoerceOptions{DropInvalidFields: true, ReturnUnknownFieldPaths: true}); len(more) > 0 {
		paths = append(paths, more...)
	}
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, index.ReplaceAllString(p, "[*]"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// compile builds, for every version of crd with a schema (of those in versions, when it is
// not nil), the structural schema and the custom resource strategy the API server would
// serve it with.
func compile(crd *apiextv1.CustomResourceDefinition, versions map[string]bool) (map[string]*rules, error) {
	out := map[string]*rules{}
	for _, v := range crd.Spec.Versions {
		if versions != nil && !versions[v.Name] {
			continue
		}
		val, err := apihelpers.GetSchemaForVersion(crd, v.Name)
		if err != nil {
			return nil, err
		}
		if val == nil || val.OpenAPIV3Schema == nil {
			continue
		}
		internal := &apiextinternal.CustomResourceValidation{}
		if err := apiextv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, internal, nil); err != nil {
			return nil, fmt.Errorf("version %s: %w", v.Name, err)
		}
		s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
		if err != nil {
			return nil, fmt.Errorf("version %s: not a structural schema: %w", v.Name, err)
		}
		s = s.DeepCopy()
		if err := structuraldefaulting.PruneDefaults(s); err != nil {
			return nil, fmt.Errorf("version %s: %w", v.Name, err)
		}
		validator, _, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
		if err != nil {
			return nil, fmt.Errorf("version %s: %w", v.Name, err)
		}
		// CEL programs are compiled here, with the API server's per-call cost limit.
		out[v.Name] = &rules{structural: s, validator: validator,
			cel: sync.OnceValue(func() *cel.Validator { return cel.NewValidator(s, true, celconfig.PerCallLimit) })}
	}
	return out, nil
}

// plan decides the passes over live objects. For every version the next CRD keeps whose
// schema changes, objects are read at that version (if the live CRD serves it) and judged
// against its next schema. When the next CRD stores at another version without a
// conversion webhook, objects are also read at the live storage version and judged
// against the next storage version's schema: a write re-encodes them there, relabelled.
func plan(live, next *apiextv1.CustomResourceDefinition) []Read {
	var reads []Read
	add := func(r Read) {
		if !slices.Contains(reads, r) {
			reads = append(reads, r)
		}
	}
	for _, v := range next.Spec.Versions {
		if !apihelpers.HasServedCRDVersion(live, v.Name) || sameSchema(live, v.Name, next, v.Name) {
			continue
		}
		add(Read{ReadAt: v.Name, Against: v.Name, Validate: true})
	}
	liveStorage, _ := apihelpers.GetCRDStorageVersion(live)
	nextStorage, _ := apihelpers.GetCRDStorageVersion(next)
	if liveStorage != "" && nextStorage != "" && liveStorage != nextStorage && noConversion(next) &&
		apihelpers.HasServedCRDVersion(live, liveStorage) && !sameSchema(live, liveStorage, next, nextStorage) {
		add(Read{ReadAt: liveStorage, Against: nextStorage})
	}
	return reads
}

func sameSchema(a *apiextv1.CustomResourceDefinition, av string, b *apiextv1.CustomResourceDefinition, bv string) bool {
	sa, _ := apihelpers.GetSchemaForVersion(a, av)
	sb, _ := apihelpers.GetSchemaForVersion(b, bv)
	if sb == nil {
		return sa == nil
	}
	if sa == nil {
		return false
	}
	return equality.Semantic.DeepEqual(sa.OpenAPIV3Schema, sb.OpenAPIV3Schema)
}

func noConversion(crd *apiextv1.CustomResourceDefinition) bool {
	return crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy == apiextv1.NoneConverter
}

// ConversionRemoval is a conversion webhook that the change removes while objects are
// stored at versions whose schemas differ: the API server then serves each object at the
// version asked for by relabelling it, unconverted.
type ConversionRemoval struct {
	StoredVersions []string `json:"storedVersions"`
	// DifferentSchemas are the stored versions whose schema differs from the next
	// storage version's.
	DifferentSchemas []string `json:"differentSchemas"`
	Message          string   `json:"message"`
}

func conversionRemoved(live, next *apiextv1.CustomResourceDefinition) *ConversionRemoval {
	if noConversion(live) || !noConversion(next) || len(live.Status.StoredVersions) < 2 {
		return nil
	}
	nextStorage, differ := unconverted(live, live.Status.StoredVersions, next)
	if len(differ) == 0 {
		return nil
	}
	return &ConversionRemoval{
		StoredVersions:   slices.Clone(live.Status.StoredVersions),
		DifferentSchemas: differ,
		Message: fmt.Sprintf("the conversion webhook is removed while objects are stored at %s: objects stored at %s would be served as %s unconverted, and the next write keeps only what the %s schema declares",
			strings.Join(live.Status.StoredVersions, ", "), strings.Join(differ, ", "), nextStorage, nextStorage),
	}
}
