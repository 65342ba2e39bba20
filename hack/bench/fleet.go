package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// benchFleet: one in-process controller, a platform control plane, and targets+1 target
// control planes (kube-apiservers on one etcd), each in the Flux incident's state with n
// stale HelmRepositories. The extra one is migrated alone first (the baseline); then a
// policy over the other targets runs them all at once. Then: the controller's RSS per
// idle target, API requests per target, and a pass with one target down.
func benchFleet(ctx context.Context, targets, n int) error {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4})))
	platform, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = platform.Stop() }()
	if err := testenv.ApplyUpgradeguardCRDs(ctx, platform.Config); err != nil {
		return err
	}
	fmt.Printf("starting %d target control planes on one etcd ...\n", targets+1)
	started := time.Now()
	fleet, err := testenv.StartFleet(targets + 1)
	if err != nil {
		return err
	}
	defer func() { _ = fleet.Stop() }()
	fmt.Printf("  ready in %s\n", time.Since(started).Round(100*time.Millisecond))
	fmt.Printf("putting %d HelmRepositories at v1beta2 on each ...\n", n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(3)
	for _, c := range fleet.Clusters {
		g.Go(func() error { _, err := incidentState(gctx, c, n); return err })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	c, err := client.New(platform.Config, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fleet"}}); err != nil {
		return err
	}
	alone := fleet.Clusters[targets]
	for i, cp := range fleet.Clusters {
		group := "fleet"
		if i == targets {
			group = "alone"
		}
		data, err := os.ReadFile(cp.Kubeconfig)
		if err != nil {
			return err
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i), Namespace: "fleet", Labels: map[string]string{"group": group}},
			Data: map[string][]byte{"value": data}}
		if err := c.Create(ctx, s); err != nil {
			return err
		}
	}
	mgr, err := controller.NewManager(platform.Config, controller.Options{MetricsAddr: "0", ProbeAddr: "0", LeaderElectionNamespace: "default",
		MaxConcurrentMigrations: targets, SkipNameValidation: true})
	if err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = mgr.Start(mctx) }()

	policy := func(name, group string) error {
		return c.Create(ctx, &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"source.toolkit.fluxcd.io"},
				Targets: &v1alpha1.FleetTargets{Namespace: "fleet", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"group": group}}}}})
	}
	// done waits until the proactive StorageMigrations of the clusters have succeeded
	// after since (read on the platform, so the wait adds no request to the targets).
	done := func(clusters []int, since time.Time) (time.Duration, error) {
		var took time.Duration
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
			for _, i := range clusters {
				sm := &v1alpha1.StorageMigration{}
				err := c.Get(ctx, client.ObjectKey{Name: controller.FleetName(fmt.Sprintf("c%d", i), benchCRD)}, sm)
				if err != nil || sm.Status.Phase != v1alpha1.PhaseSucceeded || sm.Status.CompletionTime == nil || sm.Status.CompletionTime.Time.Before(since.Truncate(time.Second)) {
					return false, client.IgnoreNotFound(err)
				}
			}
			took = time.Since(since)
			return true, nil
		})
		return took, err
	}
	all := make([]int, targets)
	for i := range all {
		all[i] = i
	}

	// 1. The baseline: one cluster alone.
	reqBefore := requests(ctx, alone.Config)
	t0 := time.Now()
	if err := policy("alone", "alone"); err != nil {
		return err
	}
	aloneTime, err := done([]int{targets}, t0)
	if err != nil {
		return fmt.Errorf("alone: %w", err)
	}
	aloneReqs := requests(ctx, alone.Config) - reqBefore

	// 2. Every other target at once.
	before := make([]float64, targets)
	for i := range targets {
		before[i] = requests(ctx, fleet.Clusters[i].Config)
	}
	t0 = time.Now()
	if err := policy("fleet", "fleet"); err != nil {
		return err
	}
	fleetTime, err := done(all, t0)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	var fleetReqs float64
	for i := range targets {
		fleetReqs += requests(ctx, fleet.Clusters[i].Config) - before[i]
	}
	fleetReqs /= float64(targets)

	// 3. RSS per idle target: targets+1 idle targets, then 1.
	time.Sleep(3 * time.Second) // idle: informers synced, no migration running
	rssAll := rssAfterGC()
	if err := c.Delete(ctx, &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fleet"}}); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // the fleet's targets and informers stop
	rssOne := rssAfterGC()
	perTarget := float64(rssAll-rssOne) / float64(targets) / 1024

	// 4. One target down: stale storedVersions again on every target (their objects are
	// now current, so this is a full pass without rewrites), the last one stopped.
	restale := func(cp *testenv.ControlPlane) error {
		return testenv.SetStoredVersions(ctx, apiextclient.NewForConfigOrDie(cp.Config), benchCRD, "v1beta2", "v1")
	}
	t0 = time.Now()
	if err := restale(alone); err != nil {
		return err
	}
	passAlone, err := done([]int{targets}, t0)
	if err != nil {
		return fmt.Errorf("pass alone: %w", err)
	}
	for i := range targets {
		if err := restale(fleet.Clusters[i]); err != nil {
			return err
		}
	}
	if err := fleet.Clusters[targets-1].StopAPIServer(); err != nil {
		return err
	}
	t0 = time.Now()
	if err := policy("fleet", "fleet"); err != nil {
		return err
	}
	passDown, err := done(all[:targets-1], t0)
	if err != nil {
		return fmt.Errorf("pass with one down: %w", err)
	}

	fmt.Printf("\nfleet: %d targets x %d stale HelmRepositories, %s, kube-apiserver from bin/\n\n", targets, n, machine())
	fmt.Println("| case | time | ratio | goal |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| one cluster alone (baseline), %d objects | %s | 1.00x | |\n", n, aloneTime.Round(100*time.Millisecond))
	fmt.Printf("| %d clusters at once, until every one is pruned | %s | %.2fx | at most 1.5x |\n", targets, fleetTime.Round(100*time.Millisecond), fleetTime.Seconds()/aloneTime.Seconds())
	fmt.Printf("| pass over current objects, one cluster alone (baseline) | %s | 1.00x | |\n", passAlone.Round(100*time.Millisecond))
	fmt.Printf("| the same pass on %d clusters with a %dth one down, until the %d are pruned | %s | %.2fx | delay under 5 s |\n",
		targets, targets, targets-1, passDown.Round(100*time.Millisecond), passDown.Seconds()/passAlone.Seconds())
	fmt.Println()
	fmt.Printf("| measure | value | goal |\n|---|---|---|\n")
	fmt.Printf("| API requests, the cluster alone | %.0f | |\n", aloneReqs)
	fmt.Printf("| API requests per cluster, %d at once | %.0f | |\n", targets, fleetReqs)
	fmt.Printf("| bench process RSS with %d idle targets | %d MiB | |\n", targets+1, rssAll/1024)
	fmt.Printf("| bench process RSS with 1 idle target | %d MiB | |\n", rssOne/1024)
	fmt.Printf("| RSS per idle target | %.1f MiB | at most 10 MiB |\n", perTarget)
	return nil
}

// requests is the API server's apiserver_request_total, summed over its labels.
func requests(ctx context.Context, cfg *rest.Config) float64 {
	return metricSum(ctx, cfg, "apiserver_request_total", "")
}

// metricSum is the API server's metric name summed over the series whose labels contain
// label (every series when empty).
func metricSum(ctx context.Context, cfg *rest.Config, name, label string) float64 {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0
	}
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

// rssAfterGC is this process's resident set (KiB) after a full collection.
func rssAfterGC() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
