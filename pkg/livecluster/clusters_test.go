package livecluster_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// counted counts the requests count says to (not watches, for every caller here).
type counted struct {
	rt    http.RoundTripper
	n     *atomic.Int64
	count func(r *http.Request) bool
}

func (c counted) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Get("watch") != "true" && c.count(r) {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// crdLists counts full LISTs of CRDs (not metadata-only lists).
func crdLists(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/customresourcedefinitions") &&
		!strings.Contains(r.Header.Get("Accept"), "PartialObjectMetadata")
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
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return counted{rt: rt, n: &lists, count: crdLists} })

	clusters := livecluster.NewClusters(livecluster.ClustersOptions{})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = clusters.Start(runCtx) }()
	// Start runs in its own goroutine: a target is kept once Start has begun.
	target := keptTarget(t, clusters, livecluster.Key("test"), cfg)
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
	// made a moment ago is seen at once, caught up or not. The CRD watches are held while
	// the change is made, so that no informer has caught up: a target without VerifyCRDs,
	// the control, still answers the old storedVersions from memory.
	held := &heldWatches{}
	gated := rest.CopyConfig(cp.Config)
	gated.Wrap(held.wrap)
	verified, _ := testenv.CountedTarget(t, gated, livecluster.ClustersOptions{VerifyCRDs: true}, false)
	control, _ := testenv.CountedTarget(t, gated, livecluster.ClustersOptions{}, false)
	for _, target := range []*livecluster.Target{verified, control} {
		if _, err := target.Cluster.CRDs(ctx); err != nil { // waits for the first sync
			t.Fatal(err)
		}
	}
	held.hold()
	t.Cleanup(held.release) // the informers' readers end once they can read again
	if err := testenv.SetStoredVersions(ctx, cs, name, "v1"); err != nil {
		t.Fatal(err)
	}
	stale, err := control.Cluster.CRDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := stale[name].Status.StoredVersions; len(got) != 2 {
		t.Fatalf("the control without VerifyCRDs saw storedVersions %v at once: its watch was not held, and the check below would prove nothing", got)
	}
	crds, err = verified.Cluster.CRDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := crds[name].Status.StoredVersions; len(got) != 1 {
		t.Errorf("VerifyCRDs: storedVersions right after the change = %v, want [v1]", got)
	}
}

// heldWatches holds the CRD watch streams of the clients it wraps while hold is in
// effect: what a stream reads from the API server then reaches the informer only after
// release.
type heldWatches struct {
	// gate, while held, is a channel that release closes.
	gate atomic.Pointer[chan struct{}]
}

func (h *heldWatches) hold() {
	gate := make(chan struct{})
	h.gate.Store(&gate)
}

func (h *heldWatches) release() {
	if gate := h.gate.Swap(nil); gate != nil {
		close(*gate)
	}
}

func (h *heldWatches) wrap(rt http.RoundTripper) http.RoundTripper {
	return heldTransport{rt: rt, h: h}
}

type heldTransport struct {
	rt http.RoundTripper
	h  *heldWatches
}

func (t heldTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(r)
	if err == nil && strings.HasSuffix(r.URL.Path, "/customresourcedefinitions") && r.URL.Query().Get("watch") == "true" {
		resp.Body = heldBody{ReadCloser: resp.Body, h: t.h}
	}
	return resp, err
}

// heldBody waits for the hold to end after each read, so that bytes that arrive during
// the hold (the reader was already waiting for them) are not handed on either.
type heldBody struct {
	io.ReadCloser
	h *heldWatches
}

func (b heldBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if gate := b.h.gate.Load(); gate != nil {
		<-*gate
	}
	return n, err
}
