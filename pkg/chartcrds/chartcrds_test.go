package chartcrds_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func crd(group, kind, storage string) string {
	plural := strings.ToLower(kind) + "s"
	return "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: " + plural + "." + group +
		"\nspec:\n  group: " + group + "\n  scope: Namespaced\n  names: {plural: " + plural + ", singular: " + strings.ToLower(kind) +
		", kind: " + kind + "}\n  versions:\n  - {name: " + storage + ", served: true, storage: true}\n"
}

type row struct {
	Name, File, Storage string
	Source              predict.Source
}

func rows(r *chartcrds.Rendered) []row {
	var out []row
	for _, c := range r.CRDs {
		out = append(out, row{Name: c.CRD.Name, File: c.File, Source: c.Source, Storage: c.CRD.Spec.Versions[0].Name})
	}
	return out
}

// TestRenderedSources: the chart source of each CRD is read from the Source lines helm
// template writes (a crds/ file's later documents have none of their own), and a CRD
// without one is named by file and document.
func TestRenderedSources(t *testing.T) {
	// What `helm template app ./app --include-crds` prints for a chart with a crds/ file
	// of two CRDs, a subchart crds/ file, and a template CRD.
	rendered := "---\n# Source: app/crds/both.yaml\n" + crd("a.example.com", "Alpha", "v1") + "---\n" + crd("a.example.com", "Beta", "v1") +
		// A crds/ file that starts with "---": its Source line is a document of its own.
		"\n---\n# Source: app/charts/sub/crds/sub.yaml\n---\n" + crd("s.example.com", "Sub", "v1") +
		"---\n# Source: app/templates/crds/gamma.yaml\n" + crd("a.example.com", "Gamma", "v1") +
		"---\n# Source: app/templates/widgets.yaml\napiVersion: a.example.com/v1\nkind: Alpha\nmetadata: {name: x}\n" +
		"---\n# Source: app/templates/widgets.yaml\napiVersion: a.example.com/v2\nkind: Alpha\nmetadata: {name: y}\n" +
		"---\n# Source: app/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
	r, err := chartcrds.ReadRendered(chartcrds.Stdin, strings.NewReader(rendered))
	if err != nil {
		t.Fatal(err)
	}
	want := []row{
		{Name: "alphas.a.example.com", File: "app/crds/both.yaml", Source: predict.CRDsDir, Storage: "v1"},
		{Name: "betas.a.example.com", File: "app/crds/both.yaml", Source: predict.CRDsDir, Storage: "v1"},
		{Name: "subs.s.example.com", File: "app/charts/sub/crds/sub.yaml", Source: predict.CRDsDir, Storage: "v1"},
		{Name: "gammas.a.example.com", File: "app/templates/crds/gamma.yaml", Source: predict.Templates, Storage: "v1"},
	}
	if diff := cmp.Diff(want, rows(r)); diff != "" {
		t.Errorf("CRDs (-want +got):\n%s", diff)
	}
	wantObjects := map[schema.GroupKind]int{{Group: "a.example.com", Kind: "Alpha"}: 2, {Kind: "ConfigMap"}: 1}
	if diff := cmp.Diff(wantObjects, r.Objects); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
	if r.Documents != 7 || len(r.Files) != 1 || r.Files[0] != chartcrds.Stdin {
		t.Errorf("documents %d, files %v; want 7 from stdin", r.Documents, r.Files)
	}
	if n := r.ObjectsOf(r.CRDs[0].CRD); n != 2 {
		t.Errorf("ObjectsOf(alphas) = %d, want 2 (any version)", n)
	}
}

// TestRenderedDirectory: a directory is read for its YAML and JSON files in lexical
// order, a CRD that appears twice is its later copy, and other files are left alone.
func TestRenderedDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.yml", crd("a.example.com", "Alpha", "v2"))
	write("a.yaml", crd("a.example.com", "Alpha", "v1")+"---\n"+crd("a.example.com", "Beta", "v1"))
	write("c.json", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"a.example.com/v2","kind":"Alpha","metadata":{"name":"x"}}]}`)
	write("README.md", "not a manifest: [")
	write("sub/d.yaml", crd("d.example.com", "Delta", "v1")) // not read: kubectl -f DIR is not recursive either
	r, err := chartcrds.ReadRendered(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []row{
		{Name: "betas.a.example.com", File: filepath.Join(dir, "a.yaml") + " (document 2)", Source: predict.Templates, Storage: "v1"},
		{Name: "alphas.a.example.com", File: filepath.Join(dir, "b.yml") + " (document 1)", Source: predict.Templates, Storage: "v2"},
	}
	if diff := cmp.Diff(want, rows(r)); diff != "" {
		t.Errorf("CRDs (-want +got):\n%s", diff)
	}
	wantFiles := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yml"), filepath.Join(dir, "c.json")}
	if diff := cmp.Diff(wantFiles, r.Files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if r.Objects[schema.GroupKind{Group: "a.example.com", Kind: "Alpha"}] != 1 {
		t.Errorf("objects %v, want the List's one Alpha", r.Objects)
	}
}

func TestRenderedErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\n---\nkind: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, stdin, want string
	}{
		{"a directory without manifests", dir, "", dir + " holds no *.yaml, *.yml or *.json file"},
		{"a missing file", filepath.Join(dir, "nope.yaml"), "", "no such file"},
		{"a bad document in a file", bad, "", bad + " (document 2): not valid YAML"},
		{"nothing on stdin", chartcrds.Stdin, "", "standard input holds no Kubernetes object"},
		{"comments only", chartcrds.Stdin, "---\n# Source: app/templates/off.yaml\n", "set -o pipefail"},
		{"a bad document on stdin", chartcrds.Stdin, "---\napiVersion: v1\nkind: ConfigMap\n---\n{\"kind\": ", "standard input (document 2): not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := chartcrds.ReadRendered(tc.path, strings.NewReader(tc.stdin))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestRenderedMigrations: the StorageVersionMigrations of rendered manifests are read as
// a chart's are, named by their Source line, else by file and document.
func TestRenderedMigrations(t *testing.T) {
	svm := func(name string) string {
		return "apiVersion: storagemigration.k8s.io/v1\nkind: StorageVersionMigration\nmetadata: {name: " + name +
			"}\nspec:\n  resource: {group: a.example.com, resource: alphas}\n"
	}
	rendered := "---\n# Source: app/templates/svm.yaml\n" + svm("alphas-2.0.0") + "---\n" + crd("a.example.com", "Alpha", "v1") +
		"---\n" + svm("alphas-by-hand")
	r, err := chartcrds.ReadRendered(chartcrds.Stdin, strings.NewReader(rendered))
	if err != nil {
		t.Fatal(err)
	}
	want := []chartcrds.Migration{
		{Name: "alphas-2.0.0", APIVersion: "storagemigration.k8s.io/v1", File: "app/templates/svm.yaml", Group: "a.example.com", Resource: "alphas"},
		{Name: "alphas-by-hand", APIVersion: "storagemigration.k8s.io/v1", File: "app/templates/svm.yaml", Group: "a.example.com", Resource: "alphas"},
	}
	if diff := cmp.Diff(want, r.Migrations); diff != "" {
		t.Errorf("migrations (-want +got):\n%s", diff)
	}
}
