package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"helm.sh/helm/v4/pkg/action"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/getter"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// migrateHelmVersion is the Helm that runs the migration's uninstall: the SDK built in.
const migrateHelmVersion = "4.3.1"

type releaseMigrateOptions struct {
	release, newRelease string
	chart               chartsource.Options
	plan, execute, yes  bool
	override            bool
	dir                 string
	mapPVC, mapSecret   map[string]string
	helmDriver          *cliflag.HelmDriver
	output              string
	timeout             time.Duration
}

func newReleaseMigrateCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &releaseMigrateOptions{}
	cmd := &cobra.Command{
		Use:     "migrate NAME --to-chart REF (--plan | --execute --backup-dir DIR)",
		Short:   "Move a release to another chart, keeping its volumes and credentials Secrets",
		Long:    releaseMigrateLong,
		Example: releaseMigrateExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.release = args[0]
			return o.run(cmd.Context(), streams, kube)
		},
	}
	cliflag.AddChartSource(cmd.Flags(), cliflag.ToChart, &o.chart)
	o.addFlags(cmd.Flags())
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	return cmd
}

func (o *releaseMigrateOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.newRelease, "new-release", "", "name of the new release (default: the old release's name)")
	f.BoolVar(&o.plan, "plan", false, "only plan: read, compare and print the steps")
	f.BoolVar(&o.execute, "execute", false, "carry the plan out (needs --backup-dir)")
	f.BoolVar(&o.yes, "yes", false, "agree to patching PVs to Retain without asking")
	f.BoolVar(&o.override, "override-blocking", false, "execute even though the plan has blocking findings (read them first)")
	f.StringVar(&o.dir, "backup-dir", "", "directory for the backup and the migration record; re-use it to resume")
	f.StringToStringVar(&o.mapPVC, "map-pvc", nil, "pair an old claim with a new one: OLD=NEW (can repeat)")
	f.StringToStringVar(&o.mapSecret, "map-secret", nil, "restore an old Secret under a new name: OLD=NEW (can repeat)")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long to wait for claims to go and to bind")
	output.AddReportFlag(f, &o.output)
}

type releaseMigrateOutput struct {
	Plan   *chartmigrate.Plan   `json:"plan"`
	Result *chartmigrate.Result `json:"result,omitempty"`
}

func (o *releaseMigrateOptions) validate() error {
	switch {
	case o.plan == o.execute:
		return couldNot("pass exactly one of --plan (read only) and --execute")
	case o.chart.Ref == "":
		return couldNot("no new chart given: pass --to-chart REF")
	case o.execute && o.dir == "":
		return couldNot("--execute needs --backup-dir DIR: the backup and the migration record go there, and a re-run with it resumes")
	}
	if o.newRelease == "" {
		o.newRelease = o.release
	}
	return nil
}

func (o *releaseMigrateOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	src, ch, err := o.load(ctx, conn)
	if err != nil {
		return err
	}
	st, resumed, err := chartmigrate.Open(ctx, src, o.request(conn, ch))
	if err != nil {
		return classifyAs(cmdReleaseMigrate, err, conn)
	}
	if resumed {
		fmt.Fprintf(streams.ErrOut, "resuming the migration recorded in %s\n", o.dir)
	}
	if o.plan {
		out := &releaseMigrateOutput{Plan: st.Plan}
		return finishReport(streams, o.output, out, out.text, st.Plan.FindingReport, !st.Plan.Safe)
	}
	return o.executePlan(ctx, streams, kube, conn, src, st, ch)
}

// load builds the migration's readers and loads the new chart, rendered for the new
// release.
func (o *releaseMigrateOptions) load(ctx context.Context, conn *connection) (chartmigrate.Sources, *chartsource.Chart, error) {
	src, err := o.sources(conn)
	if err != nil {
		return src, nil, err
	}
	o.chart.ReleaseName, o.chart.Namespace, o.chart.KubeVersion = o.newRelease, conn.namespace, conn.serverVersion
	ch, err := chartsource.Load(ctx, o.chart)
	if err != nil {
		return src, nil, chartFailed(cmdReleaseMigrate, err)
	}
	return src, ch, nil
}

// sources are the migration's readers, on the one connection.
func (o *releaseMigrateOptions) sources(conn *connection) (chartmigrate.Sources, error) {
	uc, err := uninstall.NewClients(conn.config)
	if err != nil {
		return chartmigrate.Sources{}, couldNot("build client: %w", err)
	}
	reader, err := helmrelease.NewReader(conn.clientset, conn.namespace, o.helmDriver.Driver())
	if err != nil {
		return chartmigrate.Sources{}, couldNot("%w", err)
	}
	uopts := uninstall.Options{Release: o.release, Namespace: conn.namespace, Driver: o.helmDriver.Driver(), HelmVersion: migrateHelmVersion}
	return chartmigrate.Sources{Kube: conn.clientset, Releases: reader, Uninstall: uc, UninstallOptions: uopts}, nil
}

func (o *releaseMigrateOptions) request(conn *connection, ch *chartsource.Chart) chartmigrate.Request {
	req := chartmigrate.Request{Release: o.release, NewRelease: o.newRelease, Namespace: conn.namespace,
		NewChart: ch.Name, NewChartVersion: ch.Version, NewManifest: ch.Manifest, MapPVC: o.mapPVC, MapSecret: o.mapSecret}
	if o.execute {
		req.Dir = o.dir
	}
	return req
}

func (o *releaseMigrateOptions) executePlan(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, conn *connection,
	src chartmigrate.Sources, st *chartmigrate.State, ch *chartsource.Chart) error {
	vals, err := o.chart.Values.MergeValues(getter.All(helmcli.New()))
	if err != nil {
		return couldNot("values: %w", err)
	}
	res, err := chartmigrate.Execute(ctx, o.env(streams, kube, conn, src), st, chartmigrate.ExecOptions{Dir: o.dir, Chart: ch.Chart, Values: vals, Override: o.override, Timeout: o.timeout})
	if errors.Is(err, chartmigrate.ErrBlocked) {
		// Refused before any step: the plan and its findings are the answer.
		out := &releaseMigrateOutput{Plan: st.Plan}
		if werr := finishReport(streams, o.output, out, out.text, st.Plan.FindingReport, false); werr != nil {
			return werr
		}
		return &ExitError{Code: ExitFindings, Err: fmt.Errorf("%w%s", err, advice(cmdReleaseMigrate, err))}
	}
	out := &releaseMigrateOutput{Plan: st.Plan, Result: res}
	if rerr := output.WriteReport(streams.Out, o.output, out, out.text, st.Plan.FindingReport); rerr != nil && err == nil {
		return couldNot("write output: %w", rerr)
	}
	if err != nil {
		return couldNot("%w%s", err, advice(cmdReleaseMigrate, err))
	}
	return nil
}

// env is what Execute works with: the connection's clients, Helm on the same
// kubeconfig, the terminal for questions and stderr for progress.
func (o *releaseMigrateOptions) env(streams Streams, kube *genericclioptions.ConfigFlags, conn *connection, src chartmigrate.Sources) chartmigrate.Env {
	return chartmigrate.Env{
		Kube: conn.clientset, Uninstall: src.Uninstall, UninstallOptions: src.UninstallOptions,
		Helm: func() (*action.Configuration, error) {
			cfg := action.NewConfiguration()
			if err := cfg.Init(kube, conn.namespace, string(o.helmDriver.Driver())); err != nil {
				return nil, fmt.Errorf("initialise Helm: %w", err)
			}
			return cfg, nil
		},
		Confirm:  o.confirm(streams),
		Progress: func(_, msg string) { fmt.Fprintln(streams.ErrOut, msg) },
	}
}

// confirm asks on the terminal, or refuses when nobody can answer.
func (o *releaseMigrateOptions) confirm(streams Streams) func(string) (bool, error) {
	return func(q string) (bool, error) {
		if o.yes {
			return true, nil
		}
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return false, errors.New(q + " Refusing without an answer: stdin is not a terminal; pass --yes to agree")
		}
		fmt.Fprintf(streams.ErrOut, "%s [y/N] ", q)
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		a := strings.ToLower(strings.TrimSpace(line))
		return a == "y" || a == "yes", nil
	}
}

func (out *releaseMigrateOutput) text(w io.Writer) error {
	p := out.Plan
	fmt.Fprintf(w, "Migration of release %s/%s (%s, revision %d) to %s (%s-%s)\n", p.Namespace, p.Release, p.OldChart, p.Revision, p.NewRelease, p.NewChart, p.NewChartVersion)
	planVolumes(w, p)
	planSecrets(w, p)
	planDeletes(w, p)
	planFindings(w, p.Findings)
	fmt.Fprintln(w, "Steps:")
	lines(w, p.Steps)
	switch {
	case out.Result != nil:
		migrationResult(w, p, out.Result)
	case p.Safe:
		fmt.Fprintln(w, "Nothing blocks. Run again with --execute --backup-dir DIR.")
	default:
		fmt.Fprintln(w, "Blocked: fix the BLOCKING findings first.")
	}
	return nil
}

// lines writes each item on its own indented line.
func lines(w io.Writer, items []string) {
	for _, s := range items {
		fmt.Fprintf(w, "  %s\n", s)
	}
}

func planVolumes(w io.Writer, p *chartmigrate.Plan) {
	fmt.Fprintln(w, "\nVolumes:")
	if len(p.Volumes) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, v := range p.Volumes {
		fmt.Fprintf(w, "  %s -> %s  on PV %s (uid %s, %s, %s, %s, class %q)\n", v.OldPVC, v.NewPVC, v.PV, v.PVUID, v.Source, v.ReclaimPolicy, v.Capacity, v.StorageClass)
		if v.OldStatefulSet != nil || v.NewStatefulSet != nil {
			fmt.Fprintf(w, "      %s -> %s\n", stsOrChart(v.OldStatefulSet, "old release's manifest"), stsOrChart(v.NewStatefulSet, "new chart's manifest"))
		}
	}
	for _, n := range p.FreshPVCs {
		fmt.Fprintf(w, "  (new) %s gets a new volume\n", n)
	}
}

func planSecrets(w io.Writer, p *chartmigrate.Plan) {
	fmt.Fprintln(w, "Secrets:")
	if len(p.Secrets) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, s := range p.Secrets {
		fmt.Fprintf(w, "  %s -> %s  (%s, keys %s)\n", s.Old, s.New, s.Type, strings.Join(s.Keys, ","))
	}
}

func planDeletes(w io.Writer, p *chartmigrate.Plan) {
	fmt.Fprintf(w, "The uninstall deletes %d object(s):\n", len(p.Deletes))
	lines(w, p.Deletes)
	if len(p.Kept) > 0 {
		fmt.Fprintf(w, "and leaves %d in place: %s\n", len(p.Kept), strings.Join(p.Kept, ", "))
	}
	if len(p.ClaimDeletes) > 0 {
		fmt.Fprintf(w, "The uninstall leaves %d StatefulSet claim(s) behind; the migration deletes them itself, by uid, after their PVs are Retain:\n", len(p.ClaimDeletes))
		lines(w, p.ClaimDeletes)
	}
}

func planFindings(w io.Writer, findings []chartmigrate.Finding) {
	if len(findings) == 0 {
		return
	}
	fmt.Fprintln(w, "Findings:")
	for _, f := range findings {
		tag := "note    "
		if f.Blocks() {
			tag = "BLOCKING"
		}
		fmt.Fprintf(w, "  %s %s  %s: %s\n", tag, f.Check, f.Subject, f.Message)
		if f.Remediation != "" {
			fmt.Fprintf(w, "           fix: %s\n", withFlag(f.Remediation, f.Input))
		}
	}
}

func migrationResult(w io.Writer, p *chartmigrate.Plan, r *chartmigrate.Result) {
	fmt.Fprintln(w, "\nResult:")
	for _, s := range r.Steps {
		line := s.Detail
		if s.Error != "" {
			line = s.Error
		}
		fmt.Fprintf(w, "  %-16s %-8s %s\n", s.Step, s.Status, line)
	}
	migrationChecks(w, r)
	if r.Done {
		fmt.Fprintf(w, "Migrated: release %s is installed on the old volumes.\n", p.NewRelease)
	}
}

func migrationChecks(w io.Writer, r *chartmigrate.Result) {
	for _, v := range r.Volumes {
		fmt.Fprintf(w, "  claim %s: PV %s bound=%v sameUID=%v sameSource=%v", v.PVC, v.PV, v.Bound, v.SameUID, v.SameData)
		if v.StatefulSet != "" {
			fmt.Fprintf(w, " usedByStatefulSet %s=%v", v.StatefulSet, v.StatefulSetUses)
		}
		fmt.Fprintln(w)
	}
	for _, s := range r.Secrets {
		fmt.Fprintf(w, "  Secret %s: same data=%v\n", s.Secret, s.SameData)
	}
}

func stsOrChart(r *chartmigrate.STSRef, chart string) string {
	if r == nil {
		return "claim in the " + chart
	}
	return r.String()
}

const releaseMigrateLong = `migrate moves a Helm release to a different chart (uninstall the old one, install the
new one) while keeping the data: each PersistentVolumeClaim's volume and each credentials
Secret carry over to the names the new chart renders.

--plan only reads. It pairs the old release's claims and Secrets with the new chart's
(equal names, names equal once the release names are taken out, or the one left with the
one left; --map-pvc and --map-secret decide the rest), checks each pair (storage class,
size, access modes against the bound PV), runs the uninstall pre-flight, and prints the
ordered steps. Exit 1 when a finding blocks.

StatefulSet claims (volumeClaimTemplates, named TEMPLATE-STATEFULSET-ORDINAL) count too:
the old StatefulSets' live, bound claims pair with the claims the new chart's StatefulSets
will use, by StatefulSet, template and ordinal. helm uninstall does not delete them, so
the plan lists them, and execute deletes exactly those (by uid) after the uninstall and
pre-creates the new ones bound to the same PVs, for the new StatefulSet to take.

--execute carries the plan out, in order:
  1. backup          Secrets, PVCs and PVs into --backup-dir (sanitised for re-apply)
  2. retain          patch bound PVs to reclaimPolicy Retain (asks; --yes to agree)
  3. uninstall       helm uninstall (Helm SDK), after re-checking that it deletes nothing
                     the plan did not show; then the old StatefulSet claims the plan lists
  4. claim-refs      free each retained PV of its old claim, reserved for the new one
  5. pre-create-pvcs the new claims, bound to the PVs (spec.volumeName), owned by the new
                     release so helm install adopts them
  6. restore-secrets each Secret from the backup under its new name, owned likewise
  7. install         helm install of the new chart (Helm SDK)
  8. verify          each new claim Bound to its old PV: same name, uid and volume source;
                     each restored Secret holds the same bytes

Every step is recorded in DIR/migration-state.json with the plan. A re-run with the same
--backup-dir resumes at the step that failed and never repeats a finished one. Nothing is
deleted except by the uninstall and the StatefulSet claims the plan lists. Progress goes to
stderr; Secret data and values are never printed.

Exit codes: 0 planned safe / migrated and verified, 1 the plan has blocking findings
(nothing changed), 2 could not run or a step failed (the message says what to do; re-run
to resume).`

const releaseMigrateExample = `  # What would happen
  upgradeguard release migrate db -n data --to-chart ./charts/newdb --new-release newdb --plan

  # Do it, keeping the backup and the record in ./db-migration
  upgradeguard release migrate db -n data --to-chart oci://registry.example.com/charts/newdb \
    --version 2.1.0 --new-release newdb -f newdb-values.yaml --execute --backup-dir ./db-migration --yes`
