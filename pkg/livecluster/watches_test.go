package livecluster

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestPagesWaitForTheCRDToSettle: a LIST made soon after its CRD changed may have been
// served by the API server's storage for the old CRD, and is not kept; once the CRD has
// not been written for crdSettle, LISTs are kept again. The last write is the newest
// managedFields time, or, without managedFields, when the resourceVersion was first read.
func TestPagesWaitForTheCRDToSettle(t *testing.T) {
	w := newWatches(t.Context(), time.Second)
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	crd := func(rv string, written ...time.Time) *apiextv1.CustomResourceDefinition {
		c := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "gadgets.example.io", ResourceVersion: rv}}
		for _, at := range written {
			c.ManagedFields = append(c.ManagedFields, metav1.ManagedFieldsEntry{Manager: "m", Time: &metav1.Time{Time: at}})
		}
		return c
	}

	// By managedFields: the newest entry counts.
	old := now.Add(-time.Hour)
	if !w.settled(crd("1", old)) {
		t.Error("a CRD last written an hour ago is not settled")
	}
	if w.settled(crd("2", old, now.Add(-crdSettle+time.Second))) {
		t.Error("a CRD written less than crdSettle ago is settled")
	}
	if !w.settled(crd("2", now.Add(-crdSettle), old)) {
		t.Error("a CRD written crdSettle ago is not settled")
	}

	// Without managedFields: from when this resourceVersion was first read.
	if w.settled(crd("3")) {
		t.Fatal("a resourceVersion first read now is settled")
	}
	now = now.Add(crdSettle - time.Millisecond)
	if w.settled(crd("3")) {
		t.Fatalf("settled %v after it was first read, want %v", crdSettle-time.Millisecond, crdSettle)
	}
	now = now.Add(time.Millisecond)
	if !w.settled(crd("3")) {
		t.Fatalf("not settled %v after it was first read", crdSettle)
	}
	if w.settled(crd("4")) {
		t.Fatal("a changed resourceVersion is settled at once")
	}
}

// TestInformersMakeRoomForTheNewest: at its bound, a target stops the informer asked for
// least recently to start another, once that one has been idle for idleBeforeEviction;
// while all are in use it starts none (the resource is read from the API server). A page
// kept under a stopped informer is never taken for one of its successor's (each
// informer's count of changes starts from zero).
func TestInformersMakeRoomForTheNewest(t *testing.T) {
	w := newWatches(t.Context(), time.Second)
	w.max = 2
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	build := func() toolscache.SharedIndexInformer {
		lw := &toolscache.ListWatch{
			ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
				return &metav1.PartialObjectMetadataList{}, nil
			},
			WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
		}
		return toolscache.NewSharedIndexInformer(lw, &metav1.PartialObjectMetadata{}, 0, toolscache.Indexers{})
	}
	first := w.get("a", build)
	b := w.get("b", build)
	if w.get("c", build) != nil {
		t.Fatal("an informer started for c while a and b, at the bound, were both just asked for")
	}
	now = now.Add(idleBeforeEviction)
	w.get("a", build) // a is now the more recently asked for
	if w.get("c", build) == nil {
		t.Fatalf("no informer for c, with b idle for %v", idleBeforeEviction)
	}
	if got := slices.Sorted(maps.Keys(w.informers)); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("informers %v after asking for a, b, a, c with room for 2, want [a c]", got)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return b.inf.IsStopped(), nil
	}); err != nil {
		t.Fatal("the informer b made room for c but still runs")
	}
	now = now.Add(idleBeforeEviction)
	w.get("c", build)
	w.get("b", build)
	if got := slices.Sorted(maps.Keys(w.informers)); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("informers %v, want [b c]: a was asked for before c", got)
	}
	now = now.Add(idleBeforeEviction)
	again := w.get("a", build)
	if again == nil || first.version() == again.version() {
		t.Fatalf("a restarted informer has the version of the one it replaced: a page kept under the old one would be taken as current")
	}
}

// TestMemoryGoesWithTheTarget: each target that Clusters keeps has a check.Memory of
// its own, which check reads through the Cluster; a KubeCluster that keeps nothing
// between decisions (built for one decision, or by Clusters before Start) has none.
func TestMemoryGoesWithTheTarget(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"} // never dialled: the local reader serves the CRDs
	c := NewClusters(ClustersOptions{Local: nopReader{}})
	early, err := c.build(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	single, err := NewKubeCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if early.target.Cluster.Memory() != nil || single.Memory() != nil {
		t.Error("a KubeCluster that keeps nothing between decisions has a Memory")
	}
	c.ctx = t.Context() // as Start does
	a, err := c.build(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.build(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	if first := a.target.Cluster.Memory(); first == nil || first != a.target.Cluster.Memory() {
		t.Fatal("a kept target has no Memory, or a new one at each call")
	}
	if a.target.Cluster.Memory() == b.target.Cluster.Memory() {
		t.Error("two targets share a Memory")
	}
}

// nopReader is a local cluster's reader that is never asked.
type nopReader struct{ client.Reader }
