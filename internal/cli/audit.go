package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

type auditOptions struct {
	allNamespaces bool
	registry      string
	helmDriver    string
	output        string
	fleet         string
	fleetKey      string
	fleetTimeout  time.Duration
}

func newAuditCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &auditOptions{}
	cmd := &cobra.Command{
		Use:   "audit [-A | -n NAMESPACE]",
		Short: "Report which releases' CRDs are protected from storedVersions failures, and by whom",
		Long: `audit reads every Flux HelmRelease and Helm release (with its stored chart and values)
and says, for each release that ships CRDs, who protects its upgrades and rollbacks from a
status.storedVersions rejection:

  upstream hook   the chart's own migration hook (from the chart registry) is switched on
                  by the release's values, runs before the operation and migrates objects
  upgradeguard    upgradeguard's controller is running (its Lease upgradeguard-controller
                  is held) and proactive StorageMigrationPolicies select every CRD
  nobody          neither

It flags settings that switch protection off or endanger CRDs: Flux disableHooks on
upgrade or rollback, a post-upgrade hook where a pre-upgrade one is needed, crds: Skip,
and destructive hooks such as velero's cleanUpCRDs. Only the values of the registry's
keys are shown; no other release value, and no Secret data, is printed.

The last line is the coverage: protected releases / releases that ship CRDs. A release is
protected when both its upgrade and its rollback are. Exit codes: 0 every release that
ships CRDs is protected, 1 some are not, 2 could not run.

With --fleet SELECTOR, audit reads the kubeconfig Secrets that the label selector picks in
the namespace (-n, else the kubeconfig's) of the platform cluster, in the layouts a
StorageMigrationPolicy's spec.targets reads (Flux value or value.yaml, Cluster API
<cluster>-kubeconfig, a plain kubeconfig key), and reports for each target cluster: CRDs
with pending storedVersions, releases that ship CRDs and are protected neither by an
upstream hook nor by upgradeguard (the platform's controller and the proactive policies
whose spec.targets select the cluster), and the cluster's last StorageMigration. Every
cluster is audited at once, each within --fleet-timeout; one that cannot be reached is
reported as such. Exit codes: 0 no cluster needs action, 1 some do (including one that
could not be audited), 2 the platform cluster could not be read.`,
		Example: `  # Every namespace
  upgradeguard audit -A

  # One namespace, as JSON
  upgradeguard audit -n flux-system -o json

  # With your own chart entries added to the built-in registry (see docs/registry.md)
  upgradeguard audit -A --registry platform-charts.yaml

  # Every target cluster whose kubeconfig Secret in fleet-system is labelled fleet=prod
  upgradeguard audit --fleet fleet=prod -n fleet-system -A -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), streams, kube)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "audit every namespace (default: the namespace of -n or the kubeconfig)")
	f.StringVar(&o.registry, "registry", "", "chart registry file that extends the built-in one; an entry replaces the built-in entry of the same name")
	f.StringVar(&o.helmDriver, "helm-driver", os.Getenv("HELM_DRIVER"), "Helm release storage: secret or configmap (default $HELM_DRIVER, else secret)")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	f.StringVar(&o.fleet, "fleet", "", "audit the target clusters whose kubeconfig Secrets (in the -n namespace) match this label selector")
	f.StringVar(&o.fleetKey, "fleet-key", "", "Secret key holding the kubeconfig (default: value, value.yaml, then kubeconfig)")
	f.DurationVar(&o.fleetTimeout, "fleet-timeout", time.Minute, "time allowed to audit one target cluster")
	return cmd
}

func (o *auditOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if o.output != "text" && o.output != "json" {
		return couldNot("unknown output format %q: use -o text or -o json", o.output)
	}
	reg, err := registry.Load(o.registry)
	if err != nil {
		return couldNot("%v", err)
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	if o.fleet != "" {
		return o.runFleet(ctx, streams, conn, reg)
	}
	clients, err := kubeclient.New(conn.config)
	if err != nil {
		return couldNot("build client: %v", err)
	}
	dyn, err := dynamic.NewForConfig(conn.config)
	if err != nil {
		return couldNot("build client: %v", err)
	}
	md, err := metadata.NewForConfig(conn.config)
	if err != nil {
		return couldNot("build client: %v", err)
	}
	opts := audit.Options{Namespace: conn.namespace, Registry: reg}
	if o.allNamespaces {
		opts.Namespace = ""
	}
	// spec.valuesFrom names ConfigMaps and Secrets: read them as helm-controller does.
	objects, err := client.New(conn.config, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return couldNot("build client: %v", err)
	}
	src := audit.Sources{Dynamic: dyn, Metadata: md, Leases: clients.Leases, Releases: audit.HelmStorage{Clientset: conn.clientset, Driver: o.helmDriver},
		Objects: objects}
	rep, err := audit.Run(ctx, src, opts)
	if err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return couldNot("%v\nupgradeguard audit needs list on helmreleases.helm.toolkit.fluxcd.io, on the Helm release Secrets (or ConfigMaps), on storagemigrationpolicies.upgradeguard.io, customresourcedefinitions and leases; see docs/cli.md#audit", err)
		}
		return classify(err, conn)
	}
	if err := renderAudit(streams.Out, o.output, rep); err != nil {
		return couldNot("write output: %v", err)
	}
	if rep.Unprotected() {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

func (o *auditOptions) runFleet(ctx context.Context, streams Streams, conn *connection, reg *registry.Registry) error {
	sel, err := labels.Parse(o.fleet)
	if err != nil {
		return couldNot("--fleet %q is not a label selector: %v (for example --fleet fleet=prod)", o.fleet, err)
	}
	dyn, err := dynamic.NewForConfig(conn.config)
	if err != nil {
		return couldNot("build client: %v", err)
	}
	fo := audit.FleetOptions{Namespace: conn.namespace, Selector: sel, Key: o.fleetKey, Timeout: o.fleetTimeout, HelmDriver: o.helmDriver,
		Audit: audit.Options{Namespace: conn.namespace, Registry: reg}}
	if o.allNamespaces {
		fo.Audit.Namespace = ""
	}
	rep, err := audit.RunFleet(ctx, audit.Platform{Clientset: conn.clientset, Dynamic: dyn, Leases: conn.clientset.CoordinationV1()}, fo)
	if err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return couldNot("%v\nupgradeguard audit --fleet needs list on Secrets in %s, and on leases and storagemigrationpolicies.upgradeguard.io and storagemigrations.upgradeguard.io; see docs/cli.md#audit", err, conn.namespace)
		}
		return classify(err, conn)
	}
	if err := renderFleetAudit(streams.Out, o.output, rep); err != nil {
		return couldNot("write output: %v", err)
	}
	if rep.NeedsAction > 0 {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

func renderFleetAudit(w io.Writer, format string, rep *audit.FleetReport) error {
	if format == "json" {
		return writeJSON(w, rep)
	}
	fmt.Fprintf(w, "Fleet audit: %d cluster(s) from the kubeconfig Secrets in %s matching %q.\n", len(rep.Clusters), rep.Namespace, rep.Selector)
	for _, c := range rep.Clusters {
		fmt.Fprintf(w, "\n%s (Secret %s)\n", c.Name, c.Secret)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if c.Error != "" {
			fmt.Fprintf(tw, "  error\t%s\n", c.Error)
		} else {
			if len(c.PendingCRDs) == 0 {
				fmt.Fprintf(tw, "  pending CRDs\tnone\n")
			}
			for _, p := range c.PendingCRDs {
				fmt.Fprintf(tw, "  pending CRD\t%s: storedVersions %v, storage version %s\n", p.Name, p.StoredVersions, p.StorageVersion)
			}
			if len(c.Unprotected) == 0 {
				fmt.Fprintf(tw, "  unprotected\tnone (coverage %s)\n", c.Coverage)
			} else {
				fmt.Fprintf(tw, "  unprotected\t%s (coverage %s)\n", strings.Join(c.Unprotected, ", "), c.Coverage)
			}
		}
		if m := c.LastMigration; m != nil {
			line := fmt.Sprintf("%s %s at %s", m.Name, m.Phase, m.Time.UTC().Format(time.RFC3339))
			if m.Message != "" {
				line += ": " + m.Message
			}
			fmt.Fprintf(tw, "  last migration\t%s\n", line)
		} else {
			fmt.Fprintf(tw, "  last migration\tnone\n")
		}
		action := "no"
		if c.NeedsAction {
			action = "YES"
		}
		fmt.Fprintf(tw, "  needs action\t%s\n", action)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\n%d of %d cluster(s) need action.\n", rep.NeedsAction, len(rep.Clusters))
	return nil
}

func renderAudit(w io.Writer, format string, rep *audit.Report) error {
	if format == "json" {
		return writeJSON(w, rep)
	}
	scope := "all namespaces"
	if rep.Scope != "" {
		scope = "namespace " + rep.Scope
	}
	fmt.Fprintf(w, "Audit of %s: %d release(s).\n", scope, len(rep.Releases))
	fmt.Fprintf(w, "Controller: %s.\n", rep.Controller.Reason)
	if len(rep.Policies) > 0 {
		fmt.Fprintf(w, "Proactive policies: %s.\n", strings.Join(rep.Policies, ", "))
	} else {
		fmt.Fprintln(w, "Proactive policies: none.")
	}
	for _, r := range rep.Releases {
		fmt.Fprintf(w, "\n%s\n", r.Subject)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		chart := r.Chart + " " + r.Version
		if r.HelmRelease != "" {
			chart += fmt.Sprintf(" (Helm release %s, revision %d)", r.HelmRelease, r.Revision)
		} else if r.Revision > 0 {
			chart += fmt.Sprintf(" (revision %d)", r.Revision)
		}
		if !r.Known && r.Chart != "" {
			chart += ", not in the registry"
		}
		fmt.Fprintf(tw, "  chart\t%s\n", chart)
		if !r.ShipsCRDs {
			fmt.Fprintf(tw, "  crds\tnone: nothing to protect\n")
			_ = tw.Flush()
			continue
		}
		if len(r.CRDs) > 0 {
			fmt.Fprintf(tw, "  crds\t%d\n", len(r.CRDs))
		} else {
			fmt.Fprintf(tw, "  crds\tunknown\n")
		}
		if len(r.Mechanisms) > 0 {
			fmt.Fprintf(tw, "  values\t%s\n", r.ValuesSource)
		}
		for _, m := range r.Mechanisms {
			state := "off"
			switch {
			case !m.Exists:
				state = "not in this version"
			case m.On:
				state = "on"
			}
			keys := make([]string, len(m.Keys))
			for i, k := range m.Keys {
				keys[i] = fmt.Sprintf("%s=%v (%s)", k.Key, k.Value, k.Source)
			}
			fmt.Fprintf(tw, "  mechanism\t%s: %s, %s, %s; %s\n", m.Name, strings.Join(m.Hooks, ","), m.Action, state, strings.Join(keys, ", "))
		}
		if len(r.Mechanisms) == 0 {
			fmt.Fprintf(tw, "  mechanism\tnone\n")
		}
		fmt.Fprintf(tw, "  upgrade\t%s\n", protection(r.Upgrade))
		fmt.Fprintf(tw, "  rollback\t%s\n", protection(r.Rollback))
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "  %s\t%s: %s\n", f.Severity, f.Code, f.Message)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(tw, "  note\t%s\n", n)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, warn := range rep.Warnings {
		fmt.Fprintf(w, "\nWarning: %s\n", warn)
	}
	s := rep.Summary
	fmt.Fprintf(w, "\nCoverage: %s releases that ship CRDs are protected (upgrade %d/%d, rollback %d/%d).\n",
		s.Coverage, s.UpgradeProtected, s.ShipCRDs, s.RollbackProtected, s.ShipCRDs)
	return nil
}

func protection(p audit.Protection) string {
	if !p.Protected {
		return "UNPROTECTED"
	}
	return "protected by " + strings.Join(p.By, " and ")
}
