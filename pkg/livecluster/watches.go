package livecluster

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/lru"

	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// watches are the informers a target of Clusters starts on first use, besides its CRD
// informer, so that a repeated decision reads from memory what it would otherwise ask the
// API server each time: the metadata of the Helm release Secrets, the metadata of the
// objects the schema check reads (to know when a kept LIST is still the API server's),
// and the StorageVersionMigrations. Each lives until the target is dropped. What an
// informer answers lags the API server by what its watch has not delivered yet
// (milliseconds on a healthy connection; longer while a broken watch relists): the same
// kind of race a decision already has with a write that lands just after it reads.
type watches struct {
	ctx       context.Context
	max       int
	mu        sync.Mutex
	informers map[string]*watched
	tick      uint64 // counts the informers started (watched.id)
	// syncTimeout bounds how long after an informer's start a warm-up waits for it.
	syncTimeout time.Duration
	// pages keeps the schema check's complete, single-page LISTs by resource, with the
	// count of changes the resource's informer had delivered before the LIST.
	pages *lru.Cache
	// seen is, by name, the resourceVersion of a CRD without managedFields listObjects
	// last read in memory and when it first did (see crdSettle).
	seen map[string]seenCRD
	now  func() time.Time
	// svmAt is when the StorageVersionMigration resource was resolved by discovery.
	svmMu  sync.Mutex
	svmGVR schema.GroupVersionResource
	svmAt  time.Time
}

// maxWatches bounds the informers one target keeps (one per resource the schema check
// reads, plus two); the one asked for least recently is stopped to make room once it has
// been idle for idleBeforeEviction.
const maxWatches = 64

// maxKeptPage bounds the objects of a kept LIST: a larger collection is read afresh at
// every decision that judges it.
const maxKeptPage = 500

// crdSettle is how long after a CRD's last write a LIST of its objects is not kept. The
// API server serves custom resources through storage built for the CRD its own informer
// holds, and swaps that storage only when that informer delivers the change, which may
// be after ours: a LIST in between is served (pruned, converted) by the old CRD, and kept
// under the new resourceVersion it would be repeated until an object changed. Lists in
// that window are answered but not kept. The last write is the newest time in the CRD's
// managedFields (the API server's clock; a skew of ours shortens or lengthens the
// window), or, for a CRD without them, when listObjects first read this resourceVersion.
const crdSettle = 3 * time.Second

type seenCRD struct {
	rv string
	at time.Time
}

// newWatches keeps informers running until ctx ends; a warm-up waits up to syncTimeout
// after an informer's start for it to sync (waitSynced).
func newWatches(ctx context.Context, syncTimeout time.Duration) *watches {
	return &watches{ctx: ctx, max: maxWatches, syncTimeout: syncTimeout, informers: map[string]*watched{}, pages: lru.New(maxWatches),
		seen: map[string]seenCRD{}, now: time.Now}
}

// watched is one informer and how many changes it has delivered (every add, update and
// delete, relists included): an unchanged count means nothing changed as far as the
// watch has delivered. (The informer's last resourceVersion is no such measure: the API
// server's bookmarks move it with every write to any resource.)
type watched struct {
	inf     toolscache.SharedIndexInformer
	changes atomic.Int64
	stop    context.CancelFunc
	// id tells this informer from an earlier one of the same resource (stopped and
	// started again), whose count of changes started from zero too.
	id uint64
	// used is when the informer was last asked for (w.now, in Unix nanoseconds).
	used atomic.Int64
	// started is when it was started (w.now).
	started time.Time
}

// version is what a kept page is checked against: which informer, and how many changes it
// had delivered.
func (wd *watched) version() string {
	return strconv.FormatUint(wd.id, 10) + "/" + strconv.FormatInt(wd.changes.Load(), 10)
}

// watchTweak bounds every watch of these informers (see watchTimeout).
func watchTweak(o *metav1.ListOptions) {
	secs := int64(watchTimeout / time.Second)
	o.TimeoutSeconds = &secs
}

func (w *watches) get(key string, build func() toolscache.SharedIndexInformer) *watched {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now().UnixNano()
	wd, ok := w.informers[key]
	if !ok {
		if len(w.informers) >= w.max && !w.evictLocked(now) {
			return nil
		}
		w.tick++
		wd = &watched{inf: build(), id: w.tick, started: w.now()}
		changed := func() { wd.changes.Add(1) }
		if _, err := wd.inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { changed() }, UpdateFunc: func(any, any) { changed() }, DeleteFunc: func(any) { changed() },
		}); err != nil {
			return nil
		}
		// A resource that is no longer served (its CRD deleted, a version dropped) would
		// keep the informer relisting, and its slot taken, for as long as the target lives:
		// it is stopped and forgotten, and a later read starts a new one if it is served
		// again.
		if err := wd.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *toolscache.Reflector, err error) {
			if apierrors.IsNotFound(err) {
				w.forget(key, wd)
				return
			}
			toolscache.DefaultWatchErrorHandler(ctx, r, err)
		}); err != nil {
			return nil
		}
		var ctx context.Context
		ctx, wd.stop = context.WithCancel(w.ctx)
		w.informers[key] = wd
		go wd.inf.RunWithContext(ctx)
	}
	wd.used.Store(now)
	return wd
}

// idleBeforeEviction is how long an informer must have gone unasked before it makes room
// for another.
const idleBeforeEviction = time.Minute

// evictLocked stops the informer asked for least recently, if that was idleBeforeEviction
// ago, and says whether it made room. The bound is on memory: the resource of the
// informer stopped is read from the API server again (and its informer started again) the
// next time a decision needs it. Informers all asked for within that time are kept, and a
// resource beyond the bound is simply read from the API server, so a decision that judges
// more resources than the bound does not stop and start informers at every turn. w.mu is
// held.
func (w *watches) evictLocked(now int64) bool {
	var oldest string
	for k, wd := range w.informers {
		if oldest == "" || wd.used.Load() < w.informers[oldest].used.Load() {
			oldest = k
		}
	}
	wd, ok := w.informers[oldest]
	if !ok || time.Duration(now-wd.used.Load()) < idleBeforeEviction {
		return false
	}
	wd.stop()
	delete(w.informers, oldest)
	return true
}

// waitSynced waits for each informer of wds (nil ones are skipped) to sync, but for each
// only until syncTimeout after its own start: an informer that may never sync (its LIST
// forbidden by RBAC, say) holds a warm-up that long at most, once, and one started longer
// ago than that is not waited for at all. The target's other informers are not waited
// for. It says whether ctx was still live.
func (w *watches) waitSynced(ctx context.Context, wds []*watched) bool {
	for _, wd := range wds {
		if wd == nil || wd.inf.HasSynced() {
			continue
		}
		left := w.syncTimeout - w.now().Sub(wd.started)
		if left <= 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, left)
		toolscache.WaitForCacheSync(wctx.Done(), wd.inf.HasSynced)
		cancel()
		if ctx.Err() != nil {
			return false
		}
	}
	return true
}

// forget stops wd and removes it, if it is still the informer named key.
func (w *watches) forget(key string, wd *watched) {
	wd.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.informers[key] == wd {
		delete(w.informers, key)
	}
}

// releaseIndex indexes Helm release Secrets by namespace and release name.
const releaseIndex = "release"

// helmRecords is helmrelease.Records from a metadata informer on every Secret labelled
// owner=helm.
type helmRecords struct {
	w  *watches
	md metadata.Interface
}

func (h *helmRecords) Records(namespace, name string) ([]*metav1.PartialObjectMetadata, bool) {
	wd := h.w.records(h.md)
	if wd == nil || !wd.inf.HasSynced() {
		return nil, false
	}
	objs, err := wd.inf.GetIndexer().ByIndex(releaseIndex, namespace+"/"+name)
	if err != nil {
		return nil, false
	}
	out := make([]*metav1.PartialObjectMetadata, 0, len(objs))
	for _, o := range objs {
		if m, ok := o.(*metav1.PartialObjectMetadata); ok {
			out = append(out, m)
		}
	}
	return out, true
}

// records is the metadata informer on every Secret labelled owner=helm (Helm's release
// records), indexed by namespace and release name, started on first use.
func (w *watches) records(md metadata.Interface) *watched {
	return w.get("helm-records", func() toolscache.SharedIndexInformer {
		return metadatainformer.NewFilteredMetadataInformer(md, schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, metav1.NamespaceAll, 0,
			toolscache.Indexers{releaseIndex: func(obj any) ([]string, error) {
				m, ok := obj.(*metav1.PartialObjectMetadata)
				if !ok {
					return nil, nil
				}
				return []string{m.Namespace + "/" + m.Labels["name"]}, nil
			}},
			func(o *metav1.ListOptions) { o.LabelSelector = "owner=helm"; watchTweak(o) }).Informer()
	})
}

var _ helmrelease.Records = (*helmRecords)(nil)

type keptPage struct {
	rv   string
	list *unstructured.UnstructuredList
}

// listObjects is ListObjects through memory: the first page of a resource whose LIST
// was complete in one page, kept while the resource's metadata informer has delivered no
// change since before that LIST (no object of the resource was created, changed or
// deleted since, as far as the watch has delivered) and its CRD is at the
// same resourceVersion (which decides how the objects are served). Anything else lists.
func (w *watches) listObjects(ctx context.Context, k *KubeCluster, gvr schema.GroupVersionResource,
	opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	list := func() (*unstructured.UnstructuredList, error) { return k.dynamic.Resource(gvr).List(ctx, opts) }
	if w == nil || opts.Continue != "" || opts.LabelSelector != "" || opts.FieldSelector != "" {
		return list()
	}
	// How the API server serves the objects (pruned, converted) follows their CRD: a
	// page is kept for one resourceVersion of it.
	crds, ok, err := k.memory.crds(ctx)
	if err != nil || !ok || crds[gvr.Resource+"."+gvr.Group] == nil {
		return list()
	}
	crd := crds[gvr.Resource+"."+gvr.Group]
	crdRV := crd.ResourceVersion
	settled := w.settled(crd)
	wd := w.objects(k, gvr)
	if wd == nil || !wd.inf.HasSynced() {
		return list()
	}
	rv := wd.version()
	key := gvr.String() + "?limit=" + strconv.FormatInt(opts.Limit, 10) + "&crd=" + crdRV
	if v, ok := w.pages.Get(key); ok && v.(keptPage).rv == rv {
		// Callers only read the objects (crdschema's Judge never modifies one).
		return v.(keptPage).list, nil
	}
	l, err := list()
	if err == nil && settled && l.GetContinue() == "" && len(l.Items) <= maxKeptPage {
		w.pages.Add(key, keptPage{rv: rv, list: l})
	}
	return l, err
}

// objects is the metadata informer on a resource's objects, started on first use, which
// keeps of each object only what tells it apart and says it changed (name, namespace,
// UID, resourceVersion): counting and noticing changes need nothing more, and a large
// collection's labels, annotations and managedFields are not held.
func (w *watches) objects(k *KubeCluster, gvr schema.GroupVersionResource) *watched {
	return w.get("objects/"+gvr.String(), func() toolscache.SharedIndexInformer { return ObjectsInformer(k.metadata, gvr) })
}

// ObjectsInformer is a metadata informer on every object of a resource, in every
// namespace, not yet started, which keeps of each object only what tells it apart and
// says it changed (name, namespace, UID, resourceVersion): what counting a resource's
// objects and noticing their changes need, without a large collection's labels,
// annotations and managedFields. Its watches are bounded as the targets' are. The
// objects informers of a target of Clusters are built by it, and so are the
// controller's, which keep the CRD deletion guard's label.
func ObjectsInformer(md metadata.Interface, gvr schema.GroupVersionResource) toolscache.SharedIndexInformer {
	inf := metadatainformer.NewFilteredMetadataInformer(md, gvr, metav1.NamespaceAll, 0, toolscache.Indexers{}, watchTweak).Informer()
	_ = inf.SetTransform(func(o any) (any, error) {
		if m, ok := o.(*metav1.PartialObjectMetadata); ok {
			return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
				Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}}, nil
		}
		return o, nil
	})
	return inf
}

// countObjects counts a resource's objects from its metadata informer once it has
// synced; ok is false before that (or when w has no informer for it), and the caller asks the API
// server.
func (w *watches) countObjects(k *KubeCluster, gvr schema.GroupVersionResource) (n int64, ok bool) {
	if w == nil {
		return 0, false
	}
	wd := w.objects(k, gvr)
	if wd == nil || !wd.inf.HasSynced() {
		return 0, false
	}
	return int64(len(wd.inf.GetStore().ListKeys())), true
}

// settled says whether crd was last written at least crdSettle ago.
func (w *watches) settled(crd *apiextv1.CustomResourceDefinition) bool {
	var written time.Time
	for _, mf := range crd.ManagedFields {
		if mf.Time != nil && mf.Time.After(written) {
			written = mf.Time.Time
		}
	}
	if written.IsZero() {
		w.mu.Lock()
		s, ok := w.seen[crd.Name]
		if !ok || s.rv != crd.ResourceVersion {
			s = seenCRD{rv: crd.ResourceVersion, at: w.now()}
			w.seen[crd.Name] = s
		}
		w.mu.Unlock()
		written = s.at
	}
	return w.now().Sub(written) >= crdSettle
}

// svmTTL is how long the resolution of the StorageVersionMigration resource by discovery
// is reused.
const svmTTL = 5 * time.Minute

// migrationsInProgress is svm.Active from a dynamic informer on StorageVersionMigrations,
// once it has synced.
func (w *watches) migrationsInProgress(ctx context.Context, k *KubeCluster) (map[string][]svm.Migration, error) {
	if w == nil {
		return svm.Active(ctx, k.dynamic)
	}
	gvr, ok := w.svmResource(k)
	if !ok {
		return svm.Active(ctx, k.dynamic)
	}
	if gvr.Empty() {
		return map[string][]svm.Migration{}, nil
	}
	wd := w.migrations(k, gvr)
	if wd == nil || !wd.inf.HasSynced() {
		return svm.Active(ctx, k.dynamic)
	}
	var items []unstructured.Unstructured
	for _, o := range wd.inf.GetStore().List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			items = append(items, *u)
		}
	}
	return svm.ActiveOf(items)
}

// svmResource is the StorageVersionMigration resource as discovery resolved it within
// svmTTL (empty when none is served); ok is false when discovery failed.
func (w *watches) svmResource(k *KubeCluster) (schema.GroupVersionResource, bool) {
	w.svmMu.Lock()
	defer w.svmMu.Unlock()
	if w.svmAt.IsZero() || time.Since(w.svmAt) > svmTTL {
		gvr, err := svm.Resource(k.disco)
		if err != nil {
			return schema.GroupVersionResource{}, false
		}
		w.svmGVR, w.svmAt = gvr, time.Now()
	}
	return w.svmGVR, true
}

// migrations is the dynamic informer on the StorageVersionMigrations of gvr, started on
// first use.
func (w *watches) migrations(k *KubeCluster, gvr schema.GroupVersionResource) *watched {
	return w.get("svm/"+gvr.String(), func() toolscache.SharedIndexInformer {
		return dynamicinformer.NewFilteredDynamicInformer(k.dynamic, gvr, metav1.NamespaceAll, 0, toolscache.Indexers{}, watchTweak).Informer()
	})
}

// crdsFromMemory reads the CRDs from the informer when VerifyCRDs is off, and otherwise
// only once a metadata LIST proves them fresh.
func (k *KubeCluster) crdsFromMemory(ctx context.Context) (map[string]*apiextv1.CustomResourceDefinition, bool, error) {
	m, ok, err := k.memory.crds(ctx)
	if err != nil || !ok {
		return nil, false, err
	}
	if !k.memory.verify {
		return m, true, nil
	}
	fresh, err := k.fresh(ctx, m)
	if err != nil {
		return nil, false, err
	}
	return m, fresh, nil
}
