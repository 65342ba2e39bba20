package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/getter"
	release "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

func newReleaseCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Pre-flight checks for Helm release operations",
	}
	cmd.AddCommand(newApplyCheckCmd(streams, kube))
	cmd.AddCommand(newUninstallCheckCmd(streams, kube))
	cmd.AddCommand(newDiffFailedCmd(streams, kube))
	cmd.AddCommand(newReleaseMigrateCmd(streams, kube))
	return cmd
}

type applyCheckOptions struct {
	checkOptions
	fieldManager string
	force        bool
	serverSide   string
}

func newApplyCheckCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &applyCheckOptions{}
	cmd := &cobra.Command{
		Use:   "apply-check NAME --chart REF",
		Short: "Predict object by object what a Helm 4 server-side-apply upgrade does, and the partial state a failed one leaves",
		Long: `apply-check renders the chart (with the release's stored values, or the values given)
and replays Helm 4's upgrade loop against the API server without writing anything: for
each object, in Helm's apply order, a GET and a server-side apply with dryRun=All as the
field manager of the upgrade, without forcing conflicts; then a dry-run delete of each
object the new chart drops. The model is Helm v4.2.1 to v4.3.2 (identical in each).

What it predicts, as Helm does it:
  - a field another manager owns (kubectl-patch after any kubectl patch) rejects that
    object's whole apply; Helm collects the error and goes on: the objects after it are
    still updated and new ones created
  - a create that fails stops Helm there: the objects after it are not touched
  - objects the new chart drops are deleted only when every apply and create succeeded
  - any error records the new revision as failed (the one the upgrade started from keeps
    its status); pre-upgrade hooks have run, post-upgrade hooks do not
  - a new object that exists without this release's ownership, or a kind the cluster
    does not serve, makes Helm refuse the upgrade before it applies or records anything

It prints Helm's own error, what lands and what does not, and the revision Helm records,
and runs the CRD storage-version check. Field managers: helm (Helm 4), helm-controller
with --force-conflicts (Flux, which always forces). Exit codes: 0 safe, 1 findings,
2 could not run.`,
		Example: `  upgradeguard release apply-check app --chart ./charts/app -n apps
  upgradeguard release apply-check flux --chart flux2 --repo https://fluxcd-community.github.io/helm-charts \
    --version 2.18.2 -n flux-system --field-manager helm-controller --force-conflicts -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.release = args[0]
			return o.run(cmd.Context(), streams, kube)
		},
	}
	f := cmd.Flags()
	o.addPredictFlags(f)
	_ = f.MarkHidden("release")
	_ = f.MarkHidden("rollback")
	_ = f.MarkHidden("to-revision")
	f.StringVar(&o.fieldManager, "field-manager", "helm", "field manager of the upgrade: helm, helm-controller, or another name")
	f.BoolVar(&o.force, "force-conflicts", false, "force conflicts as the upgrade will (helm upgrade --force-conflicts; Flux helm-controller always does)")
	f.StringVar(&o.serverSide, "server-side", "auto", "apply method of the upgrade, as helm upgrade --server-side: auto (the last revision's), true or false")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	return cmd
}

type applyCheckReport struct {
	Release   string             `json:"release"`
	Namespace string             `json:"namespace"`
	Apply     *applycheck.Report `json:"apply"`
	CRDCheck  *check.Report      `json:"crdCheck"`
	Safe      bool               `json:"safe"`
}

func (o *applyCheckOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	if o.serverSide != "auto" && o.serverSide != "true" && o.serverSide != "false" {
		return couldNot("unknown --server-side %q: use auto, true or false", o.serverSide)
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	reader, err := helmrelease.NewReader(conn.clientset, conn.namespace, o.helmDriver)
	if err != nil {
		return couldNot("%v", err)
	}
	history, err := reader.History(ctx, o.release)
	if err != nil {
		return classify(err, conn)
	}
	current, err := reader.Current(ctx, o.release)
	if err != nil {
		return classify(err, conn)
	}
	last := history[len(history)-1]
	if o.serverSide == "false" || (o.serverSide == "auto" && last.ApplyMethod != "ssa") {
		return couldNot("the upgrade of release %s applies client-side (--server-side=%s, last revision %d applied with %q): client-side apply overwrites "+
			"fields without conflicts, and apply-check models server-side apply only; if the upgrade will run with --server-side=true, pass --server-side=true",
			o.release, o.serverSide, last.Version, orNone(last.ApplyMethod))
	}
	o.chart.Values, o.chart.BaseValues = o.values, current.Config
	o.chart.ReleaseName, o.chart.Namespace, o.chart.IsUpgrade, o.chart.KubeVersion = o.release, conn.namespace, true, conn.serverVersion
	ch, err := chartsource.Load(ctx, o.chart)
	if err != nil {
		return couldNot("%v", err)
	}
	dyn, err := dynamic.NewForConfig(conn.config)
	if err != nil {
		return couldNot("build client: %v", err)
	}
	mapper, err := kube.ToRESTMapper()
	if err != nil {
		return couldNot("discover API resources: %v", err)
	}
	up := applycheck.Upgrade{Release: o.release, Namespace: conn.namespace, CurrentManifest: current.Manifest, Current: current.Version,
		CurrentStatus: statusOf(current), LastRevision: last.Version, LastStatus: statusOf(last), TargetManifest: ch.Manifest}
	for _, h := range ch.Hooks {
		for _, e := range h.Events {
			switch e {
			case release.HookPreUpgrade:
				up.PreUpgradeHooks = append(up.PreUpgradeHooks, h.Kind+"/"+h.Name)
			case release.HookPostUpgrade:
				up.PostUpgradeHooks = append(up.PostUpgradeHooks, h.Kind+"/"+h.Name)
			}
		}
	}
	redact := append(valueStrings(current.Config), secretStrings(current.Manifest)...)
	redact = append(redact, secretStrings(ch.Manifest)...)
	if vals, err := o.values.MergeValues(getter.All(helmcli.New())); err == nil {
		redact = append(redact, valueStrings(vals)...)
	}
	apply, err := applycheck.Run(ctx, dyn, mapper, up, applycheck.Options{FieldManager: o.fieldManager, Force: o.force, Redact: redact})
	if err != nil {
		return classify(err, conn)
	}
	crd, err := o.predict(ctx, conn)
	if err != nil {
		return err
	}
	rep := &applyCheckReport{Release: o.release, Namespace: conn.namespace, Apply: apply, CRDCheck: crd}
	rep.Safe = apply.Safe && crd.Safe
	if err := renderApplyCheck(streams.Out, o.output, rep); err != nil {
		return couldNot("write output: %v", err)
	}
	if !rep.Safe {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

func statusOf(r *release.Release) string {
	if r.Info == nil {
		return ""
	}
	return r.Info.Status.String()
}

func orNone(s string) string {
	if s == "" {
		return "none recorded: client-side"
	}
	return s
}

// valueStrings lists the string leaves of release values at least 4 characters long: they
// must never reach the output, even inside an API server error.
func valueStrings(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			out = append(out, valueStrings(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, valueStrings(x)...)
		}
	case string:
		if len(v) >= 4 {
			out = append(out, v)
		}
	}
	return out
}

// secretStrings lists the data of every Secret of a manifest, encoded and decoded.
func secretStrings(manifest string) []string {
	objs, _ := applycheck.Objects(manifest)
	var out []string
	for _, obj := range objs {
		if obj.GetKind() != "Secret" || obj.GroupVersionKind().Group != "" {
			continue
		}
		data, _, _ := unstructured.NestedMap(obj.Object, "data")
		for _, v := range data {
			if s, ok := v.(string); ok {
				out = append(out, s)
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					out = append(out, string(b))
				}
			}
		}
		plain, _, _ := unstructured.NestedMap(obj.Object, "stringData")
		for _, v := range plain {
			if s, ok := v.(string); ok {
				out = append(out, s, base64.StdEncoding.EncodeToString([]byte(s)))
			}
		}
	}
	return out
}

var outcomeLabel = map[applycheck.Outcome]string{
	applycheck.Updated: "updated", applycheck.Unchanged: "unchanged", applycheck.Created: "created", applycheck.Conflict: "CONFLICT",
	applycheck.Failed: "FAILS", applycheck.NotReached: "not reached", applycheck.Deleted: "deleted", applycheck.NotDeleted: "not deleted",
	applycheck.Kept: "kept", applycheck.AlreadyGone: "already gone", applycheck.CannotImport: "CANNOT IMPORT", applycheck.NotServed: "NOT SERVED",
}

func renderApplyCheck(w io.Writer, format string, rep *applyCheckReport) error {
	if format == "json" {
		return writeJSON(w, rep)
	}
	a := rep.Apply
	force := "conflicts not forced"
	if a.Force {
		force = "conflicts forced"
	}
	fmt.Fprintf(w, "helm upgrade %s -n %s, server-side apply as %q, %s (modelled on Helm %s):\n", rep.Release, rep.Namespace, a.FieldManager, force, a.HelmVersions)
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP\tOBJECT\tOUTCOME\tDETAIL")
	for _, obj := range a.Objects {
		detail := obj.Note
		switch {
		case len(obj.Conflicts) > 0:
			parts := make([]string, 0, len(obj.Conflicts))
			for _, c := range obj.Conflicts {
				parts = append(parts, fmt.Sprintf("%s is owned by %q", c.Field, c.Manager))
			}
			detail = strings.Join(parts, "; ")
		case obj.Error != "":
			detail = obj.Error
		case obj.Outcome == applycheck.NotReached:
			detail = "Helm stops at the failed create before it (the dry run says: " + string(obj.DryRun) + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", obj.Step, obj.Object, outcomeLabel[obj.Outcome], detail)
	}
	_ = tw.Flush()
	for line := range strings.Lines(table.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	fmt.Fprintln(w)
	switch a.Result {
	case applycheck.Succeeds:
		fmt.Fprintf(w, "The upgrade applies: Helm records revision %d as deployed and revision %d as superseded (before any --wait and post-upgrade hooks).\n",
			a.Record.Revision, a.Record.Previous)
		preHooks(w, a)
	case applycheck.Refused:
		fmt.Fprintln(w, "Helm REFUSES the upgrade before it applies anything or records a revision. It prints:")
		fmt.Fprintf(w, "  Error: UPGRADE FAILED: %s\n", a.Error)
		fmt.Fprintln(w, "Fix: give the object this release's ownership metadata (or delete it), or install the CRDs the chart needs, then re-run this check.")
	case applycheck.Fails:
		fmt.Fprintf(w, "The upgrade FAILS. Helm prints:\n  Error: UPGRADE FAILED: %s\n", a.Error)
		fmt.Fprintf(w, "It records revision %d as failed; revision %d stays %s.", a.Record.Revision, a.Record.Previous, a.Record.PreviousStatus)
		if len(a.PostUpgradeHooks) > 0 {
			fmt.Fprintf(w, " Post-upgrade hooks do not run (%s).", strings.Join(a.PostUpgradeHooks, ", "))
		}
		fmt.Fprintln(w)
		preHooks(w, a)
		fmt.Fprintln(w, "It is not atomic: without --rollback-on-failure the cluster keeps this partial, mixed state.")
		fmt.Fprintf(w, "  lands anyway: %s\n", listOrNone(a.Landed))
		fmt.Fprintf(w, "  does not land: %s\n", listOrNone(a.NotLanded))
		fmt.Fprintln(w, "Fix: settle who owns each conflicting field (take it back with a one-off apply using --force-conflicts, after reading the whole list above, "+
			"or stop the other manager from writing it), or change the chart; then re-run this check.")
	}
	fmt.Fprintln(w)
	return renderText(w, false, rep.CRDCheck)
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
