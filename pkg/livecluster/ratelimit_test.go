package livecluster

import (
	"testing"

	"k8s.io/client-go/rest"
)

// TestNoDefaultRateLimit: a KubeCluster built from a config that sets no client rate
// limit (a kubeconfig's) is not held to client-go's default of bursts of 10 (a check of a
// 14-CRD chart counts 14 resources at once, and the last would wait 200 ms each), and a
// limit the config sets is kept.
func TestNoDefaultRateLimit(t *testing.T) {
	accepted := func(cfg *rest.Config) int {
		t.Helper()
		k, err := NewKubeCluster(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rl := k.clients.Kube.CoreV1().RESTClient().GetRateLimiter()
		n := 0
		for range 50 {
			if rl == nil || rl.TryAccept() {
				n++
			}
		}
		return n
	}
	host := "https://127.0.0.1:1" // never dialled
	if n := accepted(&rest.Config{Host: host}); n != 50 {
		t.Errorf("a config without a rate limit: %d of 50 requests at once let through, want 50", n)
	}
	if n := accepted(&rest.Config{Host: host, QPS: 1, Burst: 5}); n != 5 {
		t.Errorf("a config with QPS 1, burst 5: %d of 50 requests at once let through, want 5 (its own limit kept)", n)
	}
}
