package admissionpolicy_test

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
)

// The parameters test's policy: a CRD's tier label must not be the tier its ConfigMap
// parameter forbids.
const (
	tierPolicy   = "crd-tiers.params.test"
	tierBinding  = "crd-tiers.params.test"
	paramsNS     = "policy-params"
	tierLabel    = "params.test/tier"
	noParamsSays = "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"
)

func tierPolicyObjects(ref *admissionregistrationv1.ParamRef) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: tierPolicy},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				ParamKind: &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
						Rule: admissionregistrationv1.Rule{APIGroups: []string{"apiextensions.k8s.io"}, APIVersions: []string{"v1"},
							Resources: []string{"customresourcedefinitions"}},
					}}}},
				Validations: []admissionregistrationv1.Validation{{
					Expression:        "object.metadata.?labels[?'" + tierLabel + "'].orValue('') != params.data.forbidden",
					MessageExpression: "'tier ' + params.data.forbidden + ' is forbidden by ConfigMap ' + params.metadata.name",
				}},
			},
		}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: tierBinding},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: tierPolicy, ParamRef: ref,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
		}
}

// TestParams: a policy with a paramKind (a ConfigMap) and a binding with a paramRef,
// evaluated here, agrees with the API server's answer to the same CRD update in each way
// a binding names its parameters: by name and by selector, found or not, with
// parameterNotFoundAction Deny (the binding's configuration error denies) and Allow (the
// binding is not evaluated). The denial names the parameter, and the way on is to change
// it. A user who may read the policies and the parameters gets the admin's answers; one
// who may read the policies but not the parameters gets an error the caller reports as
// not asked (never no denial).
func TestParams(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	kc := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: paramsNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	configMap := func(name, forbidden string, labels map[string]string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: paramsNS, Name: name, Labels: labels}, Data: map[string]string{"forbidden": forbidden}}
		if _, err := kc.CoreV1().ConfigMaps(paramsNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kc.CoreV1().ConfigMaps(paramsNS).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
		})
	}
	configMap("tiers", "gold", nil)
	configMap("tiers-a", "gold", map[string]string{"params.test/set": "tiers"})
	configMap("tiers-b", "bronze", map[string]string{"params.test/set": "tiers"})

	live := createCRD(t, widgetCRD("params.test", nil, nil))
	withTier := func(v string) *apiextv1.CustomResourceDefinition {
		next := live.DeepCopy()
		next.Labels = map[string]string{tierLabel: v}
		return next
	}

	reader := policyReader(t, "params-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}})
	blind := policyReader(t, "params-blind")
	deny, allow := admissionregistrationv1.DenyAction, admissionregistrationv1.AllowAction
	byName := func(name string, action admissionregistrationv1.ParameterNotFoundActionType) *admissionregistrationv1.ParamRef {
		return &admissionregistrationv1.ParamRef{Name: name, Namespace: paramsNS, ParameterNotFoundAction: &action}
	}
	bySelector := func(set string, action admissionregistrationv1.ParameterNotFoundActionType) *admissionregistrationv1.ParamRef {
		return &admissionregistrationv1.ParamRef{Namespace: paramsNS, ParameterNotFoundAction: &action,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"params.test/set": set}}}
	}

	policy, binding := tierPolicyObjects(byName("tiers", deny))
	installPolicy(t, policy, binding, live, withTier("gold"))
	bindings := kc.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()

	for _, tc := range []struct {
		name string
		ref  *admissionregistrationv1.ParamRef
		// tier is the label written; message is the denial wanted ("" none), param the
		// parameter it names.
		tier, message, param string
		// taken is a write whose answer shows the API server has taken the binding in
		// (denied when takenDenied, else admitted).
		taken       string
		takenDenied bool
	}{
		{name: "by name, forbidden tier", ref: byName("tiers", deny), tier: "gold", message: "tier gold is forbidden by ConfigMap tiers", param: "ConfigMap " + paramsNS + "/tiers",
			taken: "gold", takenDenied: true},
		{name: "by name, another tier", ref: byName("tiers", deny), tier: "silver", taken: "gold", takenDenied: true},
		{name: "by name, not found, Deny", ref: byName("missing", deny), tier: "silver", message: noParamsSays, taken: "silver", takenDenied: true},
		{name: "by name, not found, Allow", ref: byName("missing", allow), tier: "gold", taken: "gold"},
		{name: "by selector, one of two forbids", ref: bySelector("tiers", deny), tier: "bronze", message: "tier bronze is forbidden by ConfigMap tiers-b",
			param: "ConfigMap " + paramsNS + "/tiers-b", taken: "bronze", takenDenied: true},
		{name: "by selector, none forbids", ref: bySelector("tiers", deny), tier: "silver", taken: "bronze", takenDenied: true},
		{name: "by selector, none found, Deny", ref: bySelector("none", deny), tier: "silver", message: noParamsSays, taken: "silver", takenDenied: true},
		{name: "by selector, none found, Allow", ref: bySelector("none", allow), tier: "gold", taken: "gold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bindings.Get(ctx, tierBinding, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b.Spec.ParamRef = tc.ref
			if _, err := bindings.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			// The API server takes the binding in through an informer: wait until its
			// answer to a write that shows it is the one this binding gives.
			wantTaken := ""
			if tc.takenDenied {
				wantTaken = tc.message
				if wantTaken == "" {
					wantTaken = "is forbidden by ConfigMap"
				}
			}
			waitAnswer(t, "binding "+tc.name, live, withTier(tc.taken), func(err error) bool {
				if wantTaken == "" {
					return err == nil
				}
				return err != nil && strings.Contains(err.Error(), wantTaken)
			})
			next := withTier(tc.tier)
			for _, w := range []identity{{"admin", cp.Config}, reader} {
				got := agree(t, w, live, next)
				if tc.message == "" {
					if len(got) != 0 {
						t.Errorf("%s: denials %+v, want none", w.name, got)
					}
					continue
				}
				if len(got) != 1 || got[0].Message != tc.message || got[0].Param != tc.param || got[0].Binding != tierBinding {
					t.Fatalf("%s: denials %+v, want one: %q naming parameter %q", w.name, got, tc.message, tc.param)
				}
				if tc.param != "" && (got[0].WayOn.Kind != admissionpolicy.WayParam || !strings.Contains(got[0].WayOn.Command, "edit configmap")) {
					t.Errorf("%s: way on %+v, want the parameter", w.name, got[0].WayOn)
				}
			}
			// May read the policies, not their parameters: not asked, never no denial.
			policies, err := load(t, blind.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := policies.Evaluate(ctx, live, next); !apierrors.IsForbidden(err) {
				t.Errorf("a user who may not read the parameters: denials %+v, error %v; want forbidden (not asked)", got, err)
			}
		})
	}
}
