// Command bench measures upgradeguard against the local control plane and prints each
// result as a ratio to a baseline measured in the same run, so numbers compare across
// machines. Run it with `make bench`; record the results in docs/benchmarks.md.
//
//	go run ./hack/bench check     # check of the flux2 chart, and object counting
//	go run ./hack/bench migrate   # migrate throughput and memory against a raw patch loop
//	go run ./hack/bench gate      # latency the HelmRelease admission gate adds to an update
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
)

func main() {
	rounds := flag.Int("rounds", 30, "check and gate: measured rounds per case")
	objects := flag.Int("objects", 2000, "check: HelmRepository objects to count")
	n := flag.Int("n", 20000, "migrate: objects stored at the old version")
	concurrency := flag.Int("concurrency", 4, "migrate: patch concurrency for the raw loop and migrate --qps 0")
	gateCache := flag.Bool("gate-cache", true, "gate: keep charts and repository indexes between decisions (false: every decision fetches, as before the cache)")
	cases := flag.String("cases", "all", "migrate: comma-separated cases to run: a,b,c,e1,e2,d (c runs at the default 100 QPS: slow for large -n)")
	flag.Parse()
	mode := flag.Arg(0)
	ctx := context.Background()
	var err error
	switch mode {
	case "", "all":
		if err = benchCheck(ctx, *rounds, *objects); err == nil {
			err = benchMigrate(ctx, *n, *concurrency, *cases)
		}
		if err == nil {
			err = benchGate(ctx, *rounds, *gateCache)
		}
	case "check":
		err = benchCheck(ctx, *rounds, *objects)
	case "migrate":
		err = benchMigrate(ctx, *n, *concurrency, *cases)
	case "gate":
		err = benchGate(ctx, *rounds, *gateCache)
	case "raw":
		err = rawLoop(ctx, flag.Args()[1:])
	default:
		err = fmt.Errorf("unknown mode %q: use check, migrate, gate or all", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
