package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/releasediff"
)

type diffFailedOptions struct {
	revision   int
	helmDriver *cliflag.HelmDriver
	output     string
}

func newDiffFailedCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &diffFailedOptions{}
	cmd := command("diff-failed NAME", "Show what a failed upgrade left applied: per object, the failed revision, the previous one, or neither", diffFailedLong, diffFailedExample, cobra.ExactArgs(1),
		func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), streams, kube, args[0]) })
	f := cmd.Flags()
	f.IntVar(&o.revision, "revision", 0, "revision to compare with the one before it (default: the last one, which must have failed)")
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	output.AddReportFlag(f, &o.output)
	return cmd
}

func (o *diffFailedOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags, release string) error {
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	reader, err := helmrelease.NewReader(conn.clientset, conn.namespace, o.helmDriver.Driver())
	if err != nil {
		return couldNot("%w", err)
	}
	dyn, mapper, err := replayClients(kube, conn)
	if err != nil {
		return err
	}
	rep, err := releasediff.RunRelease(ctx, reader, dyn, mapper, release, o.revision, releasediff.Options{Namespace: conn.namespace})
	if err != nil {
		return classifyAs(cmdDiffFailed, err, conn)
	}
	return finishReport(streams, o.output, rep, func(w io.Writer) error { return renderDiffFailed(w, rep) }, rep.FindingReport, !rep.Clean())
}

func renderDiffFailed(w io.Writer, rep *releasediff.Report) error {
	prev := "none (a failed install)"
	if rep.PreviousRevision > 0 {
		prev = fmt.Sprintf("revision %d", rep.PreviousRevision)
	}
	fmt.Fprintf(w, "Release %s/%s: revision %d (%s) against %s\n\n", rep.Namespace, rep.Release, rep.FailedRevision, rep.FailedStatus, prev)
	t := output.NewTable(w, "OBJECT", "CHANGE", "LIVE MATCHES", "DIFFERS FROM THE FAILED REVISION")
	for _, obj := range rep.Objects {
		detail := strings.Join(obj.Differs, ", ")
		if obj.Error != "" {
			detail = obj.Error
		}
		if len(obj.Rejected) > 0 {
			var vs []string
			for _, r := range obj.Rejected {
				vs = append(vs, r.Version)
			}
			detail = fmt.Sprintf("rejected: status.storedVersions still lists %s, which revision %d drops", strings.Join(vs, ", "), rep.FailedRevision)
		}
		t.Row(obj.Object, obj.Change, obj.Verdict, detail)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	diffFailedSummary(w, rep)
	return nil
}

func diffFailedSummary(w io.Writer, rep *releasediff.Report) {
	switch {
	case rep.Mixed:
		fmt.Fprintf(w, "MIXED: %d change(s) landed and %d did not. The release is half-applied.\n", len(rep.Landed), len(rep.NotLanded))
	case len(rep.Landed) > 0:
		fmt.Fprintf(w, "Every change of revision %d landed.\n", rep.FailedRevision)
	case len(rep.NotLanded) > 0:
		fmt.Fprintf(w, "No change of revision %d landed: the objects are at the previous revision.\n", rep.FailedRevision)
	default:
		fmt.Fprintln(w, "The two revisions render the same objects.")
	}
	if len(rep.Drifted) > 0 {
		fmt.Fprintf(w, "%d object(s) match neither revision or are missing: %s\n", len(rep.Drifted), strings.Join(rep.Drifted, ", "))
	}
	if len(rep.StoredVersionsRejected) > 0 {
		fmt.Fprintf(w, "The API server rejects revision %d's CRDs on status.storedVersions:\n", rep.FailedRevision)
		for _, r := range rep.StoredVersionsRejected {
			fmt.Fprintf(w, "  %s\n    API server: %s\n", r, r.Message)
		}
	}
	for _, n := range rep.NextSteps() {
		fmt.Fprintf(w, "Next: %s.\n", n.Advice())
	}
}

const diffFailedLong = `diff-failed reads the release's failed revision (the last one, or --revision) and
the revision before it from Helm storage, and compares every object of both with the live
cluster. A failed Helm upgrade is not atomic: Helm 4.3 goes on past an object it cannot
update, creates the new objects, and then skips deleting the ones the chart dropped.

Per object it says:
  failed     the live object matches the failed revision (the change landed)
  previous   the live object still matches the previous revision
  unchanged  both revisions render it alike and the live object matches
  neither    the live object matches neither revision (another writer owns fields)
  missing    there is no live object

Only fields the revisions set are compared, through the API server's own defaulting: each
rendered object is server-side applied with dryRun=All, forced, as a field manager that
owns nothing (upgradeguard-diff), and the result is compared with the live object. It
writes nothing (it needs patch permission because dry runs are checked like writes).
Differing fields are named, never their values.

A CRD the API server refuses because the failed revision drops a version still in its
status.storedVersions is marked as rejected (its change cannot land), and the summary
quotes the API server. Both of its wordings are read: "must appear in spec.versions" up
to Kubernetes 1.32, "missing from spec.versions; ... must remain in spec.versions" from
1.33.

Exit codes: 0 the release is wholly at one revision, 1 mixed (some changes landed and
others did not) or an object matches neither revision, 2 could not run.`

const diffFailedExample = `  upgradeguard release diff-failed app -n apps
  upgradeguard release diff-failed app -n apps --revision 7 -o json`
