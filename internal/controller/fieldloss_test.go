package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
)

const helmreleases = "helmreleases.helm.toolkit.fluxcd.io"

var hrV2beta2 = schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2beta2", Resource: "helmreleases"}

// helmControllerUpgrade applies helm-controller v0.37.4's CRD, creates withFile
// HelmReleases at v2beta2 with spec.chart.spec.valuesFile (a field v2 drops) and without
// others, then applies v1.0.0's CRD (storage v2, conversion None): storedVersions
// [v2beta2 v2].
func helmControllerUpgrade(t *testing.T, e env, withFile, without int) dynamic.NamespaceableResourceInterface {
	t.Helper()
	apply(t, e, fixtureDir(t, "flux-helm-controller/v0.37.4")...)
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(hrV2beta2)
	for i := range withFile + without {
		name, chart := fmt.Sprintf("plain-%d", i), map[string]any{"chart": "podinfo", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"}}
		if i < withFile {
			name = fmt.Sprintf("with-file-%d", i)
			chart["valuesFile"] = "values-secret-" + name + ".yaml"
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "helm.toolkit.fluxcd.io/v2beta2", "kind": "HelmRelease",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"spec":     map[string]any{"interval": "5m", "chart": map[string]any{"spec": chart}}}}
		if _, err := ri.Namespace("default").Create(e.ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, e, fixtureDir(t, "flux-helm-controller/v1.0.0")...)
	if got := helmReleaseStoredVersions(t, e); !slices.Equal(got, []string{"v2beta2", "v2"}) {
		t.Fatalf("storedVersions %v, want [v2beta2 v2]", got)
	}
	return ri
}

// helmReleaseStoredVersions is status.storedVersions of the HelmRelease CRD.
func helmReleaseStoredVersions(t *testing.T, e env) []string {
	t.Helper()
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmreleases, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd.Status.StoredVersions
}

func valuesFiles(t *testing.T, e env, ri dynamic.NamespaceableResourceInterface) (withFile int, rvs map[string]string) {
	t.Helper()
	list, err := ri.List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rvs = map[string]string{}
	for _, o := range list.Items {
		if _, found, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "valuesFile"); found {
			withFile++
		}
		rvs[o.GetName()] = o.GetResourceVersion()
	}
	return withFile, rvs
}

// TestStorageMigrationRefusedForFieldLoss: a StorageMigration of the HelmReleases that
// helm-controller v0.37.4 stored at v2beta2 with spec.chart.spec.valuesFile, after the
// v1.0.0 CRD upgrade (v2 drops the field). The controller refuses: phase Failed with
// reason FieldLossRefused, the path and count in the condition and in
// status.resources[].fieldLoss (never the value), a FieldLossRefused event, the refused
// metric once, and nothing written. Allowing the loss in the spec starts it over; it
// succeeds, still lists the loss, and the field is gone from etcd.
func TestStorageMigrationRefusedForFieldLoss(t *testing.T) {
	e := setup(t)
	ri := helmControllerUpgrade(t, e, 2, 2)
	if n, _ := valuesFiles(t, e, ri); n != 2 {
		t.Fatalf("%d HelmReleases read at v2beta2 hold valuesFile, want 2", n)
	}
	_, rvs := valuesFiles(t, e, ri)
	refused := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.LocalCluster, metrics.ResultRefused))
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "helmreleases"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmreleases}, Engine: v1alpha1.EngineClient}}
	if err := e.c.Create(e.ctx, sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), sm) })
	startController(t, "ug-fieldloss", controller.Options{})

	get := func(phase v1alpha1.Phase, generation int64) *v1alpha1.StorageMigration {
		t.Helper()
		got := &v1alpha1.StorageMigration{}
		waitFor(t, 60*time.Second, "StorageMigration "+string(phase), func() (bool, error) {
			err := e.c.Get(e.ctx, client.ObjectKey{Name: sm.Name}, got)
			return err == nil && got.Status.ObservedGeneration == generation && terminalPhase(got.Status.Phase), err
		})
		if got.Status.Phase != phase {
			t.Fatalf("StorageMigration %s (%+v), want %s", got.Status.Phase, got.Status, phase)
		}
		return got
	}
	got := get(v1alpha1.PhaseFailed, 1)
	wantLoss := []v1alpha1.DroppedField{{Path: "spec.chart.spec.valuesFile", Version: "v2", Objects: 2,
		Examples: []string{"default/with-file-0", "default/with-file-1"}}}
	rp := got.Status.Resources[0]
	if diff := cmp.Diff(wantLoss, rp.FieldLoss); diff != "" {
		t.Errorf("status.resources[0].fieldLoss (-want +got):\n%s", diff)
	}
	if rp.Attempts != 1 || rp.Phase != v1alpha1.PhaseFailed {
		t.Errorf("resource progress %+v, want one failed attempt", rp)
	}
	var failed *metav1.Condition
	for i := range got.Status.Conditions {
		if got.Status.Conditions[i].Type == v1alpha1.ConditionFailed {
			failed = &got.Status.Conditions[i]
		}
	}
	if failed == nil || failed.Status != metav1.ConditionTrue || failed.Reason != controller.ReasonFieldLossRefused ||
		!strings.Contains(failed.Message, "spec.chart.spec.valuesFile (2 objects") || !strings.Contains(failed.Message, "spec.allowFieldLoss") ||
		strings.Contains(failed.Message, "values-secret") {
		t.Errorf("Failed condition %+v; want True, reason %s, naming the path and count and spec.allowFieldLoss, never the value",
			failed, controller.ReasonFieldLossRefused)
	}
	waitFor(t, 10*time.Second, "the FieldLossRefused event", func() (bool, error) {
		evs, err := kubernetes.NewForConfigOrDie(cp.Config).EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == sm.Name && ev.Reason == controller.EventFieldLossRefused && ev.Type == "Warning" &&
				strings.Contains(ev.Note, "spec.chart.spec.valuesFile") && !strings.Contains(ev.Note, "values-secret")
		}), nil
	})
	if n, after := valuesFiles(t, e, ri); n != 2 || !cmp.Equal(rvs, after) {
		t.Errorf("after the refusal: %d objects hold valuesFile, resourceVersions (-before +after):\n%s", n, cmp.Diff(rvs, after))
	}
	if got := helmReleaseStoredVersions(t, e); !slices.Equal(got, []string{"v2beta2", "v2"}) {
		t.Errorf("storedVersions after the refusal %v, want [v2beta2 v2]", got)
	}

	// The operator accepts the loss: a new generation starts over.
	got.Spec.AllowFieldLoss = true
	if err := e.c.Update(e.ctx, got); err != nil {
		t.Fatal(err)
	}
	got = get(v1alpha1.PhaseSucceeded, 2)
	if diff := cmp.Diff(wantLoss, got.Status.Resources[0].FieldLoss); diff != "" {
		t.Errorf("allowed: status.resources[0].fieldLoss (-want +got):\n%s", diff)
	}
	if sv := helmReleaseStoredVersions(t, e); !slices.Equal(sv, []string{"v2"}) {
		t.Errorf("allowed: storedVersions %v, want [v2]", sv)
	}
	if n, _ := valuesFiles(t, e, ri); n != 0 {
		t.Errorf("allowed: %d objects still hold valuesFile read at v2beta2, want 0 (gone from etcd)", n)
	}
	// One refusal over the whole test: the refused migration was not retried meanwhile.
	if d := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.LocalCluster, metrics.ResultRefused)) - refused; d != 1 {
		t.Errorf("upgradeguard_migrations_total{result=refused} grew by %v, want 1", d)
	}
}

// TestJobArgsAllowFieldLoss: a Job-mode migration passes spec.allowFieldLoss to the Job's
// `upgradeguard migrate` (and only then).
func TestJobArgsAllowFieldLoss(t *testing.T) {
	for _, allow := range []bool{false, true} {
		sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "job"},
			Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmreleases}, Mode: v1alpha1.ModeJob, AllowFieldLoss: allow}}
		objs := controller.JobObjects(sm, "j", "ns", "image", nil)
		if got := slices.Contains(objs.Job.Spec.Template.Spec.Containers[0].Args, "--allow-field-loss"); got != allow {
			t.Errorf("allowFieldLoss %v: the Job's arguments %v have --allow-field-loss %v", allow, objs.Job.Spec.Template.Spec.Containers[0].Args, got)
		}
	}
}

// TestJobModeRefusedForFieldLoss: in Job mode the Job's `upgradeguard migrate` refuses
// (exit 1) and writes its result; the controller reads it and fails the StorageMigration
// with reason FieldLossRefused and the fields in its status, as in Remote mode.
func TestJobModeRefusedForFieldLoss(t *testing.T) {
	e := setup(t)
	ri := helmControllerUpgrade(t, e, 1, 1)
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "helmreleases-job"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmreleases}, Mode: v1alpha1.ModeJob}}
	if err := e.c.Create(e.ctx, sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), sm) })
	startController(t, "ug-fieldloss-job", controller.Options{JobImage: "registry.example.com/upgradeguard:test"})
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	var args []string
	waitFor(t, 60*time.Second, "the migration Job", func() (bool, error) {
		got := &v1alpha1.StorageMigration{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: sm.Name}, got); err != nil {
			return false, err
		}
		job, err := cs.BatchV1().Jobs(controller.DefaultJobNamespace).Get(e.ctx, controller.JobName(got), metav1.GetOptions{})
		if err == nil {
			args = job.Spec.Template.Spec.Containers[0].Args
		}
		return err == nil, client.IgnoreNotFound(err)
	})
	// Play the kubelet with the Job's arguments (as the admin: the refusal is the point).
	if code, out := runAs(t, cp.Kubeconfig, args); code != 1 || !strings.Contains(out, `"fieldLossRefused": true`) {
		t.Fatalf("the Job's command: exit %d, output:\n%s\nwant exit 1 and a refusal for field loss", code, out)
	}
	got := &v1alpha1.StorageMigration{}
	waitFor(t, 60*time.Second, "the StorageMigration Failed from the Job's result", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKey{Name: sm.Name}, got)
		return err == nil && terminalPhase(got.Status.Phase), err
	})
	rp := got.Status.Resources[0]
	if got.Status.Phase != v1alpha1.PhaseFailed || len(rp.FieldLoss) != 1 || rp.FieldLoss[0].Path != "spec.chart.spec.valuesFile" || rp.FieldLoss[0].Objects != 1 {
		t.Errorf("StorageMigration %s, progress %+v; want Failed with spec.chart.spec.valuesFile (1 object)", got.Status.Phase, rp)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFailed); c == nil || c.Status != metav1.ConditionTrue || c.Reason != controller.ReasonFieldLossRefused {
		t.Errorf("Failed condition %+v, want True with reason %s", c, controller.ReasonFieldLossRefused)
	}
	if n, _ := valuesFiles(t, e, ri); n != 1 {
		t.Errorf("%d objects hold valuesFile after the refusal, want 1", n)
	}
}

// TestProactiveFieldLossPolicy: a proactive policy's migration of the HelmReleases is
// refused for the field it would drop and stays refused; setting the policy's
// allowFieldLoss replaces it, and the new one migrates.
func TestProactiveFieldLossPolicy(t *testing.T) {
	e := setup(t)
	ri := helmControllerUpgrade(t, e, 1, 1)
	p := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "helm"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"helm.toolkit.fluxcd.io"}, Proactive: ptrBool(true)}}
	if err := e.c.Create(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), p) })
	startController(t, "ug-fieldloss-policy", controller.Options{})
	name := controller.ProactiveName(helmreleases)
	sm := &v1alpha1.StorageMigration{}
	waitFor(t, 60*time.Second, "the proactive migration refused", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, sm)
		return err == nil && terminalPhase(sm.Status.Phase), client.IgnoreNotFound(err)
	})
	if sm.Status.Phase != v1alpha1.PhaseFailed || sm.Spec.AllowFieldLoss || len(sm.Status.Resources[0].FieldLoss) != 1 {
		t.Fatalf("proactive migration %s (allowFieldLoss %v, %+v), want Failed for field loss", sm.Status.Phase, sm.Spec.AllowFieldLoss, sm.Status.Resources)
	}
	refusedUID := sm.UID

	if err := e.c.Get(e.ctx, client.ObjectKey{Name: p.Name}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.AllowFieldLoss = true
	if err := e.c.Update(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a new proactive migration Succeeded", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, sm)
		return err == nil && sm.UID != refusedUID && sm.Status.Phase == v1alpha1.PhaseSucceeded, client.IgnoreNotFound(err)
	})
	if !sm.Spec.AllowFieldLoss || len(sm.Status.Resources[0].FieldLoss) != 1 {
		t.Errorf("the replacement: allowFieldLoss %v, fieldLoss %+v; want the policy's true, and the loss reported", sm.Spec.AllowFieldLoss, sm.Status.Resources[0].FieldLoss)
	}
	if sv := helmReleaseStoredVersions(t, e); !slices.Equal(sv, []string{"v2"}) {
		t.Errorf("storedVersions %v, want [v2]", sv)
	}
	if n, _ := valuesFiles(t, e, ri); n != 0 {
		t.Errorf("%d objects still hold valuesFile, want 0", n)
	}
}

func ptrBool(b bool) *bool { return &b }
