package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// reviewReleases is how many HelmReleases the review benchmark's repository holds.
const reviewReleases = 50

// reviewCharts are the charts the repository's other HelmReleases deploy, in turn: real
// fixture charts, served by the loopback repository (lws once: both of its fixtures say
// 0.1.0).
var reviewCharts = []struct{ dir, chart, version string }{
	{"kyverno-3.2.8", "kyverno", "3.2.8"},
	{"kyverno-3.3.7", "kyverno", "3.3.7"},
	{"lws-0.7.0", "lws", "0.1.0"},
	{"flux2-2.17.2", "flux2", "2.17.2"},
}

// benchReview measures review in a GitOps repository of 50 HelmReleases, each of its own
// release and namespace, where one commit bumps one of them (flux2 2.17.2 to 2.18.2),
// against one check of that release on the same cluster with the same chart, measured in
// the same run, round by round in turn. Both run as the CLI runs them (cli.Execute, in
// this process): every call builds clients of its own, as a fresh process does, so no
// API server answer is kept from one call to the next; the process start, which both
// pay alike, is left out. The cluster is prod as the incident left it: the 2.17.2 CRDs
// from a Helm release, HelmRepositories stored at v1beta2, so both find the migration.
func benchReview(ctx context.Context, rounds int) error {
	dir, err := os.MkdirTemp("", "upgradeguard-bench-review-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// The in-process CLI reads Helm's paths from HELM_*: keep them off the user's.
	for k, v := range map[string]string{"HELM_CACHE_HOME": "cache", "HELM_CONFIG_HOME": "config", "HELM_DATA_HOME": "data"} {
		if err := os.Setenv(k, filepath.Join(dir, "helm", v)); err != nil {
			return err
		}
	}
	cp, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	if err := scenario.FluxStoredV1beta2(ctx, cp, filepath.Join(dir, "fixtures")); err != nil {
		return err
	}
	charts, err := scenario.ChartRepo(filepath.Join(dir, "charts"), append([]string{"flux2-2.18.2"}, chartDirs()...)...)
	if err != nil {
		return err
	}
	defer charts.Close()
	repo := filepath.Join(dir, "repo")
	base, head, err := reviewRepository(repo, charts.URL)
	if err != nil {
		return err
	}

	kube := []string{"--kubeconfig", cp.Kubeconfig}
	checkArgs := append(slices.Clone(kube), "check", "flux2", "-n", "flux-system", "--chart", "flux2", "--repo", charts.URL, "--version", "2.18.2", "-o", "json")
	reviewArgs := append(slices.Clone(kube), "review", "--repo", repo, "--base", base, "--head", head, "-o", "json")
	// Both must find the same migration before anything is timed.
	checkOut, err := runCLI(ctx, checkArgs)
	if err != nil {
		return err
	}
	reviewOut, err := runCLI(ctx, reviewArgs)
	if err != nil {
		return err
	}
	if err := sameVerdicts(checkOut, reviewOut); err != nil {
		return err
	}

	var checks, reviews, ratios []time.Duration
	for range rounds {
		for _, c := range []struct {
			args  []string
			times *[]time.Duration
		}{{checkArgs, &checks}, {reviewArgs, &reviews}} {
			start := time.Now()
			if _, err := runCLI(ctx, c.args); err != nil {
				return err
			}
			*c.times = append(*c.times, time.Since(start))
		}
		// The ratio of each round, kept as a duration per second of check.
		ratios = append(ratios, time.Duration(float64(time.Second)*float64(reviews[len(reviews)-1])/float64(checks[len(checks)-1])))
	}
	// What the 49 untouched HelmReleases cost: finding the change, every file read at
	// both revisions, nothing judged.
	find, err := measure("review.Changes alone", rounds, func() error {
		d, err := review.Changes(ctx, review.Options{Repo: repo, Base: base, Head: head})
		if err == nil && len(d.Changes) != 1 {
			err = fmt.Errorf("%d changes, want 1", len(d.Changes))
		}
		return err
	})
	if err != nil {
		return err
	}
	med := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	c, r, ratio := med(checks), med(reviews), med(ratios).Seconds()
	fmt.Printf("\n%-78s %12s %9s\n", "case", "median", "ratio")
	fmt.Printf("%-78s %12s %8.2fx\n", "baseline: check of flux2 2.17.2 -> 2.18.2 (the CLI's, fresh clients)", c.Round(time.Microsecond), 1.0)
	fmt.Printf("%-78s %12s %8.2fx\n", fmt.Sprintf("review of one bump among %d HelmReleases (the CLI's, fresh clients)", reviewReleases), r.Round(time.Microsecond), float64(r)/float64(c))
	fmt.Printf("%-78s %12s %8.2fx\n", fmt.Sprintf("  of which finding the change among %d HelmReleases (review.Changes)", reviewReleases), find.median.Round(time.Microsecond), float64(find.median)/float64(c))
	fmt.Printf("median of the rounds' own ratios: %.2fx\n", ratio)
	fmt.Printf("review goal: <= 2.00x one check: %s\n", hitOrMiss(float64(r) <= 2*float64(c)))
	fmt.Printf("\n%d rounds, check and review in turn, median.\n", rounds)
	return nil
}

func chartDirs() []string {
	var out []string
	for _, c := range reviewCharts {
		out = append(out, c.dir)
	}
	return out
}

// reviewRepository writes a GitOps repository at dir: the flux2 HelmRelease of
// flux-system at 2.17.2 and 49 others, each of its own namespace and HelmRepository, in a
// file of its own under clusters/prod/; then a commit that bumps flux2 to 2.18.2. It
// returns the two commits.
func reviewRepository(dir, url string) (base, head string, err error) {
	r, err := git.PlainInit(dir, false)
	if err != nil {
		return "", "", err
	}
	wt, err := r.Worktree()
	if err != nil {
		return "", "", err
	}
	files := map[string]string{"clusters/prod/flux-system/flux2.yaml": scenario.FluxGitManifests(url, "2.17.2")}
	for i := 1; i < reviewReleases; i++ {
		c := reviewCharts[i%len(reviewCharts)]
		ns := fmt.Sprintf("team-%02d", i)
		files["clusters/prod/"+ns+"/"+c.chart+".yaml"] = scenario.GitManifests(ns, "charts", c.chart, url, c.version, "")
	}
	commit := func(msg string, files map[string]string) (plumbing.Hash, error) {
		for p, content := range files {
			full := filepath.Join(dir, p)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				return plumbing.ZeroHash, err
			}
			if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
				return plumbing.ZeroHash, err
			}
			if _, err := wt.Add(p); err != nil {
				return plumbing.ZeroHash, err
			}
		}
		return wt.Commit(msg, &git.CommitOptions{Author: &object.Signature{Name: "bench", Email: "bench@example.com", When: time.Unix(1_790_000_000, 0)}})
	}
	b, err := commit(fmt.Sprintf("%d HelmReleases", reviewReleases), files)
	if err != nil {
		return "", "", err
	}
	h, err := commit("Update Helm release flux2 to v2.18.2", map[string]string{"clusters/prod/flux-system/flux2.yaml": scenario.FluxGitManifests(url, "2.18.2")})
	if err != nil {
		return "", "", err
	}
	return b.String(), h.String(), nil
}

// runCLI runs upgradeguard in this process and returns its standard output; exit 1
// (findings) is what both commands must say here.
func runCLI(ctx context.Context, args []string) ([]byte, error) {
	var out, errOut bytes.Buffer
	if code := cli.Execute(ctx, args, cli.Streams{Out: &out, ErrOut: &errOut, In: bytes.NewReader(nil)}); code != cli.ExitFindings {
		return nil, fmt.Errorf("upgradeguard %v: exit %d, want %d (findings)\n%s%s", args, code, cli.ExitFindings, out.String(), errOut.String())
	}
	return out.Bytes(), nil
}

// sameVerdicts checks that the review's one row finds what the check finds.
func sameVerdicts(checkOut, reviewOut []byte) error {
	var c check.Report
	if err := json.Unmarshal(checkOut, &c); err != nil {
		return fmt.Errorf("check -o json: %w", err)
	}
	var r struct {
		Rows []struct {
			Subject string        `json:"subject"`
			Report  *check.Report `json:"report"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(reviewOut, &r); err != nil {
		return fmt.Errorf("review -o json: %w", err)
	}
	if len(r.Rows) != 1 || r.Rows[0].Report == nil {
		return fmt.Errorf("review: %d rows, want the one of HelmRelease/flux-system/flux2, judged", len(r.Rows))
	}
	verdicts := func(rep *check.Report) []string {
		var out []string
		for _, f := range rep.Findings() {
			out = append(out, string(f.Verdict)+" "+f.Name)
		}
		return out
	}
	if a, b := verdicts(&c), verdicts(r.Rows[0].Report); !slices.Equal(a, b) || len(a) == 0 {
		return fmt.Errorf("check finds %v, review %v: want the same migration", a, b)
	}
	return nil
}
