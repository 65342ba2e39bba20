package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdbackup"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

func newCRDCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "crd",
		Short: "Back up a CRD with every object of its kind, restore them, or move a CRD between Helm releases",
		Long: `Deleting a CustomResourceDefinition deletes every object of its kind, at once and
for good. 'crd backup' saves CRDs and all their objects to a directory; 'crd restore'
brings them back into a cluster where the CRDs are absent. 'crd adopt' moves a CRD from
one Helm release to another, so that neither deletes it.`,
	}
	cmd.AddCommand(newCRDBackupCmd(streams, kube), newCRDRestoreCmd(streams, kube), newCRDAdoptCmd(streams, kube))
	return cmd
}

type crdBackupOptions struct {
	dir    string
	output string
	opts   crdbackup.BackupOptions
}

func newCRDBackupCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &crdBackupOptions{}
	cmd := command("backup CRD... --dir DIR", "Save CRDs and every object of their kinds, in every namespace, to a new directory", crdBackupLong, crdBackupExample,
		cobra.MinimumNArgs(1), func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), streams, kube, args) })
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "", "the new directory `DIR` for the backup (created 0700, files 0600); one that already holds a backup is refused")
	f.Int64Var(&o.opts.PageSize, "page-size", crdbackup.DefaultPageSize, "objects listed per page")
	output.AddFlag(f, &o.output)
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagDirname("dir")
	cmd.ValidArgsFunction = func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return complete(cmd, toComplete, func(ctx context.Context) ([]string, error) { return crdNames(ctx, kube) })
	}
	return cmd
}

func (o *crdBackupOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, crds []string) error {
	conn, c, p, err := crdSession(ctx, streams, kube)
	if err != nil {
		return err
	}
	o.opts.Progress = p.crdProgress
	res, err := crdbackup.Backup(ctx, c, crds, o.dir, o.opts)
	p.finish()
	if err != nil {
		return classifyAs(cmdCRDBackup, err, conn)
	}
	return finish(streams, o.output, res, func(w io.Writer) error { return crdBackupText(w, res) }, false)
}

// crdSession connects for crd backup and crd restore: the connection, crdbackup's
// clients, and the progress drawn on stderr.
func crdSession(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) (*connection, *crdbackup.Clients, *progress, error) {
	conn, err := connect(ctx, kube)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := crdbackup.NewClients(conn.config)
	if err != nil {
		return nil, nil, nil, couldNot("build client: %w", err)
	}
	return conn, c, newProgress(streams.ErrOut), nil
}

// crdProgress draws a backup or restore's progress.
func (p *progress) crdProgress(s crdbackup.Progress) {
	p.update(migrate.Progress{CRD: s.CRD, Done: s.Done, Total: s.Total, Elapsed: s.Elapsed})
}

func crdBackupText(w io.Writer, res *crdbackup.BackupResult) error {
	fmt.Fprintf(w, "Backed up %d CRD(s) with %d object(s) to %s (index %s written last):\n", len(res.CRDs), res.Objects(), res.Dir, backup.IndexFile)
	t := output.NewTable(w, "  CRD", "VERSION", "OBJECTS", "FILE")
	for _, c := range res.CRDs {
		t.Row("  "+c.Name, c.Version, c.Objects.Count, c.Objects.File)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nThe files hold the objects' full content: keep the directory private.")
	fmt.Fprintf(w, "Restore with: %s\n", cmdline.CRDRestore{Dir: res.Dir})
	return nil
}

type crdRestoreOptions struct {
	dir    string
	output string
	opts   crdbackup.RestoreOptions
}

// crdRestoreOutput is the JSON output: the result, and whether it is complete.
type crdRestoreOutput struct {
	*crdbackup.RestoreResult
	Complete bool `json:"complete"`
}

func newCRDRestoreCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &crdRestoreOptions{}
	cmd := command("restore [CRD...] --dir DIR", "Create the CRDs of a backup and every object of theirs, with their status", crdRestoreLong, crdRestoreExample,
		cobra.ArbitraryArgs, func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), streams, kube, args) })
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "", "the backup `DIR` that 'upgradeguard crd backup' wrote")
	f.BoolVar(&o.opts.Overwrite, "overwrite", false, "replace the objects that exist and differ from the backup (without it they are left as they are and listed)")
	f.IntVar(&o.opts.Concurrency, "concurrency", crdbackup.DefaultConcurrency, "objects written in parallel: the bound on the load this run puts on the API server")
	f.DurationVar(&o.opts.EstablishTimeout, "timeout", crdbackup.DefaultEstablishTimeout, "how long to wait for each CRD to be Established and serve its objects")
	output.AddFlag(f, &o.output)
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagDirname("dir")
	return cmd
}

func (o *crdRestoreOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, crds []string) error {
	conn, c, p, err := crdSession(ctx, streams, kube)
	if err != nil {
		return err
	}
	o.opts.CRDs = crds
	o.opts.Progress = p.crdProgress
	res, err := crdbackup.Restore(ctx, c, o.dir, o.opts)
	p.finish()
	if err != nil {
		return classifyAs(cmdCRDRestore, err, conn)
	}
	out := &crdRestoreOutput{RestoreResult: res, Complete: res.Complete()}
	return finish(streams, o.output, out, out.text, !out.Complete)
}

// maxKeptListed bounds the objects the text output lists by name (-o json lists all).
const maxKeptListed = 20

func (out *crdRestoreOutput) text(w io.Writer) error {
	fmt.Fprintf(w, "Restored from %s:\n", out.Dir)
	t := output.NewTable(w, "  NAME", "CRD", "VERSION", "OBJECTS", "CREATED", "UNCHANGED", "OVERWRITTEN", "KEPT", "STATUS")
	for _, c := range out.CRDs {
		t.Row("  "+c.Name, c.CRD, c.Version, c.Objects, c.Created, c.Unchanged, c.Overwritten, len(c.Kept), c.StatusRestored)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if out.Complete {
		fmt.Fprintln(w, "COMPLETE: every object of the backup is on the cluster as it was saved.")
		return nil
	}
	kept := 0
	for _, c := range out.CRDs {
		kept += len(c.Kept)
	}
	fmt.Fprintf(w, "INCOMPLETE: %d object(s) exist and differ from the backup; they are left as they are (--overwrite replaces them):\n", kept)
	listed := 0
	for _, c := range out.CRDs {
		for _, s := range c.Kept {
			if listed == maxKeptListed {
				fmt.Fprintf(w, "  ... and %d more (-o json lists them all)\n", kept-listed)
				return nil
			}
			fmt.Fprintf(w, "  %s\n", s)
			listed++
		}
	}
	return nil
}

const crdBackupLong = `backup saves each CRD named, and every object of its kind in every namespace, to a
new directory, so that deleting the CRD (which deletes all its objects) can be undone
with 'upgradeguard crd restore'.

The objects are listed in pages at one version: the storage version when it is served,
otherwise the first served version. The directory holds, for each CRD:
  crds/NAME.yaml     the CRD, without status, uid, resourceVersion and managedFields
  objects/NAME.yaml  its objects, one YAML document each, with their status
and index.json, written last with each file's object count and SHA-256: a directory
without it is a backup that did not finish, and restore refuses it. Every file goes
through a synced temporary file and a rename. Files are 0600 and the directory 0700:
the objects may hold credentials. Nothing is printed of their content.

A directory that already holds a backup is refused: name a new one.

Exit codes: 0 written, 2 could not run (nothing complete was written).`

const crdBackupExample = `  # before deleting a CRD on purpose
  upgradeguard crd backup leaderworkersets.leaderworkerset.x-k8s.io --dir ./lws-backup

  # several CRDs in one backup, as JSON
  upgradeguard crd backup certificates.cert-manager.io issuers.cert-manager.io --dir ./cm-backup -o json`

const crdRestoreLong = `restore reads a backup written by 'upgradeguard crd backup' and brings its CRDs back,
with every object (all of them, or those of the CRDs named):

  1. it checks the whole backup first: index.json must be there, each object file must
     match its count and SHA-256, and every namespace the objects live in must exist.
     Otherwise it stops before creating anything;
  2. a CRD that is absent is created (one that exists is left as it is) and restore
     waits until it is Established and serves the version the objects were saved at;
  3. each object is created at that version, without the fields the API server sets
     (uid, resourceVersion, creationTimestamp, managedFields); its status is written
     back through the status subresource when the CRD has one;
  4. ownerReferences between objects of the backup are pointed at the owners' new UIDs.

An object that already exists is not touched: it is counted unchanged when it matches
the backup, and listed as kept when it differs (--overwrite replaces it). Running
restore again after a failure resumes where it stopped.

Exit codes: 0 every object is on the cluster as saved, 1 some exist and differ (listed),
2 could not run (the backup is incomplete or damaged, a namespace is missing, or the API
server refused).`

const crdRestoreExample = `  upgradeguard crd restore --dir ./lws-backup

  # only one CRD of the backup, replacing objects that changed since
  upgradeguard crd restore issuers.cert-manager.io --dir ./cm-backup --overwrite`
