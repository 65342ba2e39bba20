package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/cli"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
)

// planVersions is the synthetic series of the plan benchmark: 100 chart versions of one
// CRD. 1.0.0-1.47.0 store at v1alpha1; 1.48.0-1.77.0 serve v1alpha1 and store at v1beta1;
// 1.78.0-1.97.0 serve v1beta1 and store at v1; 1.98.0 and 1.99.0 keep only v1. From 1.0.0 with
// objects at v1alpha1, the newest version is three upgrades away (two stepping stones),
// and the search meets every version on the way.
func planVersions(i int) []string {
	switch {
	case i < 48:
		return []string{"v1alpha1*"}
	case i < 78:
		return []string{"v1alpha1", "v1beta1*"}
	case i < 98:
		return []string{"v1beta1", "v1*"}
	}
	return []string{"v1*"}
}

func planBenchCRD(versions []string) string {
	var b strings.Builder
	b.WriteString("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.bench.example.com\nspec:\n  group: bench.example.com\n  scope: Namespaced\n  names:\n    plural: widgets\n    singular: widget\n    kind: Widget\n    listKind: WidgetList\n  versions:\n")
	for _, v := range versions {
		fmt.Fprintf(&b, "  - name: %s\n    served: true\n    storage: %v\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n", strings.TrimSuffix(v, "*"), strings.HasSuffix(v, "*"))
	}
	return b.String()
}

// benchPlan measures plan over a loopback repository of 100 chart versions, with chart
// loads counted, against two baselines measured in the same run: loading the
// repository index once, and loading and rendering one chart version.
func benchPlan(ctx context.Context, rounds int) error {
	cp, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	dir, err := os.MkdirTemp("", "upgradeguard-bench-plan-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	repo := filepath.Join(dir, "repo")
	var first string
	for i := range 100 {
		v := fmt.Sprintf("1.%d.0", i)
		src, err := testenv.WriteChart(filepath.Join(dir, "src", v), "widgets", v, map[string]string{"templates/crd.yaml": planBenchCRD(planVersions(i))})
		if err != nil {
			return err
		}
		tgz, err := testenv.Package(src, repo)
		if err != nil {
			return err
		}
		if i == 0 {
			first = tgz
		}
	}
	url, stop, err := servers.ServeRepo(repo)
	if err != nil {
		return err
	}
	defer stop()
	if out, err := cp.Helm("install", "widgets", first, "-n", "bench", "--create-namespace").CombinedOutput(); err != nil {
		return fmt.Errorf("helm install: %w: %s", err, out)
	}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "bench.example.com", Version: "v1alpha1", Resource: "widgets"},
		Kind: "Widget", Namespaces: []string{"bench"}, PerNS: 100, Spec: map[string]any{"size": 1},
	}); err != nil {
		return err
	}
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		return err
	}
	reader, err := helmrelease.NewReader(kubernetes.NewForConfigOrDie(cp.Config), "bench", "secret")
	if err != nil {
		return err
	}
	settings := cli.New()
	settings.RepositoryCache = filepath.Join(dir, "cache")
	settings.RepositoryConfig = filepath.Join(dir, "repositories.yaml")
	opts := chartsource.Options{Ref: "widgets", RepoURL: url, ReleaseName: "widgets", Namespace: "bench", IsUpgrade: true, Settings: settings}

	index, err := measure("baseline: load the repository index (100 versions)", rounds, func() error {
		vs, err := (&chartsource.History{Options: opts}).Versions(ctx)
		if err == nil && len(vs) != 100 {
			err = fmt.Errorf("%d versions, want 100", len(vs))
		}
		return err
	})
	if err != nil {
		return err
	}
	load, err := measure("baseline: load and render one chart version", rounds, func() error {
		_, err := (&chartsource.History{Options: opts}).CRDs(ctx, "1.99.0")
		return err
	})
	if err != nil {
		return err
	}
	var p *plan.Plan
	planned, err := measure("plan 1.0.0 -> 1.99.0 (no cache between rounds)", rounds, func() error {
		p, err = plan.Run(ctx, plan.Request{Cluster: cluster, Releases: reader, Release: "widgets", Namespace: "bench",
			Versions: &chartsource.History{Options: opts}, Latest: true})
		if err == nil && len(p.Steps) != 5 {
			err = fmt.Errorf("plan of %d steps, want 5 (three upgrades, two migrations)", len(p.Steps))
		}
		return err
	})
	if err != nil {
		return err
	}
	cached, err := measure("plan 1.0.0 -> 1.99.0, chartsource.Cache per plan", rounds, func() error {
		cache := chartsource.NewCache(chartsource.CacheOptions{MaxCharts: 128})
		q, err := plan.Run(ctx, plan.Request{Cluster: cluster, Releases: reader, Release: "widgets", Namespace: "bench",
			Versions: &chartsource.History{Options: opts, Loader: cache}, Latest: true})
		if err == nil && len(q.Steps) != 5 {
			err = fmt.Errorf("plan of %d steps, want 5", len(q.Steps))
		}
		return err
	})
	if err != nil {
		return err
	}
	var direct *plan.Plan
	oneStep, err := measure("plan 1.0.0 -> 1.47.0 (one step), cache per plan", rounds, func() error {
		cache := chartsource.NewCache(chartsource.CacheOptions{MaxCharts: 128})
		direct, err = plan.Run(ctx, plan.Request{Cluster: cluster, Releases: reader, Release: "widgets", Namespace: "bench",
			Versions: &chartsource.History{Options: opts, Loader: cache}, Target: "1.47.0"})
		if err == nil && len(direct.Steps) != 1 {
			err = fmt.Errorf("plan of %d steps, want 1", len(direct.Steps))
		}
		return err
	})
	if err != nil {
		return err
	}
	var path []string
	for _, s := range p.Steps {
		path = append(path, strings.TrimSpace(string(s.Kind)+" "+s.ChartVersion))
	}
	fmt.Printf("\nplan: %s; %d chart loads of %d versions considered; newest directly safe %s\n",
		strings.Join(path, ", "), p.ChartLoads, p.VersionsConsidered, p.Latest.DirectlySafe)
	fmt.Printf("\n%-52s %12s %10s %10s %14s\n", "case", "median", "vs index", "vs 1 load", "alloc/round")
	for _, r := range []result{index, load, planned, cached, oneStep} {
		fmt.Printf("%-52s %12s %9.1fx %9.1fx %11d KiB\n", r.name, r.median.Round(time.Microsecond),
			float64(r.median)/float64(index.median), float64(r.median)/float64(load.median), r.allocs/1024)
	}
	fmt.Printf("one-step plan: %d chart load(s)\n", direct.ChartLoads)
	fmt.Printf("\nplan per chart load: %s (%d loads). %d rounds, median.\n", (planned.median / time.Duration(max(p.ChartLoads, 1))).Round(time.Microsecond), p.ChartLoads, rounds)
	return nil
}
