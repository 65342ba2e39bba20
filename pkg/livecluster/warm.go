package livecluster

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/check"
)

// keeps says whether k keeps what it reads between decisions: a target of Clusters built
// after Start. Warm does nothing on any other.
func (k *KubeCluster) keeps() bool { return k != nil && k.watch != nil }

// Warm starts now the informers a first decision on a target would start (on the Helm
// release records, on StorageVersionMigrations, on the objects of w.CRDs at every served
// version, on the ValidatingAdmissionPolicies and their bindings), waits for them to sync
// (each for at most ClustersOptions.SyncTimeout from its own start, so a resource this
// identity may not list delays it that long at most), compiles the policies
// (keptPolicies: compiled at a first decision, they cost it 100 ms and more), and lists a
// first page of each of those objects (w.PageLimit), kept as ListObjects keeps it: the
// first decision after a start then reads from memory. What to warm is check's to say
// (check.Warm). A resource whose page cannot be listed is returned as an error once the
// others are warmed; policies that cannot be read are read again at the question, which
// then says it was not asked. It does nothing for a KubeCluster that keeps nothing
// between decisions (no Memory). It only reads.
func (k *KubeCluster) Warm(ctx context.Context, w check.Warming) error {
	if !k.keeps() {
		return nil
	}
	live, err := k.CRDs(ctx)
	if err != nil {
		return err
	}
	// Only the informers this warm-up asks for are waited for, not every informer of the
	// target.
	wds := []*watched{k.watch.records(k.metadata)}
	if gvr, ok := k.watch.svmResource(k); ok && !gvr.Empty() {
		wds = append(wds, k.watch.migrations(k, gvr))
	}
	policies := k.kept != nil && k.clients != nil
	if policies {
		p, b := k.policyInformers()
		wds = append(wds, p, b)
	}
	var gvrs []schema.GroupVersionResource
	for _, name := range w.CRDs {
		l := live[name]
		if l == nil {
			continue
		}
		for _, v := range l.Spec.Versions {
			if v.Served {
				gvr := schema.GroupVersionResource{Group: l.Spec.Group, Version: v.Name, Resource: l.Spec.Names.Plural}
				gvrs = append(gvrs, gvr)
				wds = append(wds, k.watch.objects(k, gvr))
			}
		}
	}
	// A page is kept only when its informer had synced before the LIST (listObjects).
	if !k.watch.waitSynced(ctx, wds) {
		return ctx.Err()
	}
	if policies {
		_, _ = k.keptPolicies(ctx) // an error is the question's to report, when it is asked
	}
	return k.firstPages(ctx, gvrs, w.PageLimit)
}

// firstPages lists a first page of each resource's objects, four at a time. A resource
// that cannot be listed (forbidden, a conversion webhook down) does not keep the others
// from being listed: its error is returned with theirs.
func (k *KubeCluster) firstPages(ctx context.Context, gvrs []schema.GroupVersionResource, limit int64) error {
	var (
		g    errgroup.Group
		mu   sync.Mutex
		errs []error
	)
	g.SetLimit(4)
	for _, gvr := range gvrs {
		g.Go(func() error {
			if _, err := k.ListObjects(ctx, gvr, metav1.ListOptions{Limit: limit}); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("warm %s: %w", gvr.GroupResource(), err))
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait() // every function returns nil
	return errors.Join(errs...)
}
