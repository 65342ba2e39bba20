package main

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

type result struct {
	name   string
	median time.Duration
	allocs uint64 // bytes allocated per round
	// reads and writes are API requests per round, seen what they were (gate only).
	reads, writes float64
	seen          string
}

func measure(name string, rounds int, f func() error) (result, error) {
	if err := f(); err != nil { // warm caches and connections
		return result{}, err
	}
	var times []time.Duration
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	for range rounds {
		start := time.Now()
		if err := f(); err != nil {
			return result{}, err
		}
		times = append(times, time.Since(start))
	}
	runtime.ReadMemStats(&ms)
	slices.Sort(times)
	return result{name: name, median: times[len(times)/2], allocs: (ms.TotalAlloc - before) / uint64(rounds)}, nil
}

func benchCheck(ctx context.Context, rounds, objects int) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	cp, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	cs := apiextclient.NewForConfigOrDie(cp.Config)

	crds, err := incidentState(ctx, cp, objects)
	if err != nil {
		return err
	}

	// Chart loading is excluded: it is done once, before timing.
	ch, err := chartsource.Load(ctx, chartsource.Options{Ref: filepath.Join(root, "test/fixtures/charts/flux2-2.18.2")})
	if err != nil {
		return err
	}
	// Every check's clients count their requests, so that one round of each case can be
	// traced: which requests, when each started and how long it took.
	counter := &apiCounter{}
	counted := counter.wrap(cp.Config)
	cluster, err := livecluster.NewKubeCluster(counted)
	if err != nil {
		return err
	}
	md := metadata.NewForConfigOrDie(cp.Config)
	var hr *apiextv1.CustomResourceDefinition
	for _, c := range crds {
		if c.Name == "helmrepositories.source.toolkit.fluxcd.io" {
			hr = c
		}
	}

	baseline, err := measure("baseline: one LIST of all CRDs", rounds, func() error {
		_, err := cs.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
		return err
	})
	if err != nil {
		return err
	}
	// The flux2 chart leaves HelmRepository's v1 schema as it is, so the schema check reads
	// none of its objects. The worst case for the goal changes that schema (a description),
	// so that every object is read and judged.
	changed := slices.Clone(ch.CRDs)
	for i, c := range changed {
		if c.CRD.Name == "helmrepositories.source.toolkit.fluxcd.io" {
			changed[i].CRD = c.CRD.DeepCopy()
			for j := range changed[i].CRD.Spec.Versions {
				changed[i].CRD.Spec.Versions[j].Schema.OpenAPIV3Schema.Description += " (changed for the benchmark)"
			}
		}
	}
	checkAt := func(name string, noSchema bool) (result, error) {
		return measure(name, rounds, func() error {
			rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: changed, NoSchemaCheck: noSchema})
			if err == nil && rep.Safe {
				err = fmt.Errorf("expected findings")
			}
			return err
		})
	}
	storedOnly, err := checkAt(fmt.Sprintf("check flux2 2.18.2 (%d CRDs), storedVersions only", len(ch.CRDs)), true)
	if err != nil {
		return err
	}
	// The rounds above reuse one cluster's clients, and with them the API server's answers
	// to the dry runs (crdschema.Admissions). A CLI process checks once: each round here
	// gets clients of its own (built before the clock starts), so every changed CRD is
	// dry-run again.
	fresh := make([]*livecluster.KubeCluster, rounds+1)
	for i := range fresh {
		if fresh[i], err = livecluster.NewKubeCluster(counted); err != nil {
			return err
		}
	}
	next := 0
	firstOn := func(c *livecluster.KubeCluster) error {
		rep, err := check.Run(ctx, c, check.Request{Operation: predict.Upgrade, Incoming: changed, NoSchemaCheck: true})
		if err == nil && rep.Safe {
			err = fmt.Errorf("expected findings")
		}
		return err
	}
	firstCheck := func() error {
		next++
		return firstOn(fresh[next-1])
	}
	// A traced first check builds its cluster in the round (which makes no request).
	firstWith := func(cfg *rest.Config) func() error {
		return func() error {
			c, err := livecluster.NewKubeCluster(cfg)
			if err != nil {
				return err
			}
			return firstOn(c)
		}
	}
	firstInProcess, err := measure(fmt.Sprintf("check flux2 2.18.2 (%d CRDs), storedVersions only, first in a process", len(ch.CRDs)), rounds, firstCheck)
	if err != nil {
		return err
	}
	shipped := func() error {
		_, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: ch.CRDs})
		return err
	}
	// envtest's config sets a client rate limit of its own (QPS 1000); a kubeconfig sets
	// none, so a CLI run's clients get client-go's default unless upgradeguard sets one.
	kubeconfig := rest.CopyConfig(counted)
	kubeconfig.QPS, kubeconfig.Burst = 0, 0
	for i := range fresh {
		if fresh[i], err = livecluster.NewKubeCluster(kubeconfig); err != nil {
			return err
		}
	}
	next = 0
	firstAsCLI, err := measure(fmt.Sprintf("check flux2 2.18.2 (%d CRDs), storedVersions only, first in a process, a kubeconfig's rate limit", len(ch.CRDs)), rounds, firstCheck)
	if err != nil {
		return err
	}
	asShipped, err := measure("check flux2 2.18.2 as shipped (no schema of a stored version changes)", rounds, shipped)
	if err != nil {
		return err
	}
	// One more round of each, traced (untimed: the trace itself costs a little).
	var traces []string
	for _, c := range []struct {
		r result
		f func() error
	}{{baseline, func() error {
		_, err := apiextclient.NewForConfigOrDie(counted).ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
		return err
	}}, {storedOnly, func() error {
		_, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: changed, NoSchemaCheck: true})
		return err
	}}, {firstInProcess, firstWith(counted)}, {firstAsCLI, firstWith(kubeconfig)}, {asShipped, shipped}} {
		trace, elapsed, err := counter.traceOf(c.f)
		if err != nil {
			return err
		}
		traces = append(traces, fmt.Sprintf("requests of one round, %s (%s; start, duration, request):\n%s",
			c.r.name, elapsed.Round(time.Microsecond), trace))
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	listAll, err := measure(fmt.Sprintf("one LIST of the %d objects (pages of 500)", objects), rounds, func() error {
		for _, err := range kubeclient.Pages(ctx, dyn.Resource(benchGVR).List, metav1.ListOptions{}) {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	checkRun, err := checkAt(fmt.Sprintf("check flux2 2.18.2 (%d CRDs) with the schema check, %d objects judged", len(ch.CRDs), objects), false)
	if err != nil {
		return err
	}
	count, err := measure(fmt.Sprintf("count %d objects (remainingItemCount)", objects), rounds, func() error {
		n, err := cluster.CountObjects(ctx, hr)
		if err == nil && n != int64(objects) {
			err = fmt.Errorf("counted %d objects, want %d", n, objects)
		}
		return err
	})
	if err != nil {
		return err
	}
	naive, err := measure(fmt.Sprintf("count %d objects by paging metadata (naive)", objects), rounds, func() error {
		for _, err := range kubeclient.Pages(ctx, md.Resource(benchGVR).List, metav1.ListOptions{}) {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}

	fmt.Printf("\n%-64s %12s %10s %14s\n", "case", "median", "ratio", "alloc/round")
	for _, r := range []result{baseline, storedOnly, firstInProcess, firstAsCLI, asShipped} {
		fmt.Printf("%-64s %12s %9.1fx %11d KiB\n", r.name, r.median.Round(time.Microsecond), float64(r.median)/float64(baseline.median), r.allocs/1024)
	}
	// The schema check's goal: within 2x of storedVersions-only check plus one LIST of
	// the objects it reads.
	floor := storedOnly.median + listAll.median
	for _, r := range []result{listAll, checkRun} {
		fmt.Printf("%-64s %12s %9.2fx %11d KiB\n", r.name, r.median.Round(time.Microsecond), float64(r.median)/float64(floor), r.allocs/1024)
	}
	fmt.Printf("schema check goal: check <= 2.00x of (storedVersions-only check + one LIST) = %s: %s\n",
		(2 * floor).Round(time.Microsecond), hitOrMiss(checkRun.median <= 2*floor))
	for _, r := range []result{naive, count} {
		fmt.Printf("%-52s %12s %9.2fx %11d KiB\n", r.name, r.median.Round(time.Microsecond), float64(r.median)/float64(naive.median), r.allocs/1024)
	}
	fmt.Println()
	for _, t := range traces {
		fmt.Print(t)
	}
	fmt.Printf("\nratios: check vs one CRD LIST; counting vs naive paging (lower is better). %d rounds, median.\n", rounds)
	return nil
}

func hitOrMiss(ok bool) string {
	if ok {
		return "hit"
	}
	return "MISS"
}
