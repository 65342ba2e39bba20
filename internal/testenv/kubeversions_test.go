package testenv

import (
	"slices"
	"strings"
	"testing"
)

// TestKubeVersions: the default minor is the newest at a GA version, so a minor's GA is
// one change in kube-versions.
func TestKubeVersions(t *testing.T) {
	if !slices.Contains(Minors, DefaultMinor) || len(Minors) < 2 {
		t.Fatalf("Minors %v, DefaultMinor %q", Minors, DefaultMinor)
	}
	beta := "# comment\n1.37 v1.37.2\n1.38 v1.38.0-beta.0 go1.27.3\n"
	minors, def := parseKubeVersions(beta)
	if !slices.Equal(minors, []string{"1.37", "1.38"}) || def != "1.37" {
		t.Fatalf("before GA: minors %v default %q, want [1.37 1.38] and 1.37", minors, def)
	}
	if _, def := parseKubeVersions(strings.Replace(beta, "v1.38.0-beta.0", "v1.38.0", 1)); def != "1.38" {
		t.Fatalf("after GA: default %q, want 1.38", def)
	}
}
