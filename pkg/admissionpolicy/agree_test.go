package admissionpolicy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
)

// identity is who a prediction is made as.
type identity struct {
	name string
	cfg  *rest.Config
}

// policyReader is a user who may list the policies and their bindings, and nothing else
// (what a read-only platform role grants); extra rules add to it.
func policyReader(t *testing.T, name string, extra ...rbacv1.PolicyRule) identity {
	t.Helper()
	rules := append([]rbacv1.PolicyRule{{APIGroups: []string{admissionregistrationv1.GroupName},
		Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, Verbs: []string{"list"}}}, extra...)
	cp.Grant(t, name, rules...)
	cfg, err := cp.AddUser(name)
	if err != nil {
		t.Fatal(err)
	}
	return identity{name, cfg}
}

// widgetCRD is a one-version CRD widgets.GROUP with the labels and annotations given.
func widgetCRD(group string, labels, annotations map[string]string) *apiextv1.CustomResourceDefinition {
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets." + group, Labels: labels, Annotations: annotations},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextv1.NamespaceScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTo(true)}}}},
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// createCRD creates crd and deletes it when the test ends (allowed by then: the test's
// policies are gone first, as cleanups run last-in first-out).
func createCRD(t *testing.T, crd *apiextv1.CustomResourceDefinition) *apiextv1.CustomResourceDefinition {
	t.Helper()
	crds := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	created, err := crds.Create(t.Context(), crd, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crds.Delete(context.WithoutCancel(t.Context()), crd.Name, metav1.DeleteOptions{}) })
	return created
}

// realAnswer is the API server's own answer to the write: a dry-run update of next over
// live, or (nil next) a dry-run delete of live. Admission runs on a dry run as on a real
// write; nothing is stored.
func realAnswer(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) error {
	crds := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	dry := []string{metav1.DryRunAll}
	if next == nil {
		return crds.Delete(ctx, live.Name, metav1.DeleteOptions{DryRun: dry})
	}
	fresh, err := crds.Get(ctx, live.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	next = next.DeepCopy()
	next.ResourceVersion = fresh.ResourceVersion
	_, err = crds.Update(ctx, next, metav1.UpdateOptions{DryRun: dry})
	return err
}

// refusal is the API server's words for the first denial.
func refusal(d admissionpolicy.Denial) string {
	return fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s", d.Policy, d.Binding, d.Message)
}

// agree predicts the write as who (Load and Evaluate) and asks the API server the same
// write, and wants them to agree: no denial and an accepted write, or the server's
// refusal naming the predicted first denial's policy, binding and message. The API server
// takes policies, bindings and parameters in through informers a moment after they are
// stored, so its answer is polled until it agrees (a prediction it never agrees with
// fails). It returns the prediction.
func agree(t *testing.T, who identity, live, next *apiextv1.CustomResourceDefinition) []admissionpolicy.Denial {
	t.Helper()
	ctx := t.Context()
	policies, err := load(t, who.cfg)
	if err != nil {
		t.Fatalf("%s: %v", who.name, err)
	}
	got, err := policies.Evaluate(ctx, live, next)
	if err != nil {
		t.Fatalf("%s: evaluate: %v", who.name, err)
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = realAnswer(ctx, live, next)
		if len(got) == 0 {
			return last == nil, nil
		}
		return last != nil && strings.Contains(last.Error(), refusal(got[0])), nil
	})
	if err != nil {
		t.Fatalf("%s: predicted %+v; the API server answers: %v", who.name, got, last)
	}
	return got
}

// waitAnswer polls the API server's answer to the write until ok says it is the one
// wanted (a policy, binding or parameter taken in, or gone).
func waitAnswer(t *testing.T, what string, live, next *apiextv1.CustomResourceDefinition, ok func(error) bool) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = realAnswer(ctx, live, next)
		return ok(last), nil
	})
	if err != nil {
		t.Fatalf("%s: the API server answers %v", what, last)
	}
}

// installPolicy creates a policy and its binding, and returns once the API server
// refuses the probe write with it (until the test ends: testenv.InstallAdmissionPolicies).
func installPolicy(t *testing.T, policy *admissionregistrationv1.ValidatingAdmissionPolicy, binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding,
	probeLive, probeNext *apiextv1.CustomResourceDefinition) {
	t.Helper()
	cp.InstallAdmissionPolicies(t, []*admissionregistrationv1.ValidatingAdmissionPolicy{policy}, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{binding},
		func(ctx context.Context) error { return realAnswer(ctx, probeLive, probeNext) })
}

// deleteCRD deletes the CRD for real.
func deleteCRD(t *testing.T, name string) error {
	t.Helper()
	return apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Delete(t.Context(), name, metav1.DeleteOptions{})
}
