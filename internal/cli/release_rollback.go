package cli

import (
	"context"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

func newRollbackCheckCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &applyCheckOptions{checkOptions: checkOptions{cmdName: cmdRollbackCheck}}
	cmd := &cobra.Command{
		Use:   "rollback-check NAME [REVISION]",
		Short: "Predict what a Helm 4 rollback applies, what it cannot revert, what it deletes, and its CRD verdicts",
		Long: `rollback-check replays ` + "`helm rollback NAME [REVISION]`" + ` against the API server without writing
anything, as Helm 4.3.1 runs it:
  - the apply method: --server-side=auto follows the apply_method the TARGET revision
    recorded (an upgrade follows the last revision's), with the same flag errors as
    apply-check predicts
  - what the rollback applies, object by object, from the last revision's manifest
    (whatever its status) to the target's, and where it fails
  - what it cannot revert under server-side apply: fields other managers own stay as
    they are (a server-side rollback is not a revert), with those managers named
  - what it deletes: objects the last revision lists and the target does not, unless
    the live object carries helm.sh/resource-policy: keep
  - the CRD storage-version verdicts of ` + "`check --rollback`" + `
REVISION defaults to the revision before the last, as helm rollback. Release values and
Secret data never appear in the output. Exit codes: 0 safe, 1 findings, 2 could not run.`,
		Example: `  upgradeguard release rollback-check app 1 -n apps
  upgradeguard release rollback-check app -n apps --server-side=false -o json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.release, o.rollback = args[0], true
			if len(args) == 2 {
				n, err := strconv.Atoi(args[1])
				if err != nil || n < 1 {
					return couldNot("REVISION must be a revision number (see `%s`), got %q", cmdline.HelmHistory{Release: args[0]}, args[1])
				}
				o.toRevision = n
			}
			return o.runRollback(cmd.Context(), streams, kube)
		},
	}
	cliflag.AddCRDPolicy(cmd, &o.crdPolicy, "which CRDs the rollback applies: helm (crds/ never upgraded) or create-replace (Flux upgrade.crds=CreateReplace)")
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	o.addApplyFlags(cmd.Flags())
	return cmd
}

func (o *applyCheckOptions) runRollback(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	args := []string{o.release}
	if o.toRevision > 0 {
		args = append(args, strconv.Itoa(o.toRevision))
	}
	return o.runOperation(ctx, streams, kube, applycheck.OpRollback, args...)
}
