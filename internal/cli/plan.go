package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
)

type planOptions struct {
	checkOptions
	latest        bool
	allowSwitch   bool
	keepsRollback bool
	helmRelease   string
	local         []string
	// argoChart is the --argocd-app source while the plan runs (closed after it).
	argoChart *argoapp.Chart
}

func newPlanCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &planOptions{}
	cmd := &cobra.Command{
		Use:   "plan (--release NAME (--chart REF | LOCAL-CHART...) | --helmrelease NS/NAME | --argocd-app NS/NAME) [--version V | --latest]",
		Short: "Find the safe path from the running chart version to the one you want, and back",
		Long: `plan reads the chart versions the source offers (the repository index, the OCI
tags, or the local chart directories and .tgz files given as arguments) and computes the
shortest safe sequence of steps from what the release runs now to the target version:

  upgrade         a chart upgrade (helm upgrade, or a HelmRelease version to commit)
  migrate         upgradeguard migrate of named CRDs (objects rewritten, storedVersions pruned)
  storage-switch  a live storage version moved to one both sides serve (--allow-storage-switch)
  keep            helm.sh/resource-policy=keep on a CRD the next chart would delete

Each upgrade is checked, with check's own decision, against the state the steps before it
leave (predicted storedVersions and storage versions), not against the live one.

--latest also names the newest version that is safe in one step now, and what blocks each
newer one. --rollback lists every revision of the release as reachable now, reachable
after named steps, or unreachable and why. --upgrade-keeps-rollback says whether the
running revision stays reachable by a rollback once the plan is carried out.

The cluster's ValidatingAdmissionPolicies are evaluated for every CRD write a step makes
(as check does, with the API server's own policy code): a step a policy denies is not
taken, and the plan goes through other versions where they offer a way around it. A
rollback target the policies deny is denied-by-policy, with the policy's way on. When the
policies cannot be read, the plan says NOT ALL ASKED.

plan only reads. Exit codes: 0 the target is reached in one step, 1 findings: a path of
several steps exists (each step before an upgrade answers a finding), admission policies
alone deny every path (their way on is printed), or no path does (the message names the
blocking CRD and version), 2 could not run. -o markdown, sarif, junit and github give a
case per chart upgrade of the path and a finding per step it needs, and a case for the
newest version (--latest) and for each rollback target (--rollback,
--upgrade-keeps-rollback), whose findings are warnings and change no exit code.`,
		Example: `  # The path from what runs now to 2.18.2, from a chart repository
  upgradeguard plan --release flux -n flux-system --chart flux2 \
    --repo https://fluxcd-community.github.io/helm-charts --version 2.18.2

  # The newest version that is safe now, and the path to the newest one, from OCI
  upgradeguard plan --release flux -n flux-system \
    --chart oci://ghcr.io/fluxcd-community/charts/flux2 --latest

  # Local charts as the versions on offer
  upgradeguard plan --release app -n app ./charts/app-1.0.0 ./dist/app-2.0.0.tgz ./dist/app-3.0.0.tgz

  # Which revisions a rollback can reach, and whether the upgrade keeps the way back
  upgradeguard plan --release flux -n flux-system --chart flux2 --repo URL --version 2.18.2 \
    --rollback --upgrade-keeps-rollback

  # A Flux HelmRelease: the spec.chart.spec.version values to commit, as JSON
  upgradeguard plan --helmrelease flux-system/flux --latest -o json

  # An Argo CD Application: the targetRevision values to commit (default target: its own)
  upgradeguard plan --argocd-app argocd/flux --latest`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.local = args
			return o.run(cmd.Context(), streams, kube)
		},
	}
	o.addPredictFlags(cmd)
	o.addManifestsFlag(cmd, streams)
	f := cmd.Flags()
	f.Lookup(cliflag.ManifestsFlag).Hidden = true // refused with advice: plan needs chart versions
	f.Lookup("rollback").Usage = "also list every revision of the release as a rollback target: reachable now, after named steps, unreachable, or denied by an admission policy"
	f.Lookup("version").Usage = "target chart version or semver range (default: the newest stable one)"
	_ = f.MarkHidden("to-revision")
	f.BoolVar(&o.latest, "latest", false, "target the newest version, and name the newest one that is safe in one step now and what blocks each newer one")
	f.BoolVar(&o.allowSwitch, "allow-storage-switch", false, "let the plan switch a live storage version to one both sides serve (a reverse migration step)")
	f.BoolVar(&o.keepsRollback, "upgrade-keeps-rollback", false, "say whether the running revision stays reachable by a rollback after the plan")
	f.StringVar(&o.helmRelease, "helmrelease", "", "plan for a Flux HelmRelease NAMESPACE/NAME: steps are spec.chart.spec.version values to commit")
	o.argo.addFlags(cmd)
	output.AddReportFlag(f, &o.output)
	return cmd
}

func (o *planOptions) validate() error {
	switch {
	case o.argo.ref != "" && len(o.local) > 0:
		return couldNot("--%s reads the chart from the Application: drop the local charts", argoAppFlag)
	case o.argo.ref != "":
		return o.argo.validate(o.flags, []string{"version"}, "release", "helmrelease", "to-revision", "rollback", "upgrade-keeps-rollback")
	case o.manifests != "":
		return couldNot("plan searches the chart versions a repository or local charts offer, and rendered manifests are one fixed version: "+
			"run `%s` to judge them (and `%s` for what it finds to migrate)",
			cmdline.Check{Manifests: o.manifests}, cmdline.Migrate{Manifests: o.manifests})
	case o.helmRelease != "" && (o.release != "" || o.chart.Ref != "" || len(o.local) > 0):
		return couldNot("--helmrelease reads the release and the chart source from the HelmRelease: drop --release, --chart and local charts")
	case o.helmRelease != "" && strings.Count(o.helmRelease, "/") != 1:
		return couldNot("--helmrelease takes NAMESPACE/NAME, got %q", o.helmRelease)
	case o.helmRelease == "" && o.release == "":
		return couldNot("plan needs --release NAME (and -n NAMESPACE), or --helmrelease NAMESPACE/NAME")
	case o.helmRelease == "" && o.chart.Ref == "" && len(o.local) == 0:
		return couldNot("no chart versions to plan with: pass --chart REF (a repository or OCI chart), or local chart directories and .tgz files as arguments")
	case o.chart.Ref != "" && len(o.local) > 0:
		return couldNot("pass either --chart REF or local charts as arguments, not both")
	case o.latest && o.chart.Version != "":
		return couldNot("--latest and --version do not go together: --latest targets the newest version")
	case o.toRevision != 0:
		return couldNot("--to-revision does not apply to plan: --rollback lists every revision")
	}
	return nil
}

func (o *planOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	defer func() { _ = o.argoChart.Close() }()
	req, hr, err := o.request(ctx, conn)
	if err != nil {
		return err
	}
	p, err := plan.Run(ctx, req)
	err = o.argoChart.Explain(err)
	if p != nil && o.argo.ref != "" {
		p.Application = o.argo.ref
	}
	var noPath *plan.NoPathError
	switch {
	case errors.As(err, &noPath) && p.DeniedByPolicy():
		// A finding, not a failure to run: the policies' way on opens the path.
		return finishReport(streams, o.output, p, planText(p, hr), p.FindingReport, true)
	case errors.As(err, &noPath):
		// No path is a finding, not a failure to run: the plan names what blocks it.
		if werr := finishReport(streams, o.output, p, planText(p, hr), p.FindingReport, false); werr != nil {
			return werr
		}
		return &ExitError{Code: ExitFindings, Err: fmt.Errorf("%w; run `%s` on the blocked version for the details", err, cmdline.Check{})}
	case err != nil:
		var load *chartsource.LoadError
		var pl *plan.LoadError
		if errors.As(err, &load) || errors.As(err, &pl) || errors.Is(err, plan.ErrNoVersions) {
			return chartFailed(cmdPlan, err)
		}
		return classifyAs(cmdPlan, err, conn)
	}
	return finishReport(streams, o.output, p, planText(p, hr), p.FindingReport, !p.OneStep())
}

// request turns the flags into one plan.Request.
func (o *planOptions) request(ctx context.Context, conn *connection) (plan.Request, *plan.HelmRelease, error) {
	req := plan.Request{Cluster: conn.cluster, Release: o.release, Namespace: conn.namespace, Target: o.chart.Version,
		Latest: o.latest, Policy: o.crdPolicy, AllowStorageSwitch: o.allowSwitch, Rollbacks: o.rollback, KeepsRollback: o.keepsRollback}
	if o.argo.ref != "" {
		err := o.argoRequest(ctx, conn, &req)
		return req, nil, err
	}
	var hr *plan.HelmRelease
	src := o.chart
	if o.helmRelease != "" {
		ns, name, _ := strings.Cut(o.helmRelease, "/")
		var err error
		if hr, err = readHelmRelease(ctx, conn, ns, name); err != nil {
			return req, nil, err
		}
		src, req.Release, req.Namespace, req.Policy = hr.Source, hr.Release, hr.StorageNamespace, hr.Policy
		if !o.latest {
			req.Target = o.chart.Version
		}
	} else {
		src.ReleaseName, src.Namespace = o.release, conn.namespace
	}
	src.KubeVersion, src.IsUpgrade, src.Version = conn.serverVersion, true, ""
	history := cached(src)
	history.Local = o.local
	req.Versions = history
	reader, err := helmrelease.NewReader(conn.clientset, req.Namespace, o.helmDriver.Driver())
	if err != nil {
		return req, nil, couldNot("%w", err)
	}
	req.Releases = reader
	req.Commands.Upgrade = func(v string) string {
		if hr != nil {
			return hr.VersionCommand(v)
		}
		return o.upgradeCommand(history.Ref(v), v, req.Namespace)
	}
	return req, hr, nil
}

// cached is the History of src through one cache for this run: the repository index is
// read once and each chart version downloaded once, however many times the search meets it.
func cached(src chartsource.Options) *chartsource.History {
	if src.Username != "" && src.CredentialsID == "" {
		src.CredentialsID = "credentials of this run"
	}
	return &chartsource.History{Options: src, Loader: chartsource.NewCache(chartsource.CacheOptions{MaxCharts: 256, MaxIndexes: 4})}
}

// argoRequest plans for --argocd-app: the Application's chart source, release name,
// namespace and CRD policy, with no Helm release (Argo CD keeps none), from the chart
// version Argo CD last deployed (argoapp.Application.Deployed) towards --version or else
// the Application's own targetRevision. A chart on disk (a git checkout) offers its one
// version. Each upgrade step is a targetRevision to commit.
func (o *planOptions) argoRequest(ctx context.Context, conn *connection, req *plan.Request) error {
	c, err := o.argo.resolve(ctx, cmdPlan, conn)
	if err != nil {
		return err
	}
	o.argoChart = c
	src := c.Options
	req.Release, req.Namespace, req.Policy, req.Deployer, req.Current = src.ReleaseName, src.Namespace, c.Policy, c.Deployer, c.Current
	req.From, req.FromSource = c.Deployed, c.DeployedFrom
	if !o.latest && o.chart.Version == "" {
		req.Target = src.Version
	}
	history := cached(src)
	if c.Local() {
		history.Local, req.Target = []string{src.Ref}, ""
	}
	history.Options.Version = ""
	req.Versions = history
	req.Commands.Upgrade = c.Upgrade
	return nil
}

// upgradeCommand is the helm upgrade of one step. Values files are named by path;
// --set values are never printed (the header says to add them).
func (o *planOptions) upgradeCommand(ref, version, ns string) string {
	c := cmdline.HelmUpgrade{Release: o.release, Namespace: ns, Chart: ref,
		Repo: o.chart.RepoURL, PlainHTTP: o.chart.PlainHTTP, ValuesFiles: o.chart.Values.ValueFiles}
	if len(o.local) == 0 {
		c.Version = version
	}
	return c.String()
}

func readHelmRelease(ctx context.Context, conn *connection, ns, name string) (*plan.HelmRelease, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{helmv2.AddToScheme, sourcev1.AddToScheme, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, couldNot("build client: %w", err)
		}
	}
	c, err := client.New(conn.config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, couldNot("build client: %w", err)
	}
	hr, err := plan.ReadHelmRelease(ctx, c, ns, name)
	var unsupported *fluxrelease.UnsupportedError
	if errors.As(err, &unsupported) {
		return nil, couldNot("%w", err)
	}
	if err != nil {
		return nil, classifyAs(cmdPlan, err, conn)
	}
	return hr, nil
}

// planText renders the plan as text, in the terms of the HelmRelease when hr is set.
func planText(p *plan.Plan, hr *plan.HelmRelease) func(io.Writer) error {
	return func(w io.Writer) error { return renderPlanText(w, p, hr) }
}

func renderPlanText(w io.Writer, p *plan.Plan, hr *plan.HelmRelease) error {
	subject := fmt.Sprintf("release %s", p.Release)
	switch {
	case hr != nil:
		subject = fmt.Sprintf("HelmRelease %s/%s (Helm release %s)", hr.Namespace, hr.Name, p.Release)
	case p.Application != "":
		subject = fmt.Sprintf("Argo CD Application %s (release %s)", p.Application, p.Release)
	}
	from := p.From
	switch {
	case from == "":
		from = "(not installed)"
	case p.FromSource != "":
		from += " (deployed, from " + p.FromSource + ")"
	}
	fmt.Fprintf(w, "Plan for %s in %s: chart %s -> %s\n", subject, orDash(p.Namespace), from, p.Target)
	switch {
	case p.DeniedByPolicy():
		fmt.Fprintf(w, "DENIED BY POLICY: the cluster's admission policies deny every path to %s; no migration helps, their way on below does.\n", p.Target)
		renderBlocking(w, p.Blocking)
	case !p.Reachable:
		fmt.Fprintf(w, "NO PATH: nothing the plan can do reaches %s.\n", p.Target)
		renderBlocking(w, p.Blocking)
	case len(p.Steps) == 0:
		fmt.Fprintln(w, "Nothing to do: the release already runs the target version.")
	default:
		fmt.Fprintf(w, "%d step(s), %d chart upgrade(s); each upgrade is checked against the state the steps before it leave.\n", len(p.Steps), p.Upgrades())
	}
	if len(p.Unasked) > 0 {
		fmt.Fprintln(w, "NOT ALL ASKED: the cluster's ValidatingAdmissionPolicies could not be read, so no step was judged against them; the plan rests on what was asked.")
		renderUnasked(w, p.Unasked)
	}
	if detour := p.Detour(); len(detour) > 0 {
		fmt.Fprintf(w, "\nThe direct upgrade to %s is denied by the cluster's admission policies; the path goes around it.\n", p.Target)
		renderDenials(w, blockedWrites(detour))
	}
	for i, s := range p.Steps {
		renderStep(w, i+1, s, hr)
	}
	if l := p.Latest; l != nil {
		fmt.Fprintf(w, "\nNewest version: %s. Newest safe in one step now: %s\n", l.Newest, orDash(l.DirectlySafe))
		for _, b := range l.Blocked {
			fmt.Fprintf(w, "  %s blocked by %s (%s): %s\n", b.Version, orDash(b.CRD), b.Verdict, b.Reason)
		}
	}
	if p.Rollbacks != nil {
		fmt.Fprintln(w, "\nRollback targets:")
		if len(p.Rollbacks) == 0 {
			fmt.Fprintln(w, "  (the release has no other revision)")
		}
		for _, r := range p.Rollbacks {
			renderRollback(w, "revision", r)
		}
	}
	if r := p.KeepsRollback; r != nil {
		fmt.Fprintln(w, "\nAfter the plan, a rollback to the running revision is:")
		renderRollback(w, "revision", *r)
	}
	fmt.Fprintf(w, "\n(%d chart version(s) loaded; helm upgrade commands name values files but not --set values: add yours)\n", p.ChartLoads)
	return nil
}

// renderBlocking lists what blocks the target, then each admission policy's denial among
// it once, with its way on.
func renderBlocking(w io.Writer, blocking []plan.Blocker) {
	for _, b := range blocking {
		fmt.Fprintf(w, "  blocked by %s at %s (%s): %s\n", b.CRD, b.Version, b.Verdict, b.Reason)
	}
	renderDenials(w, blockedWrites(blocking))
}

// blockedWrites are the CRD writes of blockers that admission policies deny.
func blockedWrites(blocking []plan.Blocker) []deniedWrite {
	var out []deniedWrite
	for _, b := range blocking {
		for _, d := range b.Policies {
			out = append(out, deniedWrite{crd: b.CRD, denial: d})
		}
	}
	return out
}

func renderStep(w io.Writer, n int, s plan.Step, hr *plan.HelmRelease) {
	switch s.Kind {
	case plan.Upgrade:
		what := "upgrade to chart version " + s.ChartVersion
		if hr != nil {
			what = "set spec.chart.spec.version to " + s.ChartVersion
		}
		fmt.Fprintf(w, "\n%d. %s\n", n, what)
	case plan.Migrate:
		fmt.Fprintf(w, "\n%d. migrate %d CRD(s): rewrites up to %d object(s) and prunes storedVersions\n", n, len(s.CRDs), s.Objects)
	case plan.StorageSwitch:
		fmt.Fprintf(w, "\n%d. switch storage of %s: rewrites up to %d object(s)\n", n, strings.Join(s.CRDs, ", "), s.Objects)
	case plan.Keep:
		fmt.Fprintf(w, "\n%d. keep %d CRD(s) the next chart drops\n", n, len(s.CRDs))
	}
	for _, c := range s.Commands {
		fmt.Fprintf(w, "   $ %s\n", c)
	}
	for _, c := range s.After {
		fmt.Fprintf(w, "   %s: storage %s, stored [%s]\n", c.Name, c.StorageVersion, strings.Join(c.StoredVersions, " "))
	}
	if s.Check == nil {
		return
	}
	for _, b := range bundledOf(s.Check) {
		fmt.Fprintf(w, "   bundled StorageVersionMigration %s for %s: %s: %s\n", orDash(b.Name), b.CRD, b.Verdict, b.Reason)
		if b.Action != "" {
			fmt.Fprintf(w, "     next: %s\n", b.Action)
		}
	}
}

func renderRollback(w io.Writer, label string, r plan.Rollback) {
	fmt.Fprintf(w, "  %s %d (chart %s, %s): %s\n", label, r.Revision, orDash(r.ChartVersion), orDash(r.Status), r.Reach)
	for _, s := range r.Steps {
		fmt.Fprintf(w, "    $ %s\n", s)
	}
	for _, why := range r.Why {
		fmt.Fprintf(w, "    why: %s\n", why)
	}
	if len(r.Denied) > 0 {
		fmt.Fprintf(w, "    denied: %s\n", strings.Join(r.Denied, ", "))
	}
	for _, d := range r.Policies {
		fmt.Fprintf(w, "    by ValidatingAdmissionPolicy %s (binding %s): %s\n", d.Policy, orDash(d.Binding), d.Message)
		renderWayOn(w, "      ", d.WayOn)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
