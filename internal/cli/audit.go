package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

type auditOptions struct {
	allNamespaces bool
	registry      string
	helmDriver    *cliflag.HelmDriver
	output        string
	fleet         string
	fleetKey      string
	fleetTimeout  time.Duration
}

func newAuditCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &auditOptions{}
	cmd := command("audit [-A | -n NAMESPACE]", "Report which releases' CRDs are protected from storedVersions failures, and by whom", auditLong, auditExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	o.addFlags(cmd.Flags())
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	return cmd
}

func (o *auditOptions) addFlags(f *pflag.FlagSet) {
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "audit every namespace (default: the namespace of -n or the kubeconfig)")
	f.StringVar(&o.registry, "registry", "", "chart registry file that extends the built-in one; an entry replaces the built-in entry of the same name")
	output.AddReportFlag(f, &o.output)
	f.StringVar(&o.fleet, "fleet", "", "audit the target clusters whose kubeconfig Secrets (in the -n namespace) match this label selector")
	f.StringVar(&o.fleetKey, "fleet-key", "", "Secret key holding the kubeconfig (default: value, value.yaml, then kubeconfig)")
	f.DurationVar(&o.fleetTimeout, "fleet-timeout", time.Minute, "time allowed to audit one target cluster")
}

func (o *auditOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if o.fleet != "" && output.Validate(o.output) != nil {
		return couldNot("-o %s renders findings, and audit --fleet reports clusters: use -o text or -o json", o.output)
	}
	reg, err := registry.Load(o.registry)
	if err != nil {
		return couldNot("%w", err)
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	if o.fleet != "" {
		return o.runFleet(ctx, streams, conn, reg)
	}
	src, err := audit.NewSources(conn.config, o.helmDriver.Driver())
	if err != nil {
		return couldNot("%w", err)
	}
	opts := audit.Options{Namespace: conn.namespace, Registry: reg}
	if o.allNamespaces {
		opts.Namespace = ""
	}
	rep, err := audit.Run(ctx, src, opts)
	if err != nil {
		return classifyAs(cmdAudit, err, conn)
	}
	return finishReport(streams, o.output, rep, func(w io.Writer) error { return renderAudit(w, rep) }, rep.FindingReport, rep.Unprotected())
}

func (o *auditOptions) runFleet(ctx context.Context, streams Streams, conn *connection, reg *registry.Registry) error {
	sel, err := labels.Parse(o.fleet)
	if err != nil {
		return couldNot("--fleet %q is not a label selector: %w (for example --fleet fleet=prod)", o.fleet, err)
	}
	platform, err := audit.NewPlatform(conn.config)
	if err != nil {
		return couldNot("%w", err)
	}
	fo := audit.FleetOptions{Namespace: conn.namespace, Selector: sel, Key: o.fleetKey, Timeout: o.fleetTimeout, HelmDriver: o.helmDriver.Driver(),
		Audit: audit.Options{Namespace: conn.namespace, Registry: reg}}
	if o.allNamespaces {
		fo.Audit.Namespace = ""
	}
	rep, err := audit.RunFleet(ctx, platform, fo)
	if err != nil {
		return classifyAs(cmdAuditFleet, err, conn)
	}
	return finish(streams, o.output, rep, func(w io.Writer) error { return renderFleetAudit(w, rep) }, rep.NeedsAction > 0)
}

func renderFleetAudit(w io.Writer, rep *audit.FleetReport) error {
	fmt.Fprintf(w, "Fleet audit: %d cluster(s) from the kubeconfig Secrets in %s matching %q.\n", len(rep.Clusters), rep.Namespace, rep.Selector)
	for _, c := range rep.Clusters {
		fmt.Fprintf(w, "\n%s (Secret %s)\n", c.Name, c.Secret)
		t := output.NewTable(w)
		fleetCluster(t, c)
		if err := t.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\n%d of %d cluster(s) need action.\n", rep.NeedsAction, len(rep.Clusters))
	return nil
}

// fleetCluster is one target cluster's block.
func fleetCluster(t *output.Table, c audit.ClusterReport) {
	if c.Error != "" {
		t.Row("  error", c.Error)
	} else {
		fleetFindings(t, c)
	}
	t.Row("  last migration", lastMigration(c.LastMigration))
	action := "no"
	if c.NeedsAction {
		action = "YES"
	}
	t.Row("  needs action", action)
}

func fleetFindings(t *output.Table, c audit.ClusterReport) {
	if len(c.PendingCRDs) == 0 {
		t.Row("  pending CRDs", "none")
	}
	for _, p := range c.PendingCRDs {
		t.Row("  pending CRD", fmt.Sprintf("%s: storedVersions %v, storage version %s%s", p.Name, p.StoredVersions, p.StorageVersion, migratingNote(p.MigratingBy)))
	}
	unprotected := "none"
	if len(c.Unprotected) > 0 {
		unprotected = strings.Join(c.Unprotected, ", ")
	}
	t.Row("  unprotected", fmt.Sprintf("%s (coverage %s)", unprotected, c.Coverage))
}

func lastMigration(m *audit.MigrationOutcome) string {
	if m == nil {
		return "none"
	}
	line := fmt.Sprintf("%s %s at %s", m.Name, m.Phase, m.Time.UTC().Format(time.RFC3339))
	if m.Message != "" {
		line += ": " + m.Message
	}
	return line
}

func renderAudit(w io.Writer, rep *audit.Report) error {
	auditHeader(w, rep)
	for _, r := range rep.Releases {
		fmt.Fprintf(w, "\n%s\n", r.Subject)
		if err := auditRelease(w, r); err != nil {
			return err
		}
	}
	if err := auditApplications(w, rep); err != nil {
		return err
	}
	for _, warn := range rep.Warnings {
		fmt.Fprintf(w, "\nWarning: %s\n", warn)
	}
	s := rep.Summary
	fmt.Fprintf(w, "\nCoverage: %s releases that ship CRDs are protected (upgrade %d/%d, rollback %d/%d).\n",
		s.Coverage, s.UpgradeProtected, s.ShipCRDs, s.RollbackProtected, s.ShipCRDs)
	if s.Applications > 0 {
		fmt.Fprintf(w, "Argo CD: %d/%d Applications that deploy CRDs are protected.\n", s.ApplicationsProtected, s.Applications)
	}
	return nil
}

// auditApplications lists the Argo CD Applications that deploy CRDs, each with who
// protects its sync.
func auditApplications(w io.Writer, rep *audit.Report) error {
	if len(rep.Applications) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nArgo CD Applications that deploy CRDs: %d. CRD gate: %s.\n", len(rep.Applications), rep.CRDGate.Reason)
	for _, a := range rep.Applications {
		fmt.Fprintf(w, "\n%s\n", a.Subject)
		t := output.NewTable(w)
		t.Row("  source", orDash(a.Source))
		t.Row("  crds", strconv.Itoa(len(a.CRDs)))
		if len(a.Migrations) > 0 {
			t.Row("  bundled", "StorageVersionMigration "+strings.Join(a.Migrations, ", "))
		}
		mechanismRows(t, a.Mechanisms)
		t.Row("  sync", protection(a.Sync))
		for _, f := range a.Findings {
			t.Row("  "+string(f.Severity), f.Check+": "+f.Message)
		}
		for _, n := range a.Notes {
			t.Row("  note", n)
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func auditHeader(w io.Writer, rep *audit.Report) {
	scope := "all namespaces"
	if rep.Scope != "" {
		scope = "namespace " + rep.Scope
	}
	fmt.Fprintf(w, "Audit of %s: %d release(s).\n", scope, len(rep.Releases))
	fmt.Fprintf(w, "Controller: %s.\n", rep.Controller.Reason)
	policies := "none"
	if len(rep.Policies) > 0 {
		policies = strings.Join(rep.Policies, ", ")
	}
	fmt.Fprintf(w, "Proactive policies: %s.\n", policies)
}

// auditRelease is one release's block: a two-column table.
func auditRelease(w io.Writer, r audit.Release) error {
	t := output.NewTable(w)
	t.Row("  chart", auditChart(r))
	if !r.ShipsCRDs {
		t.Row("  crds", "none: nothing to protect")
		return t.Flush()
	}
	crds := "unknown"
	if len(r.CRDs) > 0 {
		crds = strconv.Itoa(len(r.CRDs))
	}
	t.Row("  crds", crds)
	auditMechanisms(t, r)
	auditVerdict(t, r)
	return t.Flush()
}

// auditVerdict is who protects the upgrade and the rollback, and the findings.
func auditVerdict(t *output.Table, r audit.Release) {
	t.Row("  upgrade", protection(r.Upgrade))
	t.Row("  rollback", protection(r.Rollback))
	for _, f := range r.Findings {
		t.Row("  "+string(f.Severity), f.Check+": "+f.Message)
	}
	for _, n := range r.Notes {
		t.Row("  note", n)
	}
}

func auditChart(r audit.Release) string {
	chart := r.Chart + " " + r.Version
	if r.HelmRelease != "" {
		chart += fmt.Sprintf(" (Helm release %s, revision %d)", r.HelmRelease, r.Revision)
	} else if r.Revision > 0 {
		chart += fmt.Sprintf(" (revision %d)", r.Revision)
	}
	if !r.Known && r.Chart != "" {
		chart += ", not in the registry"
		if r.ShipsCRDs {
			chart += " (add an entry with --registry FILE)"
		}
	}
	return chart
}

func auditMechanisms(t *output.Table, r audit.Release) {
	if len(r.Mechanisms) == 0 {
		t.Row("  mechanism", "none")
		return
	}
	t.Row("  values", r.ValuesSource)
	mechanismRows(t, r.Mechanisms)
}

func mechanismRows(t *output.Table, mechanisms []audit.Mechanism) {
	for _, m := range mechanisms {
		keys := make([]string, len(m.Keys))
		for i, k := range m.Keys {
			keys[i] = fmt.Sprintf("%s=%v (%s)", k.Key, k.Value, k.Source)
		}
		t.Row("  mechanism", fmt.Sprintf("%s: %s, %s, %s; %s", m.Name, strings.Join(m.Hooks, ","), m.Action, mechanismState(m), strings.Join(keys, ", ")))
	}
}

func mechanismState(m audit.Mechanism) string {
	switch {
	case !m.Exists:
		return "not in this version"
	case m.On:
		return "on"
	}
	return "off"
}

func protection(p audit.Protection) string {
	if !p.Protected {
		return "UNPROTECTED"
	}
	return "protected by " + strings.Join(p.By, " and ")
}

const auditLong = `audit reads every Flux HelmRelease and Helm release (with its stored chart and values)
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

Argo CD Applications whose resource tree (status.resources) holds CRDs are listed too, with
who protects a sync that drops a stored version: upgradeguard's CRD gate (its webhook
crd.upgradeguard.io installed and the controller running), a StorageVersionMigration the
Application deploys (with a warning: it runs once per name and cannot help the sync that
drops the old version), or an upstream hook (a pre-upgrade hook runs as a PreSync hook;
Argo CD never runs rollback hooks). Without Argo CD's Application CRD nothing is said of it.

The last line is the coverage: protected releases / releases that ship CRDs. A release is
protected when both its upgrade and its rollback are. Exit codes: 0 every release that
ships CRDs (and every Argo CD Application that deploys CRDs) is protected, 1 some are not,
2 could not run.

With --fleet SELECTOR, audit reads the kubeconfig Secrets that the label selector picks in
the namespace (-n, else the kubeconfig's) of the platform cluster, in the layouts a
StorageMigrationPolicy's spec.targets reads (Flux value or value.yaml, Cluster API
<cluster>-kubeconfig, a plain kubeconfig key), and reports for each target cluster: CRDs
with pending storedVersions, releases that ship CRDs and are protected neither by an
upstream hook nor by upgradeguard (the platform's controller and the proactive policies
whose spec.targets select the cluster), and the cluster's last StorageMigration. Every
cluster is audited at once, each within --fleet-timeout; one that cannot be reached is
reported as such. Exit codes: 0 no cluster needs action, 1 some do (including one that
could not be audited), 2 the platform cluster could not be read.`

const auditExample = `  # Every namespace
  upgradeguard audit -A

  # One namespace, as JSON
  upgradeguard audit -n flux-system -o json

  # With your own chart entries added to the built-in registry (see docs/registry.md)
  upgradeguard audit -A --registry platform-charts.yaml

  # Every target cluster whose kubeconfig Secret in fleet-system is labelled fleet=prod
  upgradeguard audit --fleet fleet=prod -n fleet-system -A -o json`

// migratingNote says which StorageVersionMigrations are migrating a pending CRD now.
func migratingNote(by []string) string {
	if len(by) == 0 {
		return ""
	}
	return "; migrating now (StorageVersionMigration " + strings.Join(by, ", ") + ")"
}
