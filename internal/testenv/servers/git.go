package servers

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// GitRepo is a real git repository on disk, written with go-git, for tests of code that
// reads release branches.
type GitRepo struct {
	Dir  string
	t    testing.TB
	repo *git.Repository
	wt   *git.Worktree
}

// NeedGitCLI fails the test when the git command is missing. go-git writes the
// repositories (NewGitRepo); tests that also need what only the git command makes (bare
// clones, mirrors, linked worktrees) call this first.
func NeedGitCLI(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("the git command is missing (%v): install it (apt-get install git)", err)
	}
}

// NewGitRepo initialises a repository in a temporary directory.
func NewGitRepo(t testing.TB) *GitRepo {
	t.Helper()
	dir := t.TempDir()
	repo, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	return &GitRepo{Dir: dir, t: t, repo: repo, wt: wt}
}

// Commit writes files (path -> content; "" deletes the file) and commits them on the
// current branch.
func (g *GitRepo) Commit(msg string, files map[string]string) plumbing.Hash {
	g.t.Helper()
	for path, content := range files {
		if content == "" {
			if _, err := g.wt.Remove(path); err != nil {
				g.t.Fatal(err)
			}
			continue
		}
		p := filepath.Join(g.Dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			g.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			g.t.Fatal(err)
		}
		if _, err := g.wt.Add(path); err != nil {
			g.t.Fatal(err)
		}
	}
	h, err := g.wt.Commit(msg, &git.CommitOptions{Author: &object.Signature{Name: "dev", Email: "dev@example.com", When: time.Unix(1_790_000_000, 0)}})
	if err != nil {
		g.t.Fatal(err)
	}
	return h
}

// Branch creates branch name at from and checks it out.
func (g *GitRepo) Branch(name string, from plumbing.Hash) {
	g.t.Helper()
	if err := g.wt.Checkout(&git.CheckoutOptions{Hash: from, Branch: plumbing.NewBranchReferenceName(name), Create: true}); err != nil {
		g.t.Fatal(err)
	}
}

// Tag creates the lightweight tag name at commit.
func (g *GitRepo) Tag(name string, commit plumbing.Hash) {
	g.t.Helper()
	if _, err := g.repo.CreateTag(name, commit, nil); err != nil {
		g.t.Fatal(err)
	}
}
