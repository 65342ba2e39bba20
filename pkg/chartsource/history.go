package chartsource

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v4/pkg/registry"
	repo "helm.sh/helm/v4/pkg/repo/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
)

// Versions returns the chart versions the source publishes, newest first, so that a
// stepping stone can be looked for: an OCI registry's tags, or the index of the chart
// repository (RepoURL, or the repository of a "repo/name" reference), read through l.
// Local directories and .tgz files have no history and return nil. Pre-releases are left
// out. A repository or registry that cannot be read is a *LoadError of StepVersions.
func Versions(ctx context.Context, l Loader, o Options) ([]*semver.Version, error) {
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
		name := o.Ref
		if o.RepoURL == "" {
			repoName, chartName, ok := strings.Cut(o.Ref, "/")
			if !ok || strings.HasPrefix(o.Ref, ".") || filepath.IsAbs(o.Ref) {
				return nil, nil
			}
			f, err := repo.LoadFile(settings.RepositoryConfig)
			if err != nil || f.Get(repoName) == nil {
				return nil, nil
			}
			o.RepoURL, name = f.Get(repoName).URL, chartName
		}
		index, err := l.Index(ctx, o)
		if err != nil {
			return nil, &LoadError{Ref: o.Ref, Step: StepVersions, Err: err}
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

// History is the chart versions a source offers (check.History): the versions it
// publishes, newest first, and the CRDs each one brings, rendered with the same options
// (values, release, Kubernetes version) as the incoming chart. With a Cache as its
// Loader, the repository index is the one the cache already keeps. The stepping-stone
// search of check and the planner of package plan both read it.
type History struct {
	// Options load the incoming chart; Version is replaced by each version tried.
	Options Options
	// Loader reads the index and loads each version. Nil loads with Helm.
	Loader Loader
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
	vs, err := Versions(ctx, h.loader(), h.Options)
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
	return checkChart(ctx, h.loader(), o)
}

func (h *History) loader() Loader {
	if h.Loader == nil {
		return Helm{}
	}
	return h.Loader
}

// CheckChart is the check.ChartLoader of o, loaded through l: it loads and renders the
// chart, with .Release.IsUpgrade when the release already has a revision.
func CheckChart(l Loader, o Options) check.ChartLoader {
	return func(ctx context.Context, upgrade bool) (*check.Chart, error) {
		o.IsUpgrade = upgrade
		return checkChart(ctx, l, o)
	}
}

// checkChart loads o through l and returns what check judges of it.
func checkChart(ctx context.Context, l Loader, o Options) (*check.Chart, error) {
	ch, err := l.Load(ctx, o)
	if err != nil {
		return nil, err
	}
	return &check.Chart{Name: ch.Name, Version: ch.Version, CRDs: ch.CRDs, Migrations: ch.Migrations}, nil
}
