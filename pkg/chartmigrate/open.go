package chartmigrate

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// Request is one migration of a release to another chart: what Open plans, or resumes.
type Request struct {
	// Release is the old release; NewRelease the name the new chart is installed as.
	Release, NewRelease, Namespace string
	// NewChart, NewChartVersion and NewManifest are the new chart, rendered for
	// NewRelease.
	NewChart, NewChartVersion, NewManifest string
	// MapPVC and MapSecret pair old names with new ones where the plan cannot tell.
	MapPVC, MapSecret map[string]string
	// Dir is the backup directory that holds the migration record. Empty: plan only.
	Dir string
}

// Sources are where Open reads: the cluster, Helm storage and the uninstall pre-flight
// of the old release.
type Sources struct {
	Kube             kubernetes.Interface
	Releases         *helmrelease.Reader
	Uninstall        *uninstall.Clients
	UninstallOptions uninstall.Options
}

// Open returns the migration record to carry out. When req.Dir records a migration, it
// is resumed: it must be the migration of the same release to the same new release in
// the same namespace (RecordMismatchError otherwise), and its plan, made before anything
// changed, is kept. Otherwise Open reads the old release, runs the uninstall pre-flight
// and plans afresh. Resumed says which.
func Open(ctx context.Context, src Sources, req Request) (st *State, resumed bool, err error) {
	if req.Dir != "" {
		if st, err = LoadState(req.Dir); err != nil {
			return nil, false, err
		}
	}
	if st != nil {
		p := st.Plan
		if p.Release != req.Release || p.NewRelease != req.NewRelease || p.Namespace != req.Namespace {
			return nil, false, &RecordMismatchError{Dir: req.Dir, Namespace: p.Namespace, Release: p.Release, NewRelease: p.NewRelease}
		}
		return st, true, nil
	}
	p, err := PlanRelease(ctx, src, req)
	if err != nil {
		return nil, false, err
	}
	return NewState(p), false, nil
}

// PlanRelease reads the plan's inputs (the old release's last revision, whether the new
// name is taken, the uninstall pre-flight) and plans. It only reads.
func PlanRelease(ctx context.Context, src Sources, req Request) (*Plan, error) {
	h, err := src.Releases.History(ctx, req.Release)
	if err != nil {
		return nil, err
	}
	pre, err := uninstall.Check(ctx, src.Uninstall, src.UninstallOptions)
	if err != nil {
		return nil, fmt.Errorf("uninstall pre-flight of %s/%s: %w", req.Namespace, req.Release, err)
	}
	exists := false
	if req.NewRelease != req.Release {
		_, err := src.Releases.History(ctx, req.NewRelease)
		var nf *helmrelease.NotFoundError
		if err != nil && !errors.As(err, &nf) {
			return nil, err
		}
		exists = err == nil
	}
	return MakePlan(ctx, src.Kube, PlanInput{
		Old: h[len(h)-1], NewRelease: req.NewRelease, NewChart: req.NewChart, NewChartVersion: req.NewChartVersion,
		NewManifest: req.NewManifest, Namespace: req.Namespace, Preflight: FromUninstall(pre),
		MapPVC: req.MapPVC, MapSecret: req.MapSecret, NewReleaseExists: exists,
	})
}
