package cli_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

func TestSlotsCommand(t *testing.T) {
	g := servers.NewGitRepo(t)
	base := g.Commit("base", map[string]string{"migrations/1": "one\n", "migrations/2": "two\n", "values.yaml": "migrations:\n  targetVersion: 3\n"})
	g.Branch("release-1.0", base)
	g.Commit("claim slot 3", map[string]string{"migrations/3": "repair\n", "values.yaml": "migrations:\n  targetVersion: 4\n"})
	g.Branch("release-1.1", base)
	g.Commit("1.1", map[string]string{"migrations/3": "other\n", "migrations/4": "four\n", "values.yaml": "migrations:\n  targetVersion: 5\n"})
	args := []string{"slots", "--repo", g.Dir, "--dir", "migrations", "--target", "values.yaml:migrations.targetVersion"}

	r := run(t, append(args, "--ref", "release-1.0", "--ref", "release-1.1")...)
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "slot 3 (claimed)") {
		t.Errorf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, append(args, "--ref", "release-1.0", "--ref", "release-1.1", "-o", "json")...)
	var rep slots.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Findings) != 1 || rep.Findings[0].Slot != 3 {
		t.Errorf("JSON %s (%v)", r.stdout, err)
	}
	// The CI formats: the same findings, the same exit code.
	misaligned := append(slices.Clone(args), "--ref", "release-1.0", "--ref", "release-1.1")
	for format, want := range map[string]string{
		"sarif":    `"ruleId": "claimed"`,
		"junit":    `<testcase name="slot 3" classname="slots">`,
		"markdown": "| ❌ danger | slot 3 | `claimed` |",
		"github":   "::error title=claimed%3A slot 3::",
	} {
		r = run(t, append(misaligned, "-o", format)...)
		if r.code != cli.ExitFindings || !strings.Contains(r.stdout, want) {
			t.Errorf("-o %s: exit %d, want %q in\n%s%s", format, r.code, want, r.stdout, r.stderr)
		}
	}
	r = run(t, append(args, "--ref", "master", "--ref", "release-1.1", "-o", "junit")...)
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, `failures="0"`) || strings.Contains(r.stdout, "<failure") {
		t.Errorf("aligned, -o junit: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, append(args, "--ref", "master", "--ref", "release-1.1")...)
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "ALIGNED") {
		t.Errorf("aligned: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, "slots", "--repo", g.Dir, "--ref", "release-1.0", "--ref", "release-1.1", "--dir", "migrations", "--target", "values.yaml")
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "FILE:KEY") {
		t.Errorf("bad --target: exit %d %s", r.code, r.stderr)
	}
}

// TestSlotsOnBareClone: the command reads a bare clone (as CI caches and server-side
// hooks keep repositories) as it reads the work tree it was cloned from.
func TestSlotsOnBareClone(t *testing.T) {
	servers.NeedGitCLI(t)
	g := servers.NewGitRepo(t)
	base := g.Commit("base", map[string]string{"migrations/1": "one\n", "values.yaml": "migrations:\n  targetVersion: 2\n"})
	g.Branch("release-1.0", base)
	g.Commit("claim slot 2", map[string]string{"migrations/2": "repair\n", "values.yaml": "migrations:\n  targetVersion: 3\n"})
	g.Branch("release-1.1", base)
	g.Commit("1.1", map[string]string{"migrations/2": "other\n", "migrations/3": "three\n", "values.yaml": "migrations:\n  targetVersion: 4\n"})
	bare := filepath.Join(t.TempDir(), "repo.git")
	if out, err := exec.Command("git", "clone", "--quiet", "--bare", g.Dir, bare).CombinedOutput(); err != nil {
		t.Fatalf("git clone --bare: %v\n%s", err, out)
	}
	r := run(t, "slots", "--repo", bare, "--ref", "release-1.0", "--ref", "release-1.1", "--dir", "migrations", "--target", "values.yaml:migrations.targetVersion")
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "slot 2 (claimed)") {
		t.Errorf("bare clone: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
