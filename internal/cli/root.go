// Package cli is the thin cobra front end of upgradeguard: it turns flags into library
// requests, renders the typed results as text or JSON, and maps outcomes to exit codes
// (0 safe, 1 findings, 2 could not run). No decision is made here.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// Exit codes shared by every command.
const (
	ExitSafe     = 0
	ExitFindings = 1
	ExitCouldNot = 2
)

// ExitError carries an exit code out of a command. A nil Err with ExitFindings means the
// command ran and reported findings, which it has already printed.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// couldNot wraps an error as "could not run" (exit 2).
func couldNot(format string, args ...any) error {
	return &ExitError{Code: ExitCouldNot, Err: fmt.Errorf(format, args...)}
}

// command is a subcommand: its usage line, one-line summary, help, examples, arguments
// and what it runs. Help texts are constants beside each command.
func command(use, short, long, example string, args cobra.PositionalArgs, run func(*cobra.Command, []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Example: example, Args: args, RunE: run}
}

// finish writes a command's result in format and returns its exit: ExitFindings when
// findings is true, nil otherwise.
func finish(streams Streams, format string, v any, text func(io.Writer) error, findings bool) error {
	if err := output.Write(streams.Out, format, v, text); err != nil {
		return couldNot("write output: %w", err)
	}
	if findings {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

// finishReport is finish for a command whose result is a finding.Report too, and so
// takes the CI formats (output.AddReportFlag).
func finishReport(streams Streams, format string, v any, text func(io.Writer) error, report func() finding.Report, findings bool) error {
	if err := output.WriteReport(streams.Out, format, v, text, report); err != nil {
		return couldNot("write output: %w", err)
	}
	if findings {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

// Streams are where commands write: Out for results, ErrOut for progress and errors;
// and In, what they read when a flag names "-" (os.Stdin when nil).
type Streams struct {
	Out    io.Writer
	ErrOut io.Writer
	In     io.Reader
}

// NewRootCmd builds the upgradeguard command tree.
func NewRootCmd(streams Streams) *cobra.Command {
	kube := genericclioptions.NewConfigFlags(true)
	name := currentCommandName()
	if name == nameHelm {
		applyHelmEnv(kube, os.Getenv)
	}
	root := &cobra.Command{
		Use:           "upgradeguard",
		Short:         "Make Helm and Flux upgrades, rollbacks and chart migrations safe",
		Long:          newRootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	kube.AddFlags(root.PersistentFlags())
	root.AddCommand(newCheckCmd(streams, kube), newPlanCmd(streams, kube), newMigrateCmd(streams, kube), newRBACCmd(streams, kube), newAPFCmd(streams, kube), newSlotsCmd(streams), newReviewCmd(streams, kube), newSnapshotCmd(streams, kube), newReleaseCmd(streams, kube), newVersionCmd(streams),
		newAuditCmd(streams, kube), newCRDCmd(streams, kube))
	if c := newControllerCmd(streams, kube); c != nil {
		root.AddCommand(c) // nil in a build without the controller (-tags nocontroller)
	}
	adaptFrontDoor(root, name, func() *cobra.Command { return newReleaseCmd(streams, kube) })
	registerCompletions(root, kube)
	return root
}

// Execute runs the command line and returns the process exit code.
func Execute(ctx context.Context, args []string, streams Streams) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(streams.ErrOut, &slog.HandlerOptions{Level: slog.LevelError})))
	root := NewRootCmd(streams)
	root.SetArgs(args)
	return exitCode(root.ExecuteContext(ctx), streams)
}

// exitCode reports err on stderr and returns the process exit code for it.
func exitCode(err error, streams Streams) int {
	if err == nil {
		return ExitSafe
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(streams.ErrOut, "Error:", ee.Err)
		}
		return ee.Code
	}
	// Flag and argument errors from cobra: could not run.
	fmt.Fprintln(streams.ErrOut, "Error:", err)
	fmt.Fprintf(streams.ErrOut, "Run '%s --help' for usage.\n", currentCommandName())
	return ExitCouldNot
}

const newRootLong = `upgradeguard predicts what a Helm or Flux upgrade, rollback, uninstall or chart
migration will do to a cluster, before anyone presses the button, and names the exact fix.

CRD storage versions: an upgrade fails mid-flight when its chart drops a CRD version that
the live CRD still lists in status.storedVersions; a rollback fails the same way the other
way round. 'check' finds these cases, 'migrate' fixes them, 'controller' keeps a cluster
migrated and gates Flux HelmReleases, 'audit' shows who protects each release.

CRD deletion: an upgrade that moves a CRD to crds/, turns a CRD toggle off or drops a
subchart deletes the CRD and every object of its kind; 'check' and 'plan' name it, the
controller's webhook refuses the deletion of a CRD that still holds objects, and 'crd
backup' / 'crd restore' keep a CRD and its objects in a directory you can restore from.

Release data safety: 'release uninstall-check', 'release apply-check', 'release
diff-failed' and 'release migrate' (a guided chart-to-chart move that keeps volumes and
credentials). 'slots' checks numbered migrations across release branches.

Exit codes: 0 safe, 1 findings, 2 could not run (the message says what to do).`
