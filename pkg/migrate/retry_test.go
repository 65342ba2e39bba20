package migrate

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// TestRetryDelay: waits grow with jitter up to the cap, and a throttled request never
// comes back sooner than the server's Retry-After.
func TestRetryDelay(t *testing.T) {
	gr := schema.GroupResource{Group: "source.toolkit.fluxcd.io", Resource: "helmrepositories"}
	tests := []struct {
		name     string
		err      error
		steps    int
		min, max time.Duration // of the last step
	}{
		{name: "first retry of a reset connection", err: errors.New("connection reset by peer"), steps: 1, min: 100 * time.Millisecond, max: 150 * time.Millisecond},
		{name: "fourth retry doubles three times", err: apierrors.NewInternalError(errors.New("etcd")), steps: 4, min: 800 * time.Millisecond, max: 1200 * time.Millisecond},
		{name: "capped at 10s plus jitter", err: apierrors.NewServiceUnavailable("busy"), steps: 20, min: 10 * time.Second, max: 15 * time.Second},
		{name: "429 waits at least its Retry-After", err: apierrors.NewTooManyRequests("throttled", 3), steps: 1, min: 3 * time.Second, max: 3 * time.Second},
		{name: "429 later in the backoff waits the longer backoff", err: apierrors.NewTooManyRequests("throttled", 1), steps: 6, min: 3200 * time.Millisecond, max: 4800 * time.Millisecond},
		{name: "server timeout without a delay", err: apierrors.NewServerTimeout(gr, "patch", 0), steps: 2, min: 200 * time.Millisecond, max: 300 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !retriable(tc.err) {
				t.Fatalf("%v is not retriable", tc.err)
			}
			b := retryBackoff()
			var d time.Duration
			for range tc.steps {
				d = retryDelay(&b, tc.err)
			}
			if d < tc.min || d > tc.max {
				t.Errorf("delay after %d steps = %s, want within [%s, %s]", tc.steps, d, tc.min, tc.max)
			}
		})
	}
}

// TestClientConfig: a config with no rate limit gets none (not client-go's 5 requests per
// second), an explicit one is kept, and RateLimit's burst defaults to twice the QPS.
func TestClientConfig(t *testing.T) {
	tests := []struct {
		name       string
		cfg        *rest.Config
		unlimited  bool
		qps        float32
		burst      int
		keepsLimit bool
	}{
		{name: "unset: no client-side limit", cfg: &rest.Config{}, unlimited: true},
		{name: "explicit QPS kept", cfg: &rest.Config{QPS: 20, Burst: 30}, qps: 20, burst: 30},
		{name: "explicit limiter kept", cfg: &rest.Config{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(1, 1)}, keepsLimit: true},
		{name: "RateLimit 0: none", cfg: RateLimit(&rest.Config{QPS: 20}, 0, 0), unlimited: true},
		{name: "RateLimit burst 0: twice the QPS", cfg: RateLimit(&rest.Config{}, 50, 0), qps: 50, burst: 100},
		{name: "RateLimit burst given", cfg: RateLimit(&rest.Config{}, 50, 7), qps: 50, burst: 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := kubeclient.DefaultRateLimit(tc.cfg)
			switch {
			case tc.unlimited:
				if got.RateLimiter == nil {
					t.Fatalf("no limiter: client-go would apply its default of 5 QPS")
				}
				for i := range 1000 {
					if !got.RateLimiter.TryAccept() {
						t.Fatalf("request %d throttled by %#v", i, got.RateLimiter)
					}
				}
			case tc.keepsLimit:
				if got.RateLimiter != tc.cfg.RateLimiter {
					t.Errorf("the caller's limiter was replaced")
				}
			default:
				if got.RateLimiter != nil || got.QPS != tc.qps || got.Burst != tc.burst {
					t.Errorf("limiter %v QPS %v burst %d, want QPS %v burst %d", got.RateLimiter, got.QPS, got.Burst, tc.qps, tc.burst)
				}
			}
		})
	}
}
