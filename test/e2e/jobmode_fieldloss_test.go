//go:build e2e

package e2e_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
)

// TestJobModeFieldLoss is TestJobMode with a storage schema that drops a field the objects
// hold: the CRD's v1 (the storage version) no longer declares spec.interval, which every
// HelmRepository stored at v1beta2 has. The Job, run by the node's kubelet with exactly
// its generated RBAC, finds the loss before it writes anything and refuses: the
// StorageMigration fails with reason FieldLossRefused naming the field, its count and
// spec.allowFieldLoss, storedVersions stays [v1beta2 v1], and the objects still hold the
// field.
func TestJobModeFieldLoss(t *testing.T) {
	const n, ns = 50, "job-mode-fieldloss"
	started := time.Now()
	jt, crds, _ := startJobTarget(t, ns, n)
	jw := jt.watch(t)
	ctx := t.Context()

	crd, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, helmrepos, metav1.GetOptions{})
	must(t, err, "get %s", helmrepos)
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		if !v.Storage {
			continue
		}
		spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
		if _, ok := spec.Properties["interval"]; !ok {
			t.Fatalf("%s %s declares no spec.interval: the test's premise is gone", helmrepos, v.Name)
		}
		delete(spec.Properties, "interval")
		spec.Required = slices.DeleteFunc(spec.Required, func(f string) bool { return f == "interval" })
		v.Schema.OpenAPIV3Schema.Properties["spec"] = spec
	}
	_, err = crds.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{})
	must(t, err, "narrow %s's storage schema", helmrepos)

	sm := jt.migrate(t, "job-mode-fieldloss")
	job, sm := jt.waitJob(t, sm)
	name := job.Name
	jt.generatedRBAC(t, crds, sm)
	kubectl(t, "uncordon", jt.node.Name)

	sm = waitMigrationIn(t, jt.platform, sm.Name, 5*time.Minute, "to finish", terminal)
	failed := findCondition(sm.Status.Conditions, v1alpha1.ConditionFailed)
	if sm.Status.Phase != v1alpha1.PhaseFailed || failed == nil || failed.Status != metav1.ConditionTrue || failed.Reason != controller.ReasonFieldLossRefused {
		t.Fatalf("StorageMigration %s: phase %s, Failed condition %+v; want Failed with reason %s", sm.Name, sm.Status.Phase, failed, controller.ReasonFieldLossRefused)
	}
	t.Logf("the StorageMigration failed with: %s", failed.Message)
	for _, want := range []string{"spec.interval", "spec.allowFieldLoss"} {
		if !strings.Contains(failed.Message, want) {
			t.Errorf("the Failed condition's message lacks %q:\n%s", want, failed.Message)
		}
	}
	if ok, seen := jw.ran(name, jt.node.Name, jt.image, name); !ok {
		t.Errorf("no Pod of Job %s seen running on %s with image %s as ServiceAccount %s; seen: %s", name, jt.node.Name, jt.image, name, seen)
	}
	if rp := sm.Status.Resources[0]; rp.Phase != v1alpha1.PhaseFailed || rp.Rewritten != 0 {
		t.Errorf("progress %+v; want Failed with nothing rewritten", rp)
	}
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Errorf("storedVersions %v after the refusal, want [v1beta2 v1] untouched", got)
	}
	// Read at v1beta2, whose schema still declares it: every object keeps spec.interval.
	list, err := dynamic.NewForConfigOrDie(cp.Config).Resource(hrV1beta2).Namespace(ns).List(ctx, metav1.ListOptions{})
	must(t, err, "list the HelmRepositories at v1beta2")
	kept := 0
	for _, o := range list.Items {
		if spec, _ := o.Object["spec"].(map[string]any); spec["interval"] == hrSpec["interval"] {
			kept++
		}
	}
	if kept != n || len(list.Items) != n {
		t.Errorf("%d of %d HelmRepositories (of %d) still hold spec.interval, want all", kept, len(list.Items), n)
	}
	t.Logf("TestJobModeFieldLoss took %v", time.Since(started).Round(time.Second))
}
