package fluxrelease

import (
	"context"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"helm.sh/helm/v4/pkg/cli"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Request is one HelmRelease change to predict.
type Request struct {
	// HelmRelease is the object as it would be after the update.
	HelmRelease *helmv2.HelmRelease
	// Reader reads sources and Secrets on the cluster holding the HelmRelease.
	Reader Reader
	// Local is the config of that cluster, the target when spec.kubeConfig is unset.
	Local *rest.Config
	// Settings carries Helm's cache paths for fetching charts. Nil uses HELM_*.
	Settings *cli.EnvSettings
	// Cache, when set, keeps fetched charts and repository indexes between checks.
	Cache *chartsource.Cache
	// Clusters, when set, keeps each target's clients between checks: a
	// *livecluster.Clusters with its Kubernetes version and an informer's CRDs (the
	// gates), a *livecluster.Connections for the checks of one run, which share the
	// clients and the API server's answers to dry runs but keep no informer (review).
	// Nil connects for this check alone.
	Clusters Targets
	// NoObjectCounts leaves the report's object counts out (one LIST per CRD saved).
	NoObjectCounts bool
	// Recorded, when set, is the target's state as recorded elsewhere (a snapshot): the
	// prediction reads its CRDs, objects and Helm releases instead of a live cluster's,
	// through the same check. Local and Clusters are then unused, and a HelmRelease whose
	// spec.kubeConfig names another cluster is not resolved.
	Recorded Recorded
}

// Targets keeps target clusters' connections between checks, by key: implemented by
// *livecluster.Clusters and *livecluster.Connections.
type Targets interface {
	Get(ctx context.Context, key string, cfg *rest.Config, local bool) (*livecluster.Target, error)
}

// Recorded is a cluster's state read from a record of it rather than from the cluster:
// what check reads (its CRDs, object counts and objects), the server's version, and
// each namespace's Helm releases.
type Recorded interface {
	check.Cluster
	ServerVersion(ctx context.Context) (string, error)
	Releases(namespace string) (*helmrelease.Reader, error)
}

// Result is the prediction with what it was made from.
type Result struct {
	Report *check.Report
	// Operation is Upgrade, or Rollback when the incoming chart is an older version of
	// the chart the release runs now (Flux performs that as an upgrade to the older
	// chart; the CRDs meet the live storage versions exactly as in a helm rollback).
	Operation predict.Operation
	// Release and StorageNamespace name the Helm release on the target.
	Release, StorageNamespace string
	// Remote is true when the target is the kubeConfig Secret's cluster.
	Remote bool
	// Chart and Version are the resolved incoming chart; CurrentVersion is the release's
	// chart version now (empty when the release is not installed yet).
	Chart, Version, CurrentVersion string
	// LiveCRDs are the target's CRDs as check saw them, for callers that select them.
	LiveCRDs map[string]*apiextv1.CustomResourceDefinition
	// RemediationRisk names the CRDs on which helm-controller's rollback remediation
	// would be rejected if this upgrade failed after applying its CRDs. Empty when the
	// HelmRelease does not remediate by rollback or a rollback stays safe.
	RemediationRisk []string
	// UninstallRisk names the live CRDs that helm-controller's uninstall remediation would
	// delete, with every object of their types, if this upgrade failed: helm uninstall
	// deletes what the last (failed) revision's manifest lists, and the incoming chart
	// renders these CRDs from templates/ without helm.sh/resource-policy: keep.
	UninstallRisk []string
}

// Check resolves the incoming chart and the target, reads the release's current
// revision from Helm storage on the target, and predicts the change with package check.
// The chart is rendered with the values helm-controller would compose (Values). It only
// reads. A *ValuesError means helm-controller would fail the release on a spec.valuesFrom
// reference. An *UnsupportedError means the source or target is not one the gate
// resolves; any other error means the prediction could not run.
func Check(ctx context.Context, req Request) (*Result, error) {
	hr := req.HelmRelease
	o, err := open(ctx, req)
	if err != nil {
		return nil, err
	}
	rel := o.rel
	res := &Result{Release: rel.Name, StorageNamespace: rel.StorageNamespace, Remote: o.remote, Operation: predict.Upgrade}
	src := rel.Source
	src.KubeVersion, src.Settings = o.version, req.Settings
	var loader chartsource.Loader = chartsource.Helm{}
	if req.Cache != nil {
		loader = req.Cache
	}
	p, err := check.Predict(ctx, check.Sources{
		Cluster: o.cluster, Releases: o.releases, Release: res.Release, Namespace: res.StorageNamespace, ReleaseOptional: true,
		Chart: chartsource.CheckChart(loader, src), OlderIsRollback: true, Policy: rel.Policy,
		SteppingStones: &chartsource.History{Options: src, Loader: loader},
	})
	if err != nil {
		return nil, err
	}
	rep := p.Report
	res.Report, res.LiveCRDs, res.Operation = rep, p.Live, rep.Operation
	res.Chart, res.Version, res.CurrentVersion = rep.Chart, rep.ChartVersion, p.CurrentChartVersion
	deployed := rep.FromRevision > 0
	if RollbackRemediation(hr) && deployed && rep.Operation == predict.Upgrade {
		res.RemediationRisk = remediationRisk(p.Live, p.Incoming, p.Current, rel.Policy)
	}
	if UninstallRemediation(hr) && deployed {
		res.UninstallRisk = predict.Deletes(predict.ReleaseChange{Deployer: helmController, Operation: predict.Uninstall,
			Release: res.Release, Namespace: res.StorageNamespace, Live: p.Live, Current: p.Incoming})
	}
	return res, nil
}

// helmController is the Helm that helm-controller v1.6 embeds (its SDK, v4.2.2): its
// uninstall does not verify the live ownership.
var helmController = predict.HelmDeployer{Version: "4.2.2"}

// remediationRisk predicts helm-controller's rollback remediation after this upgrade: the
// live CRDs as the upgrade under policy leaves them (predict.Apply), against the current
// revision's CRDs that a rollback applies. A rollback is a Helm rollback whatever the
// HelmRelease's upgrade.crds: it applies templates/ only.
func remediationRisk(live map[string]*apiextv1.CustomResourceDefinition, incoming, current []chartcrds.CRD, policy predict.Policy) []string {
	after := predict.Apply(helmController, predict.Upgrade, live, incoming, current, policy)
	var out []string
	for _, cur := range current {
		a := after[cur.CRD.Name]
		if a == nil || !predict.PolicyHelm.Applies(cur.Source) {
			continue
		}
		if f := predict.Decide(a, predict.Incoming{CRD: cur.CRD, Source: cur.Source, Applied: true}); f.Verdict == predict.Bridge {
			out = append(out, f.Name)
		}
	}
	return out
}

// Warm reads what Check of a change to req's HelmRelease will read before its incoming
// chart is known (check.Warm): with req.Clusters set, the first Check after a start then
// reads the release and the target's objects from memory. It only reads.
func Warm(ctx context.Context, req Request) error {
	if req.Recorded != nil {
		return nil // nothing to read ahead: the record is in memory
	}
	o, err := open(ctx, req)
	if err != nil {
		return err
	}
	return check.Warm(ctx, o.kube, o.releases, o.rel.Name)
}

// opened is a HelmRelease's Helm release on its target, read before its incoming chart.
type opened struct {
	rel     *Release
	remote  bool
	cluster check.Cluster
	// kube is the live cluster (nil for a Recorded one), version its server's.
	kube     *livecluster.KubeCluster
	version  string
	releases *helmrelease.Reader
}

// open reads the HelmRelease's source and target, connects to the target and reads the
// release's revisions there through the target's memory.
func open(ctx context.Context, req Request) (*opened, error) {
	rel, err := Read(ctx, req.Reader, req.HelmRelease)
	if err != nil {
		return nil, err
	}
	if req.Recorded != nil {
		return openRecorded(ctx, req, rel)
	}
	cfg, remote, key, err := target(ctx, req.Reader, req.HelmRelease, req.Local)
	if err != nil {
		return nil, err
	}
	tgt, err := connect(ctx, req.Clusters, key, cfg, remote)
	if err != nil {
		return nil, err
	}
	reader, err := helmrelease.NewReader(tgt.Clientset, rel.StorageNamespace, helmrelease.DriverSecret)
	if err != nil {
		return nil, err
	}
	return &opened{rel: rel, remote: remote, cluster: tgt.Cluster, kube: tgt.Cluster, version: tgt.Version,
		releases: reader.WithMemory(tgt.Metadata, tgt.Releases)}, nil
}

// openRecorded is open over a Recorded cluster: the HelmRelease's own, since a record
// holds no credentials for another.
func openRecorded(ctx context.Context, req Request, rel *Release) (*opened, error) {
	if req.HelmRelease.Spec.KubeConfig != nil {
		return nil, &UnsupportedError{Reason: "spec.kubeConfig targets another cluster, which a snapshot of the HelmRelease's own cluster does not hold: take a snapshot of the target and map the HelmRelease to it"}
	}
	version, err := req.Recorded.ServerVersion(ctx)
	if err != nil {
		return nil, err
	}
	reader, err := req.Recorded.Releases(rel.StorageNamespace)
	if err != nil {
		return nil, err
	}
	return &opened{rel: rel, cluster: req.Recorded, version: version, releases: reader}, nil
}

// connect returns the target's clients and Kubernetes version: kept in clusters when
// given, else built for this check.
func connect(ctx context.Context, clusters Targets, key string, cfg *rest.Config, remote bool) (*livecluster.Target, error) {
	if clusters == nil {
		return livecluster.Connect(ctx, cfg)
	}
	return clusters.Get(ctx, key, cfg, !remote)
}
