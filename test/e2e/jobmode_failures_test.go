//go:build e2e

package e2e_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

	sm, failed := jt.waitFailed(t, sm.Name, controller.ReasonFieldLossRefused)
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

// TestJobModeNoResult is TestJobMode with the generated Role lacking its one rule, `create`
// on configmaps in the Job's namespace, removed on the target before the node runs the Job:
// the Job migrates but cannot write its result, its Pods fail until the Job's retries are
// spent, and the StorageMigration fails saying the Job failed without a result, with the
// Job's reason and where its logs are. The Job is kept for them, and its log has the 403.
func TestJobModeNoResult(t *testing.T) {
	const n, ns = 20, "job-mode-noresult"
	jt, crds, _ := startJobTarget(t, ns, n)
	ctx := t.Context()
	sm := jt.migrate(t, "job-mode-noresult")
	job, sm := jt.waitJob(t, sm)
	name := job.Name
	jt.generatedRBAC(t, crds, sm)
	role, err := jt.cs.RbacV1().Roles(jt.ns).Get(ctx, name, metav1.GetOptions{})
	must(t, err, "read the migration's Role")
	i := slices.IndexFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Equal(r.Resources, []string{"configmaps"}) })
	if i < 0 {
		t.Fatalf("the generated Role has no rule for configmaps: %v", role.Rules)
	}
	role.Rules = slices.Delete(role.Rules, i, i+1)
	_, err = jt.cs.RbacV1().Roles(jt.ns).Update(ctx, role, metav1.UpdateOptions{})
	must(t, err, "remove the result rule from Role %s/%s", jt.ns, name)
	jt.waitDenied(t, "system:serviceaccount:"+jt.ns+":"+name, &authzv1.ResourceAttributes{Namespace: jt.ns, Resource: "configmaps", Verb: "create"})
	kubectl(t, "uncordon", jt.node.Name)

	_, failed := jt.waitFailed(t, sm.Name, "")
	for _, want := range []string{"the migration Job " + jt.ns + "/" + name + " failed without a result", "BackoffLimitExceeded", "kubectl -n " + jt.ns + " logs job/" + name} {
		if !strings.Contains(failed.Message, want) {
			t.Errorf("the Failed condition's message lacks %q:\n%s", want, failed.Message)
		}
	}
	if out := kubectlOut("get", "job/"+name, "-n", jt.ns, "-o", "name"); !strings.Contains(out, name) {
		t.Errorf("after the failure, job/%s on the target: %s; want it kept", name, strings.TrimSpace(out))
	}
	if logs := kubectlOut("-n", jt.ns, "logs", "job/"+name); !strings.Contains(logs, "forbidden") || !strings.Contains(logs, "configmaps") {
		t.Errorf("kubectl -n %s logs job/%s lacks the 403 on the result:\n%s", jt.ns, name, logs)
	}
}
