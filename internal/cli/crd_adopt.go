package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/crdmove"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

type crdAdoptOptions struct {
	from, to   string
	apply      bool
	output     string
	chart      chartsource.Options
	helmDriver *cliflag.HelmDriver
}

func newCRDAdoptCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &crdAdoptOptions{}
	cmd := command("adopt CRD --from NAMESPACE/RELEASE --to NAMESPACE/RELEASE [--chart REF] [--apply]",
		"Move a CRD from one Helm release to another without deleting it or its objects", crdAdoptLong, crdAdoptExample,
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), streams, kube, args[0]) })
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "the release the CRD leaves, `NAMESPACE/RELEASE`")
	f.StringVar(&o.to, "to", "", "the release the CRD joins, `NAMESPACE/RELEASE`")
	f.BoolVar(&o.apply, "apply", false, "write the CRD's metadata (without it, nothing is written: a dry run that prints the plan)")
	cliflag.AddChartSource(f, cliflag.AdoptChart, &o.chart)
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	output.AddFlag(f, &o.output)
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("to")
	cmd.ValidArgsFunction = func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return complete(cmd, toComplete, func(ctx context.Context) ([]string, error) { return crdNames(ctx, kube) })
	}
	return cmd
}

func (o *crdAdoptOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, crd string) error {
	from, err := predict.ParseReleaseRef("from", o.from)
	if err != nil {
		return couldNot("%w", err)
	}
	to, err := predict.ParseReleaseRef("to", o.to)
	if err != nil {
		return couldNot("%w", err)
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	ext, err := apiextclient.NewForConfig(conn.config)
	if err != nil {
		return couldNot("build client: %w", err)
	}
	req := crdmove.Request{CRD: crd, From: from, To: to, Apply: o.apply}
	if o.chart.Ref != "" {
		o.chart.ReleaseName, o.chart.Namespace, o.chart.KubeVersion = to.Name, to.Namespace, conn.serverVersion
		req.ToChart, req.ToChartRef = chartsource.CheckChart(chartsource.Helm{}, o.chart), o.chart.Ref
	}
	res, err := crdmove.Adopt(ctx, crdmove.Clients{CRDs: ext.ApiextensionsV1().CustomResourceDefinitions(), Kube: conn.clientset, Driver: o.helmDriver.Driver()}, req)
	var refused *crdmove.RefusedError
	var load *chartsource.LoadError
	switch {
	case errors.As(err, &refused):
		return couldNot("%w", err)
	case errors.As(err, &load):
		return chartFailed(cmdCRDAdopt, err)
	case err != nil:
		return classifyAs(cmdCRDAdopt, err, conn)
	}
	return finish(streams, o.output, res, func(w io.Writer) error { return crdAdoptText(w, res) }, false)
}

func crdAdoptText(w io.Writer, res *crdmove.Result) error {
	m := res.Move
	fmt.Fprintf(w, "Move CRD %s (kind %s) from release %s to release %s\n", m.CRD, res.Kind, m.From, m.To)
	switch {
	case res.FromRenders:
		fmt.Fprintf(w, "  release %s renders it today (revision %d): its next upgrade without it deletes it unless it is kept\n", m.From, res.FromRevision)
	case res.FromRevision > 0:
		fmt.Fprintf(w, "  release %s no longer renders it (revision %d)\n", m.From, res.FromRevision)
	}
	fmt.Fprintf(w, "  %s renders it from templates/\n", res.RenderedBy)
	switch {
	case res.DryRun && len(res.Pending()) > 0:
		fmt.Fprintln(w, "\nDRY RUN: nothing was written. --apply writes the steps on the live CRD below, in one patch of its metadata (its objects are not touched).")
	case res.Changed:
		fmt.Fprintln(w, "\nWRITTEN: the live CRD's metadata now carries the steps below (its objects were not touched).")
	default:
		fmt.Fprintln(w, "\nNothing to write: the live CRD already carries every step below.")
	}
	fmt.Fprintln(w, "\nOn the live CRD:")
	n := 0
	for _, s := range res.Steps {
		if !s.Metadata {
			continue
		}
		n++
		state := "to do"
		if s.Done {
			state = "done"
		}
		fmt.Fprintf(w, "  %d. [%s] %s\n       %s\n", n, state, s.Command, s.Why)
	}
	fmt.Fprintln(w, "\nThen, in this order:")
	for _, s := range res.Steps {
		if s.Metadata {
			continue
		}
		n++
		fmt.Fprintf(w, "  %d. %s\n       %s\n", n, s.Command, s.Why)
	}
	return nil
}

const crdAdoptLong = `adopt moves a CRD from one Helm release to another without deleting it or its objects:
the fix for a chart that moves its CRDs to a new chart (an operator chart split into
NAME and NAME-crds) or to a sibling chart.

Helm alone loses the CRD either way. The release the CRD leaves deletes it, with every
object of its type, at its next upgrade. The release it joins refuses it, "invalid
ownership metadata", because the CRD's ownership names the other release. adopt does
what makes both work, in the order that works:

  1. keep it on the side it leaves: helm.sh/resource-policy=keep on the live CRD, which
     Helm reads when an upgrade drops an object;
  2. point Helm's ownership annotations at the release it joins
     (meta.helm.sh/release-name, meta.helm.sh/release-namespace);
  3. set the label app.kubernetes.io/managed-by=Helm, which Helm's check also reads.

and then prints what to run: install or upgrade the release it joins (the CRD enters its
manifest, and its upgrades update it from then on), then upgrade the release it leaves
(Helm leaves the CRD, kept).

Before writing, adopt checks that the release the CRD joins renders it from templates/:
the chart named with --chart (with the values given), or that release's installed
revision. It refuses a chart that does not render it, or ships it in crds/ (never part of
a release), and a CRD whose ownership names a third release. Without --apply nothing is
written: it prints the plan. With --apply, the three steps go in one patch of the CRD's
metadata that fails, writing nothing, if the CRD changed meanwhile. Running it again
finds every step done and writes nothing. No object is ever written or deleted.

The keep annotation stays: it also keeps the CRD if the release it joins ever stops
rendering it.

Exit codes: 0 planned or written, 2 refused or could not run (nothing was written).`

const crdAdoptExample = `  # The Piraeus CRDs move from piraeus-operator to the new piraeus-operator-crds chart
  upgradeguard crd adopt linstorclusters.piraeus.io --from piraeus/piraeus-operator \
    --to piraeus/piraeus-operator-crds --chart piraeus-charts/piraeus-operator-crds
  upgradeguard crd adopt linstorclusters.piraeus.io --from piraeus/piraeus-operator \
    --to piraeus/piraeus-operator-crds --chart piraeus-charts/piraeus-operator-crds --apply

  # The release it joins is installed already and renders the CRD; as JSON
  upgradeguard crd adopt widgets.example.io --from apps/widgets --to apps/widgets-crds --apply -o json`
