package plan

import (
	"context"
	"fmt"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
)

// HelmRelease is what a plan for a Flux HelmRelease reads: the Helm release it owns and
// where, the chart source its versions come from (rendered with the HelmRelease's
// composed values) and the CRD policy of its upgrades.
type HelmRelease struct {
	Name, Namespace string
	// Release and StorageNamespace are the Helm release helm-controller manages.
	Release, StorageNamespace string
	Source                    chartsource.Options
	Policy                    check.CRDPolicy
}

// ReadHelmRelease resolves a HelmRelease the way helm-controller does (package
// fluxrelease). A HelmRelease that installs to a remote cluster (spec.kubeConfig) is not
// planned: the plan reads the local cluster.
func ReadHelmRelease(ctx context.Context, r fluxrelease.Reader, namespace, name string) (*HelmRelease, error) {
	var hr helmv2.HelmRelease
	if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &hr); err != nil {
		return nil, fmt.Errorf("HelmRelease %s/%s: %w", namespace, name, err)
	}
	if hr.Spec.KubeConfig != nil {
		return nil, &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("HelmRelease %s/%s installs to a remote cluster (spec.kubeConfig): run plan against that cluster with --release %s", namespace, name, fluxrelease.ReleaseName(&hr))}
	}
	if hr.Spec.Chart == nil {
		return nil, &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("HelmRelease %s/%s has no spec.chart: a plan is a sequence of spec.chart.spec.version values", namespace, name)}
	}
	src, err := fluxrelease.Source(ctx, r, &hr)
	if err != nil {
		return nil, err
	}
	vals, err := fluxrelease.Values(ctx, r, &hr)
	if err != nil {
		return nil, err
	}
	src.BaseValues = vals
	src.ReleaseName, src.Namespace = fluxrelease.ReleaseName(&hr), hr.GetReleaseNamespace()
	policy := check.PolicyHelm
	if fluxrelease.CRDPolicyCreateReplace(&hr) {
		policy = check.PolicyCreateReplace
	}
	return &HelmRelease{Name: name, Namespace: namespace, Release: fluxrelease.ReleaseName(&hr),
		StorageNamespace: fluxrelease.StorageNamespace(&hr), Source: src, Policy: policy}, nil
}

// VersionCommand is the step that moves a HelmRelease to a chart version: the value to
// commit, and the kubectl patch that does the same on the cluster.
func (h *HelmRelease) VersionCommand(version string) string {
	return fmt.Sprintf(`commit spec.chart.spec.version: %q to HelmRelease %s/%s (or: kubectl patch helmrelease %s -n %s --type merge -p '{"spec":{"chart":{"spec":{"version":%q}}}}')`,
		version, h.Namespace, h.Name, h.Name, h.Namespace, version)
}
