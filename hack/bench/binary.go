package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// benchBinary compares the start-up floor of upgradeguard with kubectl and helm in one
// run: each binary's size and the peak RSS of its `version` command (kubectl: version --client) (the median of
// rounds runs, each its own process). ug is the binary to measure; extra binaries (an
// older build, a split build) are measured beside it as NAME=PATH.
func benchBinary(rounds int, ug string, extra []string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	cases := [][2]string{{"upgradeguard", ug}}
	for _, e := range extra {
		name, path, ok := cutEq(e)
		if !ok {
			return fmt.Errorf("extra binary %q: want NAME=PATH", e)
		}
		cases = append(cases, [2]string{name, path})
	}
	_, kubeBin, err := testenv.KubeBinDir()
	if err != nil {
		return err
	}
	cases = append(cases, [2]string{"kubectl", filepath.Join(kubeBin, "kubectl")}, [2]string{"helm", filepath.Join(root, "bin", "helm")})
	fmt.Printf("%-28s %10s %14s %10s\n", "binary", "size", "version RSS", "vs kubectl")
	var kubectl float64
	rows := make([][3]any, 0, len(cases))
	for _, c := range cases {
		st, err := os.Stat(c[1])
		if err != nil {
			return fmt.Errorf("%s: %w (build it first)", c[0], err)
		}
		rss, err := medianRSS(rounds, c[1])
		if err != nil {
			return err
		}
		if c[0] == "kubectl" {
			kubectl = float64(rss)
		}
		rows = append(rows, [3]any{c[0], st.Size(), rss})
	}
	for _, r := range rows {
		fmt.Printf("%-28s %7.1f MB %10.1f MiB %9.2fx\n", r[0], float64(r[1].(int64))/1e6, float64(r[2].(int64))/1024, float64(r[2].(int64))/kubectl)
	}
	fmt.Printf("\nMedian of %d runs of `version` each; peak RSS is VmHWM sampled every 10 ms (%s).\n", rounds, machine())
	return nil
}

func medianRSS(rounds int, path string) (int64, error) {
	var rss []int64
	for range rounds {
		args := []string{"version"}
		if filepath.Base(path) == "kubectl" {
			args = append(args, "--client") // no server to ask
		}
		r, err := runProc(filepath.Base(path)+" version", path, args...)
		if err != nil {
			return 0, err
		}
		rss = append(rss, r.maxRSS)
	}
	slices.Sort(rss)
	return rss[len(rss)/2], nil
}

func cutEq(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}
