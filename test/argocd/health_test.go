//go:build argocd

package argocd_test

import (
	"context"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
)

// healthGroup is the group of the CRD the health test migrates.
const healthGroup = "health.upgradeguard.test"

var (
	crdGVR = apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	svmGVR = schema.GroupVersionResource{Group: "storagemigration.k8s.io", Version: "v1", Resource: "storageversionmigrations"}
)

// The argocd-cm keys of the health checks deploy/argocd ships for a CRD and a
// StorageVersionMigration.
const (
	crdHealthKey = "resource.customizations.health.apiextensions.k8s.io_CustomResourceDefinition"
	svmHealthKey = "resource.customizations.health.storagemigration.k8s.io_StorageVersionMigration"
)

// TestArgoCDJudgesCRDAndStorageVersionMigration: an Application syncs a CRD whose objects
// are stored at an older version and a StorageVersionMigration of its resource, with
// deploy/argocd/argocd-cm.yaml loaded, and kube-controller-manager's built-in migrator
// running. The real Argo CD evaluates upgradeguard's health checks for both kinds, and
// gives what the harness (argocd.RunHealth, with which deploy/argocd's tests judge the
// scripts) gives for the same objects:
//   - Degraded for both while admission refuses the migrator's patches: the
//     StorageVersionMigration fails and the migrator marks the CRD StorageMigrating
//     False, MigrationFailed (Argo CD's own CRD check says Healthy there, and it has none
//     for StorageVersionMigrations);
//   - Healthy for both once the refusal is gone and the next commit's
//     StorageVersionMigration (a new name: one runs once) has succeeded.
func TestArgoCDJudgesCRDAndStorageVersionMigration(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	cp := testenv.ForTest(t, testenv.Options{ControllerManager: true,
		// Kubernetes' built-in migrator, and the garbage collector whose informers it reads.
		Controllers: []string{"garbage-collector-controller", "storage-version-migrator-controller"}})
	if cp.Minor < 37 {
		t.Fatalf("Kubernetes 1.%d: the built-in migrator is GA (storagemigration.k8s.io/v1, on by default) from 1.37; run this test there", cp.Minor)
	}
	crd := staleHealthCRD(t, cp, 10)
	unfreeze := testenv.FreezeUpdates(t, cp.Config, "freeze-widgets", schema.GroupVersionResource{Group: healthGroup, Version: "v1", Resource: "widgets"}, "widgets", "obj-0")
	settings := shippedSettings(t)
	for _, k := range []string{crdHealthKey, svmHealthKey} {
		if settings[k] == "" {
			t.Fatalf("deploy/argocd/argocd-cm.yaml has no %s", k)
		}
	}
	// The CRD carries no tracking annotation, so its migrator's condition brings no
	// comparison: the resync does (crdResync).
	argo := argocd.Start(t, cp, argocd.Options{Settings: settings, PersistResourceHealth: true, Resync: crdResync})

	crdYAML, err := yaml.Marshal(map[string]any{"apiVersion": crd.APIVersion, "kind": crd.Kind,
		"metadata": map[string]any{"name": crd.Name}, "spec": crd.Spec})
	if err != nil {
		t.Fatal(err)
	}
	svmYAML := func(name string) string {
		return `apiVersion: storagemigration.k8s.io/v1
kind: StorageVersionMigration
metadata:
  name: ` + name + `
spec:
  resource:
    group: ` + healthGroup + `
    resource: widgets
`
	}
	const app, failing, succeeding = "health", "widgets-refused", "widgets-again"
	repo := servers.NewGitRepo(t)
	first := repo.Commit("a CRD and the migration of its objects", map[string]string{
		"health/crd.yaml": string(crdYAML), "health/svm.yaml": svmYAML(failing),
	}).String()
	if err := argo.Create(ctx, argocd.AutomatedApplication(app, argocd.GitSource(repo.Dir, "health", first), "health",
		argocd.SyncRetry{Limit: 2, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second})); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, argo, app, first)

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	waitObject(t, dyn, svmGVR, failing, "Failed", func(o map[string]any) bool { return conditionTrue(o, "Failed") })
	waitObject(t, dyn, crdGVR, crd.Name, "StorageMigrating False, MigrationFailed", func(o map[string]any) bool {
		c := conditionOf(o, "StorageMigrating")
		return c != nil && c["status"] == "False" && c["reason"] == "MigrationFailed"
	})
	for _, r := range []struct {
		gvr        schema.GroupVersionResource
		kind, name string
		key        string
	}{{crdGVR, "CustomResourceDefinition", crd.Name, crdHealthKey}, {svmGVR, "StorageVersionMigration", failing, svmHealthKey}} {
		if h := argoJudges(t, argo, dyn, app, r.gvr, r.kind, r.name, settings[r.key]); h.Status != "Degraded" {
			t.Errorf("Argo CD's health of %s %s after the failed migration: %+v, want Degraded", r.kind, r.name, h)
		}
	}

	unfreeze()
	second := repo.Commit("migrate again: a StorageVersionMigration runs once", map[string]string{
		"health/crd.yaml": string(crdYAML), "health/svm.yaml": svmYAML(succeeding),
	}).String()
	if err := argo.SetTargetRevision(ctx, app, second); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, argo, app, second)
	waitObject(t, dyn, svmGVR, succeeding, "Succeeded", func(o map[string]any) bool {
		return conditionTrue(o, "Succeeded") && !conditionTrue(o, "Running")
	})
	waitObject(t, dyn, crdGVR, crd.Name, "StorageMigrating False, MigrationSucceeded", func(o map[string]any) bool {
		c := conditionOf(o, "StorageMigrating")
		return c != nil && c["status"] == "False" && c["reason"] == "MigrationSucceeded"
	})
	for _, r := range []struct {
		gvr        schema.GroupVersionResource
		kind, name string
		key        string
	}{{crdGVR, "CustomResourceDefinition", crd.Name, crdHealthKey}, {svmGVR, "StorageVersionMigration", succeeding, svmHealthKey}} {
		if h := argoJudges(t, argo, dyn, app, r.gvr, r.kind, r.name, settings[r.key]); h.Status != "Healthy" {
			t.Errorf("Argo CD's health of %s %s after the second migration: %+v, want Healthy", r.kind, r.name, h)
		}
	}
}

// staleHealthCRD creates a CRD with n objects stored at v1alpha1 in namespace widgets,
// then makes v1 its storage version, and returns it as it is written in git (the live
// spec: Argo CD's apply changes nothing of it).
func staleHealthCRD(t *testing.T, cp *testenv.ControlPlane, n int) *apiextv1.CustomResourceDefinition {
	t.Helper()
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD(healthGroup, "widgets", "Widget")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: healthGroup, Version: "v1alpha1", Resource: "widgets"},
		Kind: "Widget", Namespaces: []string{"widgets"}, PerNS: n, Spec: map[string]any{"size": int64(3)}}); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	return &apiextv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: apiextv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: crd.Name},
		Spec:       crd.Spec,
	}
}

// waitObject waits until the API server's gvr object name is what done says (what: for
// the error).
func waitObject(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, name, what string, done func(map[string]any) bool) {
	t.Helper()
	var last map[string]any
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		obj, err := dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = obj.Object
		return done(last), nil
	})
	if err != nil {
		t.Fatalf("%s %s never %s: %v; status %v", gvr.Resource, name, what, err, last["status"])
	}
}

func conditionOf(obj map[string]any, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

func conditionTrue(obj map[string]any, typ string) bool {
	c := conditionOf(obj, typ)
	return c != nil && c["status"] == "True"
}

// argoJudges waits until the real Argo CD's health of the Application's kind/name is what
// argocd.RunHealth gives for script on the object as the API server holds it, and returns
// it (or fails the test and returns Argo CD's last). The object does not change meanwhile
// (its migration is over).
func argoJudges(t *testing.T, argo *argocd.ArgoCD, dyn dynamic.Interface, app string, gvr schema.GroupVersionResource, kind, name, script string) argocd.Health {
	t.Helper()
	obj, err := dyn.Resource(gvr).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := argocd.RunHealth(t.Context(), script, obj.Object)
	if err != nil {
		t.Fatalf("the harness on %s %s: %v", kind, name, err)
	}
	var got argocd.Health
	_, err = argo.WaitApplication(t.Context(), app, 2*time.Minute, func(a *argocd.Application) bool {
		for _, r := range a.Status.Resources {
			if r.Kind == kind && r.Name == name && r.Health != nil {
				got = *r.Health
			}
		}
		return got == want
	})
	if err != nil {
		t.Errorf("Argo CD's health of %s %s is %+v; the harness gives %+v for the same object", kind, name, got, want)
		return got
	}
	t.Logf("Argo CD and the harness agree on %s %s: %+v", kind, name, got)
	return got
}
