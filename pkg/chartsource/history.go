package chartsource

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/getter"
	"helm.sh/helm/v4/pkg/registry"
	repo "helm.sh/helm/v4/pkg/repo/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
)

// Versions returns the chart versions the source publishes, newest first, so that a
// stepping stone can be looked for. Local directories and .tgz files have no history and
// return nil. Pre-releases are left out. A repository or registry that cannot be read
// is a *LoadError of StepVersions.
func Versions(ctx context.Context, o Options) ([]*semver.Version, error) {
	settings := o.settings()
	var raw []string
	switch {
	case registry.IsOCI(o.Ref):
		rc, err := o.registryClient(settings)
		if err != nil {
			return nil, err
		}
		ref := strings.TrimPrefix(o.Ref, "oci://")
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			ref = ref[:i]
		}
		tags, err := rc.Tags(ref)
		if err != nil {
			return nil, &LoadError{Ref: o.Ref, Step: StepVersions, Err: fmt.Errorf("list the registry's tags: %w", err)}
		}
		raw = tags
	default:
		url, name := o.RepoURL, o.Ref
		if url == "" {
			repoName, chartName, ok := strings.Cut(o.Ref, "/")
			if !ok || strings.HasPrefix(o.Ref, ".") || filepath.IsAbs(o.Ref) {
				return nil, nil
			}
			f, err := repo.LoadFile(settings.RepositoryConfig)
			if err != nil || f.Get(repoName) == nil {
				return nil, nil
			}
			url, name = f.Get(repoName).URL, chartName
		}
		var index *repo.IndexFile
		var err error
		if o.Cache != nil && o.RepoURL != "" {
			if creds, ok := o.cacheable(); ok {
				index, err = o.Cache.index(o, settings, creds)
			}
		}
		if index == nil && err == nil {
			index, err = o.index(settings, url)
		}
		if err != nil {
			return nil, err
		}
		for _, cv := range index.Entries[name] {
			raw = append(raw, cv.Version)
		}
	}
	var out []*semver.Version
	for _, r := range raw {
		v, err := semver.NewVersion(strings.ReplaceAll(r, "_", "+"))
		if err != nil || v.Prerelease() != "" {
			continue
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *semver.Version) int { return b.Compare(a) })
	return out, ctx.Err()
}

func (o Options) index(settings *cli.EnvSettings, url string) (*repo.IndexFile, error) {
	entry := &repo.Entry{
		Name: "upgradeguard-" + strings.NewReplacer("/", "-", ":", "-").Replace(url), URL: url,
		Username: o.Username, Password: o.Password, CertFile: o.CertFile, KeyFile: o.KeyFile, CAFile: o.CAFile,
		InsecureSkipTLSVerify: o.InsecureSkipTLSVerify, PassCredentialsAll: o.PassCredentialsAll,
	}
	r, err := repo.NewChartRepository(entry, getter.All(settings))
	if err != nil {
		return nil, err
	}
	r.CachePath = settings.RepositoryCache
	path, err := r.DownloadIndexFile()
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: StepVersions, Err: fmt.Errorf("download index of %s: %w", url, err)}
	}
	return repo.LoadIndexFile(path)
}

// History is the chart versions a source offers (check.History): the versions it
// publishes, newest first, and the CRDs each one brings, rendered with the same options
// (values, release, Kubernetes version) as the incoming chart. With Options.Cache set,
// the repository index is the one the cache already keeps. The stepping-stone search of
// check and the planner of package plan both read it.
type History struct {
	// Options load the incoming chart; Version is replaced by each version tried.
	Options Options
	// Local, when set, are chart directories or .tgz files that stand for the source:
	// their versions are the ones offered, and each version loads from its own path.
	Local []string

	mu    sync.Mutex
	paths map[string]string // version -> local path
}

// Versions lists the versions of the source as strings, newest first.
func (h *History) Versions(ctx context.Context) ([]string, error) {
	if len(h.Local) > 0 {
		paths, err := h.local()
		if err != nil {
			return nil, err
		}
		var vs []*semver.Version
		for v := range paths {
			if sv, err := semver.NewVersion(v); err == nil {
				vs = append(vs, sv)
			}
		}
		slices.SortFunc(vs, func(a, b *semver.Version) int { return b.Compare(a) })
		out := make([]string, 0, len(vs))
		for _, v := range vs {
			out = append(out, v.Original())
		}
		return out, ctx.Err()
	}
	vs, err := Versions(ctx, h.Options)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.Original())
	}
	return out, nil
}

// Ref is the chart reference that installs version: its local path for Local charts,
// otherwise Options.Ref.
func (h *History) Ref(version string) string {
	if len(h.Local) > 0 {
		if paths, err := h.local(); err == nil && paths[version] != "" {
			return paths[version]
		}
	}
	return h.Options.Ref
}

// local reads the version of every Local chart once.
func (h *History) local() (map[string]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.paths != nil {
		return h.paths, nil
	}
	paths := map[string]string{}
	for _, p := range h.Local {
		ch, err := loadChart(p, p)
		if err != nil {
			return nil, err
		}
		v := ch.Metadata.Version
		if prev, ok := paths[v]; ok {
			return nil, &LoadError{Ref: p, Step: "load", Err: fmt.Errorf("version %s is also given by %s: give each version once", v, prev)}
		}
		paths[v] = p
	}
	h.paths = paths
	return paths, nil
}

// CRDs loads one version and returns the CRDs it brings.
func (h *History) CRDs(ctx context.Context, version string) ([]chartcrds.CRD, error) {
	ch, err := h.Chart(ctx, version)
	if err != nil {
		return nil, err
	}
	return ch.CRDs, nil
}

// Chart loads one version and returns what check judges of it: the CRDs it brings and
// the StorageVersionMigrations it renders (check.ChartHistory).
func (h *History) Chart(ctx context.Context, version string) (*check.Chart, error) {
	o := h.Options
	o.Version = version
	if len(h.Local) > 0 {
		paths, err := h.local()
		if err != nil {
			return nil, err
		}
		if paths[version] == "" {
			return nil, &LoadError{Ref: version, Step: "locate", Err: fmt.Errorf("no local chart has version %s", version)}
		}
		o.Ref, o.Version, o.RepoURL = paths[version], "", ""
	}
	ch, err := Load(ctx, o)
	if err != nil {
		return nil, err
	}
	return &check.Chart{Name: ch.Name, Version: ch.Version, CRDs: ch.CRDs, Migrations: ch.Migrations}, nil
}

// CheckChart is the check.ChartLoader of o: it loads and renders the chart, with
// .Release.IsUpgrade when the release already has a revision.
func CheckChart(o Options) func(ctx context.Context, upgrade bool) (*check.Chart, error) {
	return func(ctx context.Context, upgrade bool) (*check.Chart, error) {
		o.IsUpgrade = upgrade
		ch, err := Load(ctx, o)
		if err != nil {
			return nil, err
		}
		return &check.Chart{Name: ch.Name, Version: ch.Version, CRDs: ch.CRDs, Migrations: ch.Migrations}, nil
	}
}
