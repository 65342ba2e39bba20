package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestKrewManifest packages every release platform (with a stand-in binary: packaging
// is what is tested here; TestPlugins installs a real one) and checks the krew manifest:
// krew's own validator accepts it, every platform is there with the checksum of its
// archive, and a tampered archive or a missing platform is caught.
func TestKrewManifest(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rel := Release{Version: "v1.2.3", Commit: strings.Repeat("a", 40), Date: time.Unix(1700000000, 0).UTC(), Root: root}
	bins := map[Platform]string{}
	for _, p := range ReleasePlatforms {
		bins[p] = filepath.Join(t.TempDir(), p.exe("upgradeguard"))
		if err := os.WriteFile(bins[p], []byte("stand-in for "+p.String()), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	if _, err := Package(t.Context(), rel, bins, dir, ""); err != nil {
		t.Fatal(err)
	}
	if err := verifyDist(dir, ReleasePlatforms); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, KrewManifest)
	if !testing.Short() {
		out, err := exec.CommandContext(t.Context(), filepath.Join(krewTools(t), "validate-krew-manifest"), "-manifest", manifest, "-skip-install").CombinedOutput()
		if err != nil {
			t.Fatalf("krew's validate-krew-manifest rejects %s: %v\n%s", KrewManifest, err, out)
		}
	}
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var m krewPlugin
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Spec.Platforms {
		if !strings.HasPrefix(p.URI, SourceURL+"/releases/download/v1.2.3/upgradeguard_1.2.3_") {
			t.Errorf("uri %s", p.URI)
		}
	}

	// Same inputs, same bytes: a second run gives the same checksums file.
	again := t.TempDir()
	if _, err := Package(t.Context(), rel, bins, again, ""); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(dir, ChecksumsFile))
	b, _ := os.ReadFile(filepath.Join(again, ChecksumsFile))
	if string(a) != string(b) || len(a) == 0 {
		t.Errorf("two packagings differ:\n%s\n%s", a, b)
	}

	// A tampered archive fails both the checksums file and the manifest.
	linux := filepath.Join(dir, ArchiveName(rel, Platform{"linux", "arm64"}))
	if err := os.WriteFile(linux, []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := VerifyKrewManifest(dir, ReleasePlatforms); err == nil || !strings.Contains(err.Error(), "linux/arm64") {
		t.Errorf("tampered archive: %v", err)
	}
	// A manifest missing a platform is incomplete.
	m.Spec.Platforms = m.Spec.Platforms[1:]
	data, _ = yaml.Marshal(m)
	if err := os.WriteFile(filepath.Join(again, KrewManifest), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := VerifyKrewManifest(again, ReleasePlatforms); err == nil || !strings.Contains(err.Error(), "platforms") {
		t.Errorf("incomplete manifest: %v", err)
	}
}
