package review

import "testing"

// TestRepoID: the URL forms of one repository (https, scp-like ssh, ssh with a port, a
// user, .git and a trailing slash) name it alike, and another repository differently.
func TestRepoID(t *testing.T) {
	const want = "git.example.com/platform/fleet"
	for _, u := range []string{
		"https://git.example.com/platform/fleet.git",
		"https://git.example.com/platform/fleet/",
		"git@git.example.com:platform/fleet.git",
		"ssh://git@git.example.com:22/platform/fleet",
		"HTTPS://token@Git.Example.com/platform/fleet",
	} {
		if got := repoID(u); got != want {
			t.Errorf("repoID(%q) = %q, want %q", u, got, want)
		}
	}
	if got := repoID("https://git.example.com/platform/other.git"); got == want {
		t.Errorf("another repository is named as this one: %q", got)
	}
}

// TestDependencyLine: the line of a dependency's version in a Chart.yaml, by name or by
// alias, and 1 when the chart has no such dependency.
func TestDependencyLine(t *testing.T) {
	chart := []byte(`apiVersion: v2
name: platform
version: 0.1.0
dependencies:
  - name: flux2
    version: "2.18.2"
    repository: https://charts.example.com
  - name: lws
    alias: batch
    repository: https://charts.example.com
    version: 0.8.0
`)
	for name, want := range map[string]int{"flux2": 6, "batch": 11, "lws": 1, "none": 1} {
		if got := dependencyLine(chart, name); got != want {
			t.Errorf("dependencyLine(%s) = %d, want %d", name, got, want)
		}
	}
}
