// Package livecluster owns a target cluster as decisions read it: its clients, and for a
// target kept by Clusters the memory between decisions (an informer on its CRDs, informers
// on the Helm release records, StorageVersionMigrations and the objects the schema check
// reads, and pages of those objects kept while nothing changed). It only ever reads the
// cluster, but for the dry-run writes that ask the API server whether it accepts a CRD
// (AdmitCRD), which persist nothing, and the SelfSubjectReview that tells who the
// admission policies are evaluated as (PolicyDenials). KubeCluster implements package check's Cluster port; a target kept by Clusters
// also keeps what check remembers of it (a check.Memory: the CRDs of release revisions and
// compiled schema judges), which check reads through that port and which goes with the
// target.
package livecluster

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// KubeCluster reads a real cluster (it implements check.Cluster, the optional readers
// check asks for, and check.Warmer). It issues GET and LIST, and the dry-run writes of
// AdmitCRD.
type KubeCluster struct {
	crds     apiextclient.Interface
	metadata metadata.Interface
	disco    discovery.DiscoveryInterface
	dynamic  dynamic.Interface
	// memory, when set (Clusters), reads the CRDs from an informer's cache.
	memory *memoryCRDs
	// kept, when set (a target kept by Clusters), is what check keeps of the target.
	kept *check.Memory
	// watch, when set (Clusters), keeps informers that answer repeated reads.
	watch *watches
	// version is the API server's version once read: a check asks for it no more.
	version atomic.Pointer[string]
	// admissions keeps the API server's answers to AdmitCRD's dry runs, for a process
	// that asks again about the same CRDs (a second check, a review of releases that
	// share a chart).
	admissions *crdschema.Admissions
	// clients are the clients the KubeCluster was built from; policies are the cluster's
	// ValidatingAdmissionPolicies, read once (PolicyDenials).
	clients *kubeclient.Clients
	// last are the CRDs the last read from the API server gave (CRDs, crdsSince); their
	// objects are shared with every caller, which never changes a live CRD.
	last struct {
		sync.Mutex
		crds map[string]*apiextv1.CustomResourceDefinition
	}
	policies struct {
		sync.Mutex
		loaded bool
		p      *admissionpolicy.Policies
		err    error
		// version is what the informers had delivered when p was compiled (keptPolicies).
		version string
	}
}

// NewKubeCluster builds a KubeCluster from a REST config, kept nowhere: every check asks
// the API server what it decides on. What it keeps, for as long as the KubeCluster lives,
// is kept by what the answer depends on, so that a process that checks again (plan,
// review, the bench) asks only what changed: the CRDs by resourceVersion (a repeated
// read lists their metadata and reads again only those that changed, CRDs), the answers
// to AdmitCRD's dry runs by the live CRD's resourceVersion and the incoming CRD, the API
// server's version, and the admission policies (read at the first question). A config
// that sets no client rate limit (a kubeconfig's) gets none (kubeclient.DefaultRateLimit):
// client-go's default of 5 requests a second, in bursts of 10, held the last object
// counts of a 14-CRD check back by 200 ms each; a check bounds its requests by
// concurrency, and the API server's Priority and Fairness paces them.
func NewKubeCluster(cfg *rest.Config) (*KubeCluster, error) {
	t, err := newTarget(cfg)
	if err != nil {
		return nil, err
	}
	return t.Cluster, nil
}

// newKubeCluster is the Cluster of the clients c, built from cfg.
func newKubeCluster(c *kubeclient.Clients, cfg *rest.Config) (*KubeCluster, error) {
	// The schema check reads objects at old versions on purpose: the API server's
	// deprecation warnings for those reads would only be noise on the user's terminal.
	quiet := rest.CopyConfig(cfg)
	quiet.WarningHandler = rest.NoWarnings{}
	quiet.Wrap(kubeclient.FailFastOnConversion)
	dyn, err := dynamic.NewForConfig(quiet)
	if err != nil {
		return nil, err
	}
	return &KubeCluster{crds: c.CRDs, metadata: c.Metadata, disco: c.Discovery, dynamic: dyn, admissions: crdschema.NewAdmissions(0), clients: c}, nil
}

// A KubeCluster answers every question a prediction asks.
var (
	_ check.Warmer                  = (*KubeCluster)(nil)
	_ check.MigrationLister         = (*KubeCluster)(nil)
	_ check.ExistingMigrationLister = (*KubeCluster)(nil)
	_ check.ObjectLister            = (*KubeCluster)(nil)
)

// Memory is what check keeps of a target kept by Clusters (check.Memory), nil for a
// KubeCluster that keeps nothing between decisions (NewKubeCluster, Connect, or a target
// of Clusters built before Start).
func (k *KubeCluster) Memory() *check.Memory { return k.kept }

// MigrationsInProgress are the StorageVersionMigrations in progress, by CRD (see svm.Active).
func (k *KubeCluster) MigrationsInProgress(ctx context.Context) (map[string][]svm.Migration, error) {
	if k.dynamic == nil {
		return map[string][]svm.Migration{}, nil
	}
	return k.watch.migrationsInProgress(ctx, k)
}

// ExistingMigrations are the StorageVersionMigrations on the cluster by name, finished
// or not (see svm.All).
func (k *KubeCluster) ExistingMigrations(ctx context.Context) (map[string]svm.Existing, bool, error) {
	if k.dynamic == nil {
		return nil, false, nil
	}
	return svm.All(ctx, k.dynamic)
}

// ServerVersion returns the API server's git version, for rendering charts against it
// and wording the schema findings. A KubeCluster reads it once (Connect does, to prove
// the API server answers), so its checks ask for it no more; a control plane upgrade is
// seen by a KubeCluster built after it (a target kept again).
func (k *KubeCluster) ServerVersion(_ context.Context) (string, error) {
	if v := k.version.Load(); v != nil {
		return *v, nil
	}
	v, err := k.disco.ServerVersion()
	if err != nil {
		return "", err
	}
	k.version.Store(&v.GitVersion)
	return v.GitVersion, nil
}

// AdmitCRD asks the API server whether it accepts next over live (nil: a new CRD), with a
// dry-run write (crdschema.Admit), unless next does not change the live spec or the same
// question was answered before (crdschema.Admissions). A target kept by Clusters does not ask: the gates it
// serves decide from memory, with no API request per decision, and the API server still
// refuses such a CRD when it is applied (nothing is lost; the operation fails there).
func (k *KubeCluster) AdmitCRD(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) (*crdschema.Refusal, error) {
	if k.kept != nil {
		return nil, nil
	}
	return k.admissions.Admit(ctx, k.crds.ApiextensionsV1().CustomResourceDefinitions(), live, next)
}

// PolicyDenials evaluates the cluster's ValidatingAdmissionPolicies for writing next over
// live (nil live: a new CRD; nil next: the deletion of live), here, with the API server's own policy code
// (admissionpolicy.Policies.Evaluate), from the policies, bindings and parameters this
// identity may read: no write, so a read-only identity gets an admin's answer. A
// KubeCluster kept nowhere reads the policies once, at the first question. A target kept
// by Clusters (the gates) reads them from informers, compiled again when they change
// (keptPolicies), so its decisions make no request for them; a binding's parameters are
// read when a policy that takes them matches.
func (k *KubeCluster) PolicyDenials(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error) {
	if k.clients == nil {
		return nil, nil
	}
	var p *admissionpolicy.Policies
	var err error
	if k.kept != nil {
		p, err = k.keptPolicies(ctx)
	} else {
		k.policies.Lock()
		if !k.policies.loaded {
			k.policies.p, k.policies.err = admissionpolicy.Load(ctx, k.clients, k.dynamic)
			k.policies.loaded = ctx.Err() == nil
		}
		p, err = k.policies.p, k.policies.err
		k.policies.Unlock()
	}
	if err != nil {
		return nil, err
	}
	return p.Evaluate(ctx, live, next)
}

// CRDs lists every CRD in pages, or reads them from memory for a cluster of Clusters
// whose informer has synced (checked against a metadata LIST first with
// ClustersOptions.VerifyCRDs). A KubeCluster that has listed them once lists only their
// metadata afterwards, and reads again only the CRDs whose resourceVersion moved
// (crdsSince). The CRDs returned are shared: a caller must not change them.
func (k *KubeCluster) CRDs(ctx context.Context) (map[string]*apiextv1.CustomResourceDefinition, error) {
	m, ok, err := k.crdsFromMemory(ctx)
	if err != nil {
		return nil, err
	}
	if ok {
		return m, nil
	}
	k.last.Lock()
	last := k.last.crds
	k.last.Unlock()
	var out map[string]*apiextv1.CustomResourceDefinition
	if last != nil {
		if out, ok, err = k.crdsSince(ctx, last); err != nil {
			return nil, err
		}
	}
	if !ok {
		if out, err = k.listCRDs(ctx); err != nil {
			return nil, err
		}
	}
	k.last.Lock()
	k.last.crds = out
	k.last.Unlock()
	return maps.Clone(out), nil
}

// listCRDs lists every CRD in pages.
func (k *KubeCluster) listCRDs(ctx context.Context) (map[string]*apiextv1.CustomResourceDefinition, error) {
	out := map[string]*apiextv1.CustomResourceDefinition{}
	for list, err := range kubeclient.Pages(ctx, k.crds.ApiextensionsV1().CustomResourceDefinitions().List, metav1.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list CustomResourceDefinitions: %w", err)
		}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
	}
	return out, nil
}

// maxCRDReads bounds the CRDs crdsSince reads again one by one; when more have changed
// (a chart applied a moment ago), one LIST of all is cheaper.
const maxCRDReads = 8

// crdsSince are the CRDs now, from those read last and the API server's resourceVersions
// of its CRDs (one LIST of their metadata, crdVersions): a CRD whose resourceVersion has
// not moved is the one read last, and every other (created or written since: a new
// storage version, storedVersions pruned) is read again, with a GET. A CRD deleted since
// is gone. So nothing a check decides on is older than that LIST, and a repeated check
// of a large cluster reads a fraction of a full LIST. ok is false when more than
// maxCRDReads changed.
func (k *KubeCluster) crdsSince(ctx context.Context, last map[string]*apiextv1.CustomResourceDefinition) (map[string]*apiextv1.CustomResourceDefinition, bool, error) {
	versions, err := k.crdVersions(ctx)
	if err != nil {
		return nil, false, err
	}
	out := make(map[string]*apiextv1.CustomResourceDefinition, len(versions))
	var changed []string
	for name, rv := range versions {
		if c := last[name]; c != nil && c.ResourceVersion == rv {
			out[name] = c
		} else {
			changed = append(changed, name)
		}
	}
	if len(changed) > maxCRDReads {
		return nil, false, nil
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for _, name := range changed {
		g.Go(func() error {
			c, err := k.CRD(gctx, name)
			if apierrors.IsNotFound(err) {
				return nil // deleted since the LIST
			}
			if err != nil {
				return fmt.Errorf("read CustomResourceDefinition %s: %w", name, err)
			}
			mu.Lock()
			out[name] = c
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// crdVersions are the API server's CRDs' resourceVersions, by name, from one LIST of
// their metadata (a small fraction of the full objects).
func (k *KubeCluster) crdVersions(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for list, err := range kubeclient.Pages(ctx, k.metadata.Resource(crdResource).List, metav1.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list CustomResourceDefinitions: %w", err)
		}
		for _, item := range list.Items {
			out[item.Name] = item.ResourceVersion
		}
	}
	return out, nil
}

// CRD reads one CRD from the API server, never from memory: what a caller checks a
// view from memory against before it acts on it.
func (k *KubeCluster) CRD(ctx context.Context, name string) (*apiextv1.CustomResourceDefinition, error) {
	return k.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
}

// ListObjects lists one page of a custom resource's objects in every namespace; for a
// target of Clusters, a small collection unchanged since its last LIST is answered from
// memory. The objects returned must not be modified.
func (k *KubeCluster) ListObjects(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	return k.watch.listObjects(ctx, k, gvr, opts)
}

// CountObjects asks for one object's metadata and reads the remaining item count the
// API server reports, so counting costs one call whatever the number of objects. A target
// of Clusters counts from memory once the resource's metadata informer has synced.
func (k *KubeCluster) CountObjects(ctx context.Context, crd *apiextv1.CustomResourceDefinition) (int64, error) {
	gvr, err := objectsOf(crd)
	if err != nil {
		return 0, err
	}
	if n, ok := k.watch.countObjects(k, gvr); ok {
		return n, nil
	}
	n, _, err := k.SampleObjects(ctx, crd, 1)
	return n, err
}

// SampleObjects asks the API server, never memory, how many objects of the CRD's type
// exist in all namespaces, and names up to limit of them ("namespace/name", or "name" for
// a cluster-scoped type) in the API server's order: one metadata LIST of limit objects
// whose remaining item count gives the rest. A caller that refuses something because
// objects exist (the CRD deletion guard) confirms with it what memory said, and names
// examples.
func (k *KubeCluster) SampleObjects(ctx context.Context, crd *apiextv1.CustomResourceDefinition, limit int64) (int64, []string, error) {
	gvr, err := objectsOf(crd)
	if err != nil {
		return 0, nil, err
	}
	list := func(ctx context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
		if opts.Continue != "" {
			// No count offered with the first page (for example a list served from a watch
			// cache that does not know it): page through the rest, metadata only.
			opts.Limit = kubeclient.PageSize
		}
		return k.metadata.Resource(gvr).List(ctx, opts)
	}
	var n int64
	var names []string
	for page, err := range kubeclient.Pages(ctx, list, metav1.ListOptions{Limit: max(limit, 1)}) {
		if err != nil {
			return 0, nil, fmt.Errorf("list %s: %w", gvr.GroupResource(), err)
		}
		for _, item := range page.Items {
			if int64(len(names)) < limit {
				names = append(names, objectName(item.Namespace, item.Name))
			}
		}
		n += int64(len(page.Items))
		if page.Continue != "" && page.RemainingItemCount != nil {
			return n + *page.RemainingItemCount, names, nil
		}
	}
	return n, names, nil
}

// objectsOf is the resource of a CRD's objects at a version it serves.
func objectsOf(crd *apiextv1.CustomResourceDefinition) (schema.GroupVersionResource, error) {
	version := crdversions.ServedVersion(crd)
	if version == "" {
		return schema.GroupVersionResource{}, fmt.Errorf("%s serves no version, so its objects cannot be listed", crd.Name)
	}
	return schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural}, nil
}

// objectName is "namespace/name", or "name" for a cluster-scoped object.
func objectName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

var crdResource = schema.GroupVersionResource{Group: apiextv1.GroupName, Version: "v1", Resource: "customresourcedefinitions"}

// fresh reports whether CRDs read from memory are the API server's CRDs now: the same
// names at the same resourceVersions, by one LIST of their metadata (a small fraction of
// the full objects). A decision is about status.storedVersions, so an informer that lags
// a migration or a chart applied a moment ago must not answer it.
func (k *KubeCluster) fresh(ctx context.Context, m map[string]*apiextv1.CustomResourceDefinition) (bool, error) {
	versions, err := k.crdVersions(ctx)
	if err != nil || len(versions) != len(m) {
		return false, err
	}
	for name, rv := range versions {
		if c := m[name]; c == nil || c.ResourceVersion != rv {
			return false, nil
		}
	}
	return true, nil
}
