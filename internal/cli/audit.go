package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

type auditOptions struct {
	allNamespaces bool
	registry      string
	helmDriver    string
	output        string
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
ships CRDs is protected, 1 some are not, 2 could not run.`,
		Example: `  # Every namespace
  upgradeguard audit -A

  # One namespace, as JSON
  upgradeguard audit -n flux-system -o json

  # With your own chart entries added to the built-in registry (see docs/registry.md)
  upgradeguard audit -A --registry platform-charts.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), streams, kube)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "audit every namespace (default: the namespace of -n or the kubeconfig)")
	f.StringVar(&o.registry, "registry", "", "chart registry file that extends the built-in one; an entry replaces the built-in entry of the same name")
	f.StringVar(&o.helmDriver, "helm-driver", os.Getenv("HELM_DRIVER"), "Helm release storage: secret or configmap (default $HELM_DRIVER, else secret)")
	output.AddFlag(f, &o.output)
	return cmd
}

func (o *auditOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	reg, err := registry.Load(o.registry)
	if err != nil {
		return couldNot("%w", err)
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
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
		return classifyAs(cmdAudit, err, conn)
	}
	if err := output.Write(streams.Out, o.output, rep, func(w io.Writer) error { return renderAudit(w, rep) }); err != nil {
		return couldNot("write output: %w", err)
	}
	if rep.Unprotected() {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

func renderAudit(w io.Writer, rep *audit.Report) error {
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
			fmt.Fprintf(tw, "  %s\t%s: %s\n", f.Severity, f.Check, f.Message)
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
