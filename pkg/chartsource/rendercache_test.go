package chartsource_test

import (
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

// TestCacheKeepsRenders: a Cache serves the CRDs of a chart rendered before with the same
// inputs without rendering it again (no loaded chart comes back), and renders again when
// any input the CRDs depend on changes: values, release, install or upgrade.
func TestCacheKeepsRenders(t *testing.T) {
	pkgs := t.TempDir()
	if _, err := testenv.Package(crdChart(t, t.TempDir(), "1.0.0"), pkgs); err != nil {
		t.Fatal(err)
	}
	url, stop, err := testenv.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cache := chartsource.NewCache(chartsource.CacheOptions{})
	load := func(values map[string]any, release string, upgrade bool) *chartsource.Chart {
		t.Helper()
		ch, err := chartsource.Load(t.Context(), chartsource.Options{Ref: "widgets", RepoURL: url, Settings: settings(t), Cache: cache,
			BaseValues: values, ReleaseName: release, IsUpgrade: upgrade})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	first := load(map[string]any{"extra": true}, "a", true)
	if first.Chart == nil || len(first.CRDs) != 3 {
		t.Fatalf("first load: chart %v, %d CRDs, want a rendered chart with 3", first.Chart != nil, len(first.CRDs))
	}
	again := load(map[string]any{"extra": true}, "a", true)
	if again.Chart != nil || len(again.CRDs) != 3 || again.Version != "1.0.0" {
		t.Errorf("same inputs: chart %v, %d CRDs, version %s; want the kept render (no chart), 3 CRDs, 1.0.0", again.Chart != nil, len(again.CRDs), again.Version)
	}
	for name, ch := range map[string]*chartsource.Chart{
		"other values":  load(map[string]any{"extra": false}, "a", true),
		"other release": load(map[string]any{"extra": true}, "b", true),
		"install":       load(map[string]any{"extra": true}, "a", false),
	} {
		if ch.Chart == nil {
			t.Errorf("%s: served a kept render, want a new one", name)
		}
	}
	if ch := load(map[string]any{"extra": false}, "a", true); len(ch.CRDs) != 2 {
		t.Errorf("extra: false gave %d CRDs, want 2", len(ch.CRDs))
	}
}
