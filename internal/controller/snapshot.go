package controller

import (
	"context"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

// SnapshotOptions say where the controller pushes snapshots of this cluster, and how
// often, so that review in CI needs read access to a registry, not to the cluster.
type SnapshotOptions struct {
	// Push is the snapshot's place: oci://REGISTRY/REPOSITORY:TAG; "" pushes none.
	Push string
	// Every is how often (default DefaultSnapshotEvery).
	Every time.Duration
	// Registry says how to reach the registry: credentials from a Secret mounted as a
	// Docker config file (the chart's snapshot.credentialsSecret), plain HTTP.
	Registry snapshot.Registry
	// Take says what the snapshot needs to know of the cluster: Argo CD's namespace.
	Take snapshot.Options
}

// DefaultSnapshotEvery is how often the controller pushes a snapshot by default.
const DefaultSnapshotEvery = time.Hour

// snapshotPusher takes a snapshot of the cluster and pushes it at once, then every
// Every: a manager runnable of the leader, so one replica pushes.
type snapshotPusher struct {
	cfg *rest.Config
	o   SnapshotOptions
}

// NeedLeaderElection is true: one replica pushes.
func (p *snapshotPusher) NeedLeaderElection() bool { return true }

// Start pushes until ctx ends. A push that fails is logged and counted, and the next one
// comes at the next tick.
func (p *snapshotPusher) Start(ctx context.Context) error {
	every := p.o.Every
	if every <= 0 {
		every = DefaultSnapshotEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		p.push(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *snapshotPusher) push(ctx context.Context) {
	log := ctrl.LoggerFrom(ctx).WithName("snapshot")
	s, err := snapshot.Take(ctx, p.cfg, p.o.Take)
	if err == nil {
		var digest string
		if digest, err = p.o.Registry.Push(ctx, s, p.o.Push); err == nil {
			metrics.SnapshotPushes.WithLabelValues(metrics.ResultSucceeded).Inc()
			metrics.SnapshotLastPush.Set(float64(time.Now().Unix()))
			log.Info("pushed a snapshot", "ref", p.o.Push, "digest", digest, "crds", len(s.CRDs), "releases", len(s.Releases), "took", time.Duration(s.Took).String())
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	metrics.SnapshotPushes.WithLabelValues(metrics.ResultFailed).Inc()
	log.Error(err, "could not push a snapshot; the next try is at the next tick", "ref", p.o.Push)
}

// addSnapshotPusher runs the pusher with the manager when o.Snapshot.Push is set.
func addSnapshotPusher(mgr ctrl.Manager, o Options) error {
	if o.Snapshot.Push == "" {
		return nil
	}
	return mgr.Add(&snapshotPusher{cfg: mgr.GetConfig(), o: o.Snapshot})
}
