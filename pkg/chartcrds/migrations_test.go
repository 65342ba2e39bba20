package chartcrds

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMigrationsFromManifest(t *testing.T) {
	manifest := `---
# Source: c/templates/configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: notes
data:
  kind: StorageVersionMigration
---
# Source: c/templates/svm.yaml
apiVersion: storagemigration.k8s.io/v1beta1
kind: StorageVersionMigration
metadata:
  name: widgets-2.0.0
spec:
  resource:
    group: example.com
    resource: widgets
---
# Source: c/templates/old-migrator.yaml
apiVersion: migration.k8s.io/v1alpha1
kind: StorageVersionMigration
metadata:
  name: out-of-tree
spec:
  resource:
    group: example.com
    resource: widgets
    version: v1
---
# Source: c/templates/svm-core.yaml
apiVersion: storagemigration.k8s.io/v1
kind: StorageVersionMigration
metadata:
  generateName: secrets-
spec:
  resource:
    resource: secrets
`
	got, err := MigrationsFromManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	want := []Migration{
		{Name: "widgets-2.0.0", APIVersion: "storagemigration.k8s.io/v1beta1", Group: "example.com", Resource: "widgets", File: "c/templates/svm.yaml"},
		{APIVersion: "storagemigration.k8s.io/v1", Resource: "secrets", File: "c/templates/svm-core.yaml"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("migrations (-want +got):\n%s", diff)
	}

	if got, err := MigrationsFromManifest(""); err != nil || got != nil {
		t.Errorf("empty manifest: %v, %v; want none", got, err)
	}
	_, err = MigrationsFromManifest("# Source: c/templates/bad.yaml\napiVersion: storagemigration.k8s.io/v1\nkind: StorageVersionMigration\nmetadata:\n  name: x\n")
	if err == nil || !strings.Contains(err.Error(), "c/templates/bad.yaml") || !strings.Contains(err.Error(), "spec.resource.resource") {
		t.Errorf("no spec.resource: %v, want an error naming the file and the field", err)
	}
}

// TestDocumentsOfKind: the documents naming a kind come in document order (with more
// than ten, as Helm renders them), named by their "# Source:" file or, without one, by
// their place; a line the YAML reader cannot read is an error, not a silent split.
func TestDocumentsOfKind(t *testing.T) {
	var b strings.Builder
	var want []document
	for i := range 12 {
		doc := fmt.Sprintf("# Source: c/templates/svm-%02d.yaml\nkind: StorageVersionMigration\n", 11-i)
		b.WriteString("---\n" + doc)
		want = append(want, document{file: fmt.Sprintf("c/templates/svm-%02d.yaml", 11-i), content: doc})
	}
	b.WriteString("---\nkind: ConfigMap\n---\nkind: StorageVersionMigration\n")
	want[0].content = "---\n" + want[0].content // the reader keeps a leading separator
	want = append(want, document{file: "document 14", content: "kind: StorageVersionMigration\n"})
	got, err := documents(b.String(), "StorageVersionMigration")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(document{})); diff != "" {
		t.Errorf("documents (-want +got):\n%s", diff)
	}
	if _, err := documents("kind: StorageVersionMigration\n---x\nkind: StorageVersionMigration\n", "StorageVersionMigration"); err == nil {
		t.Error("a separator the reader refuses gave no error")
	}
}
