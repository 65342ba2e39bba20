package testenv

import (
	"context"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateAdmissionPolicies creates ValidatingAdmissionPolicies and their bindings, all
// removed when the test ends. The API server takes them in through informers, a moment
// later: a test waits for a request they refuse.
func (cp *ControlPlane) CreateAdmissionPolicies(t testing.TB, policies []*admissionregistrationv1.ValidatingAdmissionPolicy,
	bindings []*admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	ctx := t.Context()
	api := kubernetes.NewForConfigOrDie(cp.Config).AdmissionregistrationV1()
	for _, p := range policies {
		if _, err := api.ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ValidatingAdmissionPolicy %s: %v", p.Name, err)
		}
		t.Cleanup(func() {
			_ = api.ValidatingAdmissionPolicies().Delete(context.WithoutCancel(ctx), p.Name, metav1.DeleteOptions{})
		})
	}
	for _, b := range bindings {
		if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ValidatingAdmissionPolicyBinding %s: %v", b.Name, err)
		}
		t.Cleanup(func() {
			_ = api.ValidatingAdmissionPolicyBindings().Delete(context.WithoutCancel(ctx), b.Name, metav1.DeleteOptions{})
		})
	}
}
