package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

type uninstallCheckOptions struct {
	helmVersion string
	helmDriver  *cliflag.HelmDriver
	output      string
	backup      string
}

func newUninstallCheckCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &uninstallCheckOptions{}
	cmd := command("uninstall-check NAME", "Predict what helm uninstall deletes, keeps or skips, and the traps that lose data", uninstallCheckLong, uninstallCheckExample, cobra.ExactArgs(1),
		func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), streams, kube, args[0]) })
	o.addFlags(cmd.Flags())
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	return cmd
}

func (o *uninstallCheckOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.helmVersion, "helm-version", uninstall.DefaultHelmVersion, "version of the Helm that will run the uninstall (4.3 and newer skip objects whose live ownership does not name the release)")
	output.AddReportFlag(f, &o.output)
	f.StringVar(&o.backup, "backup", "", "write the release's Secrets, PVCs and PVs (sanitised for re-apply) to this new directory")
}

// uninstallCheckOutput is the JSON output: the report, and the backup when taken.
type uninstallCheckOutput struct {
	*uninstall.Report
	BackupDir string                  `json:"backupDir,omitempty"`
	Backup    *uninstall.BackupResult `json:"backup,omitempty"`
}

func (o *uninstallCheckOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, release string) error {
	if _, _, err := uninstall.VerifiesOwnership(o.helmVersion); err != nil {
		return couldNot("--helm-version: %w", err)
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	c, opts, rep, err := o.check(ctx, conn, release)
	if err != nil {
		return err
	}
	out := &uninstallCheckOutput{Report: rep}
	backupErr := o.takeBackup(ctx, c, opts, out)
	if err := finishReport(streams, o.output, out, out.text, rep.FindingReport, !rep.Safe); backupErr == nil {
		return err
	}
	return backupErr
}

// check runs the uninstall pre-flight on the connection's clients.
func (o *uninstallCheckOptions) check(ctx context.Context, conn *connection, release string) (*uninstall.Clients, uninstall.Options, *uninstall.Report, error) {
	opts := uninstall.Options{Release: release, Namespace: conn.namespace, Driver: o.helmDriver.Driver(), HelmVersion: o.helmVersion}
	c, err := uninstall.NewClients(conn.config)
	if err != nil {
		return nil, opts, nil, couldNot("build client: %w", err)
	}
	// The admission policies are evaluated for each CRD the uninstall deletes.
	if opts.Policies, err = livecluster.NewKubeCluster(conn.config); err != nil {
		return nil, opts, nil, couldNot("build client: %w", err)
	}
	rep, err := uninstall.Check(ctx, c, opts)
	if err != nil {
		return nil, opts, nil, classifyAs(cmdUninstallCheck, err, conn)
	}
	return c, opts, rep, nil
}

// takeBackup writes the backup when --backup asks for one and records it in out.
func (o *uninstallCheckOptions) takeBackup(ctx context.Context, c *uninstall.Clients, opts uninstall.Options, out *uninstallCheckOutput) error {
	if o.backup == "" {
		return nil
	}
	res, err := uninstall.Backup(ctx, c, opts, o.backup)
	var exists *backup.ExistsError
	switch {
	case errors.As(err, &exists):
		return couldNot("backup: %w", err)
	case err != nil:
		return couldNot("backup to %s failed, so it is incomplete (no %s was written): %w", o.backup, uninstall.IndexFile, err)
	}
	out.Backup, out.BackupDir = res, o.backup
	return nil
}

func (out *uninstallCheckOutput) text(w io.Writer) error {
	rep := out.Report
	uninstallHeader(w, rep)
	fmt.Fprintln(w)
	if err := uninstallObjects(w, rep); err != nil {
		return err
	}
	uninstallExtras(w, out)
	fmt.Fprintln(w)
	if rep.Safe && rep.PoliciesNotAsked != "" {
		fmt.Fprintf(w, "NOT ALL ASKED: no trap found in what was asked, but the cluster's ValidatingAdmissionPolicies could not be read for the CRDs it deletes "+
			"(they need list on validatingadmissionpolicies and validatingadmissionpolicybindings): %s\n", rep.PoliciesNotAsked)
		return nil
	}
	if rep.Safe {
		fmt.Fprintln(w, "SAFE: no trap found.")
		return nil
	}
	fmt.Fprintf(w, "UNSAFE: %d finding(s)\n", len(rep.Findings))
	for _, f := range rep.Findings {
		fmt.Fprintf(w, "  [%s] %s\n      %s\n      fix: %s\n", f.Check, f.Subject, f.Message, f.Remediation)
	}
	if rep.PoliciesNotAsked != "" {
		fmt.Fprintf(w, "Not asked: the cluster's ValidatingAdmissionPolicies for the CRDs it deletes: %s\n", rep.PoliciesNotAsked)
	}
	return nil
}

func uninstallHeader(w io.Writer, rep *uninstall.Report) {
	fmt.Fprintf(w, "Release %s in namespace %s: revision %d (%s), chart %s %s, Helm storage %s\n",
		rep.Release, rep.Namespace, rep.Revision, rep.Status, rep.Chart, rep.ChartVersion, rep.Driver)
	if rep.VerifiesOwnership {
		fmt.Fprintf(w, "Verdict for Helm %s, which skips objects whose live ownership metadata does not name the release (--helm-version to change).\n", rep.HelmVersion)
	} else {
		fmt.Fprintf(w, "Verdict for Helm %s, which deletes every object of the stored manifest without keep, whatever the live object says (--helm-version to change).\n", rep.HelmVersion)
	}
	if !rep.NotDeployed {
		return
	}
	fmt.Fprintf(w, "The last revision %d is %s: its manifest is the delete list", rep.Revision, rep.Status)
	if rep.LastDeployedRevision > 0 {
		fmt.Fprintf(w, " (not deployed revision %d's)", rep.LastDeployedRevision)
	}
	fmt.Fprintln(w, ".")
}

func uninstallObjects(w io.Writer, rep *uninstall.Report) error {
	if len(rep.Objects) == 0 {
		fmt.Fprintln(w, "helm uninstall touches no objects.")
		return nil
	}
	fmt.Fprintln(w, "helm uninstall would:")
	t := output.NewTable(w)
	for _, o := range rep.Objects {
		t.Row("  "+strings.ToUpper(string(o.Action)), o.Subject, objectDetails(o))
	}
	return t.Flush()
}

// uninstallExtras are what is left behind, the hooks and the backup.
func uninstallExtras(w io.Writer, out *uninstallCheckOutput) {
	rep := out.Report
	if len(rep.LeftBehind) > 0 {
		fmt.Fprintf(w, "\nLeft behind (only deployed revision %d lists them, so the uninstall does not delete them):\n", rep.LastDeployedRevision)
		for _, s := range rep.LeftBehind {
			fmt.Fprintf(w, "  %s\n", s)
		}
	}
	if len(rep.Hooks) > 0 {
		fmt.Fprintf(w, "\nHooks the uninstall runs (unless --no-hooks): %s\n", strings.Join(rep.Hooks, ", "))
	}
	if out.Backup == nil {
		return
	}
	fmt.Fprintf(w, "\nBackup written to %s (%d object(s), index %s):\n", out.BackupDir, len(out.Backup.Files), uninstall.IndexFile)
	for _, f := range out.Backup.Files {
		fmt.Fprintf(w, "  %s -> %s\n", f.Subject, f.File)
	}
}

// objectDetails is the last column of the text table: the reason and what sits behind
// the object.
func objectDetails(o uninstall.Object) string {
	parts := []string{o.Reason}
	if p := o.PVC; p != nil {
		parts = append(parts, pvcDetails(p))
	}
	if c := o.Cascade; c != nil && c.Total > 0 {
		parts = append(parts, cascadeDetails(c))
	}
	if s := o.Secret; s != nil && len(s.Keys) > 0 {
		parts = append(parts, fmt.Sprintf("type %s, keys %s", s.Type, strings.Join(s.Keys, ", ")))
	}
	if s := o.Storage; s != nil && len(s.PersistentVolumes) > 0 {
		parts = append(parts, "used by PVs "+strings.Join(s.PersistentVolumes, ", "))
	}
	return strings.Join(parts, "; ")
}

func pvcDetails(p *uninstall.PVCInfo) string {
	s := "claim " + p.Phase
	if p.Volume != "" {
		s += ", volume " + p.Volume
		if p.ReclaimPolicy != "" {
			s += " (" + p.ReclaimPolicy + ")"
		}
	}
	if p.StorageClass != "" {
		s += ", class " + p.StorageClass
		if p.StorageClassDeleted {
			s += " (deleted too)"
		}
	}
	if len(p.UsedBy) > 0 {
		s += ", mounted by " + strings.Join(p.UsedBy, ", ")
	}
	return s
}

func cascadeDetails(c *uninstall.Cascade) string {
	keys := slices.Sorted(maps.Keys(c.Counts))
	counts := make([]string, 0, len(keys))
	for _, k := range keys {
		counts = append(counts, fmt.Sprintf("%d %s", c.Counts[k], k))
	}
	return fmt.Sprintf("takes %d object(s) with it: %s", c.Total, strings.Join(counts, ", "))
}

const uninstallCheckLong = `uninstall-check reads the release from Helm storage (Secret or ConfigMap driver) and
says, for every object of its last stored manifest, what helm uninstall does to it:
delete, keep (helm.sh/resource-policy: keep in the STORED manifest), untouched (another
policy value), skip-not-owned (Helm 4.3 or newer, when the live ownership label and
annotations no longer name the release) or absent. It writes nothing unless --backup.

It flags the traps that lost data in real chart migrations, each with its remediation:
keep only on the live object (ignored), stripped ownership metadata (protects only with
Helm 4.3 or newer: the verdict follows --helm-version, default the newest), a failed or
pending last revision (its manifest is the delete list), PVCs on Delete volumes, PVCs
held by pods or Jobs outside the release, deleted StorageClasses, Namespaces and CRDs with
what cascades with them, and Secrets holding credentials. Secret values and release
values are never printed.

--backup DIR saves the release's Secrets, PVCs and their PVs, sanitised for re-apply
(files 0600, DIR/index.json lists them; restore with kubectl apply -f DIR/objects).

Exit codes: 0 safe, 1 findings, 2 could not run.`

const uninstallCheckExample = `  upgradeguard release uninstall-check db -n apps
  upgradeguard release uninstall-check db -n apps --helm-version 3.18 -o json
  upgradeguard release uninstall-check db -n apps --backup ./db-backup`
