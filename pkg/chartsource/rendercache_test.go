package chartsource_test

import (
	"context"
	"sync/atomic"
	"testing"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	repo "helm.sh/helm/v4/pkg/repo/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
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
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cache := chartsource.NewCache(chartsource.CacheOptions{})
	load := func(values map[string]any, release string, upgrade bool) *chartsource.Chart {
		t.Helper()
		ch, err := cache.Load(t.Context(), chartsource.Options{Ref: "widgets", RepoURL: url, Settings: settings(t),
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

// counting is a Loader that passes every call to Helm and counts them.
type counting struct {
	chartsource.Helm
	load, locate, render, index atomic.Int32
}

func (c *counting) Load(ctx context.Context, o chartsource.Options) (*chartsource.Chart, error) {
	c.load.Add(1)
	return c.Helm.Load(ctx, o)
}

func (c *counting) Locate(ctx context.Context, o chartsource.Options) (string, error) {
	c.locate.Add(1)
	return c.Helm.Locate(ctx, o)
}

func (c *counting) Render(ctx context.Context, ch *chart.Chart, o chartsource.Options) (*chartsource.Chart, error) {
	c.render.Add(1)
	return c.Helm.Render(ctx, ch, o)
}

func (c *counting) Index(ctx context.Context, o chartsource.Options) (*repo.IndexFile, error) {
	c.index.Add(1)
	return c.Helm.Index(ctx, o)
}

// TestCacheWrapsALoader: a Cache asks the Loader it wraps only for what it does not keep:
// the repository index once per TTL, each archive once, a render once per set of inputs;
// and it passes a local chart, and credentials without an identity, straight on.
func TestCacheWrapsALoader(t *testing.T) {
	pkgs := t.TempDir()
	dir := crdChart(t, t.TempDir(), "1.0.0")
	if _, err := testenv.Package(dir, pkgs); err != nil {
		t.Fatal(err)
	}
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	next := &counting{}
	cache := chartsource.NewCache(chartsource.CacheOptions{Loader: next})
	s := settings(t)
	remote := chartsource.Options{Ref: "widgets", RepoURL: url, Settings: s}
	for _, release := range []string{"a", "a", "b"} {
		o := remote
		o.ReleaseName = release
		if _, err := cache.Load(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := chartsource.Versions(t.Context(), cache, remote); err != nil {
		t.Fatal(err)
	}
	type calls struct{ Load, Locate, Render, Index int32 }
	got := calls{next.load.Load(), next.locate.Load(), next.render.Load(), next.index.Load()}
	if want := (calls{Load: 0, Locate: 1, Render: 2, Index: 1}); got != want {
		t.Errorf("remote chart loaded for releases a, a, b, then its versions listed: calls to the wrapped Loader %+v, want %+v", got, want)
	}

	passed := []chartsource.Options{{Ref: dir, Settings: s}, {Ref: "widgets", RepoURL: url, Username: "u", Password: "p", Settings: s}}
	for _, o := range passed {
		if _, err := cache.Load(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	if n := next.load.Load(); n != int32(len(passed)) {
		t.Errorf("a local chart and credentials without an identity: %d Loads passed on, want %d", n, len(passed))
	}
}
