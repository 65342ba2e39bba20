package testenv

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// requestCounter counts every API request but watches (an informer's watch is one long
// request).
type requestCounter struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if w := r.URL.Query().Get("watch"); w != "true" && w != "1" {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// CountRequests returns a copy of cfg whose clients add every API request they make but
// watches to n: a decision that makes none read everything from memory.
func CountRequests(cfg *rest.Config, n *atomic.Int64) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return requestCounter{rt: rt, n: n} })
	return cfg
}

// CountedTarget is a target of a livecluster.Clusters built with o and running until the
// test ends, reached through cfg with clients that count their requests (CountRequests).
// local says cfg is the cluster whose CRDs o.Local holds. The target is named after the
// test.
func CountedTarget(t testing.TB, cfg *rest.Config, o livecluster.ClustersOptions, local bool) (*livecluster.Target, *atomic.Int64) {
	t.Helper()
	ctx := t.Context()
	n := &atomic.Int64{}
	cfg = CountRequests(cfg, n)
	clusters := livecluster.NewClusters(o)
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = clusters.Start(runCtx) }()
	var target *livecluster.Target
	// Start runs in its own goroutine: a target is kept once Start has begun.
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		target, err = clusters.Get(ctx, livecluster.Key(t.Name()), cfg, local)
		if err != nil {
			return false, err
		}
		again, err := clusters.Get(ctx, livecluster.Key(t.Name()), cfg, local)
		return err == nil && again.Cluster == target.Cluster, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return target, n
}

// Eventually polls f until it says done, for up to 30 seconds: what an informer delivers
// arrives a moment after the write, and a test waits for that delivery, not for a fixed
// time. It fails the test with what, and f's last error, if f never does.
func Eventually(t testing.TB, what string, f func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		ok, err := f()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: never happened (last error: %v)", what, last)
	}
}
