// Package crdguard owns the CRD deletion guard as admission policies, which the API
// server evaluates itself with no webhook, TLS or running controller: two
// ValidatingAdmissionPolicies and their bindings.
//
//   - Deletion refuses the DELETE of a CustomResourceDefinition labelled
//     LabelHoldsObjects=true, unless it is annotated predict.AllowDeleteAnnotation=true.
//     The denial names the runbook and the annotation.
//   - Label lets only upgradeguard's ServiceAccount take LabelHoldsObjects=true off a
//     CRD, so that the label cannot be removed to get around Deletion.
//
// A policy cannot count objects: the controller keeps the label true on every CRD that
// holds objects, from its informers (internal/controller, HoldsObjectsReconciler). The
// label lags a create or the last delete by the time the controller takes to see it:
// docs/operator-guide.md states the bound and the race, and what closes it (the
// webhook, which counts live, beside the policy).
//
// The chart ships these objects (templates/crd-deletion-policy.yaml, compared with
// Objects in its test) when crdDeletion.mode is policy or both.
package crdguard

import (
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// LabelHoldsObjects says, set to "true" on a CRD, that the CRD holds objects. The
// controller sets it when the first object is created and removes it when the last one
// is deleted; only its ServiceAccount may remove it (the Label policy).
const LabelHoldsObjects = "upgradeguard.io/holds-objects"

// LabelGate set to "off" on a CRD keeps it from the guard: the policies' objectSelector
// skips it, as the webhook's does (the break-glass switch).
const LabelGate = "upgradeguard.io/gate"

// Runbook is the runbook a denial names.
const Runbook = "docs/runbooks/crd-delete-denied.md"

// Name is the name of the deletion policy and its binding unless Options.Name names
// them; the label policy and its binding are named Name + "-label".
const Name = "upgradeguard-crd-deletion"

// Options shape the objects.
type Options struct {
	// Name of the deletion policy and its binding (default Name); the label policy's is
	// Name + "-label".
	Name string
	// ServiceAccountNamespace and ServiceAccountName are upgradeguard's ServiceAccount,
	// the only identity that may remove LabelHoldsObjects.
	ServiceAccountNamespace, ServiceAccountName string
	// Labels go on every object.
	Labels map[string]string
	// Annotations go on every object (the chart's helm.sh/resource-policy: keep).
	Annotations map[string]string
}

// Policies are the objects of the guard.
type Policies struct {
	Deletion        *admissionregistrationv1.ValidatingAdmissionPolicy
	DeletionBinding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Label           *admissionregistrationv1.ValidatingAdmissionPolicy
	LabelBinding    *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// List is the policies and their bindings, in the order to create them (a binding names
// its policy).
func (p Policies) List() ([]*admissionregistrationv1.ValidatingAdmissionPolicy, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	return []*admissionregistrationv1.ValidatingAdmissionPolicy{p.Deletion, p.Label},
		[]*admissionregistrationv1.ValidatingAdmissionPolicyBinding{p.DeletionBinding, p.LabelBinding}
}

// Objects are the policies and bindings for o.
func Objects(o Options) Policies {
	name := o.Name
	if name == "" {
		name = Name
	}
	meta := func(kind, name string) (metav1.TypeMeta, metav1.ObjectMeta) {
		return metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: kind},
			metav1.ObjectMeta{Name: name, Labels: o.Labels, Annotations: o.Annotations}
	}
	policy := func(name string, op admissionregistrationv1.OperationType, v admissionregistrationv1.Validation) *admissionregistrationv1.ValidatingAdmissionPolicy {
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: crds(op),
			Validations:      []admissionregistrationv1.Validation{v},
		}}
		p.TypeMeta, p.ObjectMeta = meta("ValidatingAdmissionPolicy", name)
		return p
	}
	binding := func(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
		b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		}}
		b.TypeMeta, b.ObjectMeta = meta("ValidatingAdmissionPolicyBinding", name)
		return b
	}
	sa := serviceaccount.MakeUsername(o.ServiceAccountNamespace, o.ServiceAccountName)
	return Policies{
		Deletion:        policy(name, admissionregistrationv1.Delete, deletion()),
		DeletionBinding: binding(name),
		Label:           policy(name+"-label", admissionregistrationv1.Update, label(sa, name)),
		LabelBinding:    binding(name + "-label"),
	}
}

// crds matches op on CustomResourceDefinitions (not their status), but those labelled
// LabelGate=off.
func crds(op admissionregistrationv1.OperationType) *admissionregistrationv1.MatchResources {
	return &admissionregistrationv1.MatchResources{
		MatchPolicy: ptr.To(admissionregistrationv1.Equivalent),
		ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: LabelGate, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"off"}}}},
		ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{op},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"apiextensions.k8s.io"}, APIVersions: []string{"v1"},
				Resources: []string{"customresourcedefinitions"}, Scope: ptr.To(admissionregistrationv1.ClusterScope)},
		}}},
	}
}

// holds is the CEL that the CRD obj (object or oldObject) carries LabelHoldsObjects=true.
func holds(obj string) string {
	return obj + ".metadata.?labels[?" + quote(LabelHoldsObjects) + "].orValue('') == 'true'"
}

// deletion refuses a CRD that holds objects and is not annotated to go with them.
func deletion() admissionregistrationv1.Validation {
	const placeholder = "CRD_NAME_PLACEHOLDER"
	name := "' + oldObject.metadata.name + '"
	allow := strings.ReplaceAll(escape(predict.AllowDelete([]string{placeholder}).String()), placeholder, name)
	return admissionregistrationv1.Validation{
		Expression: "!(" + holds("oldObject") + ") || oldObject.metadata.?annotations[?" + quote(predict.AllowDeleteAnnotation) + "].orValue('') == 'true'",
		MessageExpression: "'CustomResourceDefinition " + name + " holds objects (label " + LabelHoldsObjects + "=true, kept by upgradeguard): " +
			"deleting it deletes every one of them, for good. Back them up and delete them first (" + Runbook + "); " +
			"to delete the CRD with its objects: " + allow + ", then delete it again'",
		Reason: ptr.To(metav1.StatusReasonForbidden),
	}
}

// label lets only sa take LabelHoldsObjects=true off a CRD.
func label(sa, deletionPolicy string) admissionregistrationv1.Validation {
	return admissionregistrationv1.Validation{
		Expression: "!(" + holds("oldObject") + ") || " + holds("object") + " || request.userInfo.username == " + quote(sa),
		MessageExpression: "'only upgradeguard (" + sa + ") removes label " + LabelHoldsObjects + " from CustomResourceDefinition ' + oldObject.metadata.name + ': " +
			"it marks a CRD that holds objects, whose deletion ValidatingAdmissionPolicy " + deletionPolicy + " refuses, and upgradeguard removes it once the CRD holds none. " +
			"An update that replaces the whole CRD must carry the label over (read the CRD first, or apply server-side); " +
			"to delete the CRD with its objects, see " + Runbook + "'",
		Reason: ptr.To(metav1.StatusReasonForbidden),
	}
}

// quote is s as a CEL string literal.
func quote(s string) string { return "'" + escape(s) + "'" }

// escape is s escaped for the inside of a single-quoted CEL string literal.
func escape(s string) string {
	q := strconv.Quote(s)
	return strings.ReplaceAll(q[1:len(q)-1], "'", `\'`)
}
