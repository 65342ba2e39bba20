package livecluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// Target is one target cluster as Clusters keeps it: its Cluster (CRDs read from an
// informer's cache once it has synced), a clientset for Helm storage, and its Kubernetes
// version.
type Target struct {
	Cluster   *KubeCluster
	Clientset kubernetes.Interface
	// Version is the API server's git version, read once per VersionTTL.
	Version string
	// Config is the REST config the target was built from.
	Config *rest.Config
	// Metadata reads objects' metadata only (Helm storage labels).
	Metadata metadata.Interface
	// Releases keeps decoded release revisions between decisions (package check keeps
	// their CRDs in the Cluster's Memory); nil for a target built for one decision.
	Releases *helmrelease.Cache
}

// ClustersOptions tune Clusters.
type ClustersOptions struct {
	// Local reads the CRDs of the local cluster from memory: the controller manager's
	// cache, whose CRD informer the controller's own watches already fill, so the gate
	// and the controller share it. Nil starts an informer for the local cluster too.
	Local client.Reader
	// MaxTargets bounds how many remote targets keep an informer (least recently used
	// go first). Default 16.
	MaxTargets int
	// VersionTTL is how long a target's Kubernetes version is reused. Default 5 minutes.
	VersionTTL time.Duration
	// SyncTimeout bounds how long a decision waits for a new target's first sync before
	// it lists the CRDs from the API server instead, and how long after an informer's
	// start a warm-up (KubeCluster.Warm) waits for it to sync. Default 10s.
	SyncTimeout time.Duration
	// VerifyCRDs checks the informer's CRDs against one metadata-only LIST of the CRDs
	// before each decision uses them (one request per decision), so a decision never
	// reads CRDs older than the API server's. Default false: a decision trusts the
	// informer, which lags the API server by what its watch has not delivered yet.
	VerifyCRDs bool
}

// Clusters keeps one Target per target cluster between decisions, so a repeated decision
// reads the live CRDs from memory: an informer per target (controller-runtime's cache),
// keyed by a hash of what identifies the target (for a kubeConfig Secret: its namespace,
// name, UID and resourceVersion, so a changed Secret makes a new target; never its
// content). It is safe for concurrent use. Start runs it: the informers live until its
// context ends.
type Clusters struct {
	o       ClustersOptions
	mu      sync.Mutex
	ctx     context.Context
	targets *lru.Cache // key -> *cachedTarget
}

type cachedTarget struct {
	mu        sync.Mutex
	target    Target
	versionAt time.Time
	reader    client.Reader
	synced    func() bool
	waitSync  func(ctx context.Context) bool
	cancel    context.CancelFunc
	informer  toolscache.SharedIndexInformer
}

// NewClusters builds a Clusters; Start it before use.
func NewClusters(o ClustersOptions) *Clusters {
	if o.MaxTargets <= 0 {
		o.MaxTargets = 16
	}
	if o.VersionTTL <= 0 {
		o.VersionTTL = 5 * time.Minute
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 10 * time.Second
	}
	c := &Clusters{o: o}
	c.targets = lru.NewWithEvictionFunc(o.MaxTargets, func(_ lru.Key, v any) {
		if t := v.(*cachedTarget); t.cancel != nil {
			t.cancel()
		}
	})
	return c
}

// Start keeps the informers running until ctx ends. It implements controller-runtime's
// Runnable, so a manager can run it.
func (c *Clusters) Start(ctx context.Context) error {
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	<-ctx.Done()
	c.mu.Lock()
	c.targets.Clear()
	c.ctx = nil
	c.mu.Unlock()
	return nil
}

// NeedLeaderElection is false: every replica serving the webhook decides.
func (c *Clusters) NeedLeaderElection() bool { return false }

// Key is the cache key of a target named by parts (a host, a Secret's identity): a hash,
// so that no key holds what it names.
func Key(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Get returns the target named key, built from cfg on first use. local says that cfg is
// the local cluster, whose CRDs ClustersOptions.Local holds. A nil Clusters keeps
// nothing: it connects for this one call (Connect).
func (c *Clusters) Get(ctx context.Context, key string, cfg *rest.Config, local bool) (*Target, error) {
	if c == nil {
		return Connect(ctx, cfg)
	}
	c.mu.Lock()
	v, ok := c.targets.Get(key)
	if !ok {
		t, err := c.build(cfg, local)
		if err != nil {
			c.mu.Unlock()
			return nil, err
		}
		// Before Start there is nothing to run an informer under: keep the target only
		// once Start has begun (a target kept earlier would never get its informers).
		if t.reader != nil && c.ctx != nil {
			c.targets.Add(key, t)
		}
		v = t
	}
	c.mu.Unlock()
	t := v.(*cachedTarget)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.target.Version == "" || time.Since(t.versionAt) > c.o.VersionTTL {
		ver, err := t.target.Cluster.ServerVersion(ctx)
		if err != nil {
			return nil, &UnreachableError{Host: cfg.Host, Err: err}
		}
		t.target.Version, t.versionAt = ver, time.Now()
	}
	out := t.target
	return &out, nil
}

// Remove drops the target named key and stops its informer (a target whose kubeconfig
// Secret was deleted or rotated).
func (c *Clusters) Remove(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets.Remove(key)
}

// Len is how many targets Clusters keeps (each with its informer).
func (c *Clusters) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.targets.Len()
}

// OnCRDChange calls fn after every change the informer of the target named key sees
// (CRDs added, changed or deleted, and its first sync), until remove is called or the
// target is dropped. fn must not block. The target must have been built by Get first,
// after Start.
func (c *Clusters) OnCRDChange(key string, fn func()) (remove func(), err error) {
	c.mu.Lock()
	v, ok := c.targets.Get(key)
	c.mu.Unlock()
	if !ok || v.(*cachedTarget).informer == nil {
		return nil, fmt.Errorf("no CRD informer for target %s: call Get after Start first", key)
	}
	inf := v.(*cachedTarget).informer
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { fn() },
		UpdateFunc: func(any, any) { fn() },
		DeleteFunc: func(any) { fn() },
	})
	if err != nil {
		return nil, fmt.Errorf("watch the CRDs of target %s: %w", key, err)
	}
	return func() { _ = inf.RemoveEventHandler(reg) }, nil
}

func (c *Clusters) build(cfg *rest.Config, local bool) (*cachedTarget, error) {
	// The clients live across decisions, and so does their rate limiter: client-go's
	// default (5 requests per second) would throttle a burst of decisions that each make
	// a few reads.
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = 50, 100
	}
	tgt, err := newTarget(cfg)
	if err != nil {
		return nil, err
	}
	kc := tgt.Cluster
	tgt.Releases = helmrelease.NewCache(0)
	t := &cachedTarget{target: *tgt}
	var tctx context.Context
	if c.ctx != nil {
		tctx, t.cancel = context.WithCancel(c.ctx)
		kc.watch, kc.kept = newWatches(tctx, c.o.SyncTimeout), check.NewMemory()
		t.target.Releases.SetRecords(&helmRecords{w: kc.watch, md: kc.metadata})
	}
	switch {
	case local && c.o.Local != nil:
		t.reader, t.synced = c.o.Local, func() bool { return true }
	case tctx != nil:
		if err := c.inform(tctx, t, cfg); err != nil {
			t.cancel()
			return nil, err
		}
	}
	kc.memory = &memoryCRDs{reader: t.reader, synced: t.synced, waitSync: t.waitSync, wait: c.o.SyncTimeout, verify: c.o.VerifyCRDs}
	return t, nil
}

// watchTimeout bounds each watch of a remote target's CRDs: the informer resumes from
// where it stopped, and a target that goes away (its API server shutting down) is never
// held by a long-running request for longer.
const watchTimeout = 10 * time.Second

// inform starts an informer on the target's CRDs, running until the target is evicted
// or Clusters stops.
func (c *Clusters) inform(ctx context.Context, t *cachedTarget, cfg *rest.Config) error {
	cs, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("target cluster: CRD informer: %w", err)
	}
	crds := cs.ApiextensionsV1().CustomResourceDefinitions()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return crds.List(ctx, o) },
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			secs := int64(watchTimeout / time.Second)
			o.TimeoutSeconds = &secs
			return crds.Watch(ctx, o)
		},
	}
	inf := toolscache.NewSharedIndexInformer(lw, &apiextv1.CustomResourceDefinition{}, 0, toolscache.Indexers{})
	go inf.RunWithContext(ctx)
	t.reader, t.informer = &storeReader{store: inf.GetStore()}, inf
	t.synced = inf.HasSynced
	t.waitSync = func(ctx context.Context) bool { return toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) }
	return nil
}

// storeReader lists CRDs from an informer's store.
type storeReader struct{ store toolscache.Store }

func (r *storeReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("storeReader only lists")
}

func (r *storeReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l, ok := list.(*apiextv1.CustomResourceDefinitionList)
	if !ok {
		return fmt.Errorf("storeReader lists CustomResourceDefinitions, not %T", list)
	}
	items := r.store.List()
	l.Items = make([]apiextv1.CustomResourceDefinition, 0, len(items))
	for _, o := range items {
		l.Items = append(l.Items, *o.(*apiextv1.CustomResourceDefinition))
	}
	return nil
}

// memoryCRDs reads CRDs from an informer's cache once it has synced; before that (or
// without one) KubeCluster lists them from the API server.
type memoryCRDs struct {
	reader   client.Reader
	synced   func() bool
	waitSync func(ctx context.Context) bool
	wait     time.Duration
	once     sync.Once
	// verify checks the CRDs against a metadata LIST before they are used.
	verify bool
}

func (m *memoryCRDs) crds(ctx context.Context) (map[string]*apiextv1.CustomResourceDefinition, bool, error) {
	if m == nil || m.reader == nil {
		return nil, false, nil
	}
	// The first decision on a target waits a moment for the first sync.
	m.once.Do(func() {
		if m.waitSync != nil {
			wctx, cancel := context.WithTimeout(ctx, m.wait)
			defer cancel()
			m.waitSync(wctx)
		}
	})
	if !m.synced() {
		return nil, false, nil
	}
	var list apiextv1.CustomResourceDefinitionList
	// The cached objects are shared, not copied: no caller changes a live CRD.
	if err := m.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, false, fmt.Errorf("list CustomResourceDefinitions from the cache: %w", err)
	}
	out := make(map[string]*apiextv1.CustomResourceDefinition, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, true, nil
}
