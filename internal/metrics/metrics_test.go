package metrics

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestClusterLabelCap: the first MaxClusterLabels target clusters keep their name in the
// cluster label and every later one shares "other", so a fleet of any size adds at most
// MaxClusterLabels+1 series per result; a name seen before keeps its value, and the local
// cluster is never capped.
func TestClusterLabelCap(t *testing.T) {
	clusterLabels.Lock()
	saved := clusterLabels.seen
	clusterLabels.seen = map[string]bool{}
	clusterLabels.Unlock()
	t.Cleanup(func() {
		clusterLabels.Lock()
		clusterLabels.seen = saved
		clusterLabels.Unlock()
	})

	const fleet = 3 * MaxClusterLabels
	migrations := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_migrations_total", Help: "test"}, []string{"cluster", "result"})
	for i := range fleet {
		name := fmt.Sprintf("cluster-%03d", i)
		got := ClusterLabel(name)
		want := name
		if i >= MaxClusterLabels {
			want = "other"
		}
		if got != want {
			t.Fatalf("ClusterLabel(%q), the %d. cluster = %q, want %q", name, i+1, got, want)
		}
		migrations.WithLabelValues(got, ResultSucceeded).Inc()
	}
	if n := testutil.CollectAndCount(migrations); n != MaxClusterLabels+1 {
		t.Errorf("%d clusters made %d series, want %d (the named ones and other)", fleet, n, MaxClusterLabels+1)
	}
	if got := testutil.ToFloat64(migrations.WithLabelValues("other", ResultSucceeded)); got != fleet-MaxClusterLabels {
		t.Errorf("other counted %v migrations, want %d", got, fleet-MaxClusterLabels)
	}
	// A cluster named before the cap was reached keeps its name; the local cluster is "".
	for _, name := range []string{"cluster-000", fmt.Sprintf("cluster-%03d", MaxClusterLabels-1)} {
		if got := ClusterLabel(name); got != name {
			t.Errorf("ClusterLabel(%q) after the cap = %q, want its name", name, got)
		}
	}
	if got := ClusterLabel(LocalCluster); got != LocalCluster {
		t.Errorf("ClusterLabel(local) after the cap = %q, want %q", got, LocalCluster)
	}
}

// TestBuildInfo: the build-info gauge holds exactly one series, of the build set last,
// at 1.
func TestBuildInfo(t *testing.T) {
	SetBuildInfo("v1.0.0", "abc", "go1.x")
	SetBuildInfo("v1.2.3", "def", "go1.y")
	if n := testutil.CollectAndCount(BuildInfo); n != 1 {
		t.Fatalf("%d upgradeguard_build_info series, want 1", n)
	}
	if v := testutil.ToFloat64(BuildInfo.WithLabelValues("v1.2.3", "def", "go1.y")); v != 1 {
		t.Errorf("upgradeguard_build_info{version=v1.2.3} = %v, want 1", v)
	}
}
