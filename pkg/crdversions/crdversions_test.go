package crdversions

import (
	"strings"
	"testing"
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
