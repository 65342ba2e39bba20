package slots_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

const migDir = "packages/core/platform/images/migrations/migrations"

func migration(n int, what string) string {
	return fmt.Sprintf("#!/bin/sh\n# %s\nkubectl annotate ns cozy-system cozystack-version=%d --overwrite\n", what, n+1)
}

func values(target int) string {
	return fmt.Sprintf("migrations:\n  enabled: true\n  targetVersion: %d\n", target)
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// cozystack builds the history of the incident: slots 1..44 aligned, release-1.5 claims
// slot 45 for a data-loss repair (targetVersion 46), release-1.6 uses 45..53 (target 54).
func cozystack(t *testing.T) (*servers.GitRepo, plumbing.Hash) {
	g := servers.NewGitRepo(t)
	files := map[string]string{"packages/core/platform/values.yaml": values(45)}
	for i := 1; i <= 44; i++ {
		files[fmt.Sprintf("%s/%d", migDir, i)] = migration(i, fmt.Sprintf("migration %d", i))
	}
	files[migDir+"/README.md"] = "numbered migrations\n"
	base := g.Commit("v1.5.2", files)
	g.Branch("release-1.5", base)
	g.Commit("repair db-split hand-over", map[string]string{
		migDir + "/45": migration(45, "repair seaweedfs db-split hand-over"), "packages/core/platform/values.yaml": values(46)})
	g.Branch("release-1.6", base)
	next := map[string]string{migDir + "/45": migration(45, "pin KubeadmConfigTemplate keep"), "packages/core/platform/values.yaml": values(54)}
	for i := 46; i <= 53; i++ {
		next[fmt.Sprintf("%s/%d", migDir, i)] = migration(i, fmt.Sprintf("1.6 migration %d", i))
	}
	g.Commit("1.6 migrations", next)
	return g, base
}

func opts(g *servers.GitRepo, refs ...string) slots.Options {
	return slots.Options{Repo: g.Dir, Refs: refs, Dir: migDir, TargetFile: "packages/core/platform/values.yaml", TargetKey: "migrations.targetVersion"}
}

func TestPatchThenMinorDivergence(t *testing.T) {
	g, _ := cozystack(t)
	rep, err := slots.Check(t.Context(), opts(g, "release-1.5", "release-1.6"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.LowestTarget != 46 || len(rep.Refs[0].Slots) != 45 || len(rep.Refs[1].Slots) != 53 {
		t.Fatalf("lowest %d, slots %d and %d", rep.LowestTarget, len(rep.Refs[0].Slots), len(rep.Refs[1].Slots))
	}
	if len(rep.Findings) != 1 {
		t.Fatalf("findings %+v, want one", rep.Findings)
	}
	f := rep.Findings[0]
	if f.Kind() != slots.Claimed || f.Slot != 45 || !strings.Contains(f.Message, "slot 54") || !strings.Contains(f.Message, "targetVersion to 55") ||
		f.Input == nil || f.Input.Option != slots.OptionEquivalent {
		t.Errorf("finding %+v", f)
	}
}

func TestEquivalentPortsAndCleanHistory(t *testing.T) {
	g, base := cozystack(t)
	// A port of release-1.6's migration 45 to 1.5 that differs only in its stamp.
	g.Branch("release-1.5-port", base)
	port := strings.Replace(migration(45, "pin KubeadmConfigTemplate keep"), "--overwrite", "--overwrite # 1.5", 1)
	g.Commit("port the kubeadm pin", map[string]string{migDir + "/45": port, "packages/core/platform/values.yaml": values(46)})

	o := opts(g, "release-1.5-port", "release-1.6")
	rep, err := slots.Check(t.Context(), o)
	if err != nil || len(rep.Findings) != 1 {
		t.Fatalf("byte-wise different port without an equivalence: %v %+v", err, rep)
	}
	eq := filepath.Join(t.TempDir(), "equivalent.yaml")
	content := fmt.Sprintf("equivalent:\n  \"45\": [%s, %s]\n", sum(port), sum(migration(45, "pin KubeadmConfigTemplate keep")))
	if err := os.WriteFile(eq, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if o.Equivalent, err = slots.LoadEquivalent(eq); err != nil {
		t.Fatal(err)
	}
	if rep, err = slots.Check(t.Context(), o); err != nil || len(rep.Findings) != 0 {
		t.Errorf("declared equivalent: %v %+v", err, rep.Findings)
	}

	// The equivalence silences exactly the declared slot: an undeclared edit of slot 30 on
	// the same branch is still reported, and only it.
	g.Commit("edit an old migration", map[string]string{migDir + "/30": migration(30, "migration 30, edited on 1.5")})
	rep, err = slots.Check(t.Context(), o)
	if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Slot != 30 || rep.Findings[0].Kind() != slots.Diverged ||
		rep.Findings[0].Input == nil || rep.Findings[0].Input.Option != slots.OptionEquivalent {
		t.Errorf("undeclared divergence next to a declared one: %v %+v, want one diverged finding for slot 30", err, rep.Findings)
	}

	// Clean history: a maintenance branch that took no new slot.
	g.Branch("release-1.5-clean", base)
	g.Commit("docs only", map[string]string{"README.md": "hello\n"})
	if rep, err = slots.Check(t.Context(), opts(g, "release-1.5-clean", "release-1.6")); err != nil || len(rep.Findings) != 0 {
		t.Errorf("clean history: %v %+v", err, rep.Findings)
	}
}

func TestMissingSlot(t *testing.T) {
	g, base := cozystack(t)
	g.Branch("release-1.5-broken", base)
	g.Commit("lost a migration", map[string]string{fmt.Sprintf("%s/%d", migDir, 20): ""})
	rep, err := slots.Check(t.Context(), opts(g, "release-1.5-broken", "release-1.6"))
	if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind() != slots.Missing || rep.Findings[0].Slot != 20 {
		t.Errorf("%v %+v", err, rep)
	}
}

func TestBadInput(t *testing.T) {
	g, _ := cozystack(t)
	cases := []struct {
		o       slots.Options
		mention string
	}{
		{opts(g, "release-1.5"), "at least two refs"},
		{opts(g, "release-1.5", "release-9.9"), "git fetch"},
		{func() slots.Options {
			o := opts(g, "release-1.5", "release-1.6")
			o.TargetKey = "migrations.nope"
			return o
		}(), "no key"},
		{func() slots.Options { o := opts(g, "release-1.5", "release-1.6"); o.Dir = "nowhere"; return o }(), "no migrations folder"},
	}
	for _, tc := range cases {
		if _, err := slots.Check(t.Context(), tc.o); err == nil || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("error %v, want one mentioning %q", err, tc.mention)
		}
	}
}

// gitCLI runs the real git binary: the repository shapes below are made the way CI caches,
// server-side hooks and developers make them.
func gitCLI(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestRepositoryShapes opens the same history as a work tree, a folder inside it, a bare
// clone, a mirror and a linked worktree: each finds the one claimed slot.
func TestRepositoryShapes(t *testing.T) {
	servers.NeedGitCLI(t)
	g, _ := cozystack(t)
	tmp := t.TempDir()
	bare, mirror, linked := filepath.Join(tmp, "bare.git"), filepath.Join(tmp, "mirror.git"), filepath.Join(tmp, "linked")
	gitCLI(t, "clone", "--quiet", "--bare", g.Dir, bare)
	gitCLI(t, "clone", "--quiet", "--mirror", g.Dir, mirror)
	gitCLI(t, "-C", g.Dir, "worktree", "add", "--quiet", "--detach", linked, "release-1.5")

	for _, tc := range []struct{ name, repo string }{
		{"work tree", g.Dir},
		{"folder inside a work tree", filepath.Join(g.Dir, migDir)},
		{"bare clone", bare},
		{"mirror", mirror},
		{"linked worktree", linked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts(g, "release-1.5", "release-1.6")
			o.Repo = tc.repo
			rep, err := slots.Check(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Findings) != 1 || rep.Findings[0].Kind() != slots.Claimed || rep.Findings[0].Slot != 45 {
				t.Errorf("findings %+v, want slot 45 claimed", rep.Findings)
			}
		})
	}

	if _, err := slots.Check(t.Context(), slots.Options{Repo: tmp, Refs: []string{"a", "b"}, Dir: migDir}); err == nil || !strings.Contains(err.Error(), "bare clone") {
		t.Errorf("a folder that is no repository: %v, want an error naming the shapes tried", err)
	}
}
