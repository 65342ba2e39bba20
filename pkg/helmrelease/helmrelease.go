// Package helmrelease owns reading Helm release history from the cluster, through the
// Helm SDK's own storage drivers (Secret and ConfigMap), and picking the revisions an
// upgrade or rollback works from. It never decodes release data by hand and never
// returns release values to callers that print.
package helmrelease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/utils/lru"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// Driver is a Helm release storage driver, spelled as HELM_DRIVER spells it.
type Driver string

// The storage drivers a Reader reads.
const (
	DriverSecret    Driver = "secret"
	DriverConfigMap Driver = "configmap"
)

// Drivers are the driver names ParseDriver accepts, in their canonical spelling.
var Drivers = []Driver{DriverSecret, DriverConfigMap}

// ParseDriver returns the driver a name means: secret or configmap, their plurals as
// Helm also takes them, and "" for secret, Helm's default. Any other name is an error
// that lists the names there are.
func ParseDriver(name string) (Driver, error) {
	switch name {
	case "", string(DriverSecret), "secrets":
		return DriverSecret, nil
	case string(DriverConfigMap), "configmaps":
		return DriverConfigMap, nil
	}
	return "", fmt.Errorf("unknown Helm storage driver %q: use %s or %s", name, DriverSecret, DriverConfigMap)
}

// Reader reads release revisions from one namespace.
type Reader struct {
	store     *storage.Storage
	namespace string
	driver    Driver
	metadata  metadata.Interface
	cache     *Cache
}

// NewReader returns a Reader over the Secret or ConfigMap driver. An empty driver
// means secret, Helm's default; a name ParseDriver rejects is an error.
func NewReader(cs kubernetes.Interface, namespace string, name Driver) (*Reader, error) {
	d, err := ParseDriver(string(name))
	if err != nil {
		return nil, err
	}
	var store driver.Driver = driver.NewSecrets(cs.CoreV1().Secrets(namespace))
	if d == DriverConfigMap {
		store = driver.NewConfigMaps(cs.CoreV1().ConfigMaps(namespace))
	}
	return &Reader{store: storage.Init(store), namespace: namespace, driver: d}, nil
}

// NewDriverReader returns a Reader over a Helm storage driver already holding the
// namespace's releases: Helm's memory driver filled from a record of them (a snapshot),
// say. name is the driver it stands for.
func NewDriverReader(d driver.Driver, namespace string, name Driver) *Reader {
	return &Reader{store: storage.Init(d), namespace: namespace, driver: name}
}

// Driver is the storage driver the reader reads, in its canonical spelling.
func (r *Reader) Driver() Driver { return r.driver }

// NotFoundError says that a release or revision does not exist.
type NotFoundError struct {
	Release, Namespace string
	Driver             Driver
	Revision           int
}

func (e *NotFoundError) Error() string {
	if e.Revision > 0 {
		return fmt.Sprintf("release %s has no revision %d in namespace %s: list revisions with `%s`",
			e.Release, e.Revision, e.Namespace, cmdline.HelmHistory{Release: e.Release, Namespace: e.Namespace})
	}
	return fmt.Sprintf("release %s not found in namespace %s (Helm driver %s): check `%s`; a release installed with HELM_DRIVER=configmap is read with the configmap driver",
		e.Release, e.Namespace, e.Driver, cmdline.HelmList{Namespace: e.Namespace})
}

// RevisionError says that a revision number was not a positive number.
type RevisionError struct{ Revision int }

func (e *RevisionError) Error() string {
	return fmt.Sprintf("a revision must be a positive revision number, got %d", e.Revision)
}

// NotFailedError says that the last revision of a release did not fail, when a failed
// one was asked for; the caller names a revision to compare instead.
type NotFailedError struct {
	Release, Namespace, Status string
	Revision                   int
}

func (e *NotFailedError) Error() string {
	return fmt.Sprintf("the last revision (%d) of release %s in namespace %s is %s, not failed",
		e.Revision, e.Release, e.Namespace, e.Status)
}

// History returns every stored revision of a release, oldest first.
func (r *Reader) History(ctx context.Context, name string) ([]*release.Release, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	list, err := r.store.History(name)
	if err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
		return nil, fmt.Errorf("read history of release %s in namespace %s: %w", name, r.namespace, err)
	}
	out := make([]*release.Release, 0, len(list))
	for _, ri := range list {
		rel, ok := ri.(*release.Release)
		if !ok {
			return nil, fmt.Errorf("release %s: unsupported release format %T", name, ri)
		}
		out = append(out, rel)
	}
	if len(out) == 0 {
		return nil, &NotFoundError{Release: name, Namespace: r.namespace, Driver: r.driver}
	}
	slices.SortFunc(out, func(a, b *release.Release) int { return a.Version - b.Version })
	return out, nil
}

// Current returns the revision an upgrade starts from: the last deployed revision when
// there is one, otherwise the last revision whatever its status.
func (r *Reader) Current(ctx context.Context, name string) (*release.Release, error) {
	h, err := r.History(ctx, name)
	if err != nil {
		return nil, err
	}
	return Deployed(h), nil
}

// Deployed is the revision an upgrade starts from, picked from a history sorted oldest
// first (as History returns it): the last deployed revision, else the last revision
// whatever its status; nil for an empty history. It is the one "latest deployed" rule of
// every caller.
func Deployed(h []*release.Release) *release.Release {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Info != nil && h[i].Info.Status == common.StatusDeployed {
			return h[i]
		}
	}
	if len(h) == 0 {
		return nil
	}
	return h[len(h)-1]
}

// RollbackPair returns what helm rollback works from and to: the last revision
// (whatever its status) and the target, which is toRevision or, when it is 0, the
// revision before the last one. This is helm's own rule.
func (r *Reader) RollbackPair(ctx context.Context, name string, toRevision int) (current, target *release.Release, err error) {
	if toRevision < 0 {
		return nil, nil, &RevisionError{Revision: toRevision}
	}
	h, err := r.History(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	current = h[len(h)-1]
	want := toRevision
	if want == 0 {
		want = current.Version - 1
	}
	if want < 1 {
		return nil, nil, fmt.Errorf("release %s in namespace %s has only revision %d: there is nothing to roll back to", name, r.namespace, current.Version)
	}
	for _, rel := range h {
		if rel.Version == want {
			return current, rel, nil
		}
	}
	return nil, nil, &NotFoundError{Release: name, Namespace: r.namespace, Driver: r.driver, Revision: want}
}

// Releases returns the current revision (as Current picks it) of every release the
// reader sees: one namespace, or every namespace for a reader made with namespace "".
// Releases uninstalled with --keep-history are left out. Sorted by namespace and name.
func (r *Reader) Releases(ctx context.Context) ([]*release.Release, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	list, err := r.store.ListReleases()
	if err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
		where := "namespace " + r.namespace
		if r.namespace == "" {
			where = "all namespaces"
		}
		return nil, fmt.Errorf("list Helm releases in %s (driver %s): %w", where, r.driver, err)
	}
	byName := map[[2]string][]*release.Release{}
	for _, ri := range list {
		rel, ok := ri.(*release.Release)
		if !ok {
			return nil, fmt.Errorf("unsupported release format %T", ri)
		}
		k := [2]string{rel.Namespace, rel.Name}
		byName[k] = append(byName[k], rel)
	}
	var out []*release.Release
	for _, h := range byName {
		slices.SortFunc(h, func(a, b *release.Release) int { return a.Version - b.Version })
		cur := Deployed(h)
		if cur.Info != nil && cur.Info.Status == common.StatusUninstalled {
			continue
		}
		out = append(out, cur)
	}
	slices.SortFunc(out, func(a, b *release.Release) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// FailedPair returns a failed revision and the revision before it: the last revision
// when revision is 0, which must then have failed, or the given one. previous is nil
// when the failed revision is the first (a failed install).
func (r *Reader) FailedPair(ctx context.Context, name string, revision int) (failed, previous *release.Release, err error) {
	if revision < 0 {
		return nil, nil, &RevisionError{Revision: revision}
	}
	h, err := r.History(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	i := len(h) - 1
	if revision > 0 {
		i = slices.IndexFunc(h, func(rel *release.Release) bool { return rel.Version == revision })
		if i < 0 {
			return nil, nil, &NotFoundError{Release: name, Namespace: r.namespace, Driver: r.driver, Revision: revision}
		}
	} else if st := h[i].Info; st == nil || (st.Status != common.StatusFailed && !st.Status.IsPending()) {
		status := "unknown"
		if st != nil {
			status = st.Status.String()
		}
		return nil, nil, &NotFailedError{Release: name, Namespace: r.namespace, Status: status, Revision: h[i].Version}
	}
	if i > 0 {
		previous = h[i-1]
	}
	return h[i], previous, nil
}

// Cache keeps decoded revisions by the identity of the object that stores them (its UID
// and resourceVersion, hashed), so a Reader asked again for an unchanged revision does not
// decode it again. It is safe for concurrent use.
type Cache struct {
	revisions *lru.Cache
	records   Records
}

// Records answers, from memory, which storage objects hold a release's revisions: the
// metadata (labels, UID, resourceVersion) of the Secrets Helm's secret driver wrote, as an
// informer on them keeps it. ok is false when it cannot answer (not synced yet): the
// Reader then lists them from the API server.
type Records interface {
	Records(namespace, name string) (items []*metav1.PartialObjectMetadata, ok bool)
}

// SetRecords lets Deployed find the release's storage Secrets in r instead of listing
// them, so an unchanged release is read with no API call. r lags the API server by what
// its watch has not delivered yet: a revision written a moment ago may not be seen.
func (c *Cache) SetRecords(r Records) *Cache {
	c.records = r
	return c
}

// NewCache keeps up to n revisions (default 64).
func NewCache(n int) *Cache {
	if n <= 0 {
		n = 64
	}
	return &Cache{revisions: lru.New(n)}
}

// WithMemory lets Deployed read the stored objects' labels through md and decode only
// the revision it picks, kept in c between calls. Either may be nil.
func (r *Reader) WithMemory(md metadata.Interface, c *Cache) *Reader {
	r.metadata, r.cache = md, c
	return r
}

// Deployed returns the revision an upgrade starts from (the rule of Deployed) and a key
// naming the stored object it came from: a hash of its UID and resourceVersion, the same
// as long as that revision is unchanged ("" when the reader has no metadata client). With
// a metadata client it reads the labels Helm's drivers write (name, version, status) and
// decodes only that revision, from the cache when it is unchanged. A release with no
// revision gives *NotFoundError.
func (r *Reader) Deployed(ctx context.Context, name string) (*release.Release, string, error) {
	if r.metadata == nil {
		h, err := r.History(ctx, name)
		if err != nil {
			return nil, "", err
		}
		return Deployed(h), "", nil
	}
	items, err := r.records(ctx, name)
	if err != nil {
		return nil, "", err
	}
	var pick *metav1.PartialObjectMetadata
	pickVersion, pickDeployed := 0, false
	for _, m := range items {
		v, err := strconv.Atoi(m.Labels["version"])
		if err != nil {
			continue
		}
		deployed := m.Labels["status"] == common.StatusDeployed.String()
		if pick == nil || (deployed && !pickDeployed) || (deployed == pickDeployed && v > pickVersion) {
			pick, pickVersion, pickDeployed = m, v, deployed
		}
	}
	if pick == nil {
		return nil, "", &NotFoundError{Release: name, Namespace: r.namespace, Driver: r.driver}
	}
	sum := sha256.Sum256([]byte(string(pick.UID) + "/" + pick.ResourceVersion))
	key := hex.EncodeToString(sum[:])
	if r.cache != nil {
		if v, ok := r.cache.revisions.Get(key); ok {
			return v.(*release.Release), key, nil
		}
	}
	ri, err := r.store.Get(name, pickVersion)
	if err != nil {
		return nil, "", fmt.Errorf("read revision %d of release %s in namespace %s: %w", pickVersion, name, r.namespace, err)
	}
	rel, ok := ri.(*release.Release)
	if !ok {
		return nil, "", fmt.Errorf("release %s: unsupported release format %T", name, ri)
	}
	if r.cache != nil {
		r.cache.revisions.Add(key, rel)
	}
	return rel, key, nil
}

// records are the metadata of the release's storage objects: from the cache's Records
// when it can answer, else one metadata-only LIST.
func (r *Reader) records(ctx context.Context, name string) ([]*metav1.PartialObjectMetadata, error) {
	if r.cache != nil && r.cache.records != nil && r.driver == DriverSecret {
		if items, ok := r.cache.records.Records(r.namespace, name); ok {
			return items, nil
		}
	}
	resource := "secrets"
	if r.driver == DriverConfigMap {
		resource = "configmaps"
	}
	list, err := r.metadata.Resource(schema.GroupVersionResource{Version: "v1", Resource: resource}).Namespace(r.namespace).
		List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + name})
	if err != nil {
		return nil, fmt.Errorf("read history of release %s in namespace %s: %w", name, r.namespace, err)
	}
	items := make([]*metav1.PartialObjectMetadata, 0, len(list.Items))
	for i := range list.Items {
		items = append(items, &list.Items[i])
	}
	return items, nil
}
