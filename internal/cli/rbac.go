package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

type rbacOptions struct {
	predictOpts    checkOptions
	crds           []string
	name           string
	leaseNamespace string
	storageSwitch  bool
	engine         migrate.Engine
}

func newRBACCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &rbacOptions{}
	cmd := command("rbac (--crd NAME... | --chart REF | --manifests FILE|DIR|-)", "Print the least-privilege ClusterRole and Role for migrating CRDs", rbacLong, rbacExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	o.predictOpts.addPredictFlags(cmd)
	o.predictOpts.addManifestsFlag(cmd, streams)
	o.addFlags(cmd.Flags())
	cliflag.AddEngine(cmd, cliflag.RoleEngine, &o.engine)
	return cmd
}

func (o *rbacOptions) addFlags(f *pflag.FlagSet) {
	f.StringArrayVar(&o.crds, "crd", nil, "CRD to migrate (can repeat)")
	f.StringVar(&o.name, "name", "upgradeguard-migrate", "name of the ClusterRole and Role")
	f.StringVar(&o.leaseNamespace, "lease-namespace", "kube-system", "namespace of the migration Leases (as migrate --lease-namespace)")
	f.BoolVar(&o.storageSwitch, "allow-storage-switch", false, "also allow changing the CRDs' storage version (reverse migrations)")
	output.AddFlag(f, &o.predictOpts.output)
}

func (o *rbacOptions) validate() error {
	if (len(o.crds) > 0) == (o.predictOpts.chart.Ref != "" || o.predictOpts.manifests != "" || o.predictOpts.rollback) {
		return couldNot("choose the CRDs with exactly one of --crd, --chart or --manifests (or --rollback --release)")
	}
	if len(o.crds) == 0 {
		return o.predictOpts.validate()
	}
	return nil
}

func (o *rbacOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	names, err := o.names(ctx, conn)
	if err != nil {
		return err
	}
	crds, err := conn.cluster.CRDs(ctx)
	if err != nil {
		return classifyAs(cmdRBAC, err, conn)
	}
	p, err := migrate.RBACFor(o.engine, o.name, o.leaseNamespace, names, crds, o.storageSwitch)
	if err != nil {
		return classifyAs(cmdRBAC, err, conn)
	}
	out := &rbacOutput{policy: p, crds: len(names), leaseNamespace: o.leaseNamespace, engine: o.engine}
	return finish(streams, o.predictOpts.output, p, out.text, false)
}

// names are the CRDs to grant: --crd, or what a migration of the chart would migrate.
func (o *rbacOptions) names(ctx context.Context, conn *connection) ([]string, error) {
	if len(o.crds) > 0 {
		return o.crds, nil
	}
	rep, err := o.predictOpts.predict(ctx, conn)
	if err != nil {
		return nil, err
	}
	targets, _, err := migrate.TargetsFor(rep, migrate.Options{AllowStorageSwitch: true})
	if err != nil {
		return nil, classifyAs(cmdRBAC, err, conn)
	}
	if len(targets) == 0 {
		return nil, couldNot("check finds nothing to migrate for this chart, so no permissions are needed")
	}
	names := make([]string, 0, len(targets))
	for _, t := range targets {
		names = append(names, t.Name)
	}
	return names, nil
}

type rbacOutput struct {
	policy         migrate.Permissions
	crds           int
	leaseNamespace string
	engine         migrate.Engine
}

// text is the ClusterRole and the Role as YAML documents, ready for kubectl apply.
func (r *rbacOutput) text(w io.Writer) error {
	command := cmdline.Migrate{}
	if r.engine == migrate.EngineBuiltin {
		command.Engine = string(migrate.EngineBuiltin)
	}
	fmt.Fprintf(w, "# Least privilege for `%s` of %d CRD(s). Bind the ClusterRole with a\n# ClusterRoleBinding and the Role with a RoleBinding in %s.\n", command, r.crds, r.leaseNamespace)
	for _, obj := range []any{r.policy.ClusterRole, r.policy.Role} {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "---\n%s", data)
	}
	return nil
}

const rbacLong = `rbac prints the minimal permissions 'upgradeguard migrate' needs for the given CRDs:

  - get, list and patch on exactly those custom resources;
  - get on the CRDs and get, update on customresourcedefinitions/status, by name;
  - create on Leases, and get, update on exactly the migration Leases, in --lease-namespace.

With --engine builtin it prints the smaller role of the builtin engine instead: only list on
the custom resources (to judge which fields the migration would drop; never a write), and
create, get, list, watch and delete on storageversionmigrations.storagemigration.k8s.io
(kube-controller-manager's built-in migrator patches the objects), with the same CRD, CRD
status and Lease rules.

With --allow-storage-switch the role may also patch and update the CRDs themselves, which a
reverse migration needs. Bind the ClusterRole with a ClusterRoleBinding and the Role with a
RoleBinding in the lease namespace.`

const rbacExample = `  upgradeguard rbac --crd helmrepositories.source.toolkit.fluxcd.io > rbac.yaml
  upgradeguard rbac --crd helmrepositories.source.toolkit.fluxcd.io --engine builtin
  upgradeguard rbac --chart ./charts/flux2 --release flux -n flux-system --lease-namespace flux-system`
