// Package crdversions owns reading CustomResourceDefinitions out of manifests and
// summarising their version sets: which versions exist, which are served, which one is
// the storage version and what the conversion strategy is. It is the vocabulary every
// other package uses to talk about CRD versions.
//
// Documents splits a manifest with pkg/manifest (which owns reading rendered manifests)
// but decodes each document its own way, on purpose: it keeps each document's raw bytes,
// decodes a CustomResourceDefinition strictly (a duplicate key, an unknown field) and
// checks the fields the API server requires, reads what kubectl reads from a file (JSON
// streams and arrays too), and names the file of a broken document. manifest.Objects
// decodes leniently, as Helm's builder does for every kind.
package crdversions

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Version is one entry of a CRD's spec.versions.
type Version struct {
	Name       string `json:"name"`
	Served     bool   `json:"served"`
	Storage    bool   `json:"storage"`
	Deprecated bool   `json:"deprecated,omitempty"`
}

// String renders a version the way operators read it: v1(storage), v1beta1(served=false).
func (v Version) String() string {
	var flags []string
	if v.Storage {
		flags = append(flags, "storage")
	}
	if !v.Served {
		flags = append(flags, "served=false")
	}
	if v.Deprecated {
		flags = append(flags, "deprecated")
	}
	if len(flags) == 0 {
		return v.Name
	}
	return v.Name + "(" + strings.Join(flags, ",") + ")"
}

// Versions lists spec.versions of a CRD in manifest order.
func Versions(crd *apiextv1.CustomResourceDefinition) []Version {
	out := make([]Version, 0, len(crd.Spec.Versions))
	for _, v := range crd.Spec.Versions {
		out = append(out, Version{Name: v.Name, Served: v.Served, Storage: v.Storage, Deprecated: v.Deprecated})
	}
	return out
}

// StorageVersion returns the name of the version marked storage, or "" when none is.
func StorageVersion(crd *apiextv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return ""
}

// Conversion returns the conversion strategy, defaulting to None as the API server does.
func Conversion(crd *apiextv1.CustomResourceDefinition) string {
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy == "" {
		return string(apiextv1.NoneConverter)
	}
	return string(crd.Spec.Conversion.Strategy)
}

// Has reports whether name is one of the CRD's spec.versions.
func Has(crd *apiextv1.CustomResourceDefinition, name string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == name {
			return true
		}
	}
	return false
}

// DroppedStoredVersions are the versions of live's status.storedVersions that incoming
// no longer lists in spec.versions, in storedVersions order: the API server rejects an
// update that drops them until a storage migration removes them from storedVersions.
func DroppedStoredVersions(live, incoming *apiextv1.CustomResourceDefinition) []string {
	var out []string
	for _, v := range live.Status.StoredVersions {
		if !Has(incoming, v) {
			out = append(out, v)
		}
	}
	return out
}

// Serves reports whether name is a served version of the CRD.
func Serves(crd *apiextv1.CustomResourceDefinition, name string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == name {
			return v.Served
		}
	}
	return false
}

// ServedVersion picks the version to read objects at: the storage version when it is
// served, otherwise the first served version. It returns "" when nothing is served.
func ServedVersion(crd *apiextv1.CustomResourceDefinition) string {
	if s := StorageVersion(crd); s != "" && Serves(crd, s) {
		return s
	}
	for _, v := range crd.Spec.Versions {
		if v.Served {
			return v.Name
		}
	}
	return ""
}

// ParseError says which document of which file could not be read as a CRD.
type ParseError struct {
	File     string
	Document int
	Err      error
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s (document %d): %v", e.File, e.Document, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// FromManifest returns every CustomResourceDefinition in a multi-document YAML
// manifest. Other kinds are skipped. A document that claims to be a CRD but does not
// decode strictly, or lacks the fields the API server requires, is an error, so that a
// broken chart is reported instead of silently ignored.
func FromManifest(file string, data []byte) ([]*apiextv1.CustomResourceDefinition, error) {
	docs, err := Documents(file, data)
	if err != nil {
		return nil, err
	}
	var out []*apiextv1.CustomResourceDefinition
	for _, d := range docs {
		out = append(out, d.CRDs...)
	}
	return out, nil
}

// Document is one document of a manifest, decoded.
type Document struct {
	// Index is the document's place in its file, from 1.
	Index int
	// Raw is the document as written, comments included.
	Raw []byte
	// CRDs are the CustomResourceDefinitions it holds.
	CRDs []*apiextv1.CustomResourceDefinition
	// Objects are the heads of the other objects it holds.
	Objects []Head
}

// Head is what an object says it is.
type Head struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// Group is the API group of the object's apiVersion ("" for the core group).
func (h Head) Group() string {
	if g, _, ok := strings.Cut(h.APIVersion, "/"); ok {
		return g
	}
	return ""
}

// Documents splits a manifest into its documents and decodes each, the way kubectl
// reads a file: YAML documents separated by "---", JSON objects (one or a stream), a
// JSON array of objects, and List kinds (kind: List, or any kind ending in List that has
// items), whose items count as objects of their own. Blank documents are left out;
// those that hold no object (comments only, no kind) are kept, with none: helm template
// writes a crds/ file's "# Source:" line as a document of its own when the file starts
// with "---". A
// document that is not valid YAML or JSON, or a CustomResourceDefinition that does not
// decode strictly or lacks the fields the API server requires, is a *ParseError naming
// the file and the document.
//
// Documents are decoded in parallel, as many at a time as there are processors: a chart
// that ships its CRDs in one file (flux2: 14 CRDs, 350 KiB of YAML) is otherwise parsed
// on one core while the first decision of a fresh process waits for it.
func Documents(file string, data []byte) ([]Document, error) {
	docs, splitErr := manifest.Documents(string(data))
	out, errs := make([]Document, len(docs)), make([]error, len(docs))
	var wg sync.WaitGroup
	limit := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, md := range docs {
		out[i] = Document{Index: md.Index, Raw: []byte(md.Text)}
		wg.Go(func() {
			limit <- struct{}{}
			defer func() { <-limit }()
			errs[i] = out[i].decode()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, &ParseError{File: file, Document: out[i].Index, Err: err}
		}
	}
	var de *manifest.DocumentError
	if errors.As(splitErr, &de) {
		return nil, &ParseError{File: file, Document: de.Index, Err: de.Err}
	}
	return out, nil
}

// decode reads the document's objects: a JSON stream value by value, YAML in one parse.
func (d *Document) decode() error {
	body, ok := jsonBody(d.Raw)
	if !ok {
		return d.object(d.Raw, "")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for n := 1; ; n++ {
		var v json.RawMessage
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil && n == 1 {
			// YAML flow style ({kind: List, items: [...]}) starts like JSON.
			if yerr := d.object(d.Raw, ""); yerr == nil {
				return nil
			}
		}
		if err != nil {
			return fmt.Errorf("not valid JSON: %w", err)
		}
		where := ""
		if n > 1 || dec.More() {
			where = fmt.Sprintf("JSON value %d: ", n)
		}
		if err := d.object(v, where); err != nil {
			return err
		}
	}
}

// jsonBody is the document without the lines before its content (blank, comments, the
// "---" the YAML reader keeps at the start of a file), and whether that content is JSON.
func jsonBody(raw []byte) ([]byte, bool) {
	for len(raw) > 0 {
		line, rest, _ := bytes.Cut(raw, []byte("\n"))
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' && !bytes.Equal(t, []byte("---")) {
			return raw, t[0] == '{' || t[0] == '['
		}
		raw = rest
	}
	return nil, false
}

// object decodes one YAML or JSON value: an object, a List of objects or an array of
// them. where prefixes errors with the value's place in the document.
func (d *Document) object(raw []byte, where string) error {
	// One YAML parse per value (CRDs are large and a chart can hold megabytes of them):
	// strictly, so that a CRD with a duplicate key is refused, and leniently only when
	// that fails, for the values of other kinds.
	js, strictErr := yaml.YAMLToJSONStrict(raw)
	if strictErr != nil {
		var err error
		if js, err = yaml.YAMLToJSON(raw); err != nil {
			return fmt.Errorf("%snot valid YAML: %w", where, err)
		}
	}
	return d.value(js, strictErr, where)
}

func (d *Document) value(js []byte, strictErr error, where string) error {
	js = bytes.TrimSpace(js)
	if len(js) > 0 && js[0] == '[' {
		var items []json.RawMessage
		if err := json.Unmarshal(js, &items); err != nil {
			return fmt.Errorf("%snot valid YAML: %w", where, err)
		}
		return d.items(items, strictErr, where)
	}
	var head struct {
		Head
		Items *[]json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return fmt.Errorf("%snot a Kubernetes object: %w", where, err)
	}
	switch {
	case head.Kind == "":
		// Comments only, or not an object at all: kubectl and Helm refuse the latter
		// when they apply it; it brings no CRD either way.
		return nil
	case strings.HasSuffix(head.Kind, "List") && head.Items != nil:
		return d.items(*head.Items, strictErr, where)
	case head.Kind != "CustomResourceDefinition":
		d.Objects = append(d.Objects, head.Head)
		return nil
	}
	crd, err := decodeCRD(head.APIVersion, js, strictErr)
	if err != nil {
		return fmt.Errorf("%s%w", where, err)
	}
	d.CRDs = append(d.CRDs, crd)
	return nil
}

func (d *Document) items(items []json.RawMessage, strictErr error, where string) error {
	for i, it := range items {
		if err := d.value(it, strictErr, fmt.Sprintf("%sitem %d: ", where, i)); err != nil {
			return err
		}
	}
	return nil
}

// decodeCRD decodes a CustomResourceDefinition strictly and checks what the API server
// requires. strictErr is the strict YAML parse's error, if it failed.
func decodeCRD(apiVersion string, js []byte, strictErr error) (*apiextv1.CustomResourceDefinition, error) {
	if apiVersion != apiextv1.SchemeGroupVersion.String() {
		return nil, fmt.Errorf("CustomResourceDefinition has apiVersion %q; only %s is served by current API servers", apiVersion, apiextv1.SchemeGroupVersion)
	}
	if strictErr != nil {
		return nil, fmt.Errorf("invalid CustomResourceDefinition: %w", strictErr)
	}
	crd := &apiextv1.CustomResourceDefinition{}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(crd); err != nil {
		return nil, fmt.Errorf("invalid CustomResourceDefinition: %w", err)
	}
	if err := validate(crd); err != nil {
		return nil, err
	}
	return crd, nil
}

func validate(crd *apiextv1.CustomResourceDefinition) error {
	if crd.Name == "" {
		return errors.New("invalid CustomResourceDefinition: metadata.name is empty")
	}
	if len(crd.Spec.Versions) == 0 {
		return fmt.Errorf("invalid CustomResourceDefinition %s: spec.versions is empty", crd.Name)
	}
	storage := 0
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage++
		}
	}
	if storage != 1 {
		return fmt.Errorf("invalid CustomResourceDefinition %s: exactly one version must be storage, found %d", crd.Name, storage)
	}
	if want := crd.Spec.Names.Plural + "." + crd.Spec.Group; crd.Name != want {
		return fmt.Errorf("invalid CustomResourceDefinition %s: metadata.name must be %q (spec.names.plural + \".\" + spec.group)", crd.Name, want)
	}
	return nil
}
