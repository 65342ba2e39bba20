package v1alpha1

import (
	"fmt"
	"slices"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Selects reports whether the policy covers crd: its labels match Selector and its group
// is one of Groups (when either is set).
func (p *StorageMigrationPolicy) Selects(crd *apiextv1.CustomResourceDefinition) (bool, error) {
	if len(p.Spec.Groups) > 0 && !slices.Contains(p.Spec.Groups, crd.Spec.Group) {
		return false, nil
	}
	if p.Spec.Selector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil {
		return false, fmt.Errorf("StorageMigrationPolicy %s: spec.selector: %w", p.Name, err)
	}
	return sel.Matches(labels.Set(crd.Labels)), nil
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
