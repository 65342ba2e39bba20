package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

type rbacOptions struct {
	predictOpts    checkOptions
	crds           []string
	name           string
	leaseNamespace string
	storageSwitch  bool
}

func newRBACCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &rbacOptions{}
	cmd := &cobra.Command{
		Use:   "rbac (--crd NAME... | --chart REF)",
		Short: "Print the least-privilege ClusterRole and Role for migrating CRDs",
		Long: `rbac prints the minimal permissions 'upgradeguard migrate' needs for the given CRDs:

  - get, list and patch on exactly those custom resources;
  - get on the CRDs and get, update on customresourcedefinitions/status, by name;
  - create on Leases, and get, update on exactly the migration Leases, in --lease-namespace.

With --allow-storage-switch the role may also patch and update the CRDs themselves, which a
reverse migration needs. Bind the ClusterRole with a ClusterRoleBinding and the Role with a
RoleBinding in the lease namespace.`,
		Example: `  upgradeguard rbac --crd helmrepositories.source.toolkit.fluxcd.io > rbac.yaml
  upgradeguard rbac --chart ./charts/flux2 --release flux -n flux-system --lease-namespace flux-system`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), streams, kube)
		},
	}
	f := cmd.Flags()
	o.predictOpts.addPredictFlags(f)
	f.StringArrayVar(&o.crds, "crd", nil, "CRD to migrate (can repeat)")
	f.StringVar(&o.name, "name", "upgradeguard-migrate", "name of the ClusterRole and Role")
	f.StringVar(&o.leaseNamespace, "lease-namespace", "kube-system", "namespace of the migration Leases (as migrate --lease-namespace)")
	f.BoolVar(&o.storageSwitch, "allow-storage-switch", false, "also allow changing the CRDs' storage version (reverse migrations)")
	return cmd
}

func (o *rbacOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if (len(o.crds) > 0) == (o.predictOpts.chart.Ref != "" || o.predictOpts.rollback) {
		return couldNot("choose the CRDs with exactly one of --crd or --chart (or --rollback --release)")
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	names := o.crds
	if len(names) == 0 {
		o.predictOpts.output = "text"
		if err := o.predictOpts.validate(); err != nil {
			return err
		}
		rep, err := o.predictOpts.predict(ctx, conn)
		if err != nil {
			return err
		}
		for _, c := range rep.CRDs {
			if c.Verdict == predict.Migrate || (c.Verdict == predict.Bridge && c.StorageSwitchTo != "") {
				names = append(names, c.Name)
			}
		}
		if len(names) == 0 {
			return couldNot("check finds nothing to migrate for this chart, so no permissions are needed")
		}
	}
	live, err := conn.cluster.CRDs(ctx)
	if err != nil {
		return classify(err, conn)
	}
	crds := make([]*apiextv1.CustomResourceDefinition, 0, len(names))
	for _, n := range names {
		c, ok := live[n]
		if !ok {
			return couldNot("CRD %s not found: check the name with `kubectl get crd`", n)
		}
		crds = append(crds, c)
	}
	p := migrate.RBAC(o.name, o.leaseNamespace, crds, o.storageSwitch)
	fmt.Fprintf(streams.Out, "# Least privilege for `upgradeguard migrate` of %d CRD(s). Bind the ClusterRole with a\n# ClusterRoleBinding and the Role with a RoleBinding in %s.\n", len(crds), o.leaseNamespace)
	for _, obj := range []any{p.ClusterRole, p.Role} {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return couldNot("render: %v", err)
		}
		fmt.Fprintf(streams.Out, "---\n%s", data)
	}
	return nil
}
