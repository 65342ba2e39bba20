package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// benchGate measures what the HelmRelease gate adds to a HelmRelease update on the real
// API server, in one run: the same chart-version change on a release the webhook never
// sees (labelled upgradeguard.io/gate=off, excluded by the shipped objectSelector) is the
// baseline; then with the webhook (safe chart: admitted; the Flux boundary: denied), and a
// label-only update with the webhook installed (matchConditions keep it from the webhook).
// The first decision of each gated case is timed on its own (an empty cache: the index and
// the chart are fetched); the rounds after it repeat decisions the cache can serve. With
// cache false the gate keeps nothing, and every round pays what the first one does.
func benchGate(ctx context.Context, rounds int, cache bool) error {
	ctrllog.SetLogger(logr.Discard())
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	cp, err := testenv.Start(testenv.Options{Webhooks: &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook")}}})
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	// The gate lists StorageMigrationPolicies before it denies a migrate verdict: without
	// the upgradeguard CRDs the flux2 case ends in "could not check" instead.
	if err := testenv.ApplyUpgradeguardCRDs(ctx, cp.Config); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "upgradeguard-bench-gate-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	repo := filepath.Join(dir, "repo")
	charts := map[string]string{}
	for _, c := range []struct{ name, version, file string }{
		{"flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml"},
		{"flux2", "2.18.2", "charts/flux2-2.18.2/rendered/crds.yaml"},
		{"kro", "0.9.0", "crds/kro/v0.9.3/kro.run_resourcegraphdefinitions.yaml"},
		{"kro", "0.9.3", "crds/kro/v0.9.3/kro.run_resourcegraphdefinitions.yaml"},
	} {
		src, err := testenv.FixtureChart(filepath.Join(dir, "src", c.name+c.version), c.name, c.version, c.file)
		if err != nil {
			return err
		}
		if charts[c.name+"-"+c.version], err = testenv.Package(src, repo); err != nil {
			return err
		}
	}
	url, stopRepo, err := testenv.ServeRepo(repo)
	if err != nil {
		return err
	}
	defer stopRepo()
	if out, err := cp.Helm("install", "flux", charts["flux2-2.17.2"], "-n", "flux-system", "--create-namespace").CombinedOutput(); err != nil {
		return fmt.Errorf("helm install flux2: %w: %s", err, out)
	}
	if out, err := cp.Helm("install", "kro", charts["kro-0.9.0"], "-n", "bench", "--create-namespace").CombinedOutput(); err != nil {
		return fmt.Errorf("helm install kro: %w: %s", err, out)
	}

	wh := cp.Webhooks
	mgr, err := controller.NewManager(cp.Config, controller.Options{LeaderElectionNamespace: "default", MetricsAddr: "0", ProbeAddr: "0",
		EnableWebhook: true, WebhookPort: wh.LocalServingPort, WebhookCertDir: wh.LocalServingCertDir})
	if err != nil {
		return err
	}
	if err := webhook.Setup(mgr, webhook.Options{HelmCacheDir: filepath.Join(dir, "helm"), ChartCacheSize: map[bool]int{true: 0, false: -1}[cache]}); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() { cancel(); <-done }()

	var c client.Client
	// The new Flux kinds are served a moment after Helm returns.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if c, err = client.New(cp.Config, client.Options{Scheme: mgr.GetScheme()}); err != nil {
			return false, err
		}
		return c.List(ctx, &helmv2.HelmReleaseList{}) == nil && c.List(ctx, &sourcev1.HelmRepositoryList{}) == nil, nil
	}); err != nil {
		return fmt.Errorf("flux kinds not served: %w", err)
	}
	for _, ns := range []string{"bench", "flux-system"} {
		if err := c.Create(ctx, &sourcev1.HelmRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "charts"},
			Spec: sourcev1.HelmRepositorySpec{URL: url, Interval: metav1.Duration{Duration: time.Hour}}}); err != nil {
			return err
		}
	}
	hr := func(ns, name, release, chart, version string, labels map[string]string) error {
		return c.Create(ctx, &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: helmv2.HelmReleaseSpec{Interval: metav1.Duration{Duration: time.Hour}, ReleaseName: release, Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
				Chart: chart, Version: version, SourceRef: helmv2.CrossNamespaceObjectReference{Kind: sourcev1.HelmRepositoryKind, Name: "charts"}}}}})
	}
	if err := hr("bench", "ungated", "kro", "kro", "0.9.0", map[string]string{"upgradeguard.io/gate": "off"}); err != nil {
		return err
	}
	if err := hr("bench", "gated", "kro", "kro", "0.9.0", nil); err != nil {
		return err
	}
	if err := hr("flux-system", "flux", "flux", "flux2", "2.17.2", nil); err != nil {
		return err
	}
	for _, crd := range []string{"helmrepositories.source.toolkit.fluxcd.io", "helmcharts.source.toolkit.fluxcd.io", "buckets.source.toolkit.fluxcd.io"} {
		if err := testenv.SetStoredVersions(ctx, apiextclient.NewForConfigOrDie(cp.Config), crd, "v1beta2", "v1"); err != nil {
			return err
		}
	}

	versions := []string{"0.9.3", "0.9.0"}
	toggle := func(ns, name string, i *int) error {
		var obj helmv2.HelmRelease
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &obj); err != nil {
			return err
		}
		base := obj.DeepCopy()
		*i++
		obj.Spec.Chart.Spec.Version = versions[*i%2]
		return c.Patch(ctx, &obj, client.MergeFrom(base))
	}
	var iu, ig, il int
	first := func(name string, f func() error) (result, error) {
		start := time.Now()
		err := f()
		return result{name: name, median: time.Since(start)}, err
	}
	baseline, err := measure("chart update, webhook not called (baseline)", rounds, func() error { return toggle("bench", "ungated", &iu) })
	if err != nil {
		return err
	}
	ig = -1 // the first toggle moves the release from 0.9.0 to 0.9.3, a real chart change
	gatedFirst, err := first("chart update through the gate: kro, admitted, first decision", func() error { return toggle("bench", "gated", &ig) })
	if err != nil {
		return err
	}
	// Each admitted decision is followed by the gate's annotation patch of the same
	// HelmRelease; a round that raced it would have its patch retried by the API server,
	// admission and all, and be timed twice. Rounds start once the annotation is written.
	settled := func(ns, name string, want func(*helmv2.HelmRelease) string) func() error {
		return func() error {
			return wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				var obj helmv2.HelmRelease
				if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &obj); err != nil {
					return false, err
				}
				return webhook.ParseState(&obj).Chart == want(&obj), nil
			})
		}
	}
	gated, err := measureSettled("chart update through the gate: kro, admitted", rounds, func() error { return toggle("bench", "gated", &ig) },
		settled("bench", "gated", func(hr *helmv2.HelmRelease) string { return "kro@" + hr.Spec.Chart.Spec.Version }))
	if err != nil {
		return err
	}
	label, err := measure("label-only update, webhook installed", rounds, func() error {
		var obj helmv2.HelmRelease
		if err := c.Get(ctx, client.ObjectKey{Namespace: "bench", Name: "gated"}, &obj); err != nil {
			return err
		}
		base := obj.DeepCopy()
		il++
		obj.Labels = map[string]string{"round": fmt.Sprint(il)}
		return c.Patch(ctx, &obj, client.MergeFrom(base))
	})
	if err != nil {
		return err
	}
	deny := func() error {
		var obj helmv2.HelmRelease
		if err := c.Get(ctx, client.ObjectKey{Namespace: "flux-system", Name: "flux"}, &obj); err != nil {
			return err
		}
		base := obj.DeepCopy()
		obj.Spec.Chart.Spec.Version = "2.18.2"
		err := c.Patch(ctx, &obj, client.MergeFrom(base))
		if apierrors.IsForbidden(err) {
			return nil
		}
		return errors.Join(errors.New("the flux2 2.18.2 update was not denied"), err)
	}
	deniedFirst, err := first("chart update through the gate: flux2 2.18.2, denied, first decision", deny)
	if err != nil {
		return err
	}
	denied, err := measureSettled("chart update through the gate: flux2 2.18.2, denied", rounds, deny, settled("flux-system", "flux", func(*helmv2.HelmRelease) string { return "flux2@2.18.2" }))
	if err != nil {
		return err
	}

	fmt.Printf("\n%-72s %12s %10s %14s\n", "case", "median", "ratio", "alloc/round")
	for _, r := range []result{baseline, label, gatedFirst, gated, deniedFirst, denied} {
		fmt.Printf("%-72s %12s %9.1fx %11d KiB\n", r.name, r.median.Round(time.Microsecond), float64(r.median)/float64(baseline.median), r.allocs/1024)
	}
	fmt.Printf("\nratios against the same update with the webhook not called. %d rounds, median; a first decision is one sample (no allocation count). Gate cache: %v. Allocations include the in-process gate.\n", rounds, cache)
	// The goals of a decision from memory, as ratios to this run's baseline.
	for _, g := range []struct {
		r    result
		goal time.Duration
	}{{gated, 20 * time.Millisecond}, {denied, 20 * time.Millisecond}, {gatedFirst, 250 * time.Millisecond}, {deniedFirst, 250 * time.Millisecond}} {
		verdict := "met"
		if g.r.median >= g.goal {
			verdict = "MISSED"
		}
		fmt.Printf("goal %-66s under %6s (%5.1fx baseline): %9s (%5.1fx) %s\n", g.r.name, g.goal, float64(g.goal)/float64(baseline.median),
			g.r.median.Round(time.Microsecond), float64(g.r.median)/float64(baseline.median), verdict)
	}
	return nil
}

// measureSettled is measure with settle run, untimed, before every round.
func measureSettled(name string, rounds int, f, settle func() error) (result, error) {
	var times []time.Duration
	var ms runtime.MemStats
	var alloc uint64
	for i := range rounds + 1 { // the first round warms caches and connections
		if err := settle(); err != nil {
			return result{}, fmt.Errorf("%s: settle: %w", name, err)
		}
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		start := time.Now()
		if err := f(); err != nil {
			return result{}, err
		}
		d := time.Since(start)
		runtime.ReadMemStats(&ms)
		if i > 0 {
			times = append(times, d)
			alloc += ms.TotalAlloc - before
		}
	}
	slices.Sort(times)
	return result{name: name, median: times[len(times)/2], allocs: alloc / uint64(rounds)}, nil
}
