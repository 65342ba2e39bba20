package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/apf"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

type apfOptions struct {
	users, groups, serviceAccounts []string
	shares                         int32
	apply                          bool
	output                         string
}

func newAPFCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &apfOptions{}
	cmd := command("apf [--user NAME]... [--group NAME]... [--serviceaccount NAMESPACE/NAME]... [--apply]",
		"Print or apply the API Priority and Fairness objects that give migrations a priority level of their own",
		apfLong, apfExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	f := cmd.Flags()
	f.StringArrayVar(&o.users, "user", nil, "user whose migrations to hold (can repeat; default: you, as the API server knows you)")
	f.StringArrayVar(&o.groups, "group", nil, "group whose members' migrations to hold (can repeat)")
	f.StringArrayVar(&o.serviceAccounts, "serviceaccount", nil, "ServiceAccount NAMESPACE/NAME whose migrations to hold, for a CI job (can repeat)")
	f.Int32Var(&o.shares, "nominal-concurrency-shares", apf.DefaultNominalConcurrencyShares, "seats of the priority level, weighed against every level's shares")
	f.BoolVar(&o.apply, "apply", false, "apply the objects (server-side apply) instead of printing them")
	output.AddFlag(f, &o.output)
	return cmd
}

// apfOutput is what apf printed or applied.
type apfOutput struct {
	PriorityLevelConfiguration *flowcontrolv1.PriorityLevelConfiguration `json:"priorityLevelConfiguration"`
	FlowSchema                 *flowcontrolv1.FlowSchema                 `json:"flowSchema"`
	Applied                    bool                                      `json:"applied"`
	// Exempt: the subject taken by default is in system:masters, whose requests no
	// FlowSchema of ours can hold.
	Exempt bool `json:"exempt,omitempty"`
}

func (o *apfOptions) subjects() ([]flowcontrolv1.Subject, error) {
	var out []flowcontrolv1.Subject
	for _, u := range o.users {
		out = append(out, apf.User(u))
	}
	for _, g := range o.groups {
		out = append(out, apf.Group(g))
	}
	for _, s := range o.serviceAccounts {
		ns, name, ok := strings.Cut(s, "/")
		if !ok || ns == "" || name == "" {
			return nil, couldNot("--serviceaccount %q: give NAMESPACE/NAME, for example ci/upgradeguard", s)
		}
		out = append(out, apf.ServiceAccount(ns, name))
	}
	return out, nil
}

func (o *apfOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if o.shares < 1 {
		return couldNot("--nominal-concurrency-shares must be at least 1")
	}
	subjects, err := o.subjects()
	if err != nil {
		return err
	}
	out := &apfOutput{}
	var conn *connection
	if len(subjects) == 0 || o.apply {
		if conn, err = connect(ctx, kube); err != nil {
			return err
		}
	}
	if len(subjects) == 0 {
		me, err := apf.Me(ctx, conn.clientset)
		if err != nil {
			return classifyAs(cmdAPF, err, conn)
		}
		subjects, out.Exempt = []flowcontrolv1.Subject{me.Subject}, me.Exempt
	}
	out.PriorityLevelConfiguration, out.FlowSchema = apf.Objects(apf.Options{Subjects: subjects, NominalConcurrencyShares: o.shares,
		Labels: map[string]string{"app.kubernetes.io/managed-by": apf.FieldManager}})
	if o.apply {
		if err := apf.Apply(ctx, conn.clientset, out.PriorityLevelConfiguration, out.FlowSchema); err != nil {
			return classifyAs(cmdAPF, err, conn)
		}
		out.Applied = true
	}
	return finish(streams, o.output, out, out.text, false)
}

func (out *apfOutput) text(w io.Writer) error {
	if out.Exempt {
		fmt.Fprintf(w, "# You are in system:masters: the API server's mandatory \"exempt\" FlowSchema takes your\n# requests before any other, so these objects cannot hold your migrations. Migrate as a\n# user outside system:masters (bound to the role `%s` prints) to use them.\n", cmdline.RBAC{})
	}
	if out.Applied {
		fmt.Fprintf(w, "Applied PriorityLevelConfiguration %s and FlowSchema %s (field manager %s).\n", out.PriorityLevelConfiguration.Name, out.FlowSchema.Name, apf.FieldManager)
		fmt.Fprintf(w, "`%s` now says \"Writes ran at API priority level %s\" after a run.\n", cmdline.Migrate{}, out.PriorityLevelConfiguration.Name)
		return nil
	}
	fmt.Fprintf(w, "# A priority level of its own for upgradeguard migrate's writes (PATCH) by the subjects\n# below: %s, or run %s.\n", cmdline.Apply{File: "this"}, cmdline.APF{Apply: true})
	for _, obj := range []any{out.PriorityLevelConfiguration, out.FlowSchema} {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "---\n%s", data)
	}
	return nil
}

const apfLong = `apf prints, or applies with --apply, an API Priority and Fairness PriorityLevelConfiguration
and FlowSchema (both named upgradeguard-migrations) that put 'upgradeguard migrate''s writes
at a priority level of their own, with few seats and nothing borrowed. The API server then
makes a migration's PATCH requests wait in their own queues instead of sharing seats with
other clients; the migrating user's reads and other requests keep their level.

The FlowSchema matches the subjects given, or, with none, you as the API server knows you
(a SelfSubjectReview). Members of system:masters are exempt from Priority and Fairness:
no FlowSchema holds their requests, and apf says so.

After a run, 'upgradeguard migrate' says at which priority level its writes ran (from the
API server's X-Kubernetes-PF-* response headers), and suggests this command when they
shared one with other clients. The Helm chart ships the same objects for the controller
(apf.enabled, on by default).

Applying needs create and patch on flowschemas and prioritylevelconfigurations
(flowcontrol.apiserver.k8s.io), which cluster administrators have.`

const apfExample = `  # Print the objects for yourself, to review and kubectl apply
  upgradeguard apf

  # Apply them for a CI job's ServiceAccount and a team's group
  upgradeguard apf --serviceaccount ci/upgradeguard --group platform-team --apply

  # Then migrate: the result says where the writes ran
  upgradeguard migrate --crd helmreleases.helm.toolkit.fluxcd.io`
