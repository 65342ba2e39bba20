package migrate_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// TestManagedFieldsCleaned: an object last applied at v1beta2 keeps a managedFields entry
// naming v1beta2. Once the CRD stops serving v1beta2, migrate drops that entry (it would
// break later server-side applies, kubernetes/kubernetes#111937) and keeps the others.
func TestManagedFieldsCleaned(t *testing.T) {
	e := fluxState(t, []string{"a"}, 0)
	old := hrV1
	old.Version = "v1beta2"
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "source.toolkit.fluxcd.io/v1beta2", "kind": "HelmRepository",
		"metadata": map[string]any{"name": "applied", "namespace": "a"},
		"spec":     map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}}
	if _, err := e.dyn.Resource(old).Namespace("a").Apply(e.ctx, "applied", obj, metav1.ApplyOptions{FieldManager: "old-applier"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.dyn.Resource(hrV1).Namespace("a").Patch(e.ctx, "applied", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"a"}}}`),
		metav1.PatchOptions{FieldManager: "labeller"}); err != nil {
		t.Fatal(err)
	}
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Name == "v1beta2" {
			crd.Spec.Versions[i].Served = false
		}
	}
	if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Update(e.ctx, crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil || res.Status != migrate.Migrated || res.ManagedFieldsCleaned != 1 {
		t.Fatalf("%v %+v", err, res)
	}
	got, err := e.dyn.Resource(hrV1).Namespace("a").Get(e.ctx, "applied", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var managers []string
	for _, m := range got.GetManagedFields() {
		managers = append(managers, m.Manager+"@"+m.APIVersion)
		if m.APIVersion == "source.toolkit.fluxcd.io/v1beta2" {
			t.Errorf("entry %s still names the unserved v1beta2", m.Manager)
		}
	}
	if len(managers) != 1 || managers[0] != "labeller@source.toolkit.fluxcd.io/v1" {
		t.Errorf("managedFields %v, want only labeller@v1", managers)
	}

	// A second run finds nothing to clean.
	if err := testenv.SetStoredVersions(e.ctx, e.crds, helmrepos, "v1beta2", "v1"); err != nil {
		t.Fatal(err)
	}
	res, err = newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil || res.ManagedFieldsCleaned != 0 || res.Rewritten != 0 {
		t.Errorf("second pass: %v %+v", err, res)
	}
}
