package livecluster

import (
	"cmp"
	"context"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	admissioninformers "k8s.io/client-go/informers/admissionregistration/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
)

// keptPolicies are a kept target's ValidatingAdmissionPolicies and bindings, from
// informers on both started at the first question, compiled again only when either has
// delivered a change since the last compilation. Until both have synced (or when they
// cannot: an identity that may not list them), the policies are read from the API server
// for this question, and its refusal is the answer (the question was not asked).
func (k *KubeCluster) keptPolicies(ctx context.Context) (*admissionpolicy.Policies, error) {
	policies, bindings := k.policyInformers()
	if policies == nil || bindings == nil || !k.watch.waitSynced(ctx, []*watched{policies, bindings}) ||
		!policies.inf.HasSynced() || !bindings.inf.HasSynced() {
		return admissionpolicy.Load(ctx, k.clients, k.dynamic)
	}
	version := policies.version() + "," + bindings.version()
	k.policies.Lock()
	defer k.policies.Unlock()
	if k.policies.loaded && k.policies.version == version {
		return k.policies.p, nil
	}
	p, err := admissionpolicy.From(ctx, k.clients, k.dynamic, stored[admissionregistrationv1.ValidatingAdmissionPolicy](policies),
		stored[admissionregistrationv1.ValidatingAdmissionPolicyBinding](bindings), k.policies.p.Writer())
	if err != nil {
		return nil, err
	}
	k.policies.p, k.policies.loaded, k.policies.version = p, true, version
	return p, nil
}

// policyInformers are the informers on the target's ValidatingAdmissionPolicies and
// bindings, started at the first call (keptPolicies, or the warm-up).
func (k *KubeCluster) policyInformers() (policies, bindings *watched) {
	kube := k.clients.Kube
	policies = k.watch.get("validatingadmissionpolicies", func() toolscache.SharedIndexInformer {
		return admissioninformers.NewFilteredValidatingAdmissionPolicyInformer(kube, 0, toolscache.Indexers{}, watchTweak)
	})
	bindings = k.watch.get("validatingadmissionpolicybindings", func() toolscache.SharedIndexInformer {
		return admissioninformers.NewFilteredValidatingAdmissionPolicyBindingInformer(kube, 0, toolscache.Indexers{}, watchTweak)
	})
	return policies, bindings
}

// stored are the objects of an informer's store, by name (the order a LIST gives).
func stored[T any, PT interface {
	*T
	GetName() string
}](wd *watched) []T {
	var out []T
	for _, o := range wd.inf.GetStore().List() {
		if v, ok := o.(PT); ok {
			out = append(out, *v)
		}
	}
	slices.SortFunc(out, func(a, b T) int { return cmp.Compare(PT(&a).GetName(), PT(&b).GetName()) })
	return out
}
