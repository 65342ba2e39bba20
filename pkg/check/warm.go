package check

import (
	"context"
	"errors"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// Warm reads now what a prediction for s's release will read before its incoming chart is
// known, so that the first decision on the release after a start reads from memory: the
// deployed revision and its CRDs (kept by the Cluster), the informers of the release's
// records, of StorageVersionMigrations and of the objects of those CRDs at every served
// version, and a first page of each of those objects, as the schema check lists them. It
// does nothing for a Cluster that keeps nothing between predictions (one not built by
// Clusters, or built before Clusters started), and nothing for a release not installed
// yet. It only reads.
func Warm(ctx context.Context, s Sources) error {
	k, ok := s.Cluster.(*KubeCluster)
	if !ok || k.watch == nil || s.Releases == nil {
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
	live, err := k.CRDs(ctx)
	if err != nil {
		return err
	}
	if _, err := k.MigrationsInProgress(ctx); err != nil {
		return err
	}
	var gvrs []schema.GroupVersionResource
	for _, c := range req.Current {
		l := live[c.CRD.Name]
		if l == nil {
			continue
		}
		for _, v := range l.Spec.Versions {
			if v.Served {
				gvr := schema.GroupVersionResource{Group: l.Spec.Group, Version: v.Name, Resource: l.Spec.Names.Plural}
				gvrs = append(gvrs, gvr)
				k.watch.objects(k, gvr)
			}
		}
	}
	// A page is kept only when its informer had synced before the LIST (listObjects).
	if !k.watch.waitSynced(ctx) {
		return ctx.Err()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for _, gvr := range gvrs {
		g.Go(func() error {
			_, err := k.ListObjects(gctx, gvr, metav1.ListOptions{Limit: crdschema.DefaultPageSize})
			return err
		})
	}
	return g.Wait()
}
