package testenv

import (
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// FreezeUpdates denies every update of gvr's resource (at any version) with a
// ValidatingAdmissionPolicy named name, so that a migrator's patches fail as they do
// against a webhook that refuses them, and returns once the API server enforces it (a
// dry-run update of ns/object is refused). unfreeze lifts the policy and returns once
// updates are admitted again; a policy not lifted goes when the test ends.
func FreezeUpdates(t testing.TB, cfg *rest.Config, name string, gvr schema.GroupVersionResource, ns, object string) (unfreeze func()) {
	t.Helper()
	ctx := t.Context()
	api := kubernetes.NewForConfigOrDie(cfg).AdmissionregistrationV1()
	fail := admissionregistrationv1.Fail
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{gvr.Group}, APIVersions: []string{"*"}, Resources: []string{gvr.Resource}},
				}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: gvr.Resource + " are frozen"}},
		}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lift := func() error {
		if err := api.ValidatingAdmissionPolicyBindings().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		return api.ValidatingAdmissionPolicies().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
	}
	lifted := false
	t.Cleanup(func() {
		if !lifted {
			_ = lift()
		}
	})
	ri := dynamic.NewForConfigOrDie(cfg).Resource(gvr).Namespace(ns)
	probe := []byte(`{"metadata":{"labels":{"probe":"frozen"}}}`)
	// enforced returns once a dry-run update of ns/object is refused by admission, or not.
	enforced := func(refused bool) {
		t.Helper()
		var last error
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, last = ri.Patch(ctx, object, types.MergePatchType, probe, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return (apierrors.IsInvalid(last) || apierrors.IsForbidden(last)) == refused, nil
		}); err != nil {
			t.Fatalf("a dry-run update of %s/%s: %v, want refused=%v by %s: %v", ns, object, last, refused, name, err)
		}
	}
	enforced(true)
	return func() {
		t.Helper()
		lifted = true
		if err := lift(); err != nil {
			t.Fatal(err)
		}
		enforced(false)
	}
}
