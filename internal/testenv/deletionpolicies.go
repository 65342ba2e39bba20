package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Two deny-deletion policies modelled on those users run on their clusters: each keeps
// the features of its model (the operations and resources it matches, how it binds, its
// expression's shape, its failure policy and reason), with names and words of its own.
const (
	// ConfirmDeletionName is ConfirmDeletion's policy, ConfirmDeletionBinding its binding.
	ConfirmDeletionName    = "confirm-crd-deletion.policies.test"
	ConfirmDeletionBinding = "confirm-crd-deletion-binding.policies.test"
	// ConfirmDeletionAnnotation is the annotation its rule asks for ("true").
	ConfirmDeletionAnnotation = "policies.test/confirm-deletion"

	// NoDeleteName is NoDelete's policy, and its binding's name.
	NoDeleteName = "no-delete-guardrail.policies.test"
	// NoDeleteLabel set to "true" on an object puts it under the guardrail.
	NoDeleteLabel = "policies.test/no-delete"
	// NoDeleteMessage is the guardrail's message.
	NoDeleteMessage = "Deletion blocked: the object carries policies.test/no-delete=true; remove that label first to delete it"
)

// ConfirmDeletion is a policy and binding modelled on sapcc/helm-charts' protect-crds
// (system/validating-admission-policy/templates/protect-crds.yaml, pull request #9527):
// every DELETE of a CRD is refused unless the CRD carries ConfirmDeletionAnnotation=true,
// with failurePolicy Fail and reason Forbidden, bound with an empty matchResources. As
// in its model, the expression indexes the annotations without a guard, so a CRD with
// no annotations is refused by the evaluation error, not by the message.
func ConfirmDeletion() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	fail := admissionregistrationv1.Fail
	forbidden := metav1.StatusReasonForbidden
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: ConfirmDeletionName},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: &fail,
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"customresourcedefinitions"}},
					}}}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: "oldObject.metadata.annotations['" + ConfirmDeletionAnnotation + "'] == 'true'",
					Message:    "annotate the CRD " + ConfirmDeletionAnnotation + "=true to confirm its deletion",
					Reason:     &forbidden,
				}},
			},
		}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ConfirmDeletionBinding},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: ConfirmDeletionName,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, MatchResources: &admissionregistrationv1.MatchResources{}},
		}
}

// NoDelete is a policy and binding modelled on Cozystack's deletion guardrail
// (packages/core/platform/templates/deletion-protection.yaml, pull request
// cozystack/cozystack#2650): a policy that refuses every DELETE of any resource, at any
// scope (its expression is the literal false; failurePolicy left unset), bound to the
// objects labelled NoDeleteLabel=true through the binding's objectSelector; Cozystack
// labels its own CRDs so. Its way past it is to remove the label.
func NoDelete() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	scope := admissionregistrationv1.AllScopes
	labels := map[string]string{NoDeleteLabel: "true"}
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: NoDeleteName, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*/*"}, Scope: &scope},
					}}}},
				Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: NoDeleteMessage}},
			},
		}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: NoDeleteName, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: NoDeleteName,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
				MatchResources:    &admissionregistrationv1.MatchResources{ObjectSelector: &metav1.LabelSelector{MatchLabels: labels}}},
		}
}

// InstallAdmissionPolicies creates policies and bindings (CreateAdmissionPolicies) and
// returns once probe, a request the first policy refuses, is refused by it: the API
// server takes policies in through informers, a moment after they are stored. When the
// test ends it deletes them and waits until probe is no longer refused by that policy,
// so that no later test meets it.
func (cp *ControlPlane) InstallAdmissionPolicies(t testing.TB, policies []*admissionregistrationv1.ValidatingAdmissionPolicy,
	bindings []*admissionregistrationv1.ValidatingAdmissionPolicyBinding, probe func(ctx context.Context) error) {
	t.Helper()
	name := policies[0].Name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := waitRefused(ctx, probe, name, false); err != nil {
			t.Errorf("the API server still enforces %s after its deletion: %v", name, err)
		}
	})
	cp.CreateAdmissionPolicies(t, policies, bindings)
	if err := waitRefused(t.Context(), probe, name, true); err != nil {
		t.Fatalf("the API server does not enforce %s: %v", name, err)
	}
}

// DryRunDeleteCRD is a probe for InstallAdmissionPolicies: a dry-run DELETE of the CRD.
func (cp *ControlPlane) DryRunDeleteCRD(name string) func(ctx context.Context) error {
	crds := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	return func(ctx context.Context) error {
		return crds.Delete(ctx, name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
}

// waitRefused polls probe until the policy refuses it (refused) or does not.
func waitRefused(ctx context.Context, probe func(ctx context.Context) error, policy string, refused bool) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = probe(ctx)
		return (last != nil && strings.Contains(last.Error(), "ValidatingAdmissionPolicy '"+policy+"'")) == refused, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last answer: %w)", err, last)
	}
	return err
}
