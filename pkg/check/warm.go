package check

import (
	"context"
	"errors"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// Warm reads now what a prediction for s's release will read before its incoming chart is
// known, so that the first decision on the release after a start reads from memory: the
// deployed revision and its CRDs (kept per target), and, through
// livecluster.KubeCluster.Warm, the informers of the release's records, of
// StorageVersionMigrations and of the objects of those CRDs at every served version, and
// a first page of each of those objects, as the schema check lists them. It does nothing
// for a Cluster that keeps nothing between predictions (one not built by
// livecluster.Clusters, or built before Clusters started), and nothing for a release not
// installed yet. It only reads.
func Warm(ctx context.Context, s Sources) error {
	k, ok := s.Cluster.(*livecluster.KubeCluster)
	if !ok || !k.Keeps() || s.Releases == nil {
		return nil
	}
	current, key, err := s.Releases.Deployed(ctx, s.Release)
	if nf := (*helmrelease.NotFoundError)(nil); errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return err
	}
	var req Request
	if err := s.currentMemo(current, key, &req, &Prediction{}); err != nil {
		return err
	}
	names := make([]string, 0, len(req.Current))
	for _, c := range req.Current {
		names = append(names, c.CRD.Name)
	}
	return k.Warm(ctx, livecluster.Warming{CRDs: names, PageLimit: crdschema.DefaultPageSize})
}
