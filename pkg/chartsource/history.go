package chartsource

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/getter"
	"helm.sh/helm/v4/pkg/registry"
	repo "helm.sh/helm/v4/pkg/repo/v1"
)

// Versions returns the chart versions the source publishes, newest first, so that a
// stepping stone can be looked for. Local directories and .tgz files have no history and
// return nil. Pre-releases are left out.
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
			return nil, fmt.Errorf("list tags of %s: %w", o.Ref, err)
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
		index, err := o.index(settings, url)
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
		return nil, fmt.Errorf("download index of %s: %w", url, err)
	}
	return repo.LoadIndexFile(path)
}
