package chartsource

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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
// Rendering is never cached: it depends on values and the target. Local charts
// (directories and files) are never cached. A Cache is safe for concurrent use.
type Cache struct {
	ttl     time.Duration
	clock   clock.PassiveClock
	indexes *lru.Cache // indexKey -> *indexEntry
	charts  *lru.Cache // chartKey -> []byte (the archive)
	mu      sync.Mutex // serialises index downloads into the shared repository cache
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
	return &Cache{ttl: o.IndexTTL, clock: o.Clock, indexes: lru.New(o.MaxIndexes), charts: lru.New(o.MaxCharts)}
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

// fetchHTTP resolves the version in the (cached) repository index, then returns the
// cached archive of that exact version or downloads it.
func (c *Cache) fetchHTTP(o Options, settings *cli.EnvSettings, creds string) (*chart.Chart, error) {
	idx, err := c.index(o, settings, creds)
	if err != nil {
		return nil, err
	}
	cv, err := idx.Get(o.Ref, o.Version)
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: "fetch", Err: fmt.Errorf("chart %q version %q not found in the index of %s (fetched at most %s ago): %w", o.Ref, o.Version, o.RepoURL, c.ttl, err)}
	}
	if len(cv.URLs) == 0 {
		return nil, &LoadError{Ref: o.Ref, Step: "fetch", Err: fmt.Errorf("chart %q version %s has no download URL in the index of %s", o.Ref, cv.Version, o.RepoURL)}
	}
	key := chartKey{source: o.RepoURL, chart: o.Ref, version: cv.Version, digest: cv.Digest, creds: creds}
	if ch, ok := c.cachedChart(o.Ref, key); ok {
		return ch, nil
	}
	chartURL, err := repo.ResolveReferenceURL(o.RepoURL, cv.URLs[0])
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: "fetch", Err: err}
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
		return nil, &LoadError{Ref: o.Ref, Step: "fetch", Err: err}
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
		return nil, &LoadError{Ref: o.Ref, Step: "fetch", Err: err}
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
		return nil, &LoadError{Ref: o.Ref, Step: "fetch", Err: fmt.Errorf("index of %s: %w (check the URL and that the repository is reachable)", o.RepoURL, err)}
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
		return nil, &LoadError{Ref: ref, Step: "fetch", Err: err}
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
