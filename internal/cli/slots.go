package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

type slotsOptions struct {
	o          slots.Options
	target     string
	equivalent string
	output     string
}

func newSlotsCmd(streams Streams) *cobra.Command {
	s := &slotsOptions{}
	cmd := command("slots --repo PATH --ref A --ref B [...] --dir DIR --target FILE:KEY", "Check that numbered migrations are aligned across release branches", slotsLong, slotsExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return s.run(cmd.Context(), streams) })
	s.addFlags(cmd.Flags())
	return cmd
}

func (s *slotsOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.o.Repo, "repo", ".", "path to the git repository: a work tree or a folder in it, a bare clone, a mirror or a linked worktree")
	f.StringArrayVar(&s.o.Refs, "ref", nil, "branch, tag or commit to compare, oldest release line first (at least two)")
	f.StringVar(&s.o.Dir, "dir", "", "migrations folder in the tree")
	f.StringVar(&s.target, "target", "", "where targetVersion lives: FILE:KEY, a YAML file and a dotted key")
	f.StringVar(&s.equivalent, "equivalent", "", "YAML file declaring equivalent slot contents by sha256")
	output.AddReportFlag(f, &s.output)
}

// options completes slots.Options from --target and --equivalent.
func (s *slotsOptions) options() (slots.Options, error) {
	o := s.o
	file, key, ok := strings.Cut(s.target, ":")
	if err := s.validate(ok && file != "" && key != ""); err != nil {
		return o, err
	}
	o.TargetFile, o.TargetKey = file, key
	if s.equivalent == "" {
		return o, nil
	}
	eq, err := slots.LoadEquivalent(s.equivalent)
	if err != nil {
		return o, couldNot("%w", err)
	}
	o.Equivalent = eq
	return o, nil
}

func (s *slotsOptions) validate(targetOK bool) error {
	switch {
	case !targetOK:
		return couldNot("--target must be FILE:KEY, for example packages/core/platform/values.yaml:migrations.targetVersion")
	case s.o.Dir == "":
		return couldNot("--dir is required: the migrations folder in the tree")
	}
	return nil
}

func (s *slotsOptions) run(ctx context.Context, streams Streams) error {
	o, err := s.options()
	if err != nil {
		return err
	}
	rep, err := slots.Check(ctx, o)
	if err != nil {
		return couldNot("%w%s", err, advice("slots", err))
	}
	return finishReport(streams, s.output, rep, func(w io.Writer) error { return renderSlots(w, rep) }, rep.FindingReport, len(rep.Findings) > 0)
}

func renderSlots(w io.Writer, rep *slots.Report) error {
	t := output.NewTable(w, "REF", "COMMIT", "TARGET VERSION", "SLOTS")
	for _, r := range rep.Refs {
		t.Rowf("%s\t%.12s\t%d\t%d\n", r.Ref, r.Commit, r.TargetVersion, len(r.Slots))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	if len(rep.Findings) == 0 {
		fmt.Fprintf(w, "\nALIGNED: every slot below %d is the same on all refs.\n", rep.LowestTarget)
		return nil
	}
	fmt.Fprintf(w, "\nMISALIGNED: %d slot(s) below %d:\n", len(rep.Findings), rep.LowestTarget)
	for _, f := range rep.Findings {
		slotFinding(w, rep.Refs, f)
	}
	return nil
}

func slotFinding(w io.Writer, refs []slots.Ref, f slots.Misalignment) {
	fmt.Fprintf(w, "\nslot %d (%s)\n  %s\n", f.Slot, f.Check, withFlag(f.Message, f.Input))
	for _, r := range refs {
		h := f.Hashes[r.Ref]
		if h == "" {
			h = "(missing)"
		}
		fmt.Fprintf(w, "  %s: %.16s\n", r.Ref, h)
	}
}

const slotsLong = `slots reads each ref's tree (with go-git: no checkout, no git binary) and compares the
numbered migration files in --dir. A runner runs slots current..targetVersion-1, so when
two release branches hold different migrations in the same slot, a cluster that takes a
patch on the older branch and then upgrades to the newer one silently skips the newer
branch's migration.

Reported (every slot below the lowest targetVersion):
  claimed   a maintenance branch's targetVersion bump took a slot the newer branch
            uses for something else (the patch-then-minor trap), with the fix
  diverged  the slot holds different migrations on two refs
  missing   the slot exists on some refs only

Ports that differ byte-wise but are the same change are declared in --equivalent:
  equivalent:
    "45": [<sha256 of one>, <sha256 of the other>]

Pass refs oldest release line first. Exit codes: 0 aligned, 1 findings, 2 could not run.`

const slotsExample = `  upgradeguard slots --repo . --ref origin/release-1.5 --ref origin/release-1.6 \
    --dir packages/core/platform/images/migrations/migrations \
    --target packages/core/platform/values.yaml:migrations.targetVersion`
