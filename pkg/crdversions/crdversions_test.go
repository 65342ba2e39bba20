package crdversions

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const good = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - {name: v1alpha1, served: false, storage: false}
  - {name: v1, served: true, storage: true}
`

func TestFromManifest(t *testing.T) {
	cases := []struct {
		name, doc string
		crds      int
		errHas    string
	}{
		{"one CRD among other kinds", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n" + good + "---\n", 1, ""},
		{"empty documents", "---\n---\n", 0, ""},
		{"unknown field", strings.Replace(good, "scope:", "scopez:", 1), 0, `unknown field "scopez"`},
		{"old apiVersion", strings.Replace(good, "apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1", 1), 0, "only apiextensions.k8s.io/v1"},
		{"two storage versions", strings.Replace(good, "served: false, storage: false", "served: true, storage: true", 1), 0, "exactly one version must be storage, found 2"},
		{"name mismatch", strings.Replace(good, "name: widgets.example.com", "name: gadgets.example.com", 1), 0, "must be \"widgets.example.com\""},
		{"not YAML", "kind: [", 0, "document 1"},
		{"duplicate key in a CRD", strings.Replace(good, "  scope: Namespaced\n", "  scope: Namespaced\n  scope: Cluster\n", 1), 0, `key "scope" already set`},
		{"duplicate key in another kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n---\n" + good, 1, ""},
		{"a list, not an object", "- a\n- b\n", 0, "document 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			crds, err := FromManifest("chart/templates/crd.yaml", []byte(tc.doc))
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), "chart/templates/crd.yaml") {
					t.Fatalf("error %v, want one naming the file and %q", err, tc.errHas)
				}
				return
			}
			if err != nil || len(crds) != tc.crds {
				t.Fatalf("got %d CRDs, err %v; want %d", len(crds), err, tc.crds)
			}
		})
	}
}

func TestVersionHelpers(t *testing.T) {
	crds, err := FromManifest("x", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	c := crds[0]
	if StorageVersion(c) != "v1" || ServedVersion(c) != "v1" || Conversion(c) != "None" {
		t.Errorf("storage %q served %q conversion %q", StorageVersion(c), ServedVersion(c), Conversion(c))
	}
	if !Has(c, "v1alpha1") || Serves(c, "v1alpha1") || Has(c, "v2") {
		t.Error("Has/Serves disagree with spec.versions")
	}
	if got := Versions(c)[0].String(); got != "v1alpha1(served=false)" {
		t.Errorf("String() = %q", got)
	}
}

// TestDroppedStoredVersions: the stored versions an update leaves out of spec.versions,
// in storedVersions order, whether or not the update serves them.
func TestDroppedStoredVersions(t *testing.T) {
	crds, err := FromManifest("x", []byte(good)) // lists v1alpha1 (not served) and v1
	if err != nil {
		t.Fatal(err)
	}
	incoming := crds[0]
	for _, tc := range []struct {
		stored []string
		want   []string
	}{
		{[]string{"v1alpha1", "v1"}, nil},
		{[]string{"v1beta2", "v1", "v1beta1"}, []string{"v1beta2", "v1beta1"}},
		{nil, nil},
	} {
		live := incoming.DeepCopy()
		live.Status.StoredVersions = tc.stored
		if diff := cmp.Diff(tc.want, DroppedStoredVersions(live, incoming)); diff != "" {
			t.Errorf("storedVersions %v: dropped (-want +got):\n%s", tc.stored, diff)
		}
	}
}

func TestDocuments(t *testing.T) {
	goodJSON := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"},` +
		`"spec":{"group":"example.com","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget"},` +
		`"versions":[{"name":"v1","served":true,"storage":true}]}}`
	widget := `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}`
	type doc struct {
		Index   int
		CRDs    []string
		Objects []Head
	}
	widgetHead, cmHead := Head{"example.com/v1", "Widget"}, Head{"v1", "ConfigMap"}
	cases := []struct {
		name, data string
		want       []doc
		errHas     string
	}{
		{name: "YAML documents, comment-only ones kept without objects, blank ones left out",
			data: "# Source: chart/templates/a.yaml\n---\n" + good + "---\n# Source: chart/templates/empty.yaml\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\n\n---\n",
			want: []doc{{Index: 1}, {Index: 2, CRDs: []string{"widgets.example.com"}}, {Index: 3}, {Index: 4, Objects: []Head{widgetHead}}}},
		{name: "one JSON object", data: goodJSON, want: []doc{{Index: 1, CRDs: []string{"widgets.example.com"}}}},
		{name: "JSON after a leading separator and a comment", data: "---\n# Source: x.json\n" + widget + "\n" + cm,
			want: []doc{{Index: 1, Objects: []Head{widgetHead, cmHead}}}},
		{name: "a JSON stream", data: goodJSON + "\n" + widget + "\n" + cm,
			want: []doc{{Index: 1, CRDs: []string{"widgets.example.com"}, Objects: []Head{widgetHead, cmHead}}}},
		{name: "a JSON array", data: "[" + goodJSON + "," + widget + "]",
			want: []doc{{Index: 1, CRDs: []string{"widgets.example.com"}, Objects: []Head{widgetHead}}}},
		{name: "a JSON List (kubectl get -o json)", data: `{"apiVersion":"v1","kind":"List","items":[` + goodJSON + "," + widget + "," + cm + `]}`,
			want: []doc{{Index: 1, CRDs: []string{"widgets.example.com"}, Objects: []Head{widgetHead, cmHead}}}},
		{name: "a YAML List of a typed kind", data: "apiVersion: v1\nkind: ConfigMapList\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n",
			want: []doc{{Index: 1, Objects: []Head{cmHead, cmHead}}}},
		{name: "a List nested in a List", data: `{"kind":"List","items":[{"kind":"List","items":[` + widget + `]}]}`,
			want: []doc{{Index: 1, Objects: []Head{widgetHead}}}},
		{name: "YAML flow style", data: "{apiVersion: v1, kind: List, items: [{apiVersion: example.com/v1, kind: Widget}]}\n",
			want: []doc{{Index: 1, Objects: []Head{widgetHead}}}},
		{name: "a kind that ends in List but has no items is an object", data: "apiVersion: example.com/v1\nkind: AccessList\nspec: {}\n",
			want: []doc{{Index: 1, Objects: []Head{{"example.com/v1", "AccessList"}}}}},
		{name: "bad YAML names the document", data: good + "---\n" + "kind: [\n", errHas: "(document 2): "},
		{name: "a separator the YAML reader refuses names the document", data: good + "---\n" + cm + "\n---x\n" + good,
			errHas: "(document 2): invalid Yaml document separator"},
		{name: "bad JSON names the document", data: "apiVersion: v1\nkind: ConfigMap\n---\n{\"kind\": ", errHas: "(document 2): not valid JSON"},
		{name: "a broken CRD in a List names the item", data: `{"kind":"List","items":[` + widget + "," + strings.Replace(goodJSON, `"scope"`, `"scopez"`, 1) + `]}`,
			errHas: `(document 1): item 1: invalid CustomResourceDefinition: json: unknown field "scopez"`},
		{name: "a broken CRD in a JSON stream names the value", data: widget + "\n" + strings.Replace(goodJSON, `"v1","served"`, `"v1","served":true,"served"`, 1),
			errHas: `(document 1): JSON value 2: invalid CustomResourceDefinition`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := Documents("out.yaml", []byte(tc.data))
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), "out.yaml "+tc.errHas) {
					t.Fatalf("error %v, want one containing %q", err, "out.yaml "+tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []doc
			for _, d := range docs {
				g := doc{Index: d.Index, Objects: d.Objects}
				for _, c := range d.CRDs {
					g.CRDs = append(g.CRDs, c.Name)
				}
				got = append(got, g)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("documents (-want +got):\n%s", diff)
			}
		})
	}
}
