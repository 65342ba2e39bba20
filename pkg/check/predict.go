package check

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// Chart is the incoming chart of an upgrade, as a ChartLoader returns it.
type Chart struct {
	Name, Version string
	CRDs          []chartcrds.CRD
	// Migrations are the StorageVersionMigrations the chart renders
	// (chartcrds.MigrationsFromManifest).
	Migrations []chartcrds.Migration
}

// ChartLoader loads and renders the incoming chart of an upgrade. upgrade says whether the
// release already has a revision (the chart is then rendered with .Release.IsUpgrade).
type ChartLoader func(ctx context.Context, upgrade bool) (*Chart, error)

// Sources are what one prediction reads: the live cluster, the release's revisions in
// Helm storage and the incoming chart. Every front end (the CLI's check, the HelmRelease
// gate, a Go program) builds its prediction from these with Predict, so the same release
// and chart get the same report and the same next steps everywhere.
type Sources struct {
	// Cluster is the live cluster.
	Cluster Cluster
	// Live are CRDs as the caller knows them live, fresher than Cluster's view (which
	// may be an informer's): an admission request's old object is the API server's own.
	// They replace Cluster's CRDs of the same names.
	Live []*apiextv1.CustomResourceDefinition
	// Releases reads the release's revisions. Nil predicts without a release (no CRD is
	// found deleted, and the chart renders as a first install).
	Releases *helmrelease.Reader
	// Release and Namespace name the release (and what the actions name).
	Release, Namespace string
	// ReleaseOptional predicts an upgrade of a release with no revision yet as a first
	// install, instead of failing with *helmrelease.NotFoundError.
	ReleaseOptional bool

	// Record is a release revision about to be stored: the record every Helm client
	// (the CLI, helm-controller, Terraform, SDK operators) writes with status
	// pending-install, pending-upgrade or pending-rollback before it applies anything of
	// the revision. Its chart and manifest are the incoming side; a pending-rollback is
	// predicted as a rollback from the release's last revision, the others as an upgrade
	// from the deployed one (read through Releases). Chart and Rollback are ignored.
	Record *release.Release

	// Rollback predicts a rollback to ToRevision (0: the previous revision, as helm
	// rollback) instead of an upgrade to Chart.
	Rollback   bool
	ToRevision int
	// Chart loads the incoming chart of an upgrade.
	Chart ChartLoader
	// OlderIsRollback predicts an upgrade to an older version of the chart the release
	// runs as a rollback (Flux moves back that way: the CRDs meet the live storage
	// versions exactly as in a helm rollback).
	OlderIsRollback bool

	Policy CRDPolicy
	// Deployer runs the operation (Request.Deployer).
	Deployer predict.Deployer
	// Current are the CRDs the deployment applies today, for a caller that has no
	// Helm release to read them from (Releases nil).
	Current []chartcrds.CRD
	// SteppingStones, when set, is searched for a stepping-stone chart version when an
	// upgrade needs a bridge (chartsource.History is one).
	SteppingStones History
	// NoObjectCounts skips counting each CRD's objects (Request.NoObjectCounts).
	NoObjectCounts bool
	// NoAdmission skips asking the API server whether it accepts each incoming CRD
	// (Request.NoAdmission).
	NoAdmission bool
	// Upgrade words moving the deployment to a chart version (Request.Upgrade).
	Upgrade func(chartVersion string) string
	// ChartRef names the incoming chart as the user did (Request.ChartRef).
	ChartRef string
}

// Prediction is a Report with what it was made from, for callers that look further
// (the gate selects the live CRDs; fluxrelease predicts remediation).
type Prediction struct {
	Report *Report
	// Live are the cluster's CRDs as the prediction read them.
	Live map[string]*apiextv1.CustomResourceDefinition
	// Incoming and Current are the CRDs of the incoming side and of the release today
	// (nil without a release).
	Incoming, Current []chartcrds.CRD
	// CurrentChartVersion is the chart version the release runs (empty without one).
	CurrentChartVersion string
}

// ErrNoChart says that an upgrade was asked for with no incoming chart.
var ErrNoChart = errors.New("no incoming chart: an upgrade needs the chart it upgrades to (a rollback reads it from the release)")

// ErrRollbackNeedsRelease says that a rollback was asked for with no release to read.
var ErrRollbackNeedsRelease = errors.New("a rollback needs the release whose revisions it moves between")

// Predict reads the release and the chart, and predicts the upgrade or rollback against
// the live cluster. It only reads.
func Predict(ctx context.Context, s Sources) (*Prediction, error) {
	req := Request{Operation: predict.Upgrade, Policy: s.Policy, Deployer: s.Deployer, Release: s.Release, Namespace: s.Namespace, Current: s.Current,
		NoObjectCounts: s.NoObjectCounts, NoAdmission: s.NoAdmission, Upgrade: s.Upgrade, ChartRef: s.ChartRef}
	p := &Prediction{}
	if s.Record != nil {
		if err := s.record(ctx, &req, p); err != nil {
			return nil, err
		}
	} else if s.Rollback {
		if err := s.rollback(ctx, &req, p); err != nil {
			return nil, err
		}
	} else if err := s.upgrade(ctx, &req, p); err != nil {
		return nil, err
	}
	cluster := &recordingCluster{Cluster: s.Cluster, known: s.Live}
	rep, err := Run(ctx, cluster, req)
	if err != nil {
		return nil, err
	}
	p.Report, p.Live, p.Incoming, p.Current = rep, cluster.live, req.Incoming, req.Current
	return p, nil
}

func (s Sources) rollback(ctx context.Context, req *Request, p *Prediction) error {
	if s.Releases == nil {
		return ErrRollbackNeedsRelease
	}
	current, target, err := s.Releases.RollbackPair(ctx, s.Release, s.ToRevision)
	if err != nil {
		return err
	}
	req.Operation, req.FromRevision, req.ToRevision = predict.Rollback, current.Version, target.Version
	if target.Chart != nil && target.Chart.Metadata != nil {
		req.Chart, req.ChartVersion = target.Chart.Metadata.Name, target.Chart.Metadata.Version
	}
	if req.Incoming, err = chartcrds.All(target.Chart, target.Manifest); err != nil {
		return fmt.Errorf("revision %d of release %s: %w", target.Version, s.Release, err)
	}
	if req.Migrations, err = chartcrds.MigrationsFromManifest(target.Manifest); err != nil {
		return fmt.Errorf("revision %d of release %s: %w", target.Version, s.Release, err)
	}
	return s.current(current, req, p)
}

func (s Sources) record(ctx context.Context, req *Request, p *Prediction) error {
	rec := s.Record
	var current *release.Release
	if s.Releases != nil {
		h, err := s.Releases.History(ctx, s.Release)
		var nf *helmrelease.NotFoundError
		if err != nil && !errors.As(err, &nf) {
			return err
		}
		// The record is not stored yet; a retried create may find it already there.
		h = slices.DeleteFunc(h, func(r *release.Release) bool { return r.Version >= rec.Version })
		if rec.Info != nil && rec.Info.Status == common.StatusPendingRollback {
			if len(h) > 0 {
				current = h[len(h)-1]
			}
			req.Operation, req.ToRevision = predict.Rollback, helmrelease.RollbackTarget(rec)
		} else {
			current = helmrelease.Deployed(h)
		}
	}
	if current != nil {
		if err := s.current(current, req, p); err != nil {
			return err
		}
	}
	if rec.Chart != nil && rec.Chart.Metadata != nil {
		req.Chart, req.ChartVersion = rec.Chart.Metadata.Name, rec.Chart.Metadata.Version
	}
	var err error
	if req.Incoming, err = chartcrds.All(rec.Chart, rec.Manifest); err != nil {
		return fmt.Errorf("revision %d of release %s: %w", rec.Version, s.Release, err)
	}
	if req.Migrations, err = chartcrds.MigrationsFromManifest(rec.Manifest); err != nil {
		return fmt.Errorf("revision %d of release %s: %w", rec.Version, s.Release, err)
	}
	if req.Operation != predict.Rollback {
		req.History = s.SteppingStones
	}
	return nil
}

func (s Sources) upgrade(ctx context.Context, req *Request, p *Prediction) error {
	if s.Chart == nil {
		return ErrNoChart
	}
	var current *release.Release
	var key string
	if s.Releases != nil {
		var err error
		current, key, err = s.Releases.Deployed(ctx, s.Release)
		var nf *helmrelease.NotFoundError
		if err != nil && (!errors.As(err, &nf) || !s.ReleaseOptional) {
			return err
		}
	}
	if current != nil {
		if err := s.currentMemo(current, key, req, p); err != nil {
			return err
		}
	}
	ch, err := s.Chart(ctx, current != nil)
	if err != nil {
		return err
	}
	req.Incoming, req.Migrations, req.Chart, req.ChartVersion = ch.CRDs, ch.Migrations, ch.Name, ch.Version
	req.History = s.SteppingStones
	if s.OlderIsRollback && current != nil && current.Chart != nil && current.Chart.Metadata != nil &&
		current.Chart.Metadata.Name == ch.Name && Older(ch.Version, p.CurrentChartVersion) {
		history, err := s.Releases.History(ctx, s.Release)
		if err != nil {
			return err
		}
		req.Operation, req.ToRevision = predict.Rollback, revisionOf(history, ch.Name, ch.Version)
	}
	return nil
}

// currentMemo is current through the cluster's Memory: the CRDs of a stored revision
// that has not changed since they were read are not read again.
func (s Sources) currentMemo(current *release.Release, key string, req *Request, p *Prediction) error {
	memo := s.Cluster.Memory()
	if memo == nil || key == "" {
		return s.current(current, req, p)
	}
	if v, ok := memo.revisions.Get(key); ok {
		req.FromRevision, req.Current = current.Version, v.([]chartcrds.CRD)
		if current.Chart != nil && current.Chart.Metadata != nil {
			p.CurrentChartVersion = current.Chart.Metadata.Version
		}
		return nil
	}
	if err := s.current(current, req, p); err != nil {
		return err
	}
	memo.revisions.Add(key, req.Current)
	return nil
}

func (s Sources) current(current *release.Release, req *Request, p *Prediction) error {
	req.FromRevision = current.Version
	var err error
	if req.Current, err = chartcrds.All(current.Chart, current.Manifest); err != nil {
		return fmt.Errorf("revision %d of release %s: %w", current.Version, s.Release, err)
	}
	if current.Chart != nil && current.Chart.Metadata != nil {
		p.CurrentChartVersion = current.Chart.Metadata.Version
	}
	return nil
}

// revisionOf is the newest revision that ran chart@version, so the rollback action can
// name it; 0 when none did.
func revisionOf(h []*release.Release, chart, version string) int {
	for i := len(h) - 1; i >= 0; i-- {
		if m := h[i].Chart; m != nil && m.Metadata != nil && m.Metadata.Name == chart && m.Metadata.Version == version {
			return h[i].Version
		}
	}
	return 0
}

// Older reports whether version is a lower semver than than; false when either does not
// parse.
func Older(version, than string) bool {
	a, err1 := semver.NewVersion(version)
	b, err2 := semver.NewVersion(than)
	if err1 != nil || err2 != nil {
		return false
	}
	return a.LessThan(b)
}

// recordingCluster keeps the CRDs Run read, so callers select them without a second
// LIST.
type recordingCluster struct {
	Cluster
	known []*apiextv1.CustomResourceDefinition // Sources.Live
	mu    sync.Mutex
	live  map[string]*apiextv1.CustomResourceDefinition
}

func (r *recordingCluster) CRDs(ctx context.Context) (map[string]*apiextv1.CustomResourceDefinition, error) {
	m, err := r.Cluster.CRDs(ctx)
	if err == nil && len(r.known) > 0 {
		m = maps.Clone(m)
		if m == nil {
			m = map[string]*apiextv1.CustomResourceDefinition{}
		}
		for _, c := range r.known {
			m[c.Name] = c
		}
	}
	r.mu.Lock()
	r.live = m
	r.mu.Unlock()
	return m, err
}

// MigrationsInProgress passes the question on when the wrapped Cluster can answer it.
func (r *recordingCluster) MigrationsInProgress(ctx context.Context) (map[string][]svm.Migration, error) {
	if ml, ok := r.Cluster.(MigrationLister); ok {
		return ml.MigrationsInProgress(ctx)
	}
	return map[string][]svm.Migration{}, nil
}

// ExistingMigrations passes the question on when the wrapped Cluster can answer it.
func (r *recordingCluster) ExistingMigrations(ctx context.Context) (map[string]svm.Existing, bool, error) {
	if el, ok := r.Cluster.(ExistingMigrationLister); ok {
		return el.ExistingMigrations(ctx)
	}
	return nil, false, nil
}

// ServerVersion passes the question on when the wrapped Cluster can answer it ("" otherwise:
// the version is not known).
func (r *recordingCluster) ServerVersion(ctx context.Context) (string, error) {
	if s, ok := r.Cluster.(Server); ok {
		return s.ServerVersion(ctx)
	}
	return "", nil
}

// AdmitCRD passes the question on when the wrapped Cluster can answer it (nil otherwise:
// not asked).
func (r *recordingCluster) AdmitCRD(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) (*crdschema.Refusal, error) {
	if s, ok := r.Cluster.(Server); ok {
		return s.AdmitCRD(ctx, live, next)
	}
	return nil, nil
}

// SkeletonObjects passes on whether the wrapped Cluster's objects are skeletons.
func (r *recordingCluster) SkeletonObjects() bool { return skeletons(r.Cluster) }

// PolicyDenials passes the question on when the wrapped Cluster can answer it (nil
// otherwise: no policy evaluated).
func (r *recordingCluster) PolicyDenials(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error) {
	if pe, ok := r.Cluster.(PolicyEvaluator); ok {
		return pe.PolicyDenials(ctx, live, next)
	}
	return nil, nil
}

// ListObjects passes the schema check's reads on when the wrapped Cluster can answer them.
func (r *recordingCluster) ListObjects(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	if ol, ok := r.Cluster.(ObjectLister); ok {
		return ol.ListObjects(ctx, gvr, opts)
	}
	return &unstructured.UnstructuredList{}, nil
}
