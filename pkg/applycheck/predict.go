package applycheck

import (
	"context"

	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	release "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// Sources are what Predict reads: Helm storage, the cluster it replays the operation
// against, and the live CRDs.
type Sources struct {
	// Releases reads the release's revisions.
	Releases *helmrelease.Reader
	// Dynamic and Mapper replay the operation object by object, with dry runs.
	Dynamic dynamic.Interface
	Mapper  meta.RESTMapper
	// Clients, when set, run the uninstall's ownership and data model on the objects the
	// operation deletes (ReleaseReport.Prune).
	Clients *uninstall.Clients
	// Cluster is the live cluster of the CRD storage-version check.
	Cluster check.Cluster
}

// Request is one `helm upgrade` or `helm rollback` of a stored release, as its command
// line asks for it.
type Request struct {
	Release, Namespace string
	// Operation is OpUpgrade (when empty) or OpRollback.
	Operation Operation
	// ToRevision is a rollback's target; 0 means the revision before the last.
	ToRevision int
	Flags      Flags
	// FieldManager defaults to "helm", the Helm CLI's.
	FieldManager string
	// Chart is an upgrade's new chart and the values given to it (Values). Predict
	// renders it for the release, with those values or, when none are given, with the
	// values stored by the revision the upgrade starts from, as helm upgrade does. Set its
	// KubeVersion to the cluster's.
	Chart chartsource.Options
	// Policy is which CRDs the operation applies, for the CRD storage-version check.
	Policy check.CRDPolicy
}

// Prediction is the whole prediction of one upgrade or rollback: the replay, object by
// object (ReleaseReport), and the CRD storage-version check of the same chart.
type Prediction struct {
	*ReleaseReport
	CRDCheck *check.Report `json:"crdCheck"`
	// Safe says that both are safe: the operation applies cleanly and deletes nothing
	// dangerous, and no CRD blocks it.
	Safe bool `json:"safe"`
}

// ReplayNotAsked is Predict's error when this identity may not make the replay's dry
// runs (they are authorized as the writes they replay) but the CRD check, which needs
// none, blocks the operation: an admission policy denies a CRD, say. The operation is
// blocked whatever the replay would say, so a front end reports CRDCheck as the verdict,
// with the replay named as not asked (Err).
type ReplayNotAsked struct {
	Err      error
	CRDCheck *check.Report
}

func (e *ReplayNotAsked) Error() string { return e.Err.Error() }
func (e *ReplayNotAsked) Unwrap() error { return e.Err }

// Predict predicts an upgrade or rollback of a stored release whole. It reads the
// release's history once and, for an upgrade, reads the values given and loads and
// renders the chart once; then it replays the operation (CheckRelease) and runs the CRD
// storage-version check (check.Predict) on that same chart, stepping-stone versions
// included. It only reads. Values that cannot be read, and a chart that cannot be
// fetched, loaded or rendered, give a *chartsource.LoadError; any error means it could
// not run.
func Predict(ctx context.Context, s Sources, r Request) (*Prediction, error) {
	history, err := s.Releases.History(ctx, r.Release)
	if err != nil {
		return nil, err
	}
	rc := ReleaseCheck{Release: r.Release, Namespace: r.Namespace, History: history, Operation: r.Operation, ToRevision: r.ToRevision,
		Flags: r.Flags, FieldManager: r.FieldManager, Clients: s.Clients}
	crds := check.Sources{Cluster: s.Cluster, Releases: s.Releases, Release: r.Release, Namespace: r.Namespace, Policy: r.Policy,
		Rollback: r.Operation == OpRollback, ToRevision: r.ToRevision}
	if r.Operation != OpRollback {
		chart, ch, vals, err := r.load(ctx, history)
		if err != nil {
			return nil, err
		}
		rc.TargetManifest, rc.TargetHooks, rc.Values = ch.Manifest, ch.Hooks, vals
		// The release has revisions, so the CRD check renders for an upgrade too: the
		// chart loaded above is the one it asks for.
		crds.Chart = func(context.Context, bool) (*check.Chart, error) {
			return &check.Chart{Name: ch.Name, Version: ch.Version, CRDs: ch.CRDs, Migrations: ch.Migrations}, nil
		}
		crds.SteppingStones = &chartsource.History{Options: chart}
	}
	rel, err := CheckRelease(ctx, s.Dynamic, s.Mapper, rc)
	if err != nil {
		if apierrors.IsForbidden(err) {
			// The replay's dry runs are authorized as writes. The CRD check needs none:
			// when it blocks, that is the answer whatever the replay would say.
			if p, perr := check.Predict(ctx, crds); perr == nil && !p.Report.Safe {
				return nil, &ReplayNotAsked{Err: err, CRDCheck: p.Report}
			}
		}
		return nil, err
	}
	p, err := check.Predict(ctx, crds)
	if err != nil {
		return nil, err
	}
	return &Prediction{ReleaseReport: rel, CRDCheck: p.Report, Safe: rel.Safe && p.Report.Safe}, nil
}

// load reads the values given to an upgrade, once, and renders the chart with them for
// the release, or with the values of the revision the upgrade starts from when none are
// given. It returns the options it rendered with (the values in them already read), the
// chart, and the values given.
func (r Request) load(ctx context.Context, history []*release.Release) (chartsource.Options, *chartsource.Chart, map[string]any, error) {
	o := r.Chart
	settings := o.Settings
	if settings == nil {
		settings = helmcli.New()
	}
	given, err := o.Values.MergeValues(getter.All(settings))
	if err != nil {
		return o, nil, nil, &chartsource.LoadError{Ref: o.Ref, Step: "values", Err: err}
	}
	o.Values, o.BaseValues = values.Options{}, given
	if len(given) == 0 {
		if from := helmrelease.Deployed(history); from != nil {
			o.BaseValues = from.Config
		}
	}
	o.ReleaseName, o.Namespace, o.IsUpgrade = r.Release, r.Namespace, true
	ch, err := chartsource.Load(ctx, o)
	return o, ch, given, err
}
