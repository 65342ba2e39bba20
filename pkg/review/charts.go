package review

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/cli/values"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

// ChartOptions say which releases a chart repository supports: the baselines each
// touched chart at the head revision is judged against, and how to render the charts.
type ChartOptions struct {
	// Baselines are refs (tags, release branches, commits) of supported releases.
	Baselines []string
	// BaselineTags and BaselineBranches are globs (path.Match) over tag and branch names:
	// each match whose tree holds the chart is a supported release, the newest
	// MaxBaselines of them by chart version.
	BaselineTags, BaselineBranches string
	// MaxBaselines bounds the releases BaselineTags and BaselineBranches give (0:
	// DefaultMaxBaselines).
	MaxBaselines int
	// TagPattern maps a tag to a chart version: "v{version}", "{name}-{version}" ({name}
	// is the chart's name). "" tries DefaultTagPatterns in turn.
	TagPattern string
	// Values are the values every release is rendered with, as check takes them.
	Values values.Options
	// KubeVersion is the Kubernetes version the charts are rendered for
	// (.Capabilities.KubeVersion); "" is DefaultKubeVersion.
	KubeVersion string
	// Settings carries Helm's paths; nil uses the HELM_* environment.
	Settings *cli.EnvSettings
	// Registry knows the charts' own migration hooks (nil: registry.Default()).
	Registry *registry.Registry
	// Deployed are chart folders that a HelmRelease in the repository renders
	// (Diff.DeployedCharts): judged on the clusters they land on, not here.
	Deployed []string
}

// DefaultMaxBaselines is how many releases BaselineTags and BaselineBranches give unless
// told otherwise.
const DefaultMaxBaselines = 5

// DefaultKubeVersion is the Kubernetes version charts are rendered for unless told
// otherwise: the default minor upgradeguard is tested on.
const DefaultKubeVersion = "v1.37.0"

// DefaultTagPatterns are the tag names tried when no TagPattern is given: chart-releaser's
// NAME-VERSION, then vVERSION and VERSION.
var DefaultTagPatterns = []string{"{name}-{version}", "v{version}", "{version}"}

var errNoTagPattern = errors.New(`--tag-pattern needs {version}, for example 'v{version}' or '{name}-{version}'`)

// Baseline is one supported release a chart is judged from.
type Baseline struct {
	// Ref is what named it: a tag, a branch or a commit.
	Ref    string `json:"ref"`
	Commit string `json:"commit"`
	// Version is the release's version: from the tag (TagPattern), else the chart's
	// Chart.yaml at that commit.
	Version string `json:"version"`
}

// Label names the release in messages: its version, else its ref.
func (b Baseline) Label() string {
	if b.Version != "" {
		return b.Version
	}
	return b.Ref
}

// revision is a commit, or the work tree over one.
type revision struct {
	commit *object.Commit
	// root is the work tree's folder when the revision is the work tree.
	root string
}

// files reads the files under dir ("" or "." for the root) at the revision: path from dir
// -> content.
func (r revision) files(dir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	prefix := ""
	if dir != "" && dir != "." {
		prefix = dir + "/"
	}
	if r.root != "" {
		base := filepath.Join(r.root, filepath.FromSlash(dir))
		err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return fs.SkipAll
				}
				return err
			}
			if d.IsDir() {
				if d.Name() == ".git" {
					return fs.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			rel, err := filepath.Rel(base, p)
			if err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[filepath.ToSlash(rel)] = data
			return nil
		})
		return out, err
	}
	tree, err := r.commit.Tree()
	if err != nil {
		return nil, fmt.Errorf("read the tree of %s: %w", r.commit.Hash, err)
	}
	if prefix != "" {
		sub, err := tree.Tree(dir)
		if errors.Is(err, object.ErrDirectoryNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s at %s: %w", dir, r.commit.Hash, err)
		}
		tree = sub
	}
	err = tree.Files().ForEach(func(f *object.File) error {
		if !f.Mode.IsFile() {
			return nil
		}
		s, err := f.Contents()
		if err != nil {
			return fmt.Errorf("read %s%s at %s: %w", prefix, f.Name, r.commit.Hash, err)
		}
		out[f.Name] = []byte(s)
		return nil
	})
	return out, err
}

// chartDirs are the charts a revision holds: the repository's root when it has a
// Chart.yaml, else each charts/NAME/ with one. Only names are read, not contents.
func chartDirs(r revision) ([]string, error) {
	if ok, err := r.has("Chart.yaml"); ok || err != nil {
		return []string{"."}, err
	}
	names, err := r.dirs("charts")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		dir := "charts/" + n
		ok, err := r.has(dir + "/Chart.yaml")
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, dir)
		}
	}
	slices.Sort(out)
	return out, nil
}

// has says whether the revision holds the file p.
func (r revision) has(p string) (bool, error) {
	if r.root != "" {
		info, err := os.Stat(filepath.Join(r.root, filepath.FromSlash(p)))
		return err == nil && info.Mode().IsRegular(), nil
	}
	_, err := r.commit.File(p)
	if errors.Is(err, object.ErrFileNotFound) {
		return false, nil
	}
	return err == nil, err
}

// dirs are the names of the folders in the folder p at the revision.
func (r revision) dirs(p string) ([]string, error) {
	var out []string
	if r.root != "" {
		entries, err := os.ReadDir(filepath.Join(r.root, filepath.FromSlash(p)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, e.Name())
			}
		}
		return out, err
	}
	tree, err := r.commit.Tree()
	if err != nil {
		return nil, fmt.Errorf("read the tree of %s: %w", r.commit.Hash, err)
	}
	sub, err := tree.Tree(p)
	if errors.Is(err, object.ErrDirectoryNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range sub.Entries {
		if e.Mode == filemode.Dir {
			out = append(out, e.Name)
		}
	}
	return out, nil
}

// chartMeta is what review reads of a Chart.yaml.
type chartMeta struct {
	Name        string            `json:"name"`
	Version     string            `json:"version"`
	Annotations map[string]string `json:"annotations"`
}

func readMeta(files map[string][]byte) (chartMeta, bool) {
	var m chartMeta
	data, ok := files["Chart.yaml"]
	if !ok || yaml.Unmarshal(data, &m) != nil {
		return m, false
	}
	return m, m.Name != ""
}

// tagPattern is a compiled TagPattern: the regular expression and the {version} group.
type tagPattern struct{ re *regexp.Regexp }

func compileTagPattern(pattern, chart string) (tagPattern, error) {
	if !strings.Contains(pattern, "{version}") {
		return tagPattern{}, errNoTagPattern
	}
	q := regexp.QuoteMeta(pattern)
	q = strings.ReplaceAll(q, regexp.QuoteMeta("{name}"), regexp.QuoteMeta(chart))
	q = strings.Replace(q, regexp.QuoteMeta("{version}"), `(?P<version>v?[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*)`, 1)
	re, err := regexp.Compile("^" + q + "$")
	if err != nil {
		return tagPattern{}, fmt.Errorf("--tag-pattern %q: %w", pattern, err)
	}
	return tagPattern{re: re}, nil
}

// tagVersion is the chart version a tag names under the patterns, "" when none matches.
func tagVersion(patterns []tagPattern, tag string) string {
	for _, p := range patterns {
		if m := p.re.FindStringSubmatch(tag); m != nil {
			return m[p.re.SubexpIndex("version")]
		}
	}
	return ""
}

// refCommit resolves a ref to its commit.
func refCommit(repo *git.Repository, ref *plumbing.Reference) (*object.Commit, error) {
	h := ref.Hash()
	if t, err := repo.TagObject(h); err == nil {
		c, err := t.Commit()
		if err != nil {
			return nil, fmt.Errorf("tag %s: %w", ref.Name().Short(), err)
		}
		return c, nil
	}
	return repo.CommitObject(h)
}

// baselines are the supported releases of the chart at dir: the refs o names, the tags
// and branches its globs match (the newest MaxBaselines by version), or the newest
// release tag reachable from base.
func (o ChartOptions) baselines(repo *git.Repository, base *object.Commit, dir, name string) ([]Baseline, error) {
	patterns, err := o.tagPatterns(name)
	if err != nil {
		return nil, err
	}
	var out []Baseline
	for _, ref := range o.Baselines {
		c, err := commit(repo, ref)
		if err != nil {
			return nil, fmt.Errorf("--baseline %s: %w (name a tag, a branch or a commit)", ref, err)
		}
		out = append(out, Baseline{Ref: ref, Commit: c.Hash.String(), Version: tagVersion(patterns, ref)})
	}
	var matched []Baseline
	if o.BaselineTags != "" || o.BaselineBranches != "" {
		refs, err := repo.References()
		if err != nil {
			return nil, fmt.Errorf("list the repository's refs: %w", err)
		}
		err = refs.ForEach(func(ref *plumbing.Reference) error {
			n := ref.Name()
			var glob string
			switch {
			case n.IsTag():
				glob = o.BaselineTags
			case n.IsBranch() || n.IsRemote():
				glob = o.BaselineBranches
			}
			short := n.Short()
			if n.IsRemote() {
				_, short, _ = strings.Cut(short, "/")
			}
			if glob == "" || ref.Type() != plumbing.HashReference {
				return nil
			}
			if ok, err := path.Match(glob, short); err != nil {
				return fmt.Errorf("glob %q: %w", glob, err)
			} else if !ok {
				return nil
			}
			c, err := refCommit(repo, ref)
			if err != nil {
				return err
			}
			b := Baseline{Ref: short, Commit: c.Hash.String()}
			if n.IsTag() {
				b.Version = tagVersion(patterns, short)
			}
			if !slices.ContainsFunc(matched, func(x Baseline) bool { return x.Ref == b.Ref && x.Commit == b.Commit }) {
				matched = append(matched, b)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(o.Baselines) == 0 && o.BaselineTags == "" && o.BaselineBranches == "" {
		b, ok, err := newestTag(repo, base, patterns)
		if err != nil || !ok {
			return nil, err
		}
		matched = append(matched, b)
	}
	// Fill in versions from Chart.yaml, drop refs without the chart, keep the newest.
	var kept []Baseline
	for _, b := range append(out, matched...) {
		c, err := repo.CommitObject(plumbing.NewHash(b.Commit))
		if err != nil {
			return nil, err
		}
		meta, ok, err := metaAt(c, dir)
		if err != nil {
			return nil, err
		}
		if !ok {
			if slices.Contains(o.Baselines, b.Ref) {
				return nil, fmt.Errorf("--baseline %s holds no chart %s in %s: name a release of this chart", b.Ref, name, dir)
			}
			continue
		}
		b.Version = cmp.Or(b.Version, meta.Version)
		kept = append(kept, b)
	}
	sortByVersion(kept)
	if n := len(kept) - o.maxBaselines() - len(o.Baselines); len(matched) > 0 && n > 0 {
		// Keep every --baseline; drop the oldest of the matched ones.
		var trimmed []Baseline
		for _, b := range kept {
			if n > 0 && !slices.Contains(o.Baselines, b.Ref) {
				n--
				continue
			}
			trimmed = append(trimmed, b)
		}
		kept = trimmed
	}
	return kept, nil
}

func (o ChartOptions) maxBaselines() int {
	if o.MaxBaselines > 0 {
		return o.MaxBaselines
	}
	return DefaultMaxBaselines
}

func (o ChartOptions) tagPatterns(name string) ([]tagPattern, error) {
	raw := DefaultTagPatterns
	if o.TagPattern != "" {
		raw = []string{o.TagPattern}
	}
	var out []tagPattern
	for _, p := range raw {
		tp, err := compileTagPattern(p, name)
		if err != nil {
			return nil, err
		}
		out = append(out, tp)
	}
	return out, nil
}

// metaAt reads the chart's Chart.yaml at a commit.
func metaAt(c *object.Commit, dir string) (chartMeta, bool, error) {
	f, err := c.File(path.Join(dir, "Chart.yaml"))
	if errors.Is(err, object.ErrFileNotFound) {
		return chartMeta{}, false, nil
	}
	if err != nil {
		return chartMeta{}, false, fmt.Errorf("read %s at %s: %w", path.Join(dir, "Chart.yaml"), c.Hash, err)
	}
	s, err := f.Contents()
	if err != nil {
		return chartMeta{}, false, err
	}
	m, ok := readMeta(map[string][]byte{"Chart.yaml": []byte(s)})
	return m, ok, nil
}

// newestTag is the release tag (one the patterns match) with the highest version whose
// commit base reaches.
func newestTag(repo *git.Repository, base *object.Commit, patterns []tagPattern) (Baseline, bool, error) {
	byCommit := map[plumbing.Hash][]Baseline{}
	tags, err := repo.Tags()
	if err != nil {
		return Baseline{}, false, fmt.Errorf("list tags: %w", err)
	}
	err = tags.ForEach(func(ref *plumbing.Reference) error {
		v := tagVersion(patterns, ref.Name().Short())
		if v == "" {
			return nil
		}
		c, err := refCommit(repo, ref)
		if err != nil {
			return err
		}
		byCommit[c.Hash] = append(byCommit[c.Hash], Baseline{Ref: ref.Name().Short(), Commit: c.Hash.String(), Version: v})
		return nil
	})
	if err != nil || len(byCommit) == 0 {
		return Baseline{}, false, err
	}
	var found []Baseline
	iter := object.NewCommitPreorderIter(base, nil, nil)
	err = iter.ForEach(func(c *object.Commit) error {
		found = append(found, byCommit[c.Hash]...)
		return nil
	})
	if err != nil && !errors.Is(err, storer.ErrStop) {
		return Baseline{}, false, err
	}
	if len(found) == 0 {
		return Baseline{}, false, nil
	}
	sortByVersion(found)
	return found[len(found)-1], true, nil
}

// sortByVersion orders releases oldest first: by semantic version, those without one
// first in the order given.
func sortByVersion(bs []Baseline) {
	slices.SortStableFunc(bs, func(a, b Baseline) int {
		va, ea := semver.NewVersion(a.Version)
		vb, eb := semver.NewVersion(b.Version)
		switch {
		case ea != nil && eb != nil:
			return 0
		case ea != nil:
			return -1
		case eb != nil:
			return 1
		}
		return va.Compare(vb)
	})
}

// render writes a chart's files to a temporary folder, fetches the dependencies it does
// not vendor (buildDependencies; a file:// one read from rev, relative to the chart's
// folder dir) and loads them with the Helm SDK, as helm reads a chart folder
// (.helmignore included), then renders it.
func (o ChartOptions) render(ctx context.Context, rev revision, dir string, files map[string][]byte, name string, upgrade bool) (*chartsource.Chart, error) {
	local := func(p string) (map[string][]byte, error) { return rev.files(path.Join(dir, p)) }
	tmp, err := os.MkdirTemp("", "upgradeguard-chart-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := writeFiles(tmp, files); err != nil {
		return nil, err
	}
	// An umbrella chart's dependencies, as a Git source's chart is built (umbrella.go).
	if err := buildDependencies(ctx, tmp, files, o.Settings, local); err != nil {
		return nil, fmt.Errorf("the chart's dependencies: %w", err)
	}
	ch, err := loader.Load(tmp)
	if err != nil {
		return nil, fmt.Errorf("load the chart: %w", err)
	}
	return chartsource.Render(ctx, ch, chartsource.Options{Ref: name, Values: o.Values, ReleaseName: name, Namespace: "default",
		IsUpgrade: upgrade, Settings: o.Settings, KubeVersion: cmp.Or(o.KubeVersion, DefaultKubeVersion)})
}

// sameFiles says whether two readings of a folder hold the same files.
func sameFiles(a, b map[string][]byte) bool { return maps.EqualFunc(a, b, bytes.Equal) }
