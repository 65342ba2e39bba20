package chartsource

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/chart/loader"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/registry"
	repo "helm.sh/helm/v4/pkg/repo/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// CacheOptions size a Cache and say what it wraps.
type CacheOptions struct {
	// Loader is what the Cache asks for whatever it does not keep. Default: Helm.
	Loader Loader
	// IndexTTL is how long a repository index (and an OCI tag resolution) is reused
	// before it is fetched again, so that a semver range or a moved tag picks up a new
	// version at most this late. Default 1 minute.
	IndexTTL time.Duration
	// MaxCharts bounds how many chart archives are kept (least recently used go first).
	// Default 64.
	MaxCharts int
	// MaxIndexes bounds how many repository indexes and OCI resolutions are kept.
	// Default 32.
	MaxIndexes int
	// Clock tells the time for the TTL. Default: the real clock.
	Clock clock.PassiveClock
}

// Cache is a Loader that wraps another and keeps what fetching a remote chart
// downloads, for a caller that loads the same charts again and again (the admission gate,
// a plan's search). Chart archives are kept by where they come from, chart name, exact
// version, digest (when the index or registry gives one) and credentials identity
// (Options.CredentialsID), so a cached chart is never handed to a caller with other
// credentials; repository indexes and OCI version resolutions are kept for IndexTTL.
// The CRDs a chart renders are kept too, by the chart archive's key and a hash of
// everything the render depends on (the composed values, release name and namespace,
// Kubernetes version, install or upgrade): keys are hashes, never values. Local charts
// (directories and files), and credentials without an identity, are passed to the wrapped
// Loader and never kept. A Cache is safe for concurrent use.
type Cache struct {
	next     Loader
	ttl      time.Duration
	clock    clock.PassiveClock
	indexes  *lru.Cache // indexKey -> *indexEntry
	charts   *lru.Cache // chartKey -> []byte (the archive)
	rendered *lru.Cache // renderKey -> *Chart (without the loaded chart)
}

// NewCache builds a Cache around o.Loader.
func NewCache(o CacheOptions) *Cache {
	if o.Loader == nil {
		o.Loader = Helm{}
	}
	if o.IndexTTL <= 0 {
		o.IndexTTL = time.Minute
	}
	if o.MaxCharts <= 0 {
		o.MaxCharts = 64
	}
	if o.MaxIndexes <= 0 {
		o.MaxIndexes = 32
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Cache{next: o.Loader, ttl: o.IndexTTL, clock: o.Clock,
		indexes: lru.New(o.MaxIndexes), charts: lru.New(o.MaxCharts), rendered: lru.New(o.MaxCharts)}
}

// Load serves the rendered CRDs of an archive already rendered with the same inputs, or
// renders the (kept) archive now and keeps the result. The Chart of a kept render has no
// loaded chart and no Path.
func (c *Cache) Load(ctx context.Context, o Options) (*Chart, error) {
	creds, ok := cacheable(o)
	if !ok {
		return c.next.Load(ctx, o)
	}
	ch, key, err := c.fetchKeyed(ctx, o, creds)
	if err != nil {
		return nil, err
	}
	rk, keyed := renderKeyOf(o, key)
	if keyed {
		if v, hit := c.rendered.Get(rk); hit {
			out := *v.(*Chart)
			return &out, nil
		}
	}
	if ch == nil {
		if ch, err = c.archive(ctx, o, creds, key); err != nil {
			return nil, err
		}
	}
	r, err := c.next.Render(ctx, ch, o)
	if err != nil {
		return nil, err
	}
	if keyed {
		kept := *r
		kept.Chart = nil // rendering changes a loaded chart: it is never shared
		c.rendered.Add(rk, &kept)
	}
	return r, nil
}

// Locate is the wrapped Loader's: a Cache keeps archives in memory, not paths.
func (c *Cache) Locate(ctx context.Context, o Options) (string, error) { return c.next.Locate(ctx, o) }

// Render is the wrapped Loader's: a render is kept only under the archive Load fetched.
func (c *Cache) Render(ctx context.Context, ch *chart.Chart, o Options) (*Chart, error) {
	return c.next.Render(ctx, ch, o)
}

// Index returns the repository's index, read through the wrapped Loader at most IndexTTL
// ago.
func (c *Cache) Index(ctx context.Context, o Options) (*repo.IndexFile, error) {
	creds, ok := cacheable(o)
	if !ok || o.RepoURL == "" {
		return c.next.Index(ctx, o)
	}
	ik := indexKey{source: o.RepoURL, creds: creds}
	if e, ok := c.fresh(ik); ok {
		return e.index, nil
	}
	at := c.clock.Now()
	idx, err := c.next.Index(ctx, o)
	if err != nil {
		return nil, err
	}
	c.indexes.Add(ik, &indexEntry{at: at, index: idx})
	return idx, nil
}

// renderKey names one render of one chart archive: a hash of the archive's key and of
// what the render depends on.
type renderKey string

// renderKeyOf returns the render's key, or false when the render depends on something a
// key cannot see (values files or --set given by path or string, read at render time).
func renderKeyOf(o Options, chart chartKey) (renderKey, bool) {
	v := o.Values
	if len(v.ValueFiles)+len(v.Values)+len(v.StringValues)+len(v.FileValues)+len(v.JSONValues)+len(v.LiteralValues) > 0 {
		return "", false
	}
	values, err := json.Marshal(o.BaseValues) // map keys sorted: the same values give the same bytes
	if err != nil {
		return "", false
	}
	h := sha256.New()
	for _, p := range []string{chart.source, chart.chart, chart.version, chart.digest, chart.creds,
		o.ReleaseName, o.Namespace, o.KubeVersion, fmt.Sprint(o.IsUpgrade)} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	h.Write(values)
	return renderKey(hex.EncodeToString(h.Sum(nil))), true
}

// indexKey names a repository index or an OCI resolution as one set of credentials sees
// it. It holds the credentials' identity, never their content.
type indexKey struct {
	source, chart, version, creds string
}

type indexEntry struct {
	at    time.Time
	index *repo.IndexFile // HTTP repositories
	chart chartKey        // OCI: what ref@version resolved to
}

// fresh is the index or resolution kept under ik, when it was fetched less than the TTL
// ago.
func (c *Cache) fresh(ik indexKey) (*indexEntry, bool) {
	v, ok := c.indexes.Get(ik)
	if !ok {
		return nil, false
	}
	e := v.(*indexEntry)
	return e, c.clock.Since(e.at) < c.ttl
}

// chartKey names one chart archive.
type chartKey struct {
	source, chart, version, digest, creds string
}

// cacheable reports whether o names a remote chart that a Cache may keep, and the
// credentials identity to key it by. Credentials without an identity are never kept.
func cacheable(o Options) (creds string, ok bool) {
	if strings.TrimSpace(o.Ref) == "" || (o.RepoURL == "" && !registry.IsOCI(o.Ref)) {
		return "", false
	}
	hasCreds := o.Username != "" || o.Password != "" || o.CertFile != "" || o.KeyFile != ""
	if hasCreds && o.CredentialsID == "" {
		return "", false
	}
	return o.CredentialsID, true
}

// fetchKeyed names the archive o asks for without loading it when it can (an HTTP
// repository's index names it; an OCI resolution kept within the TTL does), else fetches
// and loads it. ch is nil when only the key was needed.
func (c *Cache) fetchKeyed(ctx context.Context, o Options, creds string) (ch *chart.Chart, key chartKey, err error) {
	if o.RepoURL != "" {
		key, _, err = c.resolveHTTP(ctx, o, creds)
		return nil, key, err
	}
	ik := ociKey(o, creds)
	if e, ok := c.fresh(ik); ok {
		if _, ok := c.charts.Get(e.chart); ok {
			return nil, e.chart, nil
		}
	}
	ch, err = c.fetchOCI(ctx, o, creds)
	if err != nil {
		return nil, chartKey{}, err
	}
	v, _ := c.indexes.Get(ik)
	return ch, v.(*indexEntry).chart, nil
}

// archive loads the archive named key: from the cache, or downloaded again.
func (c *Cache) archive(ctx context.Context, o Options, creds string, key chartKey) (*chart.Chart, error) {
	if ch, ok := c.cachedChart(o.Ref, key); ok {
		return ch, nil
	}
	if o.RepoURL != "" {
		return c.fetchHTTP(ctx, o, creds)
	}
	return c.fetchOCI(ctx, o, creds)
}

// resolveHTTP resolves the version in the (cached) repository index.
func (c *Cache) resolveHTTP(ctx context.Context, o Options, creds string) (chartKey, *repo.ChartVersion, error) {
	idx, err := c.Index(ctx, o)
	if err != nil {
		return chartKey{}, nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: err}
	}
	cv, err := idx.Get(o.Ref, o.Version)
	if err != nil {
		return chartKey{}, nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: fmt.Errorf("chart %q version %q not found in the index of %s (fetched at most %s ago): %w", o.Ref, o.Version, o.RepoURL, c.ttl, err)}
	}
	if len(cv.URLs) == 0 {
		return chartKey{}, nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: fmt.Errorf("chart %q version %s has no download URL in the index of %s", o.Ref, cv.Version, o.RepoURL)}
	}
	return chartKey{source: o.RepoURL, chart: o.Ref, version: cv.Version, digest: cv.Digest, creds: creds}, cv, nil
}

// fetchHTTP resolves the version in the (cached) repository index, then returns the
// cached archive of that exact version or has the wrapped Loader download it.
func (c *Cache) fetchHTTP(ctx context.Context, o Options, creds string) (*chart.Chart, error) {
	key, cv, err := c.resolveHTTP(ctx, o, creds)
	if err != nil {
		return nil, err
	}
	if ch, ok := c.cachedChart(o.Ref, key); ok {
		return ch, nil
	}
	chartURL, err := repo.ResolveReferenceURL(o.RepoURL, cv.URLs[0])
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: err}
	}
	// Download the exact URL the index names. Helm passes the repository's credentials
	// on only to the repository's own host unless passCredentials is set; keep that rule.
	dl := o
	dl.Ref, dl.RepoURL, dl.Version = chartURL, "", ""
	if !o.PassCredentialsAll && !sameHost(o.RepoURL, chartURL) {
		dl.Username, dl.Password = "", ""
	}
	data, ch, err := c.download(ctx, o.Ref, dl)
	if err != nil {
		return nil, err
	}
	c.charts.Add(key, data)
	return ch, nil
}

// ociKey names the resolution of an OCI ref@version as one set of credentials sees it.
func ociKey(o Options, creds string) indexKey {
	return indexKey{source: "oci", chart: o.Ref, version: o.Version, creds: creds}
}

// fetchOCI resolves ref@version through the wrapped Loader at most once per TTL (a tag
// can move), and keeps the archive by its digest.
func (c *Cache) fetchOCI(ctx context.Context, o Options, creds string) (*chart.Chart, error) {
	ik := ociKey(o, creds)
	if e, ok := c.fresh(ik); ok {
		if ch, ok := c.cachedChart(o.Ref, e.chart); ok {
			return ch, nil
		}
	}
	at := c.clock.Now()
	data, ch, err := c.download(ctx, o.Ref, o)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	key := chartKey{source: "oci", chart: o.Ref, version: ch.Metadata.Version, digest: hex.EncodeToString(sum[:]), creds: creds}
	c.charts.Add(key, data)
	c.indexes.Add(ik, &indexEntry{at: at, chart: key})
	return ch, nil
}

// download has the wrapped Loader fetch the archive dl names, and returns it and the
// chart it loads. ref names the chart in errors.
func (c *Cache) download(ctx context.Context, ref string, dl Options) ([]byte, *chart.Chart, error) {
	path, err := c.next.Locate(ctx, dl)
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, &LoadError{Ref: ref, Step: StepFetch, Err: err}
	}
	ch, err := loadArchive(ref, data)
	if err != nil {
		return nil, nil, err
	}
	return data, ch, nil
}

// cachedChart loads a kept archive afresh: rendering changes a loaded chart (disabled
// subcharts are dropped), so the loaded form is never shared.
func (c *Cache) cachedChart(ref string, key chartKey) (*chart.Chart, bool) {
	v, ok := c.charts.Get(key)
	if !ok {
		return nil, false
	}
	ch, err := loadArchive(ref, v.([]byte))
	if err != nil {
		c.charts.Remove(key)
		return nil, false
	}
	return ch, true
}

func loadArchive(ref string, data []byte) (*chart.Chart, error) {
	charter, err := loader.LoadArchive(bytes.NewReader(data))
	if err != nil {
		return nil, &LoadError{Ref: ref, Step: "load", Err: err}
	}
	ch, ok := charter.(*chart.Chart)
	if !ok {
		return nil, &LoadError{Ref: ref, Step: "load", Err: fmt.Errorf("unsupported chart API version %T", charter)}
	}
	if err := checkDependencies(ref, ref, ch); err != nil {
		return nil, err
	}
	return ch, nil
}

func sameHost(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	if err := errors.Join(err1, err2); err != nil {
		return false
	}
	return ua.Scheme == ub.Scheme && ua.Host == ub.Host
}
