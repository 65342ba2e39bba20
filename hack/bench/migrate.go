package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

const benchCRD = "helmrepositories.source.toolkit.fluxcd.io"

var benchGVR = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "helmrepositories"}

// ugBinary is the upgradeguard binary the process cases run (-ug).
var ugBinary string

type procResult struct {
	name    string
	elapsed time.Duration
	maxRSS  int64 // KiB
}

// benchMigrate compares, in one run on the same objects: (a) a bare concurrent
// empty-patch loop, (b) migrate --qps 0 at the same concurrency, (c) migrate with its
// defaults, (d) the runbook's kubectl annotate --all --overwrite, (e) re-runs on the
// migrated set. Each runs as its own process so its peak RSS can be read.
func benchMigrate(ctx context.Context, n, concurrency int, cases string) error {
	cp, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	if _, err := incidentState(ctx, cp, n); err != nil {
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
	kc := []string{"--kubeconfig", cp.Kubeconfig}
	c := strconv.Itoa(concurrency)

	var results []procResult
	ran := false
	measure := func(name string, resetFirst bool, cmd string, args ...string) error {
		if cases != "all" && !strings.Contains(","+cases+",", ","+strings.Trim(strings.Fields(name)[0], "()")+",") {
			return nil
		}
		if resetFirst && ran {
			if err := reset(); err != nil {
				return fmt.Errorf("reset before %s: %w", name, err)
			}
		}
		fmt.Printf("running %s ...\n", name)
		r, err := runProc(name, cmd, args...)
		if err != nil {
			return err
		}
		results = append(results, r)
		ran = true
		return nil
	}
	steps := []func() error{
		func() error { return measure("(a) raw empty-patch loop", false, self, "raw", cp.Kubeconfig, c) },
		func() error {
			return measure("(b) migrate --qps 0", true, ug, append(kc, "migrate", "--crd", benchCRD, "--qps", "0", "--concurrency", c, "--lease-namespace", "default", "-o", "json")...)
		},
	}
	steps = append(steps, func() error {
		return measure("(c) migrate, default limits", true, ug, append(kc, "migrate", "--crd", benchCRD, "--lease-namespace", "default", "-o", "json", "--deadline", "1h")...)
	})
	steps = append(steps,
		func() error {
			return measure("(e1) re-run, already pruned", false, ug, append(kc, "migrate", "--crd", benchCRD, "--lease-namespace", "default", "-o", "json")...)
		},
		func() error {
			if err := testenv.SetStoredVersions(ctx, cs, benchCRD, "v1beta2", "v1"); err != nil {
				return err
			}
			return measure("(e2) re-run, objects current", false, ug, append(kc, "migrate", "--crd", benchCRD, "--qps", "0", "--concurrency", c, "--lease-namespace", "default", "-o", "json")...)
		},
	)
	if _, err := os.Stat(kubectl); err == nil {
		steps = append(steps, func() error {
			return measure("(d) kubectl annotate --all --overwrite", true, kubectl, append(kc, "annotate", "helmrepositories.source.toolkit.fluxcd.io", "--all", "-A",
				"upgradeguard.io/touched="+strconv.FormatInt(time.Now().Unix(), 10), "--overwrite", "-o", "name")...)
		})
	} else {
		fmt.Println("bin/kubectl missing: skipping (d); build it with ./hack/testbin.sh --with-kubectl")
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}

	if len(results) == 0 {
		return fmt.Errorf("no case matched -cases %q", cases)
	}
	raw := results[0]
	fmt.Printf("\nN=%d objects, concurrency %d (%s)\n", n, concurrency, machine())
	fmt.Printf("%-42s %10s %12s %10s %10s\n", "case", "time", "objects/s", "vs first", "peak RSS")
	// Peak RSS is sampled every 10 ms, so for runs shorter than that it reads low.
	for _, r := range results {
		rate := float64(n) / r.elapsed.Seconds()
		fmt.Printf("%-42s %10s %12.0f %9.2fx %7d MiB\n", r.name, r.elapsed.Round(time.Millisecond), rate,
			raw.elapsed.Seconds()/r.elapsed.Seconds(), r.maxRSS/1024)
	}
	fmt.Println("\nvs first: throughput relative to the first case run, (a) the raw loop when it ran (higher is faster).")
	fmt.Println("Re-runs write nothing; their objects/s is N over the run's time. Peak RSS is VmHWM sampled every 10 ms.")
	return nil
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
			return procResult{name: name, elapsed: time.Since(start), maxRSS: hwm}, nil
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
	opts := metav1.ListOptions{Limit: 500}
	count := 0
	for {
		list, err := md.Resource(benchGVR).List(ctx, opts)
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
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]int{"patched": count})
	return nil
}
