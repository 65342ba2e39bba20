// Package manifest owns reading rendered Kubernetes manifests: a Helm release's stored
// manifest, helm template output, or any multi-document YAML of objects. It splits them
// into documents with apimachinery's YAML reader, decodes each into unstructured
// objects, expands List kinds into their items as Helm's and kubectl's resource builder
// does (Flatten), and says how a report names an object (Subject: Kind/namespace/name).
//
// Every package that acts on the objects of a manifest (applycheck, releasediff,
// chartmigrate, chartcrds, redact, the webhook) reads them here, so that they agree on
// what a manifest holds and on what each object is called.
//
// Two readers decode apart on purpose: crdversions.Documents splits with Documents but
// decodes CustomResourceDefinitions strictly, for the API server's own validation rules,
// and uninstall reads a stored manifest through Helm's releaseutil.SortManifests, which
// reproduces helm uninstall's order and its refusal of a corrupted record.
package manifest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// DocumentError says which document of a manifest could not be read.
type DocumentError struct {
	// Index is the document's place in the manifest, from 1, as the YAML reader splits
	// it: a "---" right after another, or at the very start, begins no document.
	Index int
	// Source is the template file the document's "# Source:" line names ("" when it has
	// none; Helm writes one above every document it renders).
	Source string
	// Err is why it could not be read.
	Err error
}

func (e *DocumentError) Error() string {
	if e.Source == "" {
		return fmt.Sprintf("document %d: %v", e.Index, e.Err)
	}
	return fmt.Sprintf("document %d (%s): %v", e.Index, e.Source, e.Err)
}

func (e *DocumentError) Unwrap() error { return e.Err }

// Objects decodes every object of a rendered manifest, in document order, which is the
// order Helm applies a release manifest in (Helm stores it already sorted into install
// order; sorting it again through releaseutil.SortManifests would not keep that order,
// as it orders documents by the names "manifest-0", "manifest-1", "manifest-10", ... as
// strings). Documents with no object (blank, comments only, null) are skipped, and a List
// kind (any object with an items array) gives its items, each an object of its own.
//
// A document that does not decode is skipped too and reported: the error joins one
// *DocumentError per such document, and the objects of all the other documents are
// still returned. Callers that only look for something (redaction, an owner label) use
// them; callers that act on the manifest as a whole use All.
func Objects(text string) ([]*unstructured.Unstructured, error) {
	docs, splitErr := Documents(text)
	var errs []error
	var out []*unstructured.Unstructured
	for _, d := range docs {
		objs, err := decode([]byte(d.Text))
		if err != nil {
			errs = append(errs, &DocumentError{Index: d.Index, Source: d.Source, Err: err})
			continue
		}
		out = append(out, objs...)
	}
	// The reader stops at a line it cannot read: that error comes last.
	return out, errors.Join(append(errs, splitErr)...)
}

// Document is one document of a manifest, as written.
type Document struct {
	// Index is the document's place in the manifest, from 1 (see DocumentError).
	Index int
	// Source is the file its "# Source:" line names ("" when it has none).
	Source string
	// Text is the document, comments included.
	Text string
}

// Documents splits a manifest into its documents, in order, for callers that read them
// their own way (crdversions decodes the CustomResourceDefinitions among them strictly).
// Blank documents are left out (their place still counts in Index). A line the YAML reader cannot read (a "---" followed by
// more than a comment) ends the split: the documents before it are returned with a
// *DocumentError.
func Documents(text string) ([]Document, error) {
	r := NewYAMLReader(strings.NewReader(text), 0)
	var out []Document
	for index := 1; ; index++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, &DocumentError{Index: index, Err: err}
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		out = append(out, Document{Index: index, Source: Source(string(doc)), Text: string(doc)})
	}
}

// NewYAMLReader is apimachinery's YAML document reader over r, buffered with size bytes
// (bufio's default when 0), with a newline read after r's last line when it has none. Up
// to apimachinery v0.37, a stream whose last line has no newline and fills the reader's
// buffer exactly (4096 bytes, or any multiple) loses that line, or its whole last
// document, with no error (kubernetes/kubernetes#142527, fixed in v0.38). With the
// newline the reader never reaches EOF inside a line.
func NewYAMLReader(r io.Reader, size int) *utilyaml.YAMLReader {
	r = &terminated{r: r}
	if size == 0 {
		return utilyaml.NewYAMLReader(bufio.NewReader(r))
	}
	return utilyaml.NewYAMLReader(bufio.NewReaderSize(r, size))
}

// terminated reads r, then a newline if r's last byte was not one.
type terminated struct {
	r    io.Reader
	last byte // 0 until a byte is read
	eof  bool
}

func (t *terminated) Read(p []byte) (int, error) {
	if t.eof {
		if t.last != 0 && t.last != '\n' && len(p) > 0 {
			p[0], t.last = '\n', '\n'
			return 1, nil
		}
		return 0, io.EOF
	}
	n, err := t.r.Read(p)
	if n > 0 {
		t.last = p[n-1]
	}
	if errors.Is(err, io.EOF) {
		t.eof = true
		if n == 0 {
			return t.Read(p)
		}
		err = nil
	}
	return n, err
}

// All decodes every object of a rendered manifest as Objects does, for callers that act
// on the manifest as a whole: a document that does not decode is an error (naming the
// document) and no objects are returned.
func All(text string) ([]*unstructured.Unstructured, error) {
	objs, err := Objects(text)
	if err != nil {
		return nil, fmt.Errorf("read the manifest: %w", err)
	}
	return objs, nil
}

// decode reads one document: no object, one, or the items of a List.
func decode(doc []byte) ([]*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
		return nil, err
	}
	if len(obj.Object) == 0 {
		return nil, nil
	}
	if !obj.IsList() {
		return []*unstructured.Unstructured{obj}, nil
	}
	list, err := obj.ToList()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", obj.GetKind(), err)
	}
	out := make([]*unstructured.Unstructured, 0, len(list.Items))
	for i := range list.Items {
		item := &list.Items[i]
		// As apimachinery's decoder of lists: a typed list (a ConfigMapList) may leave
		// its items' apiVersion and kind to the list.
		if item.GetKind() == "" && item.GetAPIVersion() == "" {
			item.SetKind(strings.TrimSuffix(obj.GetKind(), "List"))
			item.SetAPIVersion(obj.GetAPIVersion())
		}
		out = append(out, item)
	}
	return out, nil
}

// Source is the file a document's "# Source:" line names: Helm writes one at the top of
// every document it renders (chart/templates/x.yaml, or a subchart's
// chart/charts/sub/templates/x.yaml). It is "" when the document has none.
func Source(doc string) string {
	for _, line := range strings.SplitN(doc, "\n", 3) {
		if f, ok := strings.CutPrefix(strings.TrimSpace(line), "# Source: "); ok {
			return f
		}
	}
	return ""
}

// Subject names an object as every report does: Kind/namespace/name, or Kind/name when
// it has no namespace (a cluster-scoped object, or a namespaced one the manifest leaves
// to the release namespace and the caller has not set yet).
func Subject(obj *unstructured.Unstructured) string {
	return SubjectOf(obj.GetKind(), obj.GetNamespace(), obj.GetName())
}

// SubjectOf is Subject for an object known by its kind, namespace and name.
func SubjectOf(kind, namespace, name string) string {
	if namespace == "" {
		return kind + "/" + name
	}
	return kind + "/" + namespace + "/" + name
}

// Subjects lists the Subject of every object of a manifest that decodes, in document
// order.
func Subjects(text string) []string {
	objs, _ := Objects(text)
	out := make([]string, 0, len(objs))
	for _, obj := range objs {
		out = append(out, Subject(obj))
	}
	return out
}
