package manifest_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

func cm(ns, name string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: %s\n", name, ns)
}

// broken is a document that is not YAML, under its Helm "# Source:" line.
const broken = "# Source: app/templates/broken.yaml\nkind: [unclosed\n"

func TestObjects(t *testing.T) {
	for _, tc := range []struct {
		name     string
		manifest string
		want     []string
		// wantErr are the documents that do not decode, as DocumentError index and source.
		wantErr []string
	}{
		{name: "empty manifest", manifest: "", want: []string{}},
		{name: "multi-document", manifest: "---\n" + cm("a", "one") + "---\n" + cm("b", "two"),
			want: []string{"ConfigMap/a/one", "ConfigMap/b/two"}},
		{name: "empty and comment-only documents are skipped", manifest: "---\n---\n# Source: app/templates/empty.yaml\n---\n" +
			cm("a", "one") + "---\n\n---\nnull\n---\n# only a comment\n---\n" + cm("a", "two") + "---\n",
			want: []string{"ConfigMap/a/one", "ConfigMap/a/two"}},
		{name: "cluster-scoped", manifest: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n",
			want: []string{"Namespace/apps"}},
		{name: "JSON document", manifest: `{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a"}}` + "\n---\n" + cm("a", "one"),
			want: []string{"Secret/a/s", "ConfigMap/a/one"}},
		{name: "List items are objects of their own", manifest: "apiVersion: v1\nkind: List\nitems:\n" +
			"- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: one\n    namespace: a\n" +
			"- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: two\n    namespace: a\n---\n" + cm("a", "three"),
			want: []string{"ConfigMap/a/one", "ConfigMap/a/two", "ConfigMap/a/three"}},
		{name: "typed List items take the list's kind", manifest: "apiVersion: v1\nkind: ConfigMapList\nitems:\n- metadata:\n    name: one\n    namespace: a\n",
			want: []string{"ConfigMap/a/one"}},
		{name: "broken document in the middle", manifest: "---\n" + cm("a", "one") + "---\n" + broken + "---\n" + cm("a", "two"),
			want: []string{"ConfigMap/a/one", "ConfigMap/a/two"}, wantErr: []string{"2 app/templates/broken.yaml"}},
		{name: "a scalar is no object", manifest: cm("a", "one") + "---\njust text\n---\n" + broken,
			want: []string{"ConfigMap/a/one"}, wantErr: []string{"2 ", "3 app/templates/broken.yaml"}},
		{name: "bad separator stops the reader", manifest: cm("a", "one") + "---\n" + cm("a", "two") + "---x\n" + cm("a", "three"),
			want: []string{"ConfigMap/a/one"}, wantErr: []string{"2 "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := manifest.Objects(tc.manifest)
			if diff := cmp.Diff(tc.want, subjects(objs)); diff != "" {
				t.Errorf("objects (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantErr, documentErrors(t, err)); diff != "" {
				t.Errorf("broken documents (-want +got):\n%s", diff)
			}
		})
	}
}

func subjects(objs []*unstructured.Unstructured) []string {
	out := []string{}
	for _, o := range objs {
		out = append(out, manifest.Subject(o))
	}
	return out
}

// documentErrors lists the "index source" of each *DocumentError joined in err, and
// checks that the message names them.
func documentErrors(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var out []string
	for _, e := range errs {
		var de *manifest.DocumentError
		if !errors.As(e, &de) {
			t.Fatalf("%v is not a *DocumentError", e)
		}
		if want := fmt.Sprintf("document %d", de.Index); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), de.Source) {
			t.Errorf("error %q does not name %s (%s)", err, want, de.Source)
		}
		out = append(out, fmt.Sprintf("%d %s", de.Index, de.Source))
	}
	return out
}

// TestAllRefusesABrokenManifest: callers that act on a manifest as a whole get no
// objects when a document is broken, and an error that names it.
func TestAllRefusesABrokenManifest(t *testing.T) {
	objs, err := manifest.All(cm("a", "one") + "---\n" + broken)
	var de *manifest.DocumentError
	if !errors.As(err, &de) || de.Index != 2 || objs != nil {
		t.Fatalf("All = %d objects, %v; want none and document 2's error", len(objs), err)
	}
	if want := "document 2 (app/templates/broken.yaml): "; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	objs, err = manifest.All(cm("a", "one"))
	if err != nil || len(objs) != 1 {
		t.Fatalf("All = %d objects, %v; want one", len(objs), err)
	}
}

// TestObjectsKeepDocumentOrder: Helm applies a stored manifest in document order. With more
// than ten documents of one kind, re-sorting by the split names ("manifest-10" before
// "manifest-2") would reorder them.
func TestObjectsKeepDocumentOrder(t *testing.T) {
	var b strings.Builder
	var want []string
	for i := range 12 {
		fmt.Fprintf(&b, "---\n# Source: app/templates/cm.yaml\n%s", cm("apps", fmt.Sprintf("cm-%02d", 11-i)))
		want = append(want, fmt.Sprintf("ConfigMap/apps/cm-%02d", 11-i))
	}
	b.WriteString("---\n# Source: app/templates/empty.yaml\n")
	if diff := cmp.Diff(want, manifest.Subjects(b.String())); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestSubject(t *testing.T) {
	for _, tc := range []struct {
		kind, namespace, name, want string
	}{
		{"Deployment", "web", "api", "Deployment/web/api"},
		{"ClusterRole", "", "reader", "ClusterRole/reader"},
	} {
		obj := &unstructured.Unstructured{}
		obj.SetKind(tc.kind)
		obj.SetNamespace(tc.namespace)
		obj.SetName(tc.name)
		if got := manifest.Subject(obj); got != tc.want {
			t.Errorf("Subject = %q, want %q", got, tc.want)
		}
		if got := manifest.SubjectOf(tc.kind, tc.namespace, tc.name); got != tc.want {
			t.Errorf("SubjectOf = %q, want %q", got, tc.want)
		}
	}
}

func TestSource(t *testing.T) {
	for doc, want := range map[string]string{
		"# Source: app/charts/db/templates/sts.yaml\nkind: StatefulSet\n":    "app/charts/db/templates/sts.yaml",
		"---\n# Source: app/templates/cm.yaml\n":                             "app/templates/cm.yaml",
		"kind: ConfigMap\n# Source: app/templates/late.yaml\n":               "app/templates/late.yaml",
		"kind: ConfigMap\nmetadata: {}\ndata: {}\n# Source: too/late.yaml\n": "",
	} {
		if got := manifest.Source(doc); got != want {
			t.Errorf("Source(%q) = %q, want %q", doc, got, want)
		}
	}
}

// TestDocuments: documents as written, blank ones left out, each with its place and
// its "# Source:" file; a line the reader cannot read ends the split.
func TestDocuments(t *testing.T) {
	text := "---\n# Source: app/templates/a.yaml\n" + cm("a", "one") + "---\n\n---\n# Source: app/templates/empty.yaml\n---\n" + cm("a", "two") +
		"---x\n" + cm("a", "three")
	docs, err := manifest.Documents(text)
	want := []manifest.Document{
		// The reader keeps the separator at the very start with the first document.
		{Index: 1, Source: "app/templates/a.yaml", Text: "---\n# Source: app/templates/a.yaml\n" + cm("a", "one")},
		{Index: 3, Source: "app/templates/empty.yaml", Text: "# Source: app/templates/empty.yaml\n"},
	}
	if diff := cmp.Diff(want, docs); diff != "" {
		t.Errorf("documents (-want +got):\n%s", diff)
	}
	var de *manifest.DocumentError
	if !errors.As(err, &de) || de.Index != 4 {
		t.Errorf("error %v, want document 4's", err)
	}
}

// TestLastLineAtBufferBoundary: a manifest whose last line has no newline and fills the
// YAML reader's buffer exactly keeps its last document (apimachinery up to v0.37 dropped
// it with no error). The fixture's last line is a 4096-byte data value.
func TestLastLineAtBufferBoundary(t *testing.T) {
	fixture, err := os.ReadFile("testdata/last-line-at-buffer-boundary.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(fixture), "\n")
	if last := lines[len(lines)-1]; len(last) != 4096 {
		t.Fatalf("the fixture's last line is %d bytes, want 4096 and no newline after it", len(last))
	}
	objs, err := manifest.Objects(string(fixture))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("read %d objects, want 2 (first, last)", len(objs))
	}
	if v, _, _ := unstructured.NestedString(objs[1].Object, "data", "last"); len(v) != 4096-len("  last: ") {
		t.Errorf("ConfigMap %s: data.last is %d bytes, want %d", objs[1].GetName(), len(v), 4096-len("  last: "))
	}

	// Every size around the buffer, and beyond it, in one reader.
	for _, n := range []int{4095, 4096, 4097, 8192, 3 * 4096, 65536} {
		last := "b: " + strings.Repeat("x", n-3)
		docs, err := manifest.Documents("a: 1\n---\n" + last)
		if err != nil || len(docs) != 2 {
			t.Errorf("last line of %d bytes: %d documents, error %v; want 2", n, len(docs), err)
			continue
		}
		if got := strings.TrimRight(docs[1].Text, "\n"); got != last {
			t.Errorf("last line of %d bytes: the last document reads %d bytes", n, len(got))
		}
	}
}
