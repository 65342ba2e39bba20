package argoapp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/Masterminds/semver/v3"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/http"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

// checkout clones a git source at its target revision and returns the chart directory
// at its path. A path that is not a chart is an *UnsupportedError.
func (c *Chart) checkout(ctx context.Context, app *Application, src *Source, creds credentials) (string, error) {
	c.Kind = Git
	repoDir := filepath.Join(c.dir, "repo")
	commit, err := clone(ctx, src.RepoURL, src.TargetRevision, repoDir, creds.gitAuth())
	if err != nil {
		return "", fmt.Errorf("%s: git source %s at %q: %w (check repoURL, targetRevision and the repository's credentials)",
			app.Subject(), src.RepoURL, orHEAD(src.TargetRevision), err)
	}
	c.Commit = commit
	chartDir := filepath.Join(repoDir, filepath.FromSlash(filepath.Clean("/"+src.Path)))
	if err := isChart(chartDir); err != nil {
		for _, k := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
			if _, statErr := os.Stat(filepath.Join(chartDir, k)); statErr == nil {
				return "", app.unsupported("path %q at %s is a Kustomize directory; upgradeguard reads Helm charts", src.Path, short(commit))
			}
		}
		return "", app.unsupported("path %q at %s is not a Helm chart (%v): Argo CD applies it as a directory of manifests", src.Path, short(commit), err)
	}
	c.Options.Ref = chartDir
	return chartDir, nil
}

func isChart(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); err != nil {
		return ErrNotHelm
	}
	return nil
}

func orHEAD(rev string) string {
	if rev == "" {
		return "HEAD"
	}
	return rev
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// clone clones url into dir and checks out revision as Argo CD resolves it: HEAD when
// empty, a branch, a tag, a commit, or a semver constraint on the tags (the highest
// matching tag).
func clone(ctx context.Context, url, revision, dir string, auth transport.AuthMethod) (string, error) {
	repo, err := git.PlainCloneContext(ctx, dir, false, &git.CloneOptions{URL: url, Auth: auth, NoCheckout: true, Tags: git.AllTags})
	if err != nil {
		return "", err
	}
	h, err := resolveRevision(repo, revision)
	if err != nil {
		return "", err
	}
	wt, err := repo.Worktree()
	if err != nil {
		return "", err
	}
	if err := wt.Checkout(&git.CheckoutOptions{Hash: h, Force: true}); err != nil {
		return "", fmt.Errorf("check out %s: %w", h, err)
	}
	return h.String(), nil
}

func resolveRevision(repo *git.Repository, revision string) (plumbing.Hash, error) {
	if revision == "" || revision == "HEAD" {
		ref, err := repo.Head()
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("resolve HEAD: %w", err)
		}
		return ref.Hash(), nil
	}
	for _, name := range []plumbing.ReferenceName{plumbing.NewRemoteReferenceName("origin", revision), plumbing.NewTagReferenceName(revision)} {
		if h, err := repo.ResolveRevision(plumbing.Revision(name)); err == nil {
			return *h, nil
		}
	}
	if h, err := repo.ResolveRevision(plumbing.Revision(revision)); err == nil {
		return *h, nil
	}
	if c, err := semver.NewConstraint(revision); err == nil {
		return highestTag(repo, revision, c)
	}
	return plumbing.ZeroHash, fmt.Errorf("no branch, tag or commit %q", revision)
}

// highestTag resolves a semver constraint to the highest matching tag, as Argo CD does.
func highestTag(repo *git.Repository, revision string, c *semver.Constraints) (plumbing.Hash, error) {
	tags, err := repo.Tags()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	var versions []*semver.Version
	byVersion := map[*semver.Version]plumbing.ReferenceName{}
	_ = tags.ForEach(func(r *plumbing.Reference) error {
		if v, err := semver.NewVersion(r.Name().Short()); err == nil && c.Check(v) {
			versions = append(versions, v)
			byVersion[v] = r.Name()
		}
		return nil
	})
	if len(versions) == 0 {
		return plumbing.ZeroHash, fmt.Errorf("no tag matches %q", revision)
	}
	sort.Sort(semver.Collection(versions))
	h, err := repo.ResolveRevision(plumbing.Revision(byVersion[versions[len(versions)-1]]))
	if err != nil {
		return plumbing.ZeroHash, err
	}
	return *h, nil
}

// unpack fetches a repository chart and unpacks it into dir, returning the chart's
// directory, so that values files inside it can be read.
func unpack(o chartsource.Options, dir, name string) (string, error) {
	tgz, err := o.Locate(nil)
	if err != nil {
		return "", err
	}
	if err := chartutil.ExpandFile(dir, tgz); err != nil {
		return "", &chartsource.LoadError{Ref: o.Ref, Step: "unpack", Err: err}
	}
	chartDir := filepath.Join(dir, name)
	if err := isChart(chartDir); err != nil {
		return "", &chartsource.LoadError{Ref: o.Ref, Step: "unpack", Err: fmt.Errorf("%s: %w", name, err)}
	}
	return chartDir, nil
}

// basicAuth is go-git's HTTP basic authentication, nil without a username or password.
func basicAuth(username, password string) transport.AuthMethod {
	if username == "" && password == "" {
		return nil
	}
	return &http.BasicAuth{Username: username, Password: password}
}
