package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// benchGate measures what the HelmRelease gate adds to a HelmRelease update on the real
// API server, in one run: the same chart-version change on a release the webhook never
// sees (labelled upgradeguard.io/gate=off, excluded by the shipped objectSelector) is the
// baseline; then with the webhook (safe chart: admitted; the Flux boundary: denied), and a
// label-only update with the webhook installed (matchConditions keep it from the webhook).
// The first decision of each gated case is timed in coldRuns fresh processes (gate-serve:
// empty index, chart and render caches), median; the repeated rounds run in one process
// whose caches serve them. With cache false that process keeps nothing, and every round
// pays what a first decision pays. Every case counts the gate process's API requests.
func benchGate(ctx context.Context, rounds, coldRuns int, cache bool) error {
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
	url, stopRepo, err := servers.ServeRepo(repo)
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

	scheme := controller.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{helmv2.AddToScheme, sourcev1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	var c client.Client
	// The new Flux kinds are served a moment after Helm returns.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if c, err = client.New(cp.Config, client.Options{Scheme: scheme}); err != nil {
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
	// Each decision is followed by the gate's annotation patch of the same HelmRelease; a
	// round that raced it would have its patch retried by the API server, admission and
	// all, and be timed twice. Rounds start once the annotation is written.
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
	kroSettled := settled("bench", "gated", func(hr *helmv2.HelmRelease) string { return "kro@" + hr.Spec.Chart.Spec.Version })
	fluxSettled := settled("flux-system", "flux", func(*helmv2.HelmRelease) string { return "flux2@2.18.2" })
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
	var iu, ig, il int

	// First decisions: each in a fresh process of its own (cold index, chart and render
	// caches, informers just synced), the median of coldRuns processes per case.
	cold := coldRunner{ctx: ctx, cp: cp, dir: dir, runs: coldRuns}
	ig = -1 // the first toggle moves the release from 0.9.0 to 0.9.3, a real chart change
	gatedFirst, err := cold.measure("chart update through the gate: kro, admitted, first decision", func() error { return toggle("bench", "gated", &ig) }, kroSettled)
	if err != nil {
		return err
	}
	deniedFirst, err := cold.measure("chart update through the gate: flux2 2.18.2, denied, first decision", deny, fluxSettled)
	if err != nil {
		return err
	}

	// Repeated decisions: one process keeps its caches across the rounds.
	counter := &apiCounter{}
	stopGate, err := startGate(ctx, counter.wrap(cp.Config), cp.Webhooks.LocalServingPort, cp.Webhooks.LocalServingCertDir, filepath.Join(dir, "helm"), cache)
	if err != nil {
		return err
	}
	defer stopGate()
	baseline, err := measure("chart update, webhook not called (baseline)", rounds, func() error { return toggle("bench", "ungated", &iu) })
	if err != nil {
		return err
	}
	gated, err := measureSettled("chart update through the gate: kro, admitted", rounds, func() error { return toggle("bench", "gated", &ig) },
		kroSettled, counter)
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
	denied, err := measureSettled("chart update through the gate: flux2 2.18.2, denied", rounds, deny, fluxSettled, counter)
	if err != nil {
		return err
	}
	report(baseline, []result{baseline, label, gatedFirst, gated, deniedFirst, denied}, rounds, coldRuns, cache)
	for _, g := range []struct {
		r    result
		goal time.Duration
	}{{gated, 20 * time.Millisecond}, {denied, 20 * time.Millisecond}, {gatedFirst, 50 * time.Millisecond}, {deniedFirst, 50 * time.Millisecond}} {
		verdict := "met"
		if g.r.median > g.goal {
			verdict = "MISSED"
		}
		fmt.Printf("goal %-66s at most %6s (%5.1fx baseline): %9s (%5.1fx) %s\n", g.r.name, g.goal, float64(g.goal)/float64(baseline.median),
			g.r.median.Round(time.Microsecond), float64(g.r.median)/float64(baseline.median), verdict)
	}
	// A repeated decision against the same update with the webhook not called.
	const ratioGoal = 1.2
	for _, r := range []result{gated, denied} {
		verdict, ratio := "met", float64(r.median)/float64(baseline.median)
		if ratio > ratioGoal {
			verdict = "MISSED"
		}
		fmt.Printf("goal %-66s at most %.1fx the update without the webhook: %.1fx %s\n", r.name, ratioGoal, ratio, verdict)
	}
	// The decision's own requests are its reads; the writes (the annotation and the event
	// that record it) are made after the answer and shown apart.
	for _, r := range []result{gated, denied} {
		verdict := "met"
		if r.reads > 0 {
			verdict = "MISSED"
		}
		fmt.Printf("goal %-66s 0 API reads per repeated decision: %.1f, %s (and %.1f writes recording it after the answer)\n", r.name, r.reads, verdict, r.writes)
	}
	return nil
}

// report prints the table of a gate run.
func report(baseline result, rs []result, rounds, coldRuns int, cache bool) {
	fmt.Printf("\n%-72s %12s %10s %14s %16s\n", "case", "median", "ratio", "alloc/round", "API reads/writes")
	for _, r := range rs {
		fmt.Printf("%-72s %12s %9.1fx %11d KiB %9.1f / %4.1f\n", r.name, r.median.Round(time.Microsecond), float64(r.median)/float64(baseline.median),
			r.allocs/1024, r.reads, r.writes)
	}
	fmt.Printf("\nratios against the same update with the webhook not called. Repeated cases: %d rounds in one process, median. First decisions: median of %d fresh processes each (no allocation count). Gate cache: %v. Allocations include the in-process gate. API requests are the gate process's, per decision, watches left out; writes record the decision after the answer (annotation, event).\n",
		rounds, coldRuns, cache)
	for _, r := range rs {
		if r.seen != "" {
			fmt.Printf("requests, %s: %s\n", r.name, r.seen)
		}
	}
}

// measureSettled is measure with settle run, untimed, before every round, and the API
// requests of every round counted in counter.
func measureSettled(name string, rounds int, f, settle func() error, counter *apiCounter) (result, error) {
	var times []time.Duration
	var ms runtime.MemStats
	var alloc uint64
	reads, writes, seen := 0, 0, map[string]int{}
	for i := range rounds + 1 { // the first round warms caches and connections
		if err := settle(); err != nil {
			return result{}, fmt.Errorf("%s: settle: %w", name, err)
		}
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		counter.snapshot()
		start := time.Now()
		if err := f(); err != nil {
			return result{}, err
		}
		d := time.Since(start)
		runtime.ReadMemStats(&ms)
		r, w, s := counter.snapshot()
		if i > 0 {
			times = append(times, d)
			alloc += ms.TotalAlloc - before
			reads, writes = reads+r, writes+w
			for k, n := range s {
				seen[k] += n
			}
		}
	}
	slices.Sort(times)
	return result{name: name, median: times[len(times)/2], allocs: alloc / uint64(rounds),
		reads: float64(reads) / float64(rounds), writes: float64(writes) / float64(rounds), seen: describeSeen(seen)}, nil
}

// coldRunner times first decisions, each in a fresh gate process (gate-serve) on the
// bench's control plane.
type coldRunner struct {
	ctx  context.Context
	cp   *testenv.ControlPlane
	dir  string
	runs int
	n    int
}

// measure starts runs fresh processes in turn and times one decision (decide) in each;
// settle waits, untimed, for the decision to be recorded before the process stops.
func (cr *coldRunner) measure(name string, decide, settle func() error) (result, error) {
	exe, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	var times []time.Duration
	reads, writes, last := 0, 0, ""
	for range cr.runs {
		cr.n++
		helmDir := filepath.Join(cr.dir, fmt.Sprintf("helm-cold-%d", cr.n))
		d, r, w, s, err := cr.once(exe, helmDir, decide, settle)
		if err != nil {
			return result{}, fmt.Errorf("%s: %w", name, err)
		}
		times = append(times, d)
		reads, writes, last = reads+r, writes+w, s
	}
	slices.Sort(times)
	return result{name: name, median: times[len(times)/2], reads: float64(reads) / float64(cr.runs), writes: float64(writes) / float64(cr.runs),
		seen: "(last process) " + last}, nil
}

func (cr *coldRunner) once(exe, helmDir string, decide, settle func() error) (time.Duration, int, int, string, error) {
	ctx, cancel := context.WithCancel(cr.ctx)
	defer cancel()
	var args []string
	if cpuProfilePath != "" {
		args = []string{"-cpuprofile", fmt.Sprintf("%s.first-%d", cpuProfilePath, cr.n)}
	}
	cmd := exec.CommandContext(ctx, exe, append(args, "gate-serve", cr.cp.Kubeconfig, strconv.Itoa(cr.cp.Webhooks.LocalServingPort), cr.cp.Webhooks.LocalServingCertDir, helmDir)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, 0, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, 0, "", err
	}
	p, err := childproc.Start(cmd)
	if err != nil {
		return 0, 0, 0, "", err
	}
	defer func() { _ = stdin.Close(); <-p.Done() }()
	out := bufio.NewScanner(stdout)
	out.Buffer(make([]byte, 0, 64*1024), 1<<20)
	if !out.Scan() || out.Text() != "ready" {
		return 0, 0, 0, "", errors.Join(fmt.Errorf("gate-serve did not start: %q", out.Text()), out.Err())
	}
	start := time.Now()
	if err := decide(); err != nil {
		return 0, 0, 0, "", err
	}
	d := time.Since(start)
	if err := settle(); err != nil {
		return 0, 0, 0, "", fmt.Errorf("settle: %w", err)
	}
	if _, err := fmt.Fprintln(stdin, "count"); err != nil {
		return 0, 0, 0, "", err
	}
	if !out.Scan() {
		return 0, 0, 0, "", errors.Join(errors.New("gate-serve did not count"), out.Err())
	}
	f := strings.SplitN(out.Text(), " ", 3)
	if len(f) < 2 {
		return 0, 0, 0, "", fmt.Errorf("gate-serve counted %q", out.Text())
	}
	r, _ := strconv.Atoi(f[0])
	w, _ := strconv.Atoi(f[1])
	s := ""
	if len(f) == 3 {
		s = f[2]
	}
	return d, r, w, s, nil
}
