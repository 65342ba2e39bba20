package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// Selects reports whether the policy covers crd: its labels match Selector and its group
// is one of Groups (when either is set). An invalid Selector is an error that names the
// policy and says how to correct it.
func (p *StorageMigrationPolicy) Selects(crd *apiextv1.CustomResourceDefinition) (bool, error) {
	if len(p.Spec.Groups) > 0 && !slices.Contains(p.Spec.Groups, crd.Spec.Group) {
		return false, nil
	}
	if p.Spec.Selector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil {
		return false, fmt.Errorf("StorageMigrationPolicy %s: spec.selector is not a valid label selector: %w; correct it (%s): "+
			"label keys and values must be valid label names, In and NotIn need values, Exists and DoesNotExist take none", p.Name, err, p.edit())
	}
	return sel.Matches(labels.Set(crd.Labels)), nil
}

// TargetSelector is spec.targets.selector as a label selector, for the fleet controller
// and audit alike. An invalid one is an error that names the policy and says how to
// correct it.
func (p *StorageMigrationPolicy) TargetSelector() (labels.Selector, error) {
	if p.Spec.Targets == nil {
		return labels.Nothing(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.Targets.Selector)
	if err != nil {
		return nil, fmt.Errorf("StorageMigrationPolicy %s: spec.targets.selector is not a valid label selector: %w; correct it (%s): "+
			"label keys and values must be valid label names, In and NotIn need values, Exists and DoesNotExist take none", p.Name, err, p.edit())
	}
	return sel, nil
}

// Select is the one selection of StorageMigrationPolicies for CRDs, for the admission
// gate, the controllers and audit: for each CRD that a policy selects, the first such
// policy in name order among those accept admits (every policy when accept is nil).
// CRDs no policy selects are left out. A policy with an invalid spec.selector that the
// selection reaches is an error, whoever asks: it may be the one meant to select the CRD,
// so no policy after it is chosen in its place until it is corrected.
func Select(policies []*StorageMigrationPolicy, crds []*apiextv1.CustomResourceDefinition,
	accept func(*StorageMigrationPolicy) bool) (map[string]*StorageMigrationPolicy, error) {
	var candidates []*StorageMigrationPolicy
	for _, p := range policies {
		if accept == nil || accept(p) {
			candidates = append(candidates, p)
		}
	}
	slices.SortFunc(candidates, func(a, b *StorageMigrationPolicy) int { return strings.Compare(a.Name, b.Name) })
	selected := map[string]*StorageMigrationPolicy{}
	for _, crd := range crds {
		for _, p := range candidates {
			ok, err := p.Selects(crd)
			if err != nil {
				return nil, err
			}
			if ok {
				selected[crd.Name] = p
				break
			}
		}
	}
	return selected, nil
}

// Policies are the list's policies, for Select.
func (l *StorageMigrationPolicyList) Policies() []*StorageMigrationPolicy {
	out := make([]*StorageMigrationPolicy, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

// IsProactive is spec.proactive with its default (true).
func (p *StorageMigrationPolicy) IsProactive() bool {
	return p.Spec.Proactive == nil || *p.Spec.Proactive
}

// AutoMigrates is spec.autoMigrate with its default (true).
func (p *StorageMigrationPolicy) AutoMigrates() bool {
	return p.Spec.AutoMigrate == nil || *p.Spec.AutoMigrate
}

// LabelCluster names the target cluster of a StorageMigration that a policy's
// spec.targets made.
const LabelCluster = "upgradeguard.io/cluster"

// Labels on a StorageMigration that the admission gates create for a Flux HelmRelease:
// the controller asks helm-controller to retry that HelmRelease at once when the
// migration succeeds (reconcile.fluxcd.io/requestedAt and resetAt).
const (
	LabelHelmReleaseNamespace = "upgradeguard.io/helmrelease-namespace"
	LabelHelmReleaseName      = "upgradeguard.io/helmrelease-name"
)

// edit is the command that corrects the policy.
func (p *StorageMigrationPolicy) edit() cmdline.Edit {
	return cmdline.Edit{Resource: "storagemigrationpolicy", Name: p.Name}
}
