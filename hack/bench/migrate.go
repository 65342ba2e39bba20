package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/apf"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

const benchCRD = "helmrepositories.source.toolkit.fluxcd.io"

var benchGVR = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "helmrepositories"}

// ugBinary is the upgradeguard binary the process cases run (-ug).
var ugBinary string

// apfSharesFlag is -apf-shares: case (i)'s nominalConcurrencyShares (0: the chart's).
var apfSharesFlag int32

// cpuProfilePath is -cpuprofile: the gate's fresh processes write theirs beside it.
var cpuProfilePath string

type procResult struct {
	name     string
	start    time.Time
	elapsed  time.Duration
	maxRSS   int64 // KiB; 0 when not measured
	probeP99 time.Duration
}

// benchMigrate compares, in one run on the same objects: (a) a bare concurrent
// empty-patch loop, (b) migrate --qps 0 at the same concurrency, (c) migrate with its
// defaults, (i) the same under upgradeguard's API Priority and Fairness objects (the
// chart's, for the migrating user), (g) migrate --engine auto as a user who may patch (it picks the client engine),
// (e) re-runs on the migrated set, (d) the runbook's kubectl annotate --all --overwrite,
// (f) the built-in StorageVersionMigration of kube-controller-manager (Kubernetes 1.37,
// storagemigration.k8s.io/v1) created by hand, and (h) migrate --engine builtin, which
// runs (f) with upgradeguard's Lease, checks, prune and clean-up. Each client case runs as its own process,
// as a user outside system:masters so that API Priority and Fairness applies to it as
// to a real user, and its peak RSS is read. A probe user GETs a ConfigMap 20 times a
// second throughout; its p99 latency under each case is compared with its idle p99.
func benchMigrate(ctx context.Context, n, concurrency, rounds int, cases string) error {
	cp, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	var pins *pinner
	if pinCPUs != "" {
		pctx, stopPinning := context.WithCancel(ctx)
		defer stopPinning()
		if pins, err = startPinning(pctx, pinCPUs); err != nil {
			return err
		}
	}
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	if _, err := incidentState(ctx, cp, n); err != nil {
		return err
	}
	userKC, probeCfg, err := benchUsers(ctx, cp)
	if err != nil {
		return err
	}
	m, err := migrate.New(migrate.RateLimit(cp.Config, 0, 0))
	if err != nil {
		return err
	}
	// reset puts every object back at v1beta2 and storage at v1, unmeasured.
	reset := func() error {
		o := migrate.Options{Concurrency: 16, AllowStorageSwitch: true, LeaseNamespace: "default", Deadline: time.Hour}
		if _, err := m.Migrate(ctx, migrate.Target{Name: benchCRD, StorageVersion: "v1beta2"}, o); err != nil {
			return err
		}
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, benchCRD, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for i := range crd.Spec.Versions {
				crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == "v1"
			}
			_, err = cs.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{})
			return err
		})
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ug := ugBinary
	kubectl := filepath.Join(cp.KubeBin, "kubectl")
	kc := []string{"--kubeconfig", userKC}
	c := strconv.Itoa(concurrency)
	// The client engine is the only one before --engine exists; name it where it does.
	engine := []string{}
	if help, err := exec.Command(ug, "migrate", "--help").Output(); err == nil && bytes.Contains(help, []byte("--engine")) {
		engine = []string{"--engine", "client"}
	}

	probe := startProbe(ctx, probeCfg)
	defer probe.stop()
	// Idle is measured before the first case and after the last, 15 s each, and the p99
	// taken over both windows: the machine's other load drifts during a long run.
	var idleWindows [][2]time.Time
	measureIdle := func() {
		fmt.Println("measuring the probe's idle latency for 15s ...")
		from := time.Now()
		time.Sleep(15 * time.Second) // a measurement window, not synchronisation
		idleWindows = append(idleWindows, [2]time.Time{from, time.Now()})
	}
	measureIdle()

	var results []procResult
	var kcm *kcmUsage
	selected := func(name string) bool {
		return cases == "all" || strings.Contains(","+cases+",", ","+strings.Trim(strings.Fields(name)[0], "()")+",")
	}
	measure := func(name string, resetFirst bool, cmd string, args ...string) error {
		if !selected(name) {
			return nil
		}
		// Every writing case starts from a reset, the first too (where it finds the
		// objects already at v1beta2 and only passes over them).
		if resetFirst {
			if err := reset(); err != nil {
				return fmt.Errorf("reset before %s: %w", name, err)
			}
		}
		fmt.Printf("running %s ...\n", name)
		r, err := runProc(name, cmd, args...)
		if err != nil {
			return err
		}
		r.probeP99 = probe.p99(r.start, r.start.Add(r.elapsed))
		results = append(results, r)
		return nil
	}
	migrateArgs := func(extra ...string) []string {
		args := append(append(append([]string{}, kc...), "migrate"), engine...)
		return append(args, append([]string{"--crd", benchCRD, "--lease-namespace", "default", "-o", "json", "--deadline", "1h"}, extra...)...)
	}
	// withEngine is migrateArgs with another engine than the client one.
	withEngine := func(e string) []string {
		args := migrateArgs()
		if i := slices.Index(args, "--engine"); i >= 0 {
			args[i+1] = e
		}
		return args
	}
	steps := []func() error{
		func() error { return measure("(a) raw empty-patch loop", true, self, "raw", userKC, c) },
		func() error {
			return measure("(b) migrate --qps 0", true, ug, migrateArgs("--qps", "0", "--concurrency", c)...)
		},
		func() error {
			return withAPFMetrics(ctx, cp.Config, "(c)", func() error { return measure("(c) migrate, defaults", true, ug, migrateArgs()...) })
		},
		func() error {
			if !selected("(i)") {
				return nil
			}
			// The chart's API Priority and Fairness objects (pkg/apf's defaults), for the
			// migrating user, for this case only.
			kube := kubernetes.NewForConfigOrDie(cp.Config)
			pl, fs := apf.Objects(apf.Options{Subjects: []flowcontrolv1.Subject{apf.User("ug-migrator")}, NominalConcurrencyShares: apfSharesFlag})
			if err := apf.Apply(ctx, kube, pl, fs); err != nil {
				return err
			}
			defer func() {
				_ = kube.FlowcontrolV1().FlowSchemas().Delete(ctx, fs.Name, metav1.DeleteOptions{})
				_ = kube.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, pl.Name, metav1.DeleteOptions{})
			}()
			return withAPFMetrics(ctx, cp.Config, "(i)", func() error {
				return measure("(i) migrate, defaults, under upgradeguard's APF level", true, ug, migrateArgs()...)
			})
		},
		func() error {
			if len(engine) == 0 {
				return nil
			}
			return measure("(g) migrate --engine auto (may patch)", true, ug, withEngine("auto")...)
		},
		func() error { return measure("(e1) re-run, already pruned", false, ug, migrateArgs()...) },
		func() error {
			if !selected("(e2)") {
				return nil
			}
			if err := testenv.SetStoredVersions(ctx, cs, benchCRD, "v1beta2", "v1"); err != nil {
				return err
			}
			return measure("(e2) re-run, objects current", false, ug, migrateArgs()...)
		},
	}
	if _, err := os.Stat(kubectl); err == nil {
		steps = append(steps, func() error {
			return measure("(d) kubectl annotate --all --overwrite", true, kubectl, append(kc, "annotate", "helmrepositories.source.toolkit.fluxcd.io", "--all", "-A",
				"upgradeguard.io/touched="+strconv.FormatInt(time.Now().Unix(), 10), "--overwrite", "-o", "name")...)
		})
	} else {
		fmt.Printf("%s missing: skipping (d); build it with make testbin\n", kubectl)
	}
	steps = append(steps, func() error {
		if !selected("(f)") {
			return nil
		}
		if err := reset(); err != nil {
			return fmt.Errorf("reset before (f): %w", err)
		}
		r, usage, err := benchBuiltin(ctx, cp, probe)
		if err != nil || usage == nil {
			return err
		}
		results, kcm = append(results, r), usage
		return nil
	})
	steps = append(steps, func() error {
		if !selected("(h)") || len(engine) == 0 {
			return nil
		}
		// As for (f): reset first, then let kube-controller-manager's garbage collector
		// take in the reset's writes before the clock starts.
		if err := reset(); err != nil {
			return fmt.Errorf("reset before (h): %w", err)
		}
		if ok, err := builtinRunning(ctx, cp, "(h)"); !ok || err != nil {
			return err
		}
		return measure("(h) migrate --engine builtin", false, ug, withEngine("builtin")...)
	})
	for range max(rounds, 1) {
		for _, s := range steps {
			if err := s(); err != nil {
				return err
			}
		}
	}

	if len(results) == 0 {
		return fmt.Errorf("no case matched -cases %q", cases)
	}
	measureIdle()
	idle, idleN := probe.p99Over(idleWindows)
	fmt.Printf("\nN=%d objects, concurrency %d, Kubernetes 1.%d (%s)\n", n, concurrency, cp.Minor, machine())
	if pins != nil {
		fmt.Printf("pinned: %s\n", pins.describe())
	}
	fmt.Printf("probe: GET of a ConfigMap 20 times a second as another user; idle p99 %s (%d GETs, before the first case and after the last)\n", idle.Round(10*time.Microsecond), idleN)
	printCases(n, results, idle)
	if rounds > 1 {
		results = medians(results)
		fmt.Printf("\nmedian of %d rounds (time and probe p99 each the median; peak RSS the highest):\n", rounds)
		printCases(n, results, idle)
	}
	fmt.Println("\nvs first: throughput relative to the first case run, (a) the raw loop when it ran (higher is faster).")
	fmt.Println("Re-runs write nothing; their objects/s is N over the run's time. Peak RSS is VmHWM sampled every 10 ms.")
	if kcm != nil {
		fmt.Printf("(f) kube-controller-manager: %.1f CPU seconds, RSS %d -> %d MiB (+%d MiB), peak %d MiB; Succeeded after %s, storedVersions pruned after %s\n",
			kcm.cpuSeconds, kcm.rssBefore/1024, kcm.rssAfter/1024, (kcm.rssAfter-kcm.rssBefore)/1024, kcm.hwm/1024,
			kcm.succeeded.Round(time.Millisecond), kcm.pruned.Round(time.Millisecond))
	}
	goals(results, idle)
	return nil
}

// printCases prints one row per result, throughput relative to the first.
func printCases(n int, results []procResult, idle time.Duration) {
	raw := results[0]
	fmt.Printf("%-42s %10s %10s %9s %9s %10s %8s\n", "case", "time", "objects/s", "vs first", "peak RSS", "probe p99", "vs idle")
	// Peak RSS is sampled every 10 ms, so for runs shorter than that it reads low.
	for _, r := range results {
		rate := float64(n) / r.elapsed.Seconds()
		rss := "-"
		if r.maxRSS > 0 {
			rss = fmt.Sprintf("%d MiB", r.maxRSS/1024)
		}
		fmt.Printf("%-42s %10s %10.0f %8.2fx %9s %10s %7.2fx\n", r.name, r.elapsed.Round(time.Millisecond), rate,
			raw.elapsed.Seconds()/r.elapsed.Seconds(), rss, r.probeP99.Round(10*time.Microsecond), ratio(r.probeP99, idle))
	}
}

// medians folds the rounds of each case into one result, in the order the cases first ran.
func medians(results []procResult) []procResult {
	var order []string
	byName := map[string][]procResult{}
	for _, r := range results {
		if _, ok := byName[r.name]; !ok {
			order = append(order, r.name)
		}
		byName[r.name] = append(byName[r.name], r)
	}
	median := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	out := make([]procResult, 0, len(order))
	for _, name := range order {
		rs := byName[name]
		m := procResult{name: name, start: rs[0].start}
		var el, p99 []time.Duration
		for _, r := range rs {
			el, p99 = append(el, r.elapsed), append(p99, r.probeP99)
			m.maxRSS = max(m.maxRSS, r.maxRSS)
		}
		m.elapsed, m.probeP99 = median(el), median(p99)
		out = append(out, m)
	}
	return out
}

// goals prints the goals that this run measured, hit or missed.
func goals(results []procResult, idle time.Duration) {
	by := map[string]procResult{}
	for _, r := range results {
		by[strings.Trim(strings.Fields(r.name)[0], "()")] = r
	}
	speed := func(a, b string) (float64, bool) {
		ra, oka := by[a]
		rb, okb := by[b]
		if !oka || !okb {
			return 0, false
		}
		return rb.elapsed.Seconds() / ra.elapsed.Seconds(), true
	}
	verdict := func(ok bool) string {
		if ok {
			return "hit"
		}
		return "MISS"
	}
	fmt.Println("\ngoals:")
	if x, ok := speed("c", "d"); ok {
		fmt.Printf("  migrate at defaults >= 1.5x kubectl annotate: %.2fx  %s\n", x, verdict(x >= 1.5))
	}
	if r, ok := by["c"]; ok && idle > 0 && r.probeP99 > 0 {
		x := ratio(r.probeP99, idle)
		fmt.Printf("  probe p99 under migrate at defaults <= 2x idle: %.2fx  %s\n", x, verdict(x <= 2))
	}
	if x, ok := speed("c", "f"); ok {
		fmt.Printf("  migrate at defaults >= 5x the built-in migrator: %.2fx  %s\n", x, verdict(x >= 5))
	}
	if x, ok := speed("c", "h"); ok {
		fmt.Printf("  migrate at defaults >= 5x migrate --engine builtin: %.2fx  %s\n", x, verdict(x >= 5))
	}
	if x, ok := speed("g", "c"); ok {
		fmt.Printf("  --engine auto with patch rights as fast as the client engine (>= 0.9x, within this machine's noise): %.2fx  %s\n", x, verdict(x >= 0.9))
	}
	if x, ok := speed("b", "a"); ok {
		fmt.Printf("  migrate --qps 0 >= 0.9x the raw loop: %.2fx  %s\n", x, verdict(x >= 0.9))
	}
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// benchUsers creates the users the cases run as, outside system:masters (whose requests
// API Priority and Fairness exempts): ug-migrator, bound to cluster-admin, with a
// kubeconfig for the client cases, and ug-probe, which may read ConfigMaps in the probe
// namespace, with its client config. Neither has a client-side rate limit.
func benchUsers(ctx context.Context, cp *testenv.ControlPlane) (string, *rest.Config, error) {
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	kc, err := cp.UserKubeconfig("ug-migrator")
	if err != nil {
		return "", nil, err
	}
	probeCfg, err := cp.AddUser("ug-probe")
	if err != nil {
		return "", nil, err
	}
	probeCfg = migrate.RateLimit(probeCfg, 0, 0)
	objs := []func() error{
		func() error {
			_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ug-migrator"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "ug-migrator"}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probeNS}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().ConfigMaps(probeNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().Roles(probeNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ug-probe"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().RoleBindings(probeNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ug-probe"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ug-probe"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "ug-probe"}}}, metav1.CreateOptions{})
			return err
		},
	}
	for _, f := range objs {
		if err := f(); err != nil {
			return "", nil, err
		}
	}
	return kc, probeCfg, nil
}

const probeNS = "probe"

// probe GETs one ConfigMap 20 times a second and keeps every latency with its start time.
type probe struct {
	mu      sync.Mutex
	samples []probeSample
	cancel  context.CancelFunc
	done    chan struct{}
}

type probeSample struct {
	at      time.Time
	latency time.Duration
}

func startProbe(ctx context.Context, cfg *rest.Config) *probe {
	ctx, cancel := context.WithCancel(ctx)
	p := &probe{cancel: cancel, done: make(chan struct{})}
	cms := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(probeNS)
	go func() {
		defer close(p.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			if _, err := cms.Get(ctx, "probe", metav1.GetOptions{}); err != nil {
				if ctx.Err() == nil {
					fmt.Fprintln(os.Stderr, "probe:", err)
				}
				continue
			}
			p.mu.Lock()
			p.samples = append(p.samples, probeSample{at: start, latency: time.Since(start)})
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *probe) stop() {
	p.cancel()
	<-p.done
}

// p99Over is the 99th percentile latency of the GETs started in any of the windows, and
// how many there were.
func (p *probe) p99Over(windows [][2]time.Time) (time.Duration, int) {
	var l []time.Duration
	for _, w := range windows {
		l = append(l, p.latencies(w[0], w[1])...)
	}
	return percentile99(l), len(l)
}

func (p *probe) latencies(from, to time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var l []time.Duration
	for _, s := range p.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			l = append(l, s.latency)
		}
	}
	return l
}

// p99 is the 99th percentile latency of the GETs started between from and to.
func (p *probe) p99(from, to time.Time) time.Duration { return percentile99(p.latencies(from, to)) }

func percentile99(l []time.Duration) time.Duration {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[min(len(l)-1, int(math.Ceil(0.99*float64(len(l))))-1)]
}

// runProc runs one case as its own process and reports its wall time and peak RSS. The
// peak is VmHWM from /proc, polled until the process exits: the rusage of a child started
// by a large parent carries the parent's high-water mark over exec, so it cannot be used.
func runProc(name, path string, args ...string) (procResult, error) {
	cmd := exec.Command(path, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return procResult{}, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
	var hwm int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if v := vmHWM(status); v > hwm {
			hwm = v
		}
		select {
		case err := <-done:
			if err != nil {
				return procResult{}, fmt.Errorf("%s: %w\n%s", name, err, lastBytes(out.Bytes(), 2000))
			}
			if os.Getenv("BENCH_SHOW_OUTPUT") != "" {
				fmt.Printf("%s output:\n%s\n", name, lastBytes(out.Bytes(), 4000))
			}
			return procResult{name: name, start: start, elapsed: time.Since(start), maxRSS: hwm}, nil
		case <-tick.C:
		}
	}
}

// vmHWM reads the peak resident set size (KiB) of a running process.
func vmHWM(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, %d CPUs", host, runtime.NumCPU())
}

// rawLoop is the baseline: list metadata in pages of 500 and send an empty merge patch to
// every object with a fixed concurrency and no rate limit. Nothing else.
// withAPFMetrics runs a case and prints what API Priority and Fairness did meanwhile, per
// priority level a client of the bench uses: requests dispatched, their mean wait in the
// level's queues, and rejections. Counters include the reset before the case.
func withAPFMetrics(ctx context.Context, cfg *rest.Config, name string, run func() error) error {
	levels := []string{"global-default", apf.Name}
	type sample struct{ n, waitSum, waitN, rejected float64 }
	read := func() map[string]sample {
		out := map[string]sample{}
		for _, l := range levels {
			label := `priority_level="` + l + `"`
			out[l] = sample{
				n:        metricSum(ctx, cfg, "apiserver_flowcontrol_dispatched_requests_total", label),
				waitSum:  metricSum(ctx, cfg, "apiserver_flowcontrol_request_wait_duration_seconds_sum", label),
				waitN:    metricSum(ctx, cfg, "apiserver_flowcontrol_request_wait_duration_seconds_count", label),
				rejected: metricSum(ctx, cfg, "apiserver_flowcontrol_rejected_requests_total", label),
			}
		}
		return out
	}
	before := read()
	if err := run(); err != nil {
		return err
	}
	after := read()
	for _, l := range levels {
		b, a := before[l], after[l]
		if a.n == b.n {
			continue
		}
		wait := 0.0
		if n := a.waitN - b.waitN; n > 0 {
			wait = (a.waitSum - b.waitSum) / n * 1000
		}
		fmt.Printf("  APF during %s: level %s: %.0f requests dispatched, mean queue wait %.2f ms, %.0f rejected\n", name, l, a.n-b.n, wait, a.rejected-b.rejected)
	}
	return nil
}

func rawLoop(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("raw KUBECONFIG CONCURRENCY")
	}
	concurrency, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", args[0])
	if err != nil {
		return err
	}
	md, err := metadata.NewForConfig(migrate.RateLimit(cfg, 0, 0))
	if err != nil {
		return err
	}
	count := 0
	for list, err := range kubeclient.Pages(ctx, md.Resource(benchGVR).List, metav1.ListOptions{}) {
		if err != nil {
			return err
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(concurrency)
		for i := range list.Items {
			item := list.Items[i]
			g.Go(func() error {
				_, err := md.Resource(benchGVR).Namespace(item.Namespace).Patch(gctx, item.Name, types.MergePatchType, []byte("{}"), metav1.PatchOptions{})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		count += len(list.Items)
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]int{"patched": count})
	return nil
}
