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
	"path/filepath"
	"sync"
	"time"

	"helm.sh/helm/v4/pkg/chart/loader"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/getter"
	"helm.sh/helm/v4/pkg/helmpath"
	"helm.sh/helm/v4/pkg/registry"
	repo "helm.sh/helm/v4/pkg/repo/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// CacheOptions size a Cache.
type CacheOptions struct {
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

// Cache keeps what fetching a remote chart downloads, for a caller that loads the same
// charts again and again (the admission gate). Chart archives are kept by where they
// come from, chart name, exact version, digest (when the index or registry gives one)
// and credentials identity, so a cached chart is never handed to a caller with other
// credentials; repository indexes and OCI version resolutions are kept for IndexTTL.
// The CRDs a chart renders are kept too, by the chart archive's key and a hash of
// everything the render depends on (the composed values, release name and namespace,
// Kubernetes version, install or upgrade): keys are hashes, never values. Local charts
// (directories and files) are never cached. A Cache is safe for concurrent use.
type Cache struct {
	ttl      time.Duration
	clock    clock.PassiveClock
	indexes  *lru.Cache // indexKey -> *indexEntry
	charts   *lru.Cache // chartKey -> []byte (the archive)
	rendered *lru.Cache // renderKey -> *Chart (without the loaded chart)
	mu       sync.Mutex // serialises index downloads into the shared repository cache
}

// NewCache builds a Cache.
func NewCache(o CacheOptions) *Cache {
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
	return &Cache{ttl: o.IndexTTL, clock: o.Clock, indexes: lru.New(o.MaxIndexes), charts: lru.New(o.MaxCharts), rendered: lru.New(o.MaxCharts)}
}

// renderKey names one render of one chart archive: a hash of the archive's key and of
// what the render depends on.
type renderKey string

// renderKeyOf returns the render's key, or false when the render depends on something a
// key cannot see (values files or --set given by path or string, read at render time).
func (o Options) renderKeyOf(chart chartKey) (renderKey, bool) {
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

// load is Load through the cache: the rendered CRDs of an archive already rendered with
// the same inputs, or the (cached) archive rendered now and kept.
func (c *Cache) load(ctx context.Context, o Options, settings *cli.EnvSettings, creds string) (*Chart, error) {
	ch, key, err := c.fetchKeyed(o, settings, creds)
	if err != nil {
		return nil, err
	}
	rk, ok := o.renderKeyOf(key)
	if ok {
		if v, hit := c.rendered.Get(rk); hit {
			out := *v.(*Chart)
			return &out, nil
		}
	}
	if ch == nil {
		if ch, err = c.archive(o, settings, key); err != nil {
			return nil, err
		}
	}
	r, err := o.render(ctx, settings, "", ch)
	if err != nil {
		return nil, err
	}
	if ok {
		kept := *r
		kept.Chart = nil // rendering changes a loaded chart: it is never shared
		c.rendered.Add(rk, &kept)
	}
	return r, nil
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

// chartKey names one chart archive.
type chartKey struct {
	source, chart, version, digest, creds string
}

// cacheable reports whether o fetches a remote chart that c may keep, and the
// credentials identity to key it by. Credentials without an identity are never cached.
func (o Options) cacheable() (creds string, ok bool) {
	if o.RepoURL == "" && !registry.IsOCI(o.Ref) {
		return "", false
	}
	hasCreds := o.Username != "" || o.Password != "" || o.CertFile != "" || o.KeyFile != ""
	if hasCreds && o.CredentialsID == "" {
		return "", false
	}
	return o.CredentialsID, true
}

// fetch returns the loaded chart o asks for, from the cache when it can.
func (c *Cache) fetch(o Options, settings *cli.EnvSettings) (*chart.Chart, error) {
	creds, ok := o.cacheable()
	if !ok {
		path, err := o.Locate(settings)
		if err != nil {
			return nil, err
		}
		return loadChart(o.Ref, path)
	}
	if o.RepoURL != "" {
		return c.fetchHTTP(o, settings, creds)
	}
	return c.fetchOCI(o, settings, creds)
}

// fetchKeyed names the archive o asks for without loading it when it can (an HTTP
// repository's index names it; an OCI resolution kept within the TTL does), else fetches
// and loads it. ch is nil when only the key was needed.
func (c *Cache) fetchKeyed(o Options, settings *cli.EnvSettings, creds string) (ch *chart.Chart, key chartKey, err error) {
	if o.RepoURL != "" {
		key, _, err = c.resolveHTTP(o, settings, creds)
		return nil, key, err
	}
	ik := indexKey{source: "oci", chart: o.Ref, version: o.Version, creds: creds}
	if v, ok := c.indexes.Get(ik); ok {
		if e := v.(*indexEntry); c.clock.Since(e.at) < c.ttl {
			if _, ok := c.charts.Get(e.chart); ok {
				return nil, e.chart, nil
			}
		}
	}
	ch, err = c.fetchOCI(o, settings, creds)
	if err != nil {
		return nil, chartKey{}, err
	}
	v, _ := c.indexes.Get(ik)
	return ch, v.(*indexEntry).chart, nil
}

// archive loads the archive named key: from the cache, or downloaded again.
func (c *Cache) archive(o Options, settings *cli.EnvSettings, key chartKey) (*chart.Chart, error) {
	if ch, ok := c.cachedChart(o.Ref, key); ok {
		return ch, nil
	}
	return c.fetch(o, settings)
}

// resolveHTTP resolves the version in the (cached) repository index.
func (c *Cache) resolveHTTP(o Options, settings *cli.EnvSettings, creds string) (chartKey, *repo.ChartVersion, error) {
	idx, err := c.index(o, settings, creds)
	if err != nil {
		return chartKey{}, nil, err
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
// cached archive of that exact version or downloads it.
func (c *Cache) fetchHTTP(o Options, settings *cli.EnvSettings, creds string) (*chart.Chart, error) {
	key, cv, err := c.resolveHTTP(o, settings, creds)
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
	// Download the exact URL the index names, with Helm's downloader. Helm passes the
	// repository's credentials on only to the repository's own host unless
	// passCredentials is set; keep that rule.
	dl := o
	dl.Ref, dl.RepoURL, dl.Version = chartURL, "", ""
	if !o.PassCredentialsAll && !sameHost(o.RepoURL, chartURL) {
		dl.Username, dl.Password = "", ""
	}
	path, err := dl.Locate(settings)
	if err != nil {
		return nil, err
	}
	return c.keep(o.Ref, key, path)
}

// fetchOCI resolves ref@version with Helm's registry client at most once per TTL (a tag
// can move), and keeps the archive by its digest.
func (c *Cache) fetchOCI(o Options, settings *cli.EnvSettings, creds string) (*chart.Chart, error) {
	ik := indexKey{source: "oci", chart: o.Ref, version: o.Version, creds: creds}
	if v, ok := c.indexes.Get(ik); ok {
		e := v.(*indexEntry)
		if c.clock.Since(e.at) < c.ttl {
			if ch, ok := c.cachedChart(o.Ref, e.chart); ok {
				return ch, nil
			}
		}
	}
	at := c.clock.Now()
	path, err := o.Locate(settings)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: err}
	}
	ch, err := loadArchive(o.Ref, data)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	key := chartKey{source: "oci", chart: o.Ref, version: ch.Metadata.Version, digest: hex.EncodeToString(sum[:]), creds: creds}
	c.charts.Add(key, data)
	c.indexes.Add(ik, &indexEntry{at: at, chart: key})
	return ch, nil
}

// index returns the repository's index, downloaded at most IndexTTL ago.
func (c *Cache) index(o Options, settings *cli.EnvSettings, creds string) (*repo.IndexFile, error) {
	ik := indexKey{source: o.RepoURL, creds: creds}
	if v, ok := c.indexes.Get(ik); ok {
		if e := v.(*indexEntry); c.clock.Since(e.at) < c.ttl {
			return e.index, nil
		}
	}
	at := c.clock.Now()
	sum := sha256.Sum256([]byte(o.RepoURL + "\x00" + creds))
	r, err := repo.NewChartRepository(&repo.Entry{
		Name: "upgradeguard-" + hex.EncodeToString(sum[:8]), URL: o.RepoURL,
		Username: o.Username, Password: o.Password, PassCredentialsAll: o.PassCredentialsAll,
		CertFile: o.CertFile, KeyFile: o.KeyFile, CAFile: o.CAFile, InsecureSkipTLSVerify: o.InsecureSkipTLSVerify,
	}, getter.All(settings))
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: err}
	}
	r.CachePath = settings.RepositoryCache
	c.mu.Lock()
	file, err := r.DownloadIndexFile()
	var idx *repo.IndexFile
	if err == nil {
		idx, err = repo.LoadIndexFile(file)
	}
	_ = os.Remove(filepath.Join(r.CachePath, helmpath.CacheIndexFile(r.Config.Name)))
	_ = os.Remove(filepath.Join(r.CachePath, helmpath.CacheChartsFile(r.Config.Name)))
	c.mu.Unlock()
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: StepFetch, Err: fmt.Errorf("index of %s: %w (check the URL and that the repository is reachable)", o.RepoURL, err)}
	}
	c.indexes.Add(ik, &indexEntry{at: at, index: idx})
	return idx, nil
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

func (c *Cache) keep(ref string, key chartKey, path string) (*chart.Chart, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &LoadError{Ref: ref, Step: StepFetch, Err: err}
	}
	ch, err := loadArchive(ref, data)
	if err != nil {
		return nil, err
	}
	c.charts.Add(key, data)
	return ch, nil
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
