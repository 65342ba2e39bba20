package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/review"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

type reviewOptions struct {
	o           review.Options
	charts      review.ChartOptions
	clusters    []string
	acknowledge []string
	output      string
	snapshots   []string
	registry    snapshot.Registry
}

func newReviewCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &reviewOptions{}
	cmd := command("review [--base REF] [--head REF] [--cluster PATH=CONTEXT ...] [--baseline REF ...]", "Judge a Git change before it is merged: its HelmRelease upgrades on the clusters they land on, or its charts against their supported releases",
		reviewLong, reviewExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	f := cmd.Flags()
	f.StringVar(&o.o.Repo, "repo", ".", "path in the git repository: its work tree, or a bare clone with --head")
	f.StringVar(&o.o.Base, "base", "", "revision the change starts from (default: the merge base with origin/HEAD, main or master)")
	f.StringVar(&o.o.Head, "head", "", "revision the change ends at (default: the work tree, uncommitted changes included)")
	f.StringArrayVar(&o.clusters, "cluster", nil, "PATH=CONTEXT: the HelmReleases under the repository folder PATH land on the kubeconfig context CONTEXT (repeatable; default: every HelmRelease on the current context)")
	f.StringArrayVar(&o.acknowledge, "acknowledge", nil, "CHECK/SUBJECT: accept this finding on purpose, for example delete/leaderworkersets.leaderworkerset.x-k8s.io (repeatable; as a CI maps a pull-request label; a HelmRelease's upgradeguard.io/acknowledge annotation does the same for its own)")
	f.StringArrayVar(&o.snapshots, "snapshot", nil, "NAME=FILE or NAME=oci://REGISTRY/REPOSITORY:TAG: judge against the cluster NAME as a snapshot recorded it (upgradeguard snapshot), with no cluster credentials; --cluster PATH=NAME maps folders to it (repeatable)")
	addRegistryFlags(f, &o.registry)
	f.StringArrayVar(&o.charts.Baselines, "baseline", nil, "chart repositories: a supported release to judge a touched chart from: a tag, a release branch or a commit (repeatable; default: the newest release tag reachable from --base)")
	f.StringVar(&o.charts.BaselineTags, "baseline-tags", "", "chart repositories: every tag matching this glob is a supported release, for example 'flux2-2.*' (the newest --max-baselines)")
	f.StringVar(&o.charts.BaselineBranches, "baseline-branches", "", "chart repositories: every branch matching this glob is a supported release, for example 'release-*' (the newest --max-baselines)")
	f.IntVar(&o.charts.MaxBaselines, "max-baselines", review.DefaultMaxBaselines, "chart repositories: how many of the releases --baseline-tags and --baseline-branches match to judge from, newest first")
	f.StringVar(&o.charts.TagPattern, "tag-pattern", "", "chart repositories: how a release tag names the chart version, for example 'v{version}' or '{name}-{version}' (default: tries '{name}-{version}', 'v{version}', '{version}')")
	f.StringVar(&o.charts.KubeVersion, "kube-version", review.DefaultKubeVersion, "chart repositories: the Kubernetes version the charts are rendered for (.Capabilities.KubeVersion)")
	cliflag.AddValues(f, &o.charts.Values)
	output.AddReportFlag(f, &o.output)
	return cmd
}

func (o *reviewOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	for _, a := range o.acknowledge {
		if check, subject, ok := strings.Cut(a, "/"); !ok || check == "" || subject == "" {
			return couldNot("--acknowledge %q: want CHECK/SUBJECT, for example delete/leaderworkersets.leaderworkerset.x-k8s.io", a)
		}
	}
	if o.charts.MaxBaselines < 1 {
		return couldNot("--max-baselines %d: give 1 or more", o.charts.MaxBaselines)
	}
	// --cluster and --snapshot are read first, so that a mistake in them is said whatever
	// the change; the current context only when a HelmRelease needs it (a chart
	// repository's CI has none).
	var clusters []review.Cluster
	var err error
	if len(o.clusters) > 0 || len(o.snapshots) > 0 {
		if clusters, err = o.allTargets(ctx, kube); err != nil {
			return err
		}
	}
	d, err := review.Changes(ctx, o.o)
	if err != nil {
		return couldNot("%w", err)
	}
	defer func() { _ = d.Close() }()
	rep := &review.Report{Base: d.Base, Head: d.Head, Rows: []review.Row{}}
	if len(d.Changes) > 0 || clusters != nil {
		if clusters == nil {
			if clusters, err = o.allTargets(ctx, kube); err != nil {
				return err
			}
		}
		if rep, err = review.Judge(ctx, d, clusters, nil); err != nil {
			return couldNot("%w (check --kubeconfig, --cluster and that the cluster is up)", err)
		}
	}
	o.charts.Deployed = d.DeployedCharts()
	if rep.Charts, err = review.Charts(ctx, o.o, o.charts); err != nil {
		return couldNot("%w", err)
	}
	rep.Acknowledge = o.acknowledge
	return finishReport(streams, o.output, rep, func(w io.Writer) error { return renderReview(w, rep) }, rep.FindingReport, !rep.Safe())
}

// targets are the clusters of --cluster, or the current context for every HelmRelease.
func (o *reviewOptions) targets(kube *genericclioptions.ConfigFlags) ([]review.Cluster, error) {
	raw, err := kube.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, couldNot("load kubeconfig: %w (set --kubeconfig or KUBECONFIG)", err)
	}
	if len(o.clusters) == 0 {
		cfg, err := kube.ToRESTConfig()
		if err != nil {
			return nil, couldNot("load kubeconfig: %w (set --kubeconfig or KUBECONFIG, and --context)", err)
		}
		name := raw.CurrentContext
		if kube.Context != nil && *kube.Context != "" {
			name = *kube.Context
		}
		return []review.Cluster{{Name: name, Config: cfg}}, nil
	}
	var out []review.Cluster
	for _, c := range o.clusters {
		path, name, ok := strings.Cut(c, "=")
		if !ok || path == "" || name == "" {
			return nil, couldNot("--cluster %q: want PATH=CONTEXT, for example --cluster clusters/prod-eu/=prod-eu", c)
		}
		i := slices.IndexFunc(out, func(cl review.Cluster) bool { return cl.Name == name })
		if i >= 0 {
			out[i].Paths = append(out[i].Paths, path)
			continue
		}
		if _, ok := raw.Contexts[name]; !ok {
			return nil, couldNot("--cluster %s: the kubeconfig has no context %q (kubectl config get-contexts lists them)", c, name)
		}
		cfg, err := clientcmd.NewNonInteractiveClientConfig(raw, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
		if err != nil {
			return nil, couldNot("--cluster %s: %w", c, err)
		}
		out = append(out, review.Cluster{Name: name, Config: cfg, Paths: []string{path}})
	}
	return out, nil
}

func renderReview(w io.Writer, rep *review.Report) error {
	fmt.Fprintf(w, "Review of %.12s..%.12s\n", rep.Base, rep.Head)
	for _, s := range rep.Snapshots {
		fmt.Fprintln(w, s.Note())
	}
	if len(rep.Rows) == 0 && len(rep.Unplaced) == 0 && len(rep.Charts) == 0 {
		fmt.Fprintln(w, "\nSAFE: the change touches no HelmRelease's chart or values, and no chart: nothing to judge.")
		return nil
	}
	cases := rep.FindingReport().Cases // one per row, in order, then one per chart
	if len(rep.Rows) > 0 || len(rep.Unplaced) > 0 {
		if err := renderReviewRows(w, rep, cases); err != nil {
			return err
		}
	}
	renderReviewCharts(w, rep, cases[len(rep.Rows):])
	if rep.Safe() {
		fmt.Fprintln(w, "\nSAFE: every touched HelmRelease and chart upgrades safely, acknowledged findings aside.")
	} else {
		fmt.Fprintln(w, "\nBLOCKED: merging this change fails an upgrade or loses data; the fix is above (or acknowledge it: --acknowledge CHECK/SUBJECT, or the upgradeguard.io/acknowledge annotation of the HelmRelease or Chart.yaml).")
	}
	return nil
}

// renderReviewCharts writes each touched chart: the releases it was judged from, and
// each finding at its file and line with its fix.
func renderReviewCharts(w io.Writer, rep *review.Report, cases []finding.Case) {
	for i, c := range rep.Charts {
		fmt.Fprintf(w, "\nChart %s %s (%s)", c.Chart, c.Version, c.Dir)
		if len(c.Baselines) > 0 {
			var from []string
			for _, b := range c.Baselines {
				from = append(from, b.Label())
			}
			fmt.Fprintf(w, ", judged from %s", strings.Join(from, ", "))
		}
		fmt.Fprintln(w, ":")
		if len(cases[i].Findings) == 0 {
			fmt.Fprintln(w, "  safe: every supported release upgrades to it")
		}
		for _, f := range cases[i].Findings {
			ack := ""
			if f.Acknowledged {
				ack = " (acknowledged)"
			}
			at := ""
			if f.Location != nil {
				at = fmt.Sprintf(" [%s:%d]", f.Location.File, f.Location.Line)
			}
			fmt.Fprintf(w, "  %s %s%s%s: %s\n", f.Check, f.Subject, ack, at, f.Message)
			if f.Remediation != "" {
				fmt.Fprintf(w, "    fix: %s\n", f.Remediation)
			}
			if f.Input != nil && f.Input.Option == review.OptionValues {
				fmt.Fprintf(w, "    check the fix: rerun with --set %s\n", f.Input.Value)
			}
		}
	}
}

// renderReviewRows writes the touched HelmReleases, a row per cluster they land on.
func renderReviewRows(w io.Writer, rep *review.Report, cases []finding.Case) error {
	t := output.NewTable(w, "CLUSTER", "HELMRELEASE", "CHANGE", "VERDICT", "FILE")
	for i, r := range rep.Rows {
		t.Row(r.Cluster, r.Subject, reviewChange(r.Change), reviewVerdict(r, cases[i]), fmt.Sprintf("%s:%d", r.File, r.Line))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	for _, c := range rep.Unplaced {
		fmt.Fprintf(w, "\nnot judged: %s (%s) lands on no cluster given (--cluster PATH=CONTEXT)\n", c.Subject, c.File)
	}
	for i, r := range rep.Rows {
		if len(cases[i].Findings) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s on %s:\n", r.Subject, r.Cluster)
		for _, f := range cases[i].Findings {
			ack := ""
			if f.Acknowledged {
				ack = " (acknowledged)"
			}
			fmt.Fprintf(w, "  %s %s%s: %s\n", f.Check, f.Subject, ack, f.Message)
		}
		if r.Report != nil && cases[i].Failed() {
			for _, s := range r.Report.NextSteps {
				fmt.Fprintf(w, "  next: %s\n", s)
			}
		}
	}
	return nil
}

func reviewChange(c review.Change) string {
	switch c.What {
	case "new":
		return "new " + c.To
	case "values":
		return "values"
	case review.WhatCRDs:
		return "CRD manifests"
	case review.WhatChartFiles:
		return "chart files " + c.From + " -> " + c.To
	}
	return c.From + " -> " + c.To
}

func reviewVerdict(r review.Row, c finding.Case) string {
	switch {
	case r.NotJudged != "":
		return "not judged"
	case c.Failed():
		return fmt.Sprintf("BLOCKED (%d CRDs)", len(r.Report.Findings()))
	case len(c.Findings) > 0 && !r.Report.Safe:
		return "acknowledged"
	}
	return "safe"
}

const reviewLong = `review reads a Git change the way a pull request shows it (the files at --base and
at --head, the work tree by default) and finds every Flux HelmRelease (helm.toolkit.fluxcd.io/v2)
whose chart, version or values the change touches. Each one is judged as the HelmRelease
gate judges it once Flux applies the change: its chart is resolved from the
HelmRepository or OCIRepository the head revision holds (the one nearest to the
HelmRelease's file), rendered with the values helm-controller composes (spec.values, and
spec.valuesFrom from ConfigMaps and Secrets in the repository), and predicted against the
live CRDs, storedVersions and objects of each cluster it lands on.

It also reads: kustomize overlays and Flux Kustomizations, built at both revisions as
kustomize-controller builds them (postBuild.substitute included), judging each
HelmRelease the build changes at the file the change touched; Argo CD Applications with
a Helm source (a targetRevision bump, a $values file in the repository), judged as check
--argocd-app judges them with the live Application's status; and files of CRD manifests
the change adds or changes, judged as check --manifests judges them; and umbrella charts
in the repository: a HelmRelease whose GitRepository source names this repository and
whose chart folder the change touches (a dependency moved in Chart.yaml or Chart.lock, a
subchart vendored in charts/) is judged with the head's chart, its dependencies fetched
as source-controller builds them (Chart.lock first; a stale lock is said); so is an Argo
CD Application whose Helm source is such a folder (a path of a repoURL naming this
repository).

Only the touched HelmReleases are rendered and judged. A HelmRelease whose source or
values are not in the repository is reported "not judged" with why.

Where each HelmRelease lands: --cluster PATH=CONTEXT maps a repository folder to a
kubeconfig context (Flux's layout, clusters/NAME/, is the usual one); without it every
touched HelmRelease is judged on the current context.

Without cluster credentials: --snapshot NAME=FILE or NAME=oci://REGISTRY/REPOSITORY:TAG
judges against a snapshot taken where credentials exist (the snapshot command), read
through the same prediction; NAME stands where a context would in --cluster PATH=NAME.
The report says each snapshot's age. A snapshot cannot say whether the API server accepts
an incoming CRD, or which objects a new validation rule would refuse. It holds no
repository credentials: an Argo CD Application's chart is fetched with the Helm settings
here.

In a chart repository (a Chart.yaml at the root, or charts/NAME/Chart.yaml), each chart
the change touches is judged, with no cluster, against its supported releases: the
newest release tag reachable from --base, or --baseline REF (tags, release branches,
commits), --baseline-tags GLOB and --baseline-branches GLOB (the newest --max-baselines).
--tag-pattern says how a tag names the chart version. Every release and the head are
rendered with the values given (-f, --set, as check takes them). review follows every
upgrade path through the releases and reports a version the head drops that
storedVersions can still hold (a migration the chart itself runs in between counts), a
CRD Helm deletes or never upgrades on the way, a keep annotation removed, and the schema
changes of each CRD (crdschema). A Chart.yaml annotation upgradeguard.io/acknowledge
acknowledges findings as a HelmRelease's does.

Exit codes: 0 every touched HelmRelease and chart upgrades safely; 1 at least one would
fail or lose data (the output names the CRDs and the fix); 2 could not run. -o markdown,
sarif, junit and github render the same verdicts for CI.`

const reviewExample = `  # What the branch changes, judged on the current context
  upgradeguard review

  # A pull request in CI: the base branch, two clusters, a comment body
  upgradeguard review --base origin/main --head HEAD \
    --cluster clusters/prod-eu/=prod-eu --cluster clusters/staging/=staging -o markdown

  # A chart repository's pull request, from its last five release tags, as SARIF
  upgradeguard review --base origin/main --head HEAD --baseline-tags 'flux2-*' -o sarif

  # The same with the chart's own migration hook switched on
  upgradeguard review --base origin/main --head HEAD --set crds.migration.enabled=true`
