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

// The deny-deletion policies users run on their clusters, as their authors wrote them.
const (
	// ProtectCRDsName is sapcc/helm-charts' policy (ProtectCRDs); ProtectCRDsBinding its
	// binding's name.
	ProtectCRDsName    = "protect-crds.cloud.sap"
	ProtectCRDsBinding = "protect-crds-binding.cloud.sap"
	// ProtectCRDsConfirm is the annotation its rule asks for ("true").
	ProtectCRDsConfirm = "confirmation.cloud.sap/deletion"

	// NoDeleteName is Cozystack's guardrail (NoDelete), and its binding's name.
	NoDeleteName = "cozystack-no-delete-guardrail"
	// NoDeleteLabel set to "true" on an object puts it under the guardrail.
	NoDeleteLabel = "platform.cozystack.io/no-delete"
	// NoDeleteMessage is the guardrail's message.
	NoDeleteMessage = "Deletion blocked: object carries platform.cozystack.io/no-delete=true. To bypass, first remove the label: " +
		"kubectl label <kind> <name> --namespace <ns> platform.cozystack.io/no-delete- (omit --namespace for cluster-scoped resources)"
)

// ProtectCRDs is sapcc/helm-charts' protect-crds policy and binding
// (system/validating-admission-policy/templates/protect-crds.yaml, pull request #9527),
// as written there: every DELETE of a CRD is refused unless the CRD is annotated
// confirmation.cloud.sap/deletion=true. Its expression indexes the annotations without a
// guard, so a CRD with no annotations is refused by the evaluation error (failurePolicy
// Fail), not by its message.
func ProtectCRDs() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	fail := admissionregistrationv1.Fail
	forbidden := metav1.StatusReasonForbidden
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: ProtectCRDsName},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: &fail,
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"customresourcedefinitions"}},
					}}}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: "oldObject.metadata.annotations['" + ProtectCRDsConfirm + "'] == 'true'",
					Message:    "You need to add the '" + ProtectCRDsConfirm + "=true' annotation to delete the CRD",
					Reason:     &forbidden,
				}},
			},
		}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ProtectCRDsBinding},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: ProtectCRDsName,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, MatchResources: &admissionregistrationv1.MatchResources{}},
		}
}

// NoDelete is Cozystack's deletion guardrail (packages/core/platform/templates/
// deletion-protection.yaml, pull request cozystack/cozystack#2650), as written there: a
// policy that refuses every DELETE (its expression is the literal false, and it leaves
// failurePolicy unset), bound to the objects labelled NoDeleteLabel=true (Cozystack
// stamps its own CRDs so). Its documented way past it is to remove the label.
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
	if err != nil {
		return fmt.Errorf("%w (last answer: %v)", err, last)
	}
	return nil
}
