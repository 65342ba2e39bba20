package admissionpolicy

import (
	"context"
	"errors"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// param is one parameter object a binding gives its policy, with its name for the
// report ("" and nil obj: the policy takes none).
type param struct {
	obj  runtime.Object
	name string
}

// params reads a binding's parameters with the caller's rights, as the API server's
// generic.CollectParams decides them: none needed gives one nil parameter; a paramRef
// by name reads that object, by selector lists them; none found is an error when the
// binding's parameterNotFoundAction is Deny, and no evaluation at all when it is Allow.
// A read the API server forbids is returned as it is (the question was not asked).
func (p *Policies) params(ctx context.Context, policy *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) ([]param, error) {
	kind, ref := policy.Spec.ParamKind, b.Spec.ParamRef
	if kind == nil || ref == nil {
		return []param{{}}, nil
	}
	gvr, scope, err := p.resourceOf(kind)
	if err != nil {
		return nil, err
	}
	if ref.Namespace != "" && scope.Name() == meta.RESTScopeNameRoot {
		return nil, errors.New("paramRef.namespace must not be provided for a cluster-scoped `paramKind`")
	}
	if scope.Name() == meta.RESTScopeNameNamespace && ref.Namespace == "" {
		// A CRD is cluster-scoped: the request has no namespace to default to.
		return nil, errors.New("cannot use namespaced paramRef in policy binding that matches cluster-scoped resources")
	}
	r := p.dynamic.Resource(gvr).Namespace(ref.Namespace)
	var out []param
	switch {
	case ref.Name != "":
		obj, err := r.Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			out = append(out, param{obj: obj, name: paramName(kind.Kind, ref.Namespace, ref.Name)})
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("read parameter %s: %w", paramName(kind.Kind, ref.Namespace, ref.Name), err)
		}
	case ref.Selector != nil:
		sel, err := metav1.LabelSelectorAsSelector(ref.Selector)
		if err != nil {
			return nil, err
		}
		list, err := r.List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return nil, fmt.Errorf("list parameters %s: %w", kind.Kind, err)
		}
		for i := range list.Items {
			out = append(out, param{obj: &list.Items[i], name: paramName(kind.Kind, list.Items[i].GetNamespace(), list.Items[i].GetName())})
		}
	default:
		return nil, errors.New("one of name or selector must be provided")
	}
	if len(out) == 0 && ref.ParameterNotFoundAction != nil && *ref.ParameterNotFoundAction == admissionregistrationv1.DenyAction {
		return nil, errors.New("no params found for policy binding with `Deny` parameterNotFoundAction")
	}
	return out, nil
}

// paramName is "Kind namespace/name", or "Kind name" when cluster-scoped.
func paramName(kind, namespace, name string) string {
	if namespace == "" {
		return kind + " " + name
	}
	return kind + " " + namespace + "/" + name
}
