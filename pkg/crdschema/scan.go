package crdschema

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// MaxExamples bounds the object names a Report keeps for each path or rule.
const MaxExamples = 3

// DefaultPageSize is how many objects one LIST page holds; a scan keeps one page in memory.
const DefaultPageSize = 500

// Report is what a schema change does to the objects stored today. It holds paths, rule
// messages, counts and a few object names, never a field's value.
type Report struct {
	// Reads are the passes made (none when no schema that matters changed).
	Reads []Read `json:"reads,omitempty"`
	// Objects is how many objects were judged, over all passes.
	Objects int64 `json:"objects"`
	// Pruned are the fields the next schema drops: hidden at once, gone from etcd at the
	// next write of each object. Data loss.
	Pruned []PathCount `json:"pruned,omitempty"`
	// Invalid are the validation failures objects would meet on their next update that
	// touches the field (the API server ratchets them until then). A warning.
	Invalid []RuleCount `json:"invalid,omitempty"`
	// ConversionRemoved is a conversion webhook removed while differently shaped versions
	// are stored. Data loss.
	ConversionRemoved *ConversionRemoval `json:"conversionRemoved,omitempty"`
	// ServerMinor is the Kubernetes minor whose words Invalid is given in (0: BuiltMinor's).
	ServerMinor int `json:"serverMinor,omitempty"`
	// ConversionFallbacks are the reads whose conversion webhook did not answer: those
	// objects were read at the storage version instead, so what the change does to them
	// as served at the version asked for was not judged.
	ConversionFallbacks []ConversionFallback `json:"conversionFallbacks,omitempty"`
}

// ConversionFallback is one read made at the storage version because the API server
// could not convert the objects to the version asked for through the CRD's conversion
// webhook (kubeclient.StorageFallback).
type ConversionFallback struct {
	// Version is the version the objects could not be read at.
	Version string `json:"version"`
	// ReadAt is the storage version they were read at instead.
	ReadAt string `json:"readAt"`
	// Error is the API server's answer to the read at Version.
	Error string `json:"error"`
}

// PathCount is one field path with the objects that hold it.
type PathCount struct {
	Path string `json:"path"`
	// Version is the version whose schema drops it.
	Version  string   `json:"version"`
	Objects  int64    `json:"objects"`
	Examples []string `json:"examples"`
}

// RuleCount is one validation failure with the objects that meet it.
type RuleCount struct {
	Path    string `json:"path"`
	Version string `json:"version"`
	// Type is the kind of failure (Required value, Unsupported value, Invalid value, ...).
	Type string `json:"type"`
	// Message is the rule's own text (a CEL rule's message, the enum's values), without
	// the object's value.
	Message  string   `json:"message"`
	Objects  int64    `json:"objects"`
	Examples []string `json:"examples"`
}

// DataLoss says whether the change loses data: pruned fields or a removed conversion.
func (r *Report) DataLoss() bool {
	return r != nil && (len(r.Pruned) > 0 || r.ConversionRemoved != nil)
}

// Warns says whether the change leaves objects that later updates will be refused for.
func (r *Report) Warns() bool { return r != nil && len(r.Invalid) > 0 }

// PrunedPaths are the pruned field paths, each once.
func (r *Report) PrunedPaths() []string {
	var out []string
	for _, p := range r.Pruned {
		out = append(out, p.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Summary is one line for a report, a condition or a denial: what is lost or refused,
// with counts and paths.
func (r *Report) Summary() string {
	if r == nil {
		return ""
	}
	var parts []string
	if len(r.Pruned) > 0 {
		var ps []string
		for _, p := range r.Pruned {
			ps = append(ps, fmt.Sprintf("%s (%d objects)", p.Path, p.Objects))
		}
		parts = append(parts, "fields dropped by the new schema: "+strings.Join(ps, ", "))
	}
	if r.ConversionRemoved != nil {
		parts = append(parts, r.ConversionRemoved.Message)
	}
	if len(r.Invalid) > 0 {
		var rs []string
		for _, i := range r.Invalid {
			rs = append(rs, fmt.Sprintf("%s: %s (%d objects)", i.Path, i.Message, i.Objects))
		}
		parts = append(parts, "objects whose next update would be rejected: "+strings.Join(rs, "; "))
	}
	return strings.Join(parts, "; ")
}

// Lister lists a CRD's live objects at one version, one page at a time.
type Lister interface {
	List(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)
}

// DynamicLister lists through a dynamic client.
type DynamicLister struct{ Client dynamic.Interface }

// List lists one page across all namespaces.
func (d DynamicLister) List(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	return d.Client.Resource(gvr).List(ctx, opts)
}

// ScanOptions tune Scan.
type ScanOptions struct {
	// PageSize is how many objects one LIST page holds (0: DefaultPageSize).
	PageSize int64
	// ServerMinor is the target API server's Kubernetes minor (0: not known). The
	// report's failures are worded as that server words them (see asServer).
	ServerMinor int
	// Skeletons says the objects listed are Skeletons of a snapshot's field paths, not
	// the stored objects: only pruning is judged (placeholders say nothing of validation),
	// and no object is named.
	Skeletons bool
}

// Scan reads the live objects the change needs, page by page, and judges each. A CRD
// whose schemas do not change is not read at all. A read at a version whose conversion
// webhook does not answer falls back to the storage version (kubeclient.StorageFallback)
// and is reported in Report.ConversionFallbacks: objects stored there need no
// conversion, and the storage version's own read, when the change needs one, judges them.
func (j *Judge) Scan(ctx context.Context, l Lister, o ScanOptions) (*Report, error) {
	rep := &Report{Reads: j.Reads(), ConversionRemoved: j.conversion, ServerMinor: o.ServerMinor}
	acc := newAccumulator(o.ServerMinor)
	const why = "judge them against the new schema"
	skeletons := o.Skeletons
	judge := func(r Read, o *unstructured.Unstructured) error {
		if skeletons {
			r.Validate = false
			acc.add(r, "", j.Object(ctx, r, o.Object))
			rep.Objects++
			return nil
		}
		acc.add(r, objectName(o), j.Object(ctx, r, o.Object))
		rep.Objects++
		return nil
	}
	for _, r := range j.reads {
		err := j.read(ctx, l, o.PageSize, r, why, judge)
		storage, ok := kubeclient.StorageFallback(j.live, r.ReadAt, err)
		if !ok {
			if err != nil {
				return nil, err
			}
			continue
		}
		rep.ConversionFallbacks = append(rep.ConversionFallbacks, ConversionFallback{Version: r.ReadAt, ReadAt: storage, Error: errors.Unwrap(err).Error()})
		if slices.ContainsFunc(j.reads, func(p Read) bool { return p.ReadAt == storage }) {
			continue // the storage version's own read judges the same objects
		}
		if err := j.read(ctx, l, o.PageSize, Read{ReadAt: storage, Against: storage}, why, judge); err != nil {
			return nil, err
		}
	}
	rep.Pruned, rep.Invalid = acc.result()
	return rep, nil
}

// each lists, page by page, the objects of every read and calls fn for each; why names
// the purpose in an error.
func (j *Judge) each(ctx context.Context, l Lister, pageSize int64, why string, fn func(Read, *unstructured.Unstructured) error) error {
	for _, r := range j.reads {
		if err := j.read(ctx, l, pageSize, r, why, fn); err != nil {
			return err
		}
	}
	return nil
}

// read lists the objects of one read, page by page, and calls fn for each.
func (j *Judge) read(ctx context.Context, l Lister, pageSize int64, r Read, why string, fn func(Read, *unstructured.Unstructured) error) error {
	if pageSize <= 0 {
		pageSize = DefaultPageSize
	}
	gvr := schema.GroupVersionResource{Group: j.live.Spec.Group, Version: r.ReadAt, Resource: j.live.Spec.Names.Plural}
	list := func(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
		return l.List(ctx, gvr, opts)
	}
	for page, err := range kubeclient.Pages(ctx, list, metav1.ListOptions{Limit: pageSize}) {
		if err != nil {
			return &ReadError{GroupResource: gvr.GroupResource().String(), Version: r.ReadAt, Why: why, Err: err}
		}
		for i := range page.Items {
			if err := fn(r, &page.Items[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// ReadError is a LIST of a read that failed; it wraps the API server's answer.
type ReadError struct {
	GroupResource, Version, Why string
	Err                         error
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("list %s at %s to %s: %v", e.GroupResource, e.Version, e.Why, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }

// Check is New and Scan in one call.
func Check(ctx context.Context, l Lister, live, next *apiextv1.CustomResourceDefinition) (*Report, error) {
	j, err := New(live, next)
	if err != nil {
		return nil, err
	}
	return j.Scan(ctx, l, ScanOptions{})
}

func objectName(o *unstructured.Unstructured) string {
	if ns := o.GetNamespace(); ns != "" {
		return ns + "/" + o.GetName()
	}
	return o.GetName()
}

type accumulator struct {
	serverMinor int
	pruned      map[[2]string]*PathCount
	invalid     map[[4]string]*RuleCount
}

func newAccumulator(serverMinor int) *accumulator {
	return &accumulator{serverMinor: serverMinor, pruned: map[[2]string]*PathCount{}, invalid: map[[4]string]*RuleCount{}}
}

func (a *accumulator) add(r Read, name string, o Outcome) {
	for _, p := range o.Pruned {
		k := [2]string{r.Against, p}
		pc := a.pruned[k]
		if pc == nil {
			pc = &PathCount{Path: p, Version: r.Against, Examples: []string{}}
			a.pruned[k] = pc
		}
		pc.Objects++
		if len(pc.Examples) < MaxExamples && name != "" {
			pc.Examples = append(pc.Examples, name)
		}
	}
	seen := map[[4]string]bool{}
	for _, e := range o.Invalid {
		path := index.ReplaceAllString(e.Field, "[*]")
		typ, detail := asServer(e, a.serverMinor)
		k := [4]string{r.Against, path, typ, detail}
		if seen[k] {
			continue
		}
		seen[k] = true
		rc := a.invalid[k]
		if rc == nil {
			rc = &RuleCount{Path: path, Version: r.Against, Type: typ, Message: message(typ, detail), Examples: []string{}}
			a.invalid[k] = rc
		}
		rc.Objects++
		if len(rc.Examples) < MaxExamples {
			rc.Examples = append(rc.Examples, name)
		}
	}
}

// message is the error without the object's value: the failure's type and the rule's
// detail (the API server's own wording for both).
func message(typ, detail string) string {
	if detail == "" {
		return typ
	}
	return typ + ": " + detail
}

func (a *accumulator) result() ([]PathCount, []RuleCount) {
	var pruned []PathCount
	for _, p := range a.pruned {
		pruned = append(pruned, *p)
	}
	slices.SortFunc(pruned, func(x, y PathCount) int {
		return strings.Compare(x.Version+"\x00"+x.Path, y.Version+"\x00"+y.Path)
	})
	var invalid []RuleCount
	for _, r := range a.invalid {
		invalid = append(invalid, *r)
	}
	slices.SortFunc(invalid, func(x, y RuleCount) int {
		return strings.Compare(x.Version+"\x00"+x.Path+"\x00"+x.Message, y.Version+"\x00"+y.Path+"\x00"+y.Message)
	})
	return pruned, invalid
}
