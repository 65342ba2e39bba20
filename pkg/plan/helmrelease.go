package plan

import (
	"context"
	"fmt"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// HelmRelease is what a plan for a Flux HelmRelease reads: the Helm release it owns and
// where, the chart source its versions come from (rendered with the HelmRelease's
// composed values) and the CRD policy of its upgrades.
type HelmRelease struct {
	Name, Namespace string
	// Release and StorageNamespace are the Helm release helm-controller manages.
	Release, StorageNamespace string
	Source                    chartsource.Options
	Policy                    predict.Policy
}

// ReadHelmRelease resolves a HelmRelease the way helm-controller does (fluxrelease.Read).
// A HelmRelease that installs to a remote cluster (spec.kubeConfig) is not planned: the
// plan reads the local cluster.
func ReadHelmRelease(ctx context.Context, r fluxrelease.Reader, namespace, name string) (*HelmRelease, error) {
	var hr helmv2.HelmRelease
	if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &hr); err != nil {
		return nil, fmt.Errorf("HelmRelease %s/%s: %w", namespace, name, err)
	}
	if hr.Spec.KubeConfig != nil {
		plan := cmdline.Plan{Release: fluxrelease.ReleaseName(&hr), Namespace: fluxrelease.StorageNamespace(&hr)}
		return nil, &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("HelmRelease %s/%s installs to a remote cluster (spec.kubeConfig): plan its Helm release against that cluster (%s, with that cluster's kubeconfig)", namespace, name, plan)}
	}
	if hr.Spec.Chart == nil {
		return nil, &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("HelmRelease %s/%s has no spec.chart: a plan is a sequence of spec.chart.spec.version values", namespace, name)}
	}
	rel, err := fluxrelease.Read(ctx, r, &hr)
	if err != nil {
		return nil, err
	}
	return &HelmRelease{Name: name, Namespace: namespace, Release: rel.Name, StorageNamespace: rel.StorageNamespace,
		Source: rel.Source, Policy: rel.Policy}, nil
}

// VersionCommand is the step that moves a HelmRelease to a chart version: the value to
// commit, and the kubectl patch that does the same on the cluster.
func (h *HelmRelease) VersionCommand(version string) string {
	return cmdline.HelmReleaseVersion{Name: h.Name, Namespace: h.Namespace, Version: version}.String()
}
