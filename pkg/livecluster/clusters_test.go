package livecluster_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// crdLists counts full LISTs of CRDs (not watches, not metadata-only lists).
type crdLists struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c crdLists) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/customresourcedefinitions") &&
		r.URL.Query().Get("watch") != "true" && !strings.Contains(r.Header.Get("Accept"), "PartialObjectMetadata") {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// TestClustersFromMemory: a target of Clusters reads its CRDs from an informer once it
// has synced (no full LIST per decision), and sees a change once the watch delivers it;
// with VerifyCRDs, a change the API server made a moment ago is seen at once, whether or
// not the informer has caught up.
func TestClustersFromMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	const name = "widgets.fresh.example.io"
	if err := testenv.ApplyCRD(ctx, cs, testenv.TwoVersionCRD("fresh.example.io", "widgets", "Widget")); err != nil {
		t.Fatal(err)
	}
	var lists atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return crdLists{rt: rt, n: &lists} })

	clusters := livecluster.NewClusters(livecluster.ClustersOptions{})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = clusters.Start(runCtx) }()
	var target *livecluster.Target
	// Start runs in its own goroutine: a target is kept once Start has begun.
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		target, err = clusters.Get(ctx, livecluster.Key("test"), cfg, false)
		if err != nil {
			return false, err
		}
		again, err := clusters.Get(ctx, livecluster.Key("test"), cfg, false)
		return err == nil && again.Cluster == target.Cluster, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if target.Version == "" {
		t.Error("no Kubernetes version")
	}
	crds, err := target.Cluster.CRDs(ctx) // waits for the first sync
	if err != nil {
		t.Fatal(err)
	}
	if crds[name] == nil {
		t.Fatalf("%s not read", name)
	}
	// The positive control: a cluster without memory, on the same wrapped config, reads
	// its CRDs with a full LIST, and the counter sees it. (The informer's first sync is a
	// watch that sends its initial events, not a LIST.)
	plain, err := livecluster.NewKubeCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := lists.Load()
	if _, err := plain.CRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if lists.Load() == before {
		t.Fatal("a read without memory counted no full CRD LIST: the counter sees nothing, and the check below would prove nothing")
	}
	before = lists.Load()
	for range 3 {
		if _, err := target.Cluster.CRDs(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := lists.Load() - before; got != 0 {
		t.Errorf("%d full CRD LISTs after the sync, want 0 (read from memory)", got)
	}

	if err := testenv.SetStoredVersions(ctx, cs, name, "v1alpha1", "v1"); err != nil {
		t.Fatal(err)
	}
	// The informer answers once its watch delivers the change.
	testenv.Eventually(t, "the new storedVersions seen", func() (bool, error) {
		crds, err := target.Cluster.CRDs(ctx)
		return err == nil && len(crds[name].Status.StoredVersions) == 2, err
	})

	// With VerifyCRDs, one metadata LIST per call proves the informer fresh, so a change
	// made a moment ago is seen at once, caught up or not.
	verified, _ := testenv.CountedTarget(t, cp.Config, livecluster.ClustersOptions{VerifyCRDs: true}, false)
	if _, err := verified.Cluster.CRDs(ctx); err != nil { // waits for the first sync
		t.Fatal(err)
	}
	if err := testenv.SetStoredVersions(ctx, cs, name, "v1"); err != nil {
		t.Fatal(err)
	}
	crds, err = verified.Cluster.CRDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := crds[name].Status.StoredVersions; len(got) != 1 {
		t.Errorf("VerifyCRDs: storedVersions right after the change = %v, want [v1]", got)
	}
}
