package webhook

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
)

// LabelGate set to "off" on a HelmRelease or CRD keeps it from the gate: the shipped
// webhook configurations' objectSelectors never send it (the break-glass switch).
const LabelGate = "upgradeguard.io/gate"

// warmLimit bounds the warm-up: a Pod is Ready by then whatever it has read.
const warmLimit = 30 * time.Second

// warmer warms the gate once the manager's cache has synced: for every HelmRelease the
// gate decides, it reads what the first decision on it would read before the incoming
// chart is known (fluxrelease.Warm: the deployed revision, the target's informers and a
// first page of the objects the schema check lists). Its readiness check passes once that
// is done, or warmLimit after it began, so a restarted Pod takes admission requests with
// that state in memory, and a release that cannot be read never holds it back.
type warmer struct {
	g *Gate
	// mapper says whether the cluster serves HelmReleases: without Flux there is nothing
	// to warm, and the cache is not asked for a kind it cannot serve.
	mapper meta.RESTMapper
	done   atomic.Bool
	// releases is how many HelmReleases the warm-up reads, for the readiness message.
	releases atomic.Int64
}

// NeedLeaderElection is false: every replica decides.
func (w *warmer) NeedLeaderElection() bool { return false }

// Start warms the gate and returns; the manager starts it after its cache has synced.
func (w *warmer) Start(ctx context.Context) error {
	defer w.done.Store(true)
	ctx, cancel := context.WithTimeout(ctx, warmLimit)
	defer cancel()
	logger := log.FromContext(ctx).WithName("gate-warm")
	if w.mapper != nil {
		if _, err := w.mapper.RESTMapping(helmv2.GroupVersion.WithKind(helmv2.HelmReleaseKind).GroupKind()); meta.IsNoMatchError(err) {
			logger.Info("the cluster serves no HelmReleases: nothing to warm")
			return nil
		}
	}
	var list helmv2.HelmReleaseList
	if err := w.g.reader.List(ctx, &list); err != nil {
		logger.Error(err, "list HelmReleases to warm the gate; the first decisions read everything afresh")
		return nil
	}
	g := errgroup.Group{}
	g.SetLimit(4)
	start := time.Now()
	for i := range list.Items {
		hr := &list.Items[i]
		if hr.Labels[LabelGate] == "off" {
			continue
		}
		w.releases.Add(1)
		g.Go(func() error {
			err := fluxrelease.Warm(ctx, fluxrelease.Request{HelmRelease: hr, Reader: w.g.reader, Local: w.g.local, Settings: w.g.settings,
				Cache: w.g.cache, Clusters: w.g.clusters})
			if err != nil {
				logger.V(1).Info("could not warm a HelmRelease; its first decision reads afresh", "helmRelease", client.ObjectKeyFromObject(hr).String(), "error", err.Error())
			}
			return nil
		})
	}
	_ = g.Wait()
	logger.Info("gate warmed", "helmReleases", w.releases.Load(), "duration", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// ready is the readiness check: it passes once the warm-up is over.
func (w *warmer) ready(*http.Request) error {
	if !w.done.Load() {
		return fmt.Errorf("reading the state of %d HelmReleases into memory (at most %s)", w.releases.Load(), warmLimit)
	}
	return nil
}
