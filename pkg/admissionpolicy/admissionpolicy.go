// Package admissionpolicy owns what a cluster's ValidatingAdmissionPolicies decide about
// the CRD writes an upgrade or a rollback would make, evaluated here, with the API server's
// own policy code (k8s.io/apiserver's validating admission policy plugin: its matcher,
// its CEL compiler and its Validator), from the policies, bindings and parameters the
// caller may read. It needs no write and no dry run: a read-only identity gets the answer
// an admin gets. A denial is typed data (Denial): the policy, the binding, the policy's
// own message and the way on.
package admissionpolicy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/matching"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// Denial is one binding of one policy denying a CRD write (a create, an update or a
// deletion): what the API server would answer the write with (its first denial), and
// every other denial beside it.
type Denial struct {
	// Policy and Binding name the ValidatingAdmissionPolicy and its binding.
	Policy  string `json:"policy"`
	Binding string `json:"binding"`
	// Operation is the write denied: CREATE, UPDATE or DELETE.
	Operation admissionregistrationv1.OperationType `json:"operation"`
	// Message is the policy's own message (its message, or its messageExpression's value),
	// or why the policy could not be evaluated when its failurePolicy is Fail.
	Message string `json:"message"`
	// Reason is the status reason the API server answers with (Invalid unless the
	// policy's validation names another).
	Reason metav1.StatusReason `json:"reason,omitempty"`
	// Param is the parameter object the binding gave the policy ("Kind namespace/name"),
	// empty when the policy takes none. A binding's parameter is the policy's own way to
	// allow what it denies.
	Param string `json:"param,omitempty"`
	// WayOn is the way past the denial: the exception the policy's authors document
	// (Documented), the parameter, or the chart change.
	WayOn WayOn `json:"wayOn"`
}

// Unasked says why a question about admission could not be asked: the policies could
// not be read (Policies), or a dry-run write that reaches webhooks was not allowed.
type Unasked struct {
	// What was not asked, for people: "ValidatingAdmissionPolicies", "admission webhooks".
	What string `json:"what"`
	// Why is the API server's answer to the read or write that would have asked it.
	Why string `json:"why"`
}

// Writer is the identity a prediction evaluates the policies as: a policy may read
// request.userInfo (an exemption for a group, say).
type Writer = user.Info

// Policies are the ValidatingAdmissionPolicies and bindings of a cluster, compiled, and
// what evaluating them needs: the parameters' reader and the writer's identity. It is
// safe for concurrent use once loaded.
type Policies struct {
	hooks   []hook
	writer  user.Info
	dynamic dynamic.Interface
	mapper  meta.RESTMapper
	authz   *selfAuthorizer
	matcher generic.PolicyMatcher
	objects admission.ObjectInterfaces
}

// hook is one policy with its compiled validator and the bindings that name it.
type hook struct {
	policy    *admissionregistrationv1.ValidatingAdmissionPolicy
	bindings  []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	validator validating.Validator
}

// Load reads every ValidatingAdmissionPolicy and binding with the caller's rights (a
// list of each, the bindings only when a policy exists; RBAC: list on
// validatingadmissionpolicies and validatingadmissionpolicybindings in
// admissionregistration.k8s.io), asks the API server
// who the caller is when a policy is bound (a SelfSubjectReview, which every
// authenticated identity may make) and compiles each policy. A read the API server refuses is an error apierrors can
// classify (IsForbidden): the caller then reports the question as not asked.
func Load(ctx context.Context, c *kubeclient.Clients, dyn dynamic.Interface) (*Policies, error) {
	policies, err := listPolicies(ctx, c.Kube)
	if err != nil {
		return nil, err
	}
	if len(policies) == 0 {
		// A binding binds nothing without its policy: a cluster without policies (most of
		// them) costs one LIST.
		return From(ctx, c, dyn, nil, nil, nil)
	}
	bindings, err := listBindings(ctx, c.Kube)
	if err != nil {
		return nil, err
	}
	return From(ctx, c, dyn, policies, bindings, nil)
}

// From compiles policies and bindings already read (from an informer's cache, say), as
// Load does. writer, when set, is the identity the policies are evaluated as (known from
// an earlier Policies' Writer); when nil and a policy is bound, the API server is asked
// (a SelfSubjectReview).
func From(ctx context.Context, c *kubeclient.Clients, dyn dynamic.Interface, policies []admissionregistrationv1.ValidatingAdmissionPolicy,
	bindings []admissionregistrationv1.ValidatingAdmissionPolicyBinding, writer user.Info) (*Policies, error) {
	p := compile(policies, bindings, c.Kube, dyn, c.Mapper)
	if len(p.hooks) == 0 {
		return p, nil // nothing to evaluate: no need to know who writes
	}
	p.writer = writer
	if p.writer == nil {
		var err error
		if p.writer, err = whoAmI(ctx, c.Kube); err != nil {
			return nil, err
		}
	}
	p.authz.self = p.writer
	return p, nil
}

// Writer is the identity the policies are evaluated as (nil when none is bound).
func (p *Policies) Writer() user.Info {
	if p == nil {
		return nil
	}
	return p.writer
}

func listPolicies(ctx context.Context, kube kubernetes.Interface) ([]admissionregistrationv1.ValidatingAdmissionPolicy, error) {
	var out []admissionregistrationv1.ValidatingAdmissionPolicy
	for page, err := range kubeclient.Pages(ctx, kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().List, metav1.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list ValidatingAdmissionPolicies: %w", err)
		}
		out = append(out, page.Items...)
	}
	return out, nil
}

func listBindings(ctx context.Context, kube kubernetes.Interface) ([]admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	var out []admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for page, err := range kubeclient.Pages(ctx, kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List, metav1.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list ValidatingAdmissionPolicyBindings: %w", err)
		}
		out = append(out, page.Items...)
	}
	return out, nil
}

// whoAmI is the caller's identity as the API server authenticates it.
func whoAmI(ctx context.Context, kube kubernetes.Interface) (user.Info, error) {
	r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("ask the API server who this identity is (a SelfSubjectReview): %w", err)
	}
	u := r.Status.UserInfo
	extra := map[string][]string{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	return &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra}, nil
}

// compile compiles each policy and joins its bindings to it, as the API server's policy
// source does (bindings whose policy does not exist bind nothing).
func compile(policies []admissionregistrationv1.ValidatingAdmissionPolicy, bindings []admissionregistrationv1.ValidatingAdmissionPolicyBinding,
	kube kubernetes.Interface, dyn dynamic.Interface, mapper meta.RESTMapper) *Policies {
	p := &Policies{dynamic: dyn, mapper: mapper, authz: &selfAuthorizer{kube: kube},
		// CRDs are cluster-scoped: the matcher never reads a namespace for them.
		matcher: generic.NewPolicyMatcher(matching.NewMatcher(nil, kube)),
		objects: admission.NewObjectInterfacesFromScheme(scheme)}
	for i := range policies {
		h := hook{policy: &policies[i], validator: compilePolicy(&policies[i])}
		for j := range bindings {
			if bindings[j].Spec.PolicyName == policies[i].Name {
				h.bindings = append(h.bindings, &bindings[j])
			}
		}
		if len(h.bindings) > 0 {
			p.hooks = append(p.hooks, h)
		}
	}
	return p
}

// Len is how many policies are bound.
func (p *Policies) Len() int {
	if p == nil {
		return 0
	}
	return len(p.hooks)
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := apiextv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

var (
	crdKind     = apiextv1.SchemeGroupVersion.WithKind("CustomResourceDefinition")
	crdResource = apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
)

// Evaluate returns the denials of every bound policy that matches writing next over live
// (nil live: a create; nil next: the deletion of live), in the order the policies and
// bindings were listed. The object the policies see is the one the API server would
// store: next's spec, next's labels and annotations over the live ones (a Helm patch
// keeps what others added), the live identity and status, and the API server's
// defaults. A deletion's policies see the live CRD as oldObject and a null object, as the
// API server's DELETE does. A policy whose parameters cannot be read is an error (the
// question was not asked), unless its failurePolicy is Ignore.
func (p *Policies) Evaluate(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]Denial, error) {
	if p == nil || len(p.hooks) == 0 || (live == nil && next == nil) {
		return nil, nil
	}
	attrs, name := p.attributes(live, next)
	var out []Denial
	for _, h := range p.hooks {
		d, err := p.evaluate(ctx, h, attrs)
		if err != nil {
			return nil, fmt.Errorf("evaluate ValidatingAdmissionPolicy %s for CRD %s: %w", h.policy.Name, name, err)
		}
		out = append(out, d...)
	}
	return out, nil
}

// attributes are the admission attributes of writing next over live (nil live: a create;
// nil next: a deletion), as the API server makes them for the writer, and the CRD's name.
func (p *Policies) attributes(live, next *apiextv1.CustomResourceDefinition) (admission.Attributes, string) {
	if next == nil {
		old := live.DeepCopy()
		old.TypeMeta = metav1.TypeMeta{APIVersion: apiextv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"}
		return admission.NewAttributesRecord(nil, old, crdKind, "", live.Name, crdResource, "", admission.Delete,
			&metav1.DeleteOptions{}, false, p.writer), live.Name
	}
	obj, old := written(live, next)
	op := admission.Create
	var oldObj runtime.Object
	var opts runtime.Object = &metav1.CreateOptions{}
	if old != nil {
		op, oldObj, opts = admission.Update, old, &metav1.UpdateOptions{}
	}
	return admission.NewAttributesRecord(obj, oldObj, crdKind, "", next.Name, crdResource, "", op, opts, false, p.writer), next.Name
}

// evaluate is one policy's denials, as the API server's dispatcher makes them
// (validating.dispatcher.Dispatch): the policy and each binding must match, each binding's
// parameters are read, and each denying decision of a binding whose validationActions
// hold Deny is a denial (Warn and Audit never deny).
func (p *Policies) evaluate(ctx context.Context, h hook, attrs admission.Attributes) ([]Denial, error) {
	matches, matchResource, matchKind, err := p.matcher.DefinitionMatches(attrs, p.objects, validating.NewValidatingAdmissionPolicyAccessor(h.policy))
	if err != nil {
		return configError(h, nil, attrs, err), nil
	}
	if !matches {
		return nil, nil
	}
	if err := h.validator.CompileError(); err != nil {
		return configError(h, nil, attrs, err), nil
	}
	versioned, err := admission.NewVersionedAttributes(attrs, matchKind, p.objects)
	if err != nil {
		return nil, err
	}
	var out []Denial
	for _, b := range h.bindings {
		ok, err := p.matcher.BindingMatches(attrs, p.objects, validating.NewValidatingAdmissionPolicyBindingAccessor(b))
		if err != nil {
			out = append(out, configError(h, b, attrs, err)...)
			continue
		}
		if !ok || !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
			continue
		}
		params, err := p.params(ctx, h.policy, b)
		if err != nil {
			if apierrors.IsForbidden(err) {
				return nil, err // not asked: the caller may not read the parameters
			}
			out = append(out, configError(h, b, attrs, err)...)
			continue
		}
		for _, param := range params {
			res := h.validator.Validate(ctx, matchResource, versioned, param.obj, nil, celconfig.RuntimeCELCostBudget, p.authz)
			for _, d := range res.Decisions {
				if d.Action != validating.ActionDeny {
					continue
				}
				reason := d.Reason
				if reason == "" {
					reason = metav1.StatusReasonInvalid
				}
				den := Denial{Policy: h.policy.Name, Binding: b.Name, Operation: operation(attrs), Message: d.Message, Reason: reason, Param: param.name}
				den.WayOn = wayOn(h.policy, b, den)
				out = append(out, den)
			}
		}
	}
	return out, nil
}

// configError is what the API server answers when a policy or binding cannot be
// evaluated: a denial under failurePolicy Fail (the default), nothing under Ignore.
func configError(h hook, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, attrs admission.Attributes, err error) []Denial {
	if fp := h.policy.Spec.FailurePolicy; fp != nil && *fp == admissionregistrationv1.Ignore {
		return nil
	}
	d := Denial{Policy: h.policy.Name, Operation: operation(attrs), Reason: metav1.StatusReasonInvalid}
	if b == nil {
		d.Message = fmt.Errorf("failed to configure policy: %w", err).Error()
	} else {
		d.Binding = b.Name
		d.Message = fmt.Errorf("failed to configure binding: %w", err).Error()
	}
	d.WayOn = wayOn(h.policy, b, d)
	return []Denial{d}
}

// operation is the write of attrs as a policy's rules name it (CREATE, UPDATE, DELETE).
func operation(attrs admission.Attributes) admissionregistrationv1.OperationType {
	return admissionregistrationv1.OperationType(attrs.GetOperation())
}

// written is the object and old object the API server's admission sees for writing next
// over live.
func written(live, next *apiextv1.CustomResourceDefinition) (obj, old *apiextv1.CustomResourceDefinition) {
	obj = next.DeepCopy()
	obj.TypeMeta = metav1.TypeMeta{APIVersion: apiextv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"}
	obj.Status = apiextv1.CustomResourceDefinitionStatus{}
	if live != nil {
		old = live.DeepCopy()
		old.TypeMeta = obj.TypeMeta
		obj.UID, obj.ResourceVersion, obj.Generation = live.UID, live.ResourceVersion, live.Generation
		obj.CreationTimestamp, obj.ManagedFields = live.CreationTimestamp, live.ManagedFields
		obj.Labels = overlay(live.Labels, next.Labels)
		obj.Annotations = overlay(live.Annotations, next.Annotations)
		obj.Status = *live.Status.DeepCopy()
	}
	apiextv1.SetObjectDefaults_CustomResourceDefinition(obj)
	return obj, old
}

// overlay is base with top's keys set over it.
func overlay(base, top map[string]string) map[string]string {
	if len(base) == 0 {
		return maps.Clone(top)
	}
	out := maps.Clone(base)
	maps.Copy(out, top)
	return out
}

// Names are the policies that deny, each once, in order.
func Names(ds []Denial) []string {
	var out []string
	for _, d := range ds {
		if !slices.Contains(out, d.Policy) {
			out = append(out, d.Policy)
		}
	}
	return out
}

// Message words denials in one line, for a verdict's reason.
func Message(ds []Denial) string {
	parts := make([]string, 0, len(ds))
	for _, d := range ds {
		s := fmt.Sprintf("ValidatingAdmissionPolicy %s", d.Policy)
		if d.Binding != "" {
			s += fmt.Sprintf(" (binding %s)", d.Binding)
		}
		parts = append(parts, s+" denies the "+d.Write()+": "+d.Message)
	}
	return strings.Join(parts, "; ")
}

// Write words the write denied, for people: "deletion" or "write".
func (d Denial) Write() string {
	if d.Operation == admissionregistrationv1.Delete {
		return "deletion"
	}
	return "write"
}

// Deletion reports whether the denial is of a deletion.
func (d Denial) Deletion() bool { return d.Operation == admissionregistrationv1.Delete }

// Deletions reports whether any of the denials is of a deletion.
func Deletions(ds []Denial) bool { return slices.ContainsFunc(ds, Denial.Deletion) }

// errNoParamKind is a binding's paramRef whose policy's paramKind no resource serves.
var errNoParamKind = errors.New("paramKind is not served")

// resourceOf maps a policy's paramKind to its resource and scope.
func (p *Policies) resourceOf(kind *admissionregistrationv1.ParamKind) (schema.GroupVersionResource, meta.RESTScope, error) {
	gv, err := schema.ParseGroupVersion(kind.APIVersion)
	if err != nil {
		return schema.GroupVersionResource{}, nil, err
	}
	if p.mapper == nil {
		return schema.GroupVersionResource{}, nil, fmt.Errorf("%w: %s %s", errNoParamKind, kind.APIVersion, kind.Kind)
	}
	m, err := p.mapper.RESTMapping(gv.WithKind(kind.Kind).GroupKind(), gv.Version)
	if err != nil {
		return schema.GroupVersionResource{}, nil, fmt.Errorf("%w: %s %s: %w", errNoParamKind, kind.APIVersion, kind.Kind, err)
	}
	return m.Resource, m.Scope, nil
}
