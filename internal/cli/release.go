package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"
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
}

func newApplyCheckCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &applyCheckOptions{}
	cmd := &cobra.Command{
		Use:   "apply-check NAME --chart REF",
		Short: "Predict server-side-apply conflicts of a Helm 4 upgrade, and the partial state it would leave",
		Long: `apply-check renders the chart (with the release's stored values, or the values given)
and dry-runs a server-side apply of every object, in Helm's apply order, as the field
manager that will run the upgrade and without forcing conflicts. It writes nothing.

A field that another manager owns (for example kubectl-patch, after any kubectl patch)
makes a real Helm 4 upgrade stop at that object with the objects before it already
applied. apply-check names each conflicting field and its manager, the object the upgrade
would stop at, and that partial state. It also lists the objects the upgrade deletes and
runs the CRD storage-version check.

Field managers: helm (Helm 4, conflicts fail), helm-controller with --force-conflicts
(Flux, which always forces). Exit codes: 0 safe, 1 findings, 2 could not run.`,
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
	f.BoolVar(&o.force, "force-conflicts", false, "force conflicts as the upgrade will (Flux helm-controller does)")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	return cmd
}

type applyCheckReport struct {
	Release  string             `json:"release"`
	Apply    *applycheck.Report `json:"apply"`
	Deletes  []string           `json:"deletes"`
	CRDCheck *check.Report      `json:"crdCheck"`
	Safe     bool               `json:"safe"`
}

func (o *applyCheckOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	reader, err := helmrelease.NewReader(conn.clientset, conn.namespace, o.helmDriver)
	if err != nil {
		return couldNot("%v", err)
	}
	current, err := reader.Current(ctx, o.release)
	if err != nil {
		return classify(err, conn)
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
	apply, err := applycheck.Run(ctx, dyn, mapper, ch.Manifest, applycheck.Options{FieldManager: o.fieldManager, Force: o.force, Namespace: conn.namespace})
	if err != nil {
		return classify(err, conn)
	}
	crd, err := o.predict(ctx, conn)
	if err != nil {
		return err
	}
	rep := &applyCheckReport{Release: o.release, Apply: apply, CRDCheck: crd, Deletes: deletes(current.Manifest, ch.Manifest)}
	rep.Safe = apply.Safe && crd.Safe
	if err := renderApplyCheck(streams.Out, o.output, rep); err != nil {
		return couldNot("write output: %v", err)
	}
	if !rep.Safe {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

// deletes lists the objects of the current manifest the new one no longer renders.
func deletes(current, next string) []string {
	keep := applycheck.Subjects(next)
	out := []string{}
	for _, s := range applycheck.Subjects(current) {
		if !slices.Contains(keep, s) {
			out = append(out, s)
		}
	}
	return out
}

func renderApplyCheck(w io.Writer, format string, rep *applyCheckReport) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	a := rep.Apply
	if a.Safe {
		fmt.Fprintf(w, "Server-side apply as %q: every object applies (%d checked).\n", a.FieldManager, len(a.Objects))
	} else {
		fmt.Fprintf(w, "Server-side apply as %q: BLOCKED at %s\n", a.FieldManager, a.StopsAt)
		for _, obj := range a.Objects {
			switch obj.Status {
			case applycheck.Conflicts:
				for _, c := range obj.Conflicts {
					fmt.Fprintf(w, "  conflict  %s  field %s is owned by %q\n", obj.Object, c.Field, c.Manager)
				}
			case applycheck.Fails:
				fmt.Fprintf(w, "  error     %s  %s\n", obj.Object, obj.Error)
			}
		}
		fmt.Fprintf(w, "A real upgrade would stop at %s, leaving these applied (a partial state):\n", a.StopsAt)
		for _, s := range a.PartialState {
			fmt.Fprintf(w, "  %s\n", s)
		}
		fmt.Fprintln(w, "Fix: take the fields back (remove the other manager's entry or apply with --force-conflicts once), or drop the change from the chart.")
	}
	if len(rep.Deletes) > 0 {
		fmt.Fprintf(w, "\nThe upgrade deletes %d object(s) the new chart no longer renders:\n", len(rep.Deletes))
		for _, d := range rep.Deletes {
			fmt.Fprintf(w, "  %s\n", d)
		}
	}
	fmt.Fprintln(w)
	return renderText(w, false, rep.CRDCheck)
}
