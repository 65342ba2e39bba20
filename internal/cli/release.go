package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

func newReleaseCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Pre-flight checks for Helm release operations",
	}
	cmd.AddCommand(newApplyCheckCmd(streams, kube))
	cmd.AddCommand(newRollbackCheckCmd(streams, kube))
	cmd.AddCommand(newUninstallCheckCmd(streams, kube))
	cmd.AddCommand(newDiffFailedCmd(streams, kube))
	cmd.AddCommand(newReleaseMigrateCmd(streams, kube))
	return cmd
}

type applyCheckOptions struct {
	checkOptions
	fieldManager string
	flags        applycheck.Flags
}

func newApplyCheckCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &applyCheckOptions{checkOptions: checkOptions{cmdName: cmdApplyCheck}}
	cmd := &cobra.Command{
		Use:   "apply-check NAME --chart REF",
		Short: "Predict object by object what a Helm 4 upgrade does, server-side or client-side, and the partial state a failed one leaves",
		Long: `apply-check renders the chart (with the release's stored values, or the values given)
and replays Helm 4's upgrade loop against the API server without writing anything. The
model is Helm v4.2.1 to v4.3.2 (identical in each).

First it resolves the apply method as Helm 4.3.1 does: --server-side=auto follows the
apply_method the last revision recorded (none, for a release written by Helm 3 or by
helm-controller before v1.5, means client-side); true and false force it. It predicts the
flag errors Helm meets, and prints command lines that work:
  - --force-conflicts on a client-side upgrade: "invalid client update option(s):
    forceConflicts enabled when serverSideApply disabled" (after the pre-upgrade hooks;
    the new revision is recorded failed)
  - --force-replace on a server-side upgrade: "invalid operation: cannot use
    server-side apply and force replace together"

Then, for each object in Helm's apply order, a GET and, server-side, an apply with
dryRun=All as the field manager of the upgrade; client-side, Helm's three-way merge
patch (the current manifest, the new one and the live object) sent with dryRun=All.
Then a dry-run delete of each object the new chart drops. What it predicts, as Helm does:
  - a field another manager owns (server-side only) or a rejection (an immutable field,
    validation, an admission webhook or policy) fails that object; Helm collects the
    error and goes on: the objects after it are still updated and new ones created
  - a create that fails stops Helm there: the objects after it are not touched
  - objects the new chart drops are deleted only when every apply and create succeeded
  - any error records the new revision as failed (the one the upgrade started from keeps
    its status); pre-upgrade hooks have run, post-upgrade hooks do not
  - a new object that exists without this release's ownership, or a kind the cluster
    does not serve, makes Helm refuse the upgrade before it applies or records anything
For a client-side release it also predicts the same upgrade with --server-side=true:
which fields move to Helm's server-side apply and who conflicts.

It prints Helm's own error, what lands and what does not, and the revision Helm records,
and runs the CRD storage-version check. Field managers: helm (Helm 4), helm-controller
with --force-conflicts (Flux, which always forces). Release values and Secret data never
appear in the output. Exit codes: 0 safe, 1 findings, 2 could not run.`,
		Example: `  upgradeguard release apply-check app --chart ./charts/app -n apps
  # The upgrade you plan to run, flags included
  upgradeguard release apply-check app --chart ./charts/app -n apps --server-side=true --force-conflicts
  upgradeguard release apply-check flux --chart flux2 --repo https://fluxcd-community.github.io/helm-charts \
    --version 2.18.2 -n flux-system --field-manager helm-controller --force-conflicts -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.release = args[0]
			return o.run(cmd.Context(), streams, kube)
		},
	}
	o.addPredictFlags(cmd)
	f := cmd.Flags()
	_ = f.MarkHidden("release")
	_ = f.MarkHidden("rollback")
	_ = f.MarkHidden("to-revision")
	o.addApplyFlags(f)
	f.BoolVar(&o.flags.TakeOwnership, "take-ownership", false, "as helm upgrade --take-ownership: adopt existing objects the chart adds, whatever their ownership metadata")
	return cmd
}

// addApplyFlags adds the apply flags of helm upgrade and helm rollback.
func (o *applyCheckOptions) addApplyFlags(f *pflag.FlagSet) {
	f.StringVar(&o.fieldManager, "field-manager", "helm", "field manager of the operation: helm, helm-controller, or another name")
	f.BoolVar(&o.flags.ForceConflicts, "force-conflicts", false, "as helm --force-conflicts (Flux helm-controller always forces)")
	f.BoolVar(&o.flags.ForceReplace, "force-replace", false, "as helm --force-replace")
	f.StringVar(&o.flags.ServerSide, "server-side", "auto", "as helm --server-side: auto (the recorded apply_method), true or false")
	output.AddReportFlag(f, &o.output)
}

func (o *applyCheckOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	return o.runOperation(ctx, streams, kube, applycheck.OpUpgrade, o.release, o.chart.Ref)
}

// runOperation predicts the operation the flags describe, one applycheck.Predict, and
// renders it; args are its helm command line's, without the namespace and apply flags.
func (o *applyCheckOptions) runOperation(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, op applycheck.Operation, args ...string) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	o.chart.KubeVersion = conn.serverVersion
	s := applycheck.Sources{Cluster: conn.cluster}
	if s.Dynamic, s.Mapper, err = replayClients(kube, conn); err != nil {
		return err
	}
	if s.Clients, err = uninstall.NewClients(conn.config); err != nil {
		return couldNot("build client: %w", err)
	}
	if s.Releases, err = helmrelease.NewReader(conn.clientset, conn.namespace, o.helmDriver.Driver()); err != nil {
		return couldNot("%w", err)
	}
	p, err := applycheck.Predict(ctx, s, applycheck.Request{Release: o.release, Namespace: conn.namespace, Operation: op, ToRevision: o.toRevision,
		Flags: o.flags, FieldManager: o.fieldManager, Chart: o.chart, Policy: o.crdPolicy})
	var load *chartsource.LoadError
	var notAsked *applycheck.ReplayNotAsked
	switch {
	case errors.As(err, &load):
		return chartFailed(o.command(), err)
	case errors.As(err, &notAsked):
		out := &replayNotAskedOutput{Replay: unaskedReplay{Why: notAsked.Err.Error()}, CRDCheck: notAsked.CRDCheck}
		return finishReport(streams, o.output, out, out.text, func() finding.Report { return notAsked.FindingReport(op) }, true)
	case err != nil:
		return classifyAs(o.command(), err, conn)
	}
	out := &applyCheckOutput{Prediction: p, command: append(args, "-n", conn.namespace)}
	return finishReport(streams, o.output, out, out.text, p.FindingReport, !p.Safe)
}

// replayNotAskedOutput is what apply-check and rollback-check print when this identity
// may not make the replay's dry runs but the CRD check blocks the operation anyway
// (applycheck.ReplayNotAsked): the CRD check is the verdict, and the replay is named as
// not asked, in the headline and in JSON.
type replayNotAskedOutput struct {
	Safe     bool          `json:"safe"`
	Replay   unaskedReplay `json:"replay"`
	CRDCheck *check.Report `json:"crdCheck"`
}

// unaskedReplay is a replay that was not asked, and why.
type unaskedReplay struct {
	Asked bool   `json:"asked"`
	Why   string `json:"why"`
}

func (o *replayNotAskedOutput) text(w io.Writer) error {
	fmt.Fprintf(w, "BLOCKED by the CRD check below. The replay of the operation was NOT ASKED (its server-side dry runs are authorized as writes): %s\n\n", o.Replay.Why)
	return renderText(w, false, o.CRDCheck)
}

// replayClients are the clients of a dry-run replay of a release: dynamic, and a REST
// mapper from kube's discovery.
func replayClients(kube *genericclioptions.ConfigFlags, conn *connection) (dynamic.Interface, meta.RESTMapper, error) {
	dyn, err := dynamic.NewForConfig(conn.config)
	if err != nil {
		return nil, nil, couldNot("build client: %w", err)
	}
	mapper, err := kube.ToRESTMapper()
	if err != nil {
		return nil, nil, couldNot("discover API resources: %w", err)
	}
	return dyn, mapper, nil
}

// applyCheckOutput is what apply-check and rollback-check print: the library's
// prediction, and the operation's helm command line without the apply flags, which the
// "works" lines complete.
type applyCheckOutput struct {
	*applycheck.Prediction
	command []string
}

var outcomeLabel = map[applycheck.Outcome]string{
	applycheck.Updated: "updated", applycheck.Unchanged: "unchanged", applycheck.Created: "created", applycheck.Conflict: "CONFLICT",
	applycheck.Failed: "FAILS", applycheck.NotReached: "not reached", applycheck.Deleted: "deleted", applycheck.NotDeleted: "not deleted",
	applycheck.Kept: "kept", applycheck.AlreadyGone: "already gone", applycheck.CannotImport: "CANNOT IMPORT", applycheck.NotServed: "NOT SERVED",
}

func (rep *applyCheckOutput) text(w io.Writer) error {
	renderMode(w, rep)
	renderObjects(w, rep.Apply)
	fmt.Fprintln(w)
	renderResult(w, rep.Apply, rep.Mode.FlagError != "")
	if rep.ServerSide != nil {
		renderServerSideMove(w, rep.ServerSide)
	}
	if rep.Prune != nil {
		renderPrune(w, rep.Mode.Operation, rep.Prune)
	}
	fmt.Fprintln(w)
	return renderText(w, false, rep.CRDCheck)
}

// renderMode says which apply method the operation uses and why, the flag error Helm
// meets, and command lines that work.
func renderMode(w io.Writer, rep *applyCheckOutput) {
	m, a := rep.Mode, rep.Apply
	method := fmt.Sprintf("client-side apply (three-way merge patch) as %q", a.FieldManager)
	switch {
	case m.Method == "":
		method = "apply method unresolved"
	case m.ServerSide && a.Force:
		method = fmt.Sprintf("server-side apply as %q, conflicts forced", a.FieldManager)
	case m.ServerSide:
		method = fmt.Sprintf("server-side apply as %q, conflicts not forced", a.FieldManager)
	}
	fmt.Fprintf(w, "helm %s %s -n %s, %s (modelled on Helm %s):\n", m.Operation, rep.Release, rep.Namespace, method, a.HelmVersions)
	fmt.Fprintf(w, "  apply method: %s\n", m.Reason)
	if m.FlagError != "" {
		stage := "before it records a revision"
		if m.FlagErrorStage == applycheck.AfterHooks {
			stage = "after it records the new revision and runs the pre-" + string(m.Operation) + " hooks, before it applies anything"
		}
		fmt.Fprintf(w, "  FLAG ERROR (%s): %s\n", stage, m.FlagError)
	}
	for _, alt := range m.Alternatives {
		fmt.Fprintf(w, "  works: %s\n         %s\n", m.Command(rep.command, alt.Flags), alt.Why)
	}
}

func renderObjects(w io.Writer, a *applycheck.Report) {
	if len(a.Objects) == 0 {
		return
	}
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP\tOBJECT\tOUTCOME\tDETAIL")
	for _, obj := range a.Objects {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", obj.Step, obj.Object, outcomeLabel[obj.Outcome], objectDetail(obj))
	}
	_ = tw.Flush()
	for line := range strings.Lines(table.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}

func objectDetail(obj applycheck.Object) string {
	switch {
	case len(obj.Conflicts) > 0:
		return applycheck.FieldOwners(obj.Conflicts, " is owned by ")
	case obj.Error != "":
		return obj.Error
	case obj.Outcome == applycheck.NotReached && obj.Note != "":
		return obj.Note + " (the dry run says: " + string(obj.DryRun) + ")"
	case obj.Outcome == applycheck.NotReached:
		return "Helm stops at the failed create before it (the dry run says: " + string(obj.DryRun) + ")"
	case len(obj.NotReverted) > 0:
		return "NOT REVERTED, other managers keep: " + applycheck.FieldOwners(obj.NotReverted, " by ")
	case len(obj.Overwrites) > 0:
		return "overwrites, without a conflict: " + applycheck.FieldOwners(obj.Overwrites, " of ")
	}
	return obj.Note
}

func renderResult(w io.Writer, a *applycheck.Report, flagError bool) {
	op := string(a.Operation)
	switch a.Result {
	case applycheck.Succeeds:
		fmt.Fprintf(w, "The %s applies: Helm records revision %d as deployed and revision %d as superseded (before any --wait and post-%s hooks).\n",
			op, a.Record.Revision, a.Record.Previous, op)
		if slices.ContainsFunc(a.Objects, func(o applycheck.Object) bool { return len(o.NotReverted) > 0 }) {
			fmt.Fprintln(w, "It is NOT A REVERT: fields another manager took stay as they are (NOT REVERTED above). "+
				"Fix: roll back with --server-side=false (its three-way merge removes them), or remove them by hand after the rollback.")
		}
		preHooks(w, a)
	case applycheck.Refused:
		fmt.Fprintf(w, "Helm REFUSES the %s before it applies anything or records a revision. It prints:\n  %s\n", op, a.HelmPrints())
		fmt.Fprintln(w, "Fix: use a command line marked \"works\" above, give the object this release's ownership metadata (or delete it), "+
			"or install the CRDs the chart needs; then re-run this check.")
	case applycheck.Fails:
		fmt.Fprintf(w, "The %s FAILS. Helm prints:\n  %s\n", op, a.HelmPrints())
		fmt.Fprintf(w, "It records revision %d as failed; revision %d stays %s.", a.Record.Revision, a.Record.Previous, a.Record.PreviousStatus)
		if len(a.PostUpgradeHooks) > 0 {
			fmt.Fprintf(w, " Post-%s hooks do not run (%s).", op, strings.Join(a.PostUpgradeHooks, ", "))
		}
		fmt.Fprintln(w)
		preHooks(w, a)
		if flagError {
			fmt.Fprintln(w, "Nothing is applied. Fix: run a command line marked \"works\" above.")
			return
		}
		fmt.Fprintln(w, "It is not atomic: without --rollback-on-failure the cluster keeps this partial, mixed state.")
		fmt.Fprintf(w, "  lands anyway: %s\n", listOrNone(a.Landed))
		fmt.Fprintf(w, "  does not land: %s\n", listOrNone(a.NotLanded))
		if slices.ContainsFunc(a.Objects, func(o applycheck.Object) bool { return len(o.StoredVersionsRejected) > 0 }) {
			fmt.Fprintln(w, "Fix: a CRD rejected on status.storedVersions needs its objects migrated off the dropped versions first: "+
				"`"+cmdline.Check{}.String()+"` with the same chart names the migrate commands (runbook: storedversions-rejected).")
		}
		fmt.Fprintln(w, "Fix: a rejected object needs a chart change (an immutable field changes only by deleting and re-creating the object); "+
			"a conflicting field needs its owner settled (take it back with a one-off apply using --force-conflicts, after reading the whole list above, "+
			"or stop the other manager from writing it); then re-run this check.")
	}
}

// renderServerSideMove summarises the same operation with --server-side=true, for an
// operation that runs client-side.
func renderServerSideMove(w io.Writer, s *applycheck.Report) {
	fmt.Fprintf(w, "With --server-side=true instead (moving the release to server-side apply on purpose), the %s %s.\n", s.Operation, s.Result)
	for _, obj := range s.Objects {
		if len(obj.TakenOver) > 0 {
			fmt.Fprintf(w, "  %s: Helm's client-side fields move to its server-side apply: %s\n", obj.Object, strings.Join(obj.TakenOver, ", "))
		}
		if len(obj.Conflicts) > 0 {
			fmt.Fprintf(w, "  %s: CONFLICT: %s\n", obj.Object, applycheck.FieldOwners(obj.Conflicts, " is owned by "))
		}
	}
	if s.Error != "" {
		fmt.Fprintf(w, "  Helm would print: %s\n", s.Error)
	}
}

func preHooks(w io.Writer, a *applycheck.Report) {
	if len(a.PreUpgradeHooks) > 0 {
		fmt.Fprintf(w, "Pre-upgrade hooks run before any object is applied (their outcome is not predicted): %s\n", strings.Join(a.PreUpgradeHooks, ", "))
	}
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ", ")
}

// renderPrune lists what the operation deletes once every apply succeeds, and why
// deleting some of it is dangerous.
func renderPrune(w io.Writer, op applycheck.Operation, p *uninstall.Report) {
	fmt.Fprintf(w, "Objects the %s deletes when every apply succeeds (the new manifest no longer renders them; Helm %s):\n", op, p.HelmVersion)
	for _, o := range p.Objects {
		fmt.Fprintf(w, "  %s  %s: %s\n", o.Action, o.Subject, o.Reason)
	}
	for _, f := range p.Findings {
		fmt.Fprintf(w, "  DANGER [%s] %s: %s\n    fix: %s\n", f.Check, f.Subject, f.Message, f.Remediation)
	}
}
