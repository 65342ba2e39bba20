package argocd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// The group of this package's CRDs.
const group = "argocd.upgradeguard.io"

var (
	crdGVR     = apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	smGVR      = v1alpha1.GroupVersion.WithResource("storagemigrations")
	svmV1      = schema.GroupVersionResource{Group: "storagemigration.k8s.io", Version: "v1", Resource: "storageversionmigrations"}
	svmV1beta1 = schema.GroupVersionResource{Group: "storagemigration.k8s.io", Version: "v1beta1", Resource: "storageversionmigrations"}
)

type env struct {
	ctx  context.Context
	crds apiextclient.Interface
	dyn  dynamic.Interface
}

func setup(t *testing.T) env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	return env{ctx: t.Context(), crds: apiextclient.NewForConfigOrDie(cp.Config), dyn: dynamic.NewForConfigOrDie(cp.Config)}
}

// switchedCRD creates plural.group with n objects stored at v1alpha1, then makes v1 the
// storage version (both served), as a chart release does: storedVersions [v1alpha1 v1].
func switchedCRD(t *testing.T, e env, plural, kind string, n int) *apiextv1.CustomResourceDefinition {
	t.Helper()
	return switchCRD(t, e, testenv.TwoVersionCRD(group, plural, kind), n)
}

// narrowedCRD is switchedCRD with a v1 schema that does not declare the objects'
// spec.size: migrating them to v1 would drop it.
func narrowedCRD(t *testing.T, e env, plural, kind string, n int) *apiextv1.CustomResourceDefinition {
	t.Helper()
	crd := testenv.TwoVersionCRD(group, plural, kind)
	crd.Spec.Versions[1].Schema = &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object",
		Properties: map[string]apiextv1.JSONSchemaProps{"spec": {Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{"color": {Type: "string"}}}}}}
	return switchCRD(t, e, crd, n)
}

func switchCRD(t *testing.T, e env, crd *apiextv1.CustomResourceDefinition, n int) *apiextv1.CustomResourceDefinition {
	t.Helper()
	plural, kind := crd.Spec.Names.Plural, crd.Spec.Names.Kind
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(context.WithoutCancel(e.ctx), crd.Name, metav1.DeleteOptions{})
	})
	old := schema.GroupVersionResource{Group: group, Version: "v1alpha1", Resource: plural}
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: old, Kind: kind, Namespaces: []string{"argocd-" + plural}, PerNS: n,
		Spec: map[string]any{"size": int64(3)}}); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	live := getCRD(t, e, crd.Name)
	if got := strings.Join(live.Status.StoredVersions, " "); got != "v1alpha1 v1" {
		t.Fatalf("%s storedVersions [%s], want [v1alpha1 v1]", crd.Name, got)
	}
	return live
}

func getCRD(t *testing.T, e env, name string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd
}

// get reads an object back from the API server, as Argo CD's cluster cache holds it.
func get(t *testing.T, e env, gvr schema.GroupVersionResource, name string) map[string]any {
	t.Helper()
	u, err := e.dyn.Resource(gvr).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u.Object
}

// watcher records every state of one object the API server sends, from a resourceVersion
// on, until the state that done accepts.
type watcher struct {
	states []map[string]any
	err    error
	done   chan struct{}
}

// record watches gvr's object name from resourceVersion rv until done(obj) holds or
// timeout passes.
func record(e env, gvr schema.GroupVersionResource, name, rv string, timeout time.Duration, done func(map[string]any) bool) *watcher {
	w := &watcher{done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	go func() {
		defer close(w.done)
		defer cancel()
		wi, err := e.dyn.Resource(gvr).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: rv})
		if err != nil {
			w.err = err
			return
		}
		defer wi.Stop()
		for {
			select {
			case <-ctx.Done():
				w.err = fmt.Errorf("%s %s: %d states seen, the last not final: %w", gvr.Resource, name, len(w.states), ctx.Err())
				return
			case ev, ok := <-wi.ResultChan():
				if !ok {
					w.err = fmt.Errorf("watch of %s %s ended after %d states", gvr.Resource, name, len(w.states))
					return
				}
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				obj := ev.Object.(*unstructured.Unstructured).Object
				w.states = append(w.states, obj)
				if done(obj) {
					return
				}
			}
		}
	}()
	return w
}

func (w *watcher) wait(t *testing.T) []map[string]any {
	t.Helper()
	<-w.done
	if w.err != nil {
		t.Fatal(w.err)
	}
	return w.states
}

// currentRV is a resourceVersion from which a watch sees every later change of gvr.
func currentRV(t *testing.T, e env, gvr schema.GroupVersionResource) string {
	t.Helper()
	list, err := e.dyn.Resource(gvr).List(e.ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return list.GetResourceVersion()
}

func typed(t *testing.T, obj map[string]any, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, into); err != nil {
		t.Fatal(err)
	}
}

func wantHealth(t *testing.T, what string, got, want health) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got %s: %s\nwant %s: %s", what, got.Status, got.Message, want.Status, want.Message)
	}
}

func condition(obj map[string]any, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

func conditionIs(obj map[string]any, typ, status string) bool {
	c := condition(obj, typ)
	return c != nil && c["status"] == status
}

// TestCRDHealth: the CRD check on CRDs in the states the API server itself puts them in,
// where it keeps Argo CD's own rules.
func TestCRDHealth(t *testing.T) {
	e := setup(t)
	api := e.crds.ApiextensionsV1().CustomResourceDefinitions()

	// Just created: the create answer has no conditions yet.
	crd := testenv.TwoVersionCRD(group, "gizmos", "Gizmo")
	created, err := api.Create(e.ctx, crd, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.WithoutCancel(e.ctx), crd.Name, metav1.DeleteOptions{}) })
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(created)
	if err != nil {
		t.Fatal(err)
	}
	wantHealth(t, "a CRD just created", judge(t, keyCRD, obj),
		health{Status: "Progressing", Message: "no status conditions yet: the API server has not processed the CRD"})

	if err := testenv.WaitEstablished(e.ctx, e.crds, crd.Name); err != nil {
		t.Fatal(err)
	}
	wantHealth(t, "established", judge(t, keyCRD, get(t, e, crdGVR, crd.Name)),
		health{Status: "Healthy", Message: "CRD is healthy; status.storedVersions [v1alpha1]"})

	// A second CRD of the same group and kind: the API server refuses its names.
	clash := testenv.TwoVersionCRD(group, "gizmoclashes", "Gizmo")
	if _, err := api.Create(e.ctx, clash, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.WithoutCancel(e.ctx), clash.Name, metav1.DeleteOptions{}) })
	var refused map[string]any
	if err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		refused = get(t, e, crdGVR, clash.Name)
		return conditionIs(refused, "NamesAccepted", "False"), nil
	}); err != nil {
		t.Fatalf("NamesAccepted of %s never turned False: %v", clash.Name, err)
	}
	wantHealth(t, "names refused", judge(t, keyCRD, refused),
		health{Status: "Degraded", Message: "CRD names have not been accepted: " + condition(refused, "NamesAccepted")["message"].(string)})

	// A storage switch: objects stored at v1alpha1 under storage version v1.
	switched := switchedCRD(t, e, "sprockets", "Sprocket", 3)
	wantHealth(t, "after a storage switch", judge(t, keyCRD, get(t, e, crdGVR, switched.Name)),
		health{Status: "Healthy", Message: "CRD is healthy; objects may still be stored at v1alpha1 (status.storedVersions [v1alpha1 v1], storage version v1): migrate them before a release removes v1alpha1"})

	// kube-controller-manager's answer when the CRD changed while its migration ran: the
	// migration succeeded, storedVersions were not pruned. Written through the status
	// subresource as the migrator writes it (its exact condition), since making the CRD
	// change land between the migrator's start and end is a race a test cannot win every time.
	live := getCRD(t, e, switched.Name)
	live.Status.Conditions = append(live.Status.Conditions, apiextv1.CustomResourceDefinitionCondition{Type: apiextv1.StorageMigrating,
		Status: apiextv1.ConditionFalse, Reason: "MigrationSucceeded", LastTransitionTime: metav1.Now(),
		Message: "The migration has succeeded but the stored versions have not been updated due to a generation mismatch"})
	updated, err := api.UpdateStatus(e.ctx, live, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	switched = updated
	wantHealth(t, "migrated but not pruned", judge(t, keyCRD, get(t, e, crdGVR, switched.Name)),
		health{Status: "Healthy", Message: "CRD is healthy; the last storage migration succeeded; objects may still be stored at v1alpha1 (status.storedVersions [v1alpha1 v1], storage version v1): migrate them before a release removes v1alpha1"})

	// The v1beta1 migrator (Kubernetes' source before 1.37's migration runner) ends a failed
	// migration with StorageMigrating True and reason MigrationFailed. Written through the
	// status subresource as it writes it: no minor built here runs that migrator.
	for i := range switched.Status.Conditions {
		if c := &switched.Status.Conditions[i]; c.Type == apiextv1.StorageMigrating {
			c.Status, c.Reason, c.Message = apiextv1.ConditionTrue, "MigrationFailed", "The migration has failed"
		}
	}
	if switched, err = api.UpdateStatus(e.ctx, switched, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantHealth(t, "failed, as the v1beta1 migrator says it", judge(t, keyCRD, get(t, e, crdGVR, switched.Name)), health{Status: "Degraded", Message: "the last storage migration failed: The migration has failed; status.storedVersions [v1alpha1 v1]" +
		": objects may still be stored at older versions; fix the cause and migrate again (a new StorageVersionMigration," +
		" or upgradeguard migrate --crd " + switched.Name + " --engine builtin), which also clears this condition"})

	// Deleted while it has objects: the API server holds it terminating while it deletes them.
	w := record(e, crdGVR, switched.Name, switched.ResourceVersion, time.Minute, func(obj map[string]any) bool {
		_, deleting, _ := unstructured.NestedString(obj, "metadata", "deletionTimestamp")
		return deleting
	})
	if err := api.Delete(e.ctx, switched.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	states := w.wait(t)
	wantHealth(t, "being deleted", judge(t, keyCRD, states[len(states)-1]), health{Status: "Progressing", Message: "CRD is terminating"})
}

// startController runs upgradeguard's controller manager in process until the test ends
// or stop is called. It saves a running migration's progress after every page.
func startController(t *testing.T) (stop func()) {
	t.Helper()
	mgr, err := controller.NewManager(cp.Config, controller.Options{MetricsAddr: "0", ProbeAddr: "0", SkipNameValidation: true,
		LeaderElectionNamespace: "default", MigrationLeaseDuration: 5 * time.Second, SaveEvery: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func createStorageMigration(t *testing.T, e env, name string, resources ...string) map[string]any {
	t.Helper()
	sm := &v1alpha1.StorageMigration{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "StorageMigration"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.StorageMigrationSpec{Resources: resources, Rate: v1alpha1.RateSettings{PageSize: 10}}}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sm)
	if err != nil {
		t.Fatal(err)
	}
	created, err := e.dyn.Resource(smGVR).Create(e.ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.dyn.Resource(smGVR).Delete(context.WithoutCancel(e.ctx), name, metav1.DeleteOptions{})
	})
	return created.Object
}

func phase(obj map[string]any) string {
	p, _, _ := unstructured.NestedString(obj, "status", "phase")
	return p
}

// TestStorageMigrationHealth: upgradeguard's real controller migrates a CRD's objects;
// every state of the StorageMigration the API server sent is judged, from the one no
// controller has seen to Succeeded, then a real failure and a spec the controller has not
// yet observed.
func TestStorageMigrationHealth(t *testing.T) {
	e := setup(t)
	if err := testenv.ApplyUpgradeguardCRDs(e.ctx, cp.Config); err != nil {
		t.Fatal(err)
	}
	crd := switchedCRD(t, e, "widgets", "Widget", 60)

	created := createStorageMigration(t, e, "argocd-widgets", crd.Name)
	wantHealth(t, "no controller has seen it", judge(t, keyStorageMigration, get(t, e, smGVR, "argocd-widgets")),
		health{Status: "Progressing", Message: "waiting for the upgradeguard controller to start migrating " + crd.Name})

	w := record(e, smGVR, "argocd-widgets", created["metadata"].(map[string]any)["resourceVersion"].(string), 2*time.Minute,
		func(obj map[string]any) bool { p := phase(obj); return p == "Succeeded" || p == "Failed" })
	stop := startController(t)
	states := w.wait(t)

	var pending, progress int
	for i, obj := range states {
		var sm v1alpha1.StorageMigration
		typed(t, obj, &sm)
		got := judge(t, keyStorageMigration, obj)
		what := fmt.Sprintf("state %d (phase %s)", i, sm.Status.Phase)
		switch {
		case sm.Status.Phase == v1alpha1.PhaseSucceeded:
			r := sm.Status.Resources[0]
			wantHealth(t, what, got, health{Status: "Healthy", Message: fmt.Sprintf("migrated %s: 60 objects, 60 rewritten, storedVersions [v1]", r.Name)})
			if i != len(states)-1 {
				t.Errorf("state %d is Succeeded but not the last", i)
			}
		case sm.Status.Phase == v1alpha1.PhaseFailed:
			t.Fatalf("%s: the migration failed: %+v", what, sm.Status)
		case sm.Status.Phase != v1alpha1.PhaseRunning || len(sm.Status.Resources) != 1:
			t.Errorf("%s: unexpected status %+v", what, sm.Status)
		case sm.Status.Resources[0].Phase == v1alpha1.PhasePending:
			pending++
			wantHealth(t, what, got, health{Status: "Progressing", Message: "waiting: " + crd.Name + " (0/1 CRDs done)"})
		case sm.Status.Resources[0].Phase == v1alpha1.PhaseRunning:
			r := sm.Status.Resources[0]
			if r.Objects > 0 {
				progress++
			}
			msg := ""
			if r.Message != "" {
				msg = " (" + r.Message + ")"
			}
			wantHealth(t, what, got, health{Status: "Progressing", Message: fmt.Sprintf("migrating %s: %d objects so far, %d rewritten%s (0/1 CRDs done)", r.Name, r.Objects, r.Rewritten, msg)})
		case sm.Status.Resources[0].Phase == v1alpha1.PhaseSucceeded:
			// The CRD is done; the next write marks the StorageMigration Succeeded.
			wantHealth(t, what, got, health{Status: "Progressing", Message: "migrated " + crd.Name + "; the controller is recording the result (1/1 CRDs done)"})
		default:
			t.Errorf("%s: unexpected resource phase %+v", what, sm.Status.Resources[0])
		}
	}
	t.Logf("%d states of StorageMigration argocd-widgets: %d with the CRD pending, %d with objects under way", len(states), pending, progress)
	if phase(states[len(states)-1]) != "Succeeded" || pending == 0 || progress == 0 {
		t.Errorf("%d states: %d with the CRD pending, %d with objects under way, last %s; want the whole life of a migration",
			len(states), pending, progress, phase(states[len(states)-1]))
	}

	// A real failure: the controller fails a migration of a CRD that does not exist.
	missing := "nothere." + group
	createStorageMigration(t, e, "argocd-missing", missing)
	var failed map[string]any
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		failed = get(t, e, smGVR, "argocd-missing")
		return phase(failed) == "Failed", nil
	}); err != nil {
		t.Fatalf("StorageMigration argocd-missing never failed: %v", err)
	}
	wantHealth(t, "failed", judge(t, keyStorageMigration, failed), health{Status: "Degraded", Message: "migration failed (MigrationFailed): " + missing + ": CRD " + missing + " not found on the target cluster: fix spec.resources"})

	// A real refusal: migrating would drop spec.size, which v1 does not declare.
	narrowed := narrowedCRD(t, e, "thingamajigs", "Thingamajig", 4)
	createStorageMigration(t, e, "argocd-refused", narrowed.Name)
	var refused map[string]any
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		refused = get(t, e, smGVR, "argocd-refused")
		return phase(refused) == "Failed", nil
	}); err != nil {
		t.Fatalf("StorageMigration argocd-refused never failed: %v", err)
	}
	if c := condition(refused, "Failed"); c["reason"] != "FieldLossRefused" {
		t.Fatalf("argocd-refused failed with %v, want reason FieldLossRefused", c)
	}
	t.Logf("what Argo CD shows for a refused migration: %s", judge(t, keyStorageMigration, refused).Message)
	wantHealth(t, "refused for field loss", judge(t, keyStorageMigration, refused), health{Status: "Degraded", Message: "migration failed (FieldLossRefused): " + message(refused, "Failed")})

	// The spec fixed while the controller is down: the status is of the last generation.
	stop()
	patch := fmt.Sprintf(`{"spec":{"resources":[%q]}}`, crd.Name)
	if _, err := e.dyn.Resource(smGVR).Patch(e.ctx, "argocd-missing", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	wantHealth(t, "a spec not yet observed", judge(t, keyStorageMigration, get(t, e, smGVR, "argocd-missing")), health{Status: "Progressing", Message: "the spec changed: waiting for the upgradeguard controller to start migrating " + crd.Name + " over"})
}

// migratorGA says whether this minor serves storagemigration.k8s.io/v1 with the 1.37
// migrator these tests follow (it marks the CRD and prunes storedVersions). Before 1.37 it
// asserts what the minor serves instead: never v1 (1.35 and 1.36 serve v1beta1, whose beta
// migrator is not followed here; earlier minors serve neither).
func migratorGA(t *testing.T) bool {
	t.Helper()
	if cp.Minor >= 37 {
		return true
	}
	gvr, err := svm.Resource(discovery.NewDiscoveryClientForConfigOrDie(cp.Config))
	if err != nil {
		t.Fatal(err)
	}
	if gvr.Version == "v1" {
		t.Fatalf("1.%d serves %s: follow its migrator here", cp.Minor, gvr)
	}
	t.Logf("1.%d serves StorageVersionMigrations at %q only (empty: none); the 1.37 migrator's states are judged on 1.37", cp.Minor, gvr.Version)
	return false
}

// svmControllers run Kubernetes' built-in migrator: it needs the garbage collector's
// informers.
var svmControllers = []string{"garbage-collector-controller", "storage-version-migrator-controller"}

func withControllerManager(t *testing.T) {
	t.Helper()
	if err := cp.StartControllerManager(svmControllers...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.StopControllerManager(); err != nil {
			t.Error(err)
		}
	})
}

// createSVM creates a StorageVersionMigration through v1beta1 and returns the create answer.
func createSVM(t *testing.T, e env, name, grp, resource string) map[string]any {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": svmV1beta1.GroupVersion().String(), "kind": "StorageVersionMigration",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"resource": map[string]any{"group": grp, "resource": resource}},
	}}
	created, err := e.dyn.Resource(svmV1beta1).Create(e.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.dyn.Resource(svmV1).Delete(context.WithoutCancel(e.ctx), name, metav1.DeleteOptions{})
	})
	return created.Object
}

// finished: the migrator is done with the StorageVersionMigration (Succeeded or Failed,
// and no longer Running: on 1.37 that is when it has recorded the end on the CRD).
func finished(obj map[string]any) bool {
	return (conditionIs(obj, "Succeeded", "True") || conditionIs(obj, "Failed", "True")) && !conditionIs(obj, "Running", "True")
}

func message(obj map[string]any, typ string) string {
	if c := condition(obj, typ); c != nil {
		m, _ := c["message"].(string)
		return m
	}
	return ""
}

// TestStorageVersionMigrationHealth: kube-controller-manager 1.37's built-in migrator runs
// a StorageVersionMigration created through v1beta1. Every state it went through, as read
// at v1 and at v1beta1, and every state of the CRD it marked, is judged; then a real
// failure, and a CRD whose migration the migrator failed.
func TestStorageVersionMigrationHealth(t *testing.T) {
	e := setup(t)
	if !migratorGA(t) {
		return
	}
	crd := switchedCRD(t, e, "gadgets", "Gadget", 40)
	withControllerManager(t)

	fromSVM := currentRV(t, e, svmV1)
	const name = "gadgets-to-v1"
	var svmWatch []*watcher
	for _, gvr := range []schema.GroupVersionResource{svmV1, svmV1beta1} {
		svmWatch = append(svmWatch, record(e, gvr, name, fromSVM, 3*time.Minute, finished))
	}
	crdWatch := record(e, crdGVR, crd.Name, crd.ResourceVersion, 3*time.Minute, func(obj map[string]any) bool {
		return conditionIs(obj, "StorageMigrating", "False")
	})
	created := createSVM(t, e, name, group, "gadgets")
	wantHealth(t, "StorageVersionMigration just created", judge(t, keySVM, created), health{Status: "Progressing", Message: "waiting for kube-controller-manager's storage version migrator to start migrating " + crd.Name +
		" (it runs one migration per resource at a time, and only where its storage-version-migrator-controller is enabled)"})

	for i, w := range svmWatch {
		version := []string{"v1", "v1beta1"}[i]
		var running, recording int
		states := w.wait(t)
		for j, obj := range states {
			what := fmt.Sprintf("%s state %d", version, j)
			got := judge(t, keySVM, obj)
			switch {
			case conditionIs(obj, "Failed", "True"):
				t.Fatalf("%s: the migration failed: %v", what, obj["status"])
			case conditionIs(obj, "Succeeded", "True") && conditionIs(obj, "Running", "True"):
				recording++
				wantHealth(t, what, got, health{Status: "Progressing", Message: "migrated " + crd.Name + ": " + message(obj, "Running") +
					"; waiting for kube-controller-manager to record it on the CRD and prune status.storedVersions"})
			case conditionIs(obj, "Succeeded", "True"):
				wantHealth(t, what, got, health{Status: "Healthy", Message: "migrated " + crd.Name + ": " + message(obj, "Succeeded")})
			case conditionIs(obj, "Running", "True"):
				running++
				if !strings.HasPrefix(message(obj, "Running"), "The migration is running") {
					t.Errorf("%s: Running says %q", what, message(obj, "Running"))
				}
				wantHealth(t, what, got, health{Status: "Progressing", Message: "migrating " + crd.Name + ": " + message(obj, "Running")})
			default:
				wantHealth(t, what, got, health{Status: "Progressing", Message: "waiting for kube-controller-manager's storage version migrator to start migrating " +
					crd.Name + " (it runs one migration per resource at a time, and only where its storage-version-migrator-controller is enabled)"})
			}
		}
		t.Logf("%s: %d states, %d running, %d succeeded and recording", version, len(states), running, recording)
		if running == 0 || recording == 0 {
			t.Errorf("%s: %d states, %d running, %d succeeded but still running; want both", version, len(states), running, recording)
		}
	}
	// The same object at both versions is judged the same.
	for _, gvr := range []schema.GroupVersionResource{svmV1, svmV1beta1} {
		wantHealth(t, "finished, at "+gvr.Version, judge(t, keySVM, get(t, e, gvr, name)),
			health{Status: "Healthy", Message: "migrated " + crd.Name + ": Migration completed"})
	}

	var marked int
	crdStates := crdWatch.wait(t)
	for j, obj := range crdStates {
		if !conditionIs(obj, "StorageMigrating", "True") {
			continue
		}
		marked++
		wantHealth(t, fmt.Sprintf("CRD state %d", j), judge(t, keyCRD, obj), health{Status: "Progressing", Message: "storage migration running: Migration " + name + " is running; objects are being re-persisted at v1, status.storedVersions [v1alpha1 v1]" +
			" (the StorageVersionMigration it names clears this when it ends; if it was deleted first, a new one does)"})
	}
	if marked == 0 {
		t.Errorf("the CRD was never seen with StorageMigrating True in %d states", len(crdStates))
	}
	last := crdStates[len(crdStates)-1]
	if c := condition(last, "StorageMigrating"); c["reason"] != "MigrationSucceeded" {
		t.Fatalf("StorageMigrating ended %v", c)
	}
	wantHealth(t, "CRD after the migration", judge(t, keyCRD, get(t, e, crdGVR, crd.Name)),
		health{Status: "Healthy", Message: "CRD is healthy; the last storage migration succeeded; status.storedVersions [v1]"})

	// A real failure: tokenreviews cannot be listed or patched, so the migrator fails it.
	failed := "tokenreviews-to-v1"
	createSVM(t, e, failed, "authentication.k8s.io", "tokenreviews")
	var obj map[string]any
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		obj = get(t, e, svmV1beta1, failed)
		return conditionIs(obj, "Failed", "True"), nil
	}); err != nil {
		t.Fatalf("StorageVersionMigration %s never failed: %v", failed, err)
	}
	wantHealth(t, "failed", judge(t, keySVM, obj), health{Status: "Degraded", Message: "migrating tokenreviews.authentication.k8s.io failed: " + message(obj, "Failed") +
		"; objects may still be stored at older versions whatever the CRD's status.storedVersions says: fix the cause" +
		" and migrate again (a StorageVersionMigration runs once: create one with a new name, or run upgradeguard migrate --crd tokenreviews.authentication.k8s.io)"})
}

// TestStorageVersionMigrationFailsOnCRD: the built-in migrator's patches are refused
// (admission denies every update of the CRD's objects), so its StorageVersionMigration
// fails and it marks the CRD StorageMigrating False, MigrationFailed. Both are judged as
// the API server returns them; the CRD's storedVersions are whatever the migrator left
// (kube-controller-manager 1.37 prunes them even after a failure).
func TestStorageVersionMigrationFailsOnCRD(t *testing.T) {
	e := setup(t)
	if !migratorGA(t) {
		return
	}
	crd := switchedCRD(t, e, "doodads", "Doodad", 5)
	testenv.FreezeUpdates(t, cp.Config, "argocd-freeze-doodads", schema.GroupVersionResource{Group: group, Version: "v1", Resource: "doodads"}, "argocd-doodads", "obj-0")
	withControllerManager(t)

	const name = "doodads-to-v1"
	w := record(e, crdGVR, crd.Name, crd.ResourceVersion, 3*time.Minute, func(obj map[string]any) bool {
		return conditionIs(obj, "StorageMigrating", "False")
	})
	createSVM(t, e, name, group, "doodads")
	states := w.wait(t)
	last := states[len(states)-1]
	if c := condition(last, "StorageMigrating"); c["reason"] != "MigrationFailed" {
		t.Fatalf("StorageMigrating ended %v, want reason MigrationFailed", c)
	}
	obj := get(t, e, svmV1, name)
	if !conditionIs(obj, "Failed", "True") {
		t.Fatalf("StorageVersionMigration %s: %v, want Failed", name, obj["status"])
	}
	t.Logf("the migrator's failure: %s", message(obj, "Failed"))
	wantHealth(t, "failed on the CRD's objects", judge(t, keySVM, obj), health{Status: "Degraded", Message: "migrating " + crd.Name + " failed: " + message(obj, "Failed") +
		"; objects may still be stored at older versions whatever the CRD's status.storedVersions says: fix the cause" +
		" and migrate again (a StorageVersionMigration runs once: create one with a new name, or run upgradeguard migrate --crd " + crd.Name + ")"})

	live := getCRD(t, e, crd.Name)
	t.Logf("storedVersions after the failed migration: %v", live.Status.StoredVersions)
	wantHealth(t, "CRD after a failed migration", judge(t, keyCRD, get(t, e, crdGVR, crd.Name)), health{Status: "Degraded", Message: "the last storage migration failed: The migration has failed; status.storedVersions [" + strings.Join(live.Status.StoredVersions, " ") + "]" +
		": objects may still be stored at older versions; fix the cause and migrate again (a new StorageVersionMigration," +
		" or upgradeguard migrate --crd " + crd.Name + " --engine builtin), which also clears this condition"})
}
