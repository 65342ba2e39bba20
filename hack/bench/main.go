// Command bench measures upgradeguard against the local control plane and prints each
// result as a ratio to a baseline measured in the same run, so numbers compare across
// machines. Run it with `make bench`; record the results in docs/benchmarks.md.
//
//	go run ./hack/bench check     # check of the flux2 chart, and object counting
//	go run ./hack/bench migrate   # migrate throughput and memory against a raw patch loop
//	go run ./hack/bench gate      # latency the HelmRelease admission gate adds to an update
//	go run ./hack/bench binary    # binary size and the start-up RSS of version, against kubectl
//	go run ./hack/bench plan      # plan over a repository of 100 chart versions, chart loads counted
//	go run ./hack/bench review    # review of one bump among 50 HelmReleases, against one check of it
//	go run ./hack/bench fleet     # one controller keeping 10 target clusters migrated
//	go run ./hack/bench -servers 30 -targets 300 fleetscale   # a fleet shared by 1 and 3 replicas
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	rounds := flag.Int("rounds", 30, "check, gate and review: measured rounds per case")
	objects := flag.Int("objects", 2000, "check: HelmRepository objects to count")
	n := flag.Int("n", 20000, "migrate: objects stored at the old version")
	concurrency := flag.Int("concurrency", migrate.DefaultConcurrency, "migrate: patch concurrency for the raw loop and migrate --qps 0")
	coldRuns := flag.Int("cold-runs", 5, "gate: fresh processes whose first decision is timed, per case (median)")
	gateCache := flag.Bool("gate-cache", true, "gate: keep charts and repository indexes between decisions (false: every decision fetches, as before the cache)")
	migrateRounds := flag.Int("migrate-rounds", 1, "migrate: run the selected cases this many times in turn and also print each case's median (for a noisy machine)")
	cases := flag.String("cases", "all", "migrate: comma-separated cases to run: a,b,c,i,g,e1,e2,d,f,h (i: c under the chart's APF objects; f: a hand-made built-in StorageVersionMigration, h: migrate --engine builtin; both from Kubernetes 1.37)")
	ug := flag.String("ug", "", "migrate and binary: the upgradeguard binary to measure (default bin/upgradeguard)")
	targets := flag.Int("targets", 10, "fleet: target clusters; fleetscale: targets spread over -servers (each its own user and CRD group)")
	fleetObjects := flag.Int("fleet-objects", 2000, "fleet and fleetscale: stale HelmRepositories per target")
	servers := flag.Int("servers", 30, "fleetscale: kube-apiservers (on one etcd) that hold the -targets targets")
	fleetStall := flag.Duration("fleet-stall", 5*time.Minute, "fleetscale: give up, saying why, when no target has finished for this long")
	apfShares := flag.Int("apf-shares", 0, "migrate case (i): nominalConcurrencyShares of upgradeguard's priority level (default: the chart's)")
	pin := flag.String("pin", "", "migrate: SERVER,CLIENT processors (as 0,1): kube-apiserver, etcd and kube-controller-manager on the first, the bench, its probe and the migrating clients on the second (taskset), so that no client waits for the server's CPU")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the in-process gate and clients; not the API server) to this file, and gate's fresh processes' to FILE.first-N")
	flag.Parse()
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	ctx := context.Background()
	if *ug == "" {
		root, err := testenv.RepoRoot()
		if err != nil {
			return err
		}
		*ug = filepath.Join(root, "bin", "upgradeguard")
	}
	ugBinary, cpuProfilePath, apfSharesFlag, pinCPUs = *ug, *cpuProfile, int32(*apfShares), *pin
	switch mode := flag.Arg(0); mode {
	case "", "all":
		if err := benchCheck(ctx, *rounds, *objects); err != nil {
			return err
		}
		if err := benchMigrate(ctx, *n, *concurrency, *migrateRounds, *cases); err != nil {
			return err
		}
		if err := benchGate(ctx, *rounds, *coldRuns, *gateCache); err != nil {
			return err
		}
		if err := benchPlan(ctx, min(*rounds, 5)); err != nil {
			return err
		}
		if err := benchReview(ctx, *rounds); err != nil {
			return err
		}
		return benchBinary(*rounds, *ug, nil)
	case "binary":
		return benchBinary(*rounds, *ug, flag.Args()[1:])
	case "check":
		return benchCheck(ctx, *rounds, *objects)
	case "migrate":
		return benchMigrate(ctx, *n, *concurrency, *migrateRounds, *cases)
	case "gate":
		return benchGate(ctx, *rounds, *coldRuns, *gateCache)
	case "plan":
		return benchPlan(ctx, min(*rounds, 5))
	case "review":
		return benchReview(ctx, *rounds)
	case "fleet":
		return benchFleet(ctx, *targets, *fleetObjects)
	case "fleetscale":
		return benchFleetScale(ctx, *servers, *targets, *fleetObjects, *fleetStall)
	case "gate-serve":
		return gateServe(ctx, flag.Args()[1:])
	case "raw":
		return rawLoop(ctx, flag.Args()[1:])
	default:
		return fmt.Errorf("unknown mode %q: use check, migrate, gate, plan, review, binary, fleet, fleetscale or all", mode)
	}
}

// startCPUProfile profiles this process into path until the returned stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
