package cli

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

type checkOptions struct {
	cmdName    string // the command, for error advice: check unless set
	chart      chartsource.Options
	release    string
	rollback   bool
	toRevision int
	helmDriver *cliflag.HelmDriver
	crdPolicy  check.CRDPolicy
	output     string
	verbose    bool
	noHistory  bool
	// manifests is --manifests (rendered manifests instead of a chart), read from stdin
	// when it is "-"; flags is the command's flag set, to refuse other sources beside it.
	manifests string
	stdin     io.Reader
	flags     *pflag.FlagSet
	// argo is --argocd-app (check and plan): the chart source read from an Argo CD
	// Application.
	argo argoAppOptions
	// argoChart is the --argocd-app source while check runs: it explains a chart server
	// that cannot be read in terms of Argo CD's repository Secrets.
	argoChart *argoapp.Chart
	// upgrade words a step to a chart version in the deployer's terms (check.Sources.Upgrade).
	upgrade func(chartVersion string) string
	// deployer runs the operation, and current are the CRDs it applies today when no Helm
	// release says (check.Sources.Deployer and Current): Argo CD's, for --argocd-app.
	deployer predict.Deployer
	current  []chartcrds.CRD
}

func newCheckCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &checkOptions{}
	cmd := &cobra.Command{
		Use:   "check [RELEASE] (--chart REF | --rollback --release NAME | --manifests FILE|DIR|- | --argocd-app NS/NAME)",
		Short: "Predict whether an upgrade or rollback will fail on CRD storage versions",
		Long: `check compares the CRDs an upgrade or rollback brings with the live CRDs and says, for
each one, what the API server will do:

  ok       the update is accepted (or the CRD is new, or Helm will not touch it)
  migrate  a stored version is dropped; migrating objects to the live storage
           version and pruning storedVersions fixes it (upgradeguard migrate)
  bridge   the live storage version itself is dropped; the storage version must
           move first (a storage switch, or a stepping-stone chart version)
  delete   the release stops rendering a live CRD: Helm deletes it and every
           object of its type
  move     the CRD moves from one Helm release to another: the release it leaves
           deletes it, the one it joins refuses it, until it is kept and Helm's
           ownership moves (upgradeguard crd adopt)
  prune    (--argocd-app) the Application stops rendering a live CRD, but its
           sync does not prune: nothing is lost now (exit 0); a sync with prune
           would delete it and every object of its type

--manifests judges rendered manifests instead of a chart (helm template --include-crds,
kustomize build, argocd app manifests): multi-document YAML, JSON, and List kinds, from a
file, a directory or standard input (-). Applied whole, as kubectl apply and Argo CD do,
they write every CRD they carry, from crds/ or templates/ alike: the prediction is the
upgrade under --crd-policy create-replace, with no release (nothing is found deleted).
Other objects are not judged; those of a CRD's kind are counted.

--argocd-app reads an Argo CD Application's Helm source the way Argo CD's repo-server
does (chart and targetRevision from a Helm repository, an OCI registry or a git path;
values files, values, valuesObject, parameters; the release name; the destination
namespace) and judges that chart under create-replace, since Argo CD applies every CRD
on each sync (helm.skipCrds: crds/ left out). A CRD the Application's resource tree lists
and the target renders nowhere leaves it: its automated sync deletes it when it prunes
(spec.syncPolicy.automated.prune), unless the CRD's sync options say Prune=false.
Kustomize, plugin and directory sources are refused with the command that judges them
instead.

check only reads from the cluster. Exit codes: 0 safe, 1 findings, 2 could not run.`,
		Example: `  # Upgrade of a release to a chart in a repository
  upgradeguard check --chart flux2 --repo https://fluxcd-community.github.io/helm-charts \
    --version 2.18.2 --release flux -n flux-system

  # The same from an OCI registry, with values
  upgradeguard check --chart oci://ghcr.io/fluxcd-community/charts/flux2 --version '~2.18' \
    -f values.yaml --set crds.migration.enabled=true --release flux -n flux-system

  # Rollback to the previous revision, as JSON for a script
  upgradeguard check --rollback --release flux -n flux-system -o json

  # The release as a positional argument, as Helm takes it
  upgradeguard check flux --chart ./charts/flux2 -n flux-system

  # Rendered manifests in CI, from standard input
  helm template flux2 ./charts/flux2 --include-crds -n flux-system | upgradeguard check --manifests -
  kustomize build ./clusters/prod | upgradeguard check --manifests -

  # An Argo CD Application, before it syncs
  upgradeguard check --argocd-app argocd/flux`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 { // the release as Helm takes it: check RELEASE --chart REF
				if o.release != "" && o.release != args[0] {
					return couldNot("release %q and --release %q differ: name the release once", args[0], o.release)
				}
				o.release = args[0]
			}
			return o.run(cmd.Context(), streams, kube)
		},
	}
	o.addPredictFlags(cmd)
	o.addManifestsFlag(cmd, streams)
	o.argo.addFlags(cmd)
	f := cmd.Flags()
	output.AddReportFlag(f, &o.output)
	f.BoolVarP(&o.verbose, "verbose", "v", false, "show every CRD, not only those that change")
	f.BoolVar(&o.noHistory, "no-stepping-stone", false, "do not search the chart's repository for a stepping-stone version")
	return cmd
}

// addPredictFlags registers the flags that choose what is predicted: shared by check,
// plan, release apply-check, and migrate and rbac (--chart and --rollback select CRDs
// there).
func (o *checkOptions) addPredictFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	cliflag.AddChartSource(f, cliflag.Chart, &o.chart)
	f.StringVar(&o.release, "release", "", "Helm release name: finds CRDs the upgrade would delete; required with --rollback")
	f.BoolVar(&o.rollback, "rollback", false, "predict a rollback of --release instead of an upgrade")
	f.IntVar(&o.toRevision, "to-revision", 0, "rollback target revision (default: the previous one, as helm rollback)")
	o.helmDriver = cliflag.AddHelmDriver(cmd)
	cliflag.AddCRDPolicy(cmd, &o.crdPolicy, cliflag.CRDPolicyUsage)
}

// addManifestsFlag registers --manifests: check, migrate and rbac take rendered manifests
// in place of --chart (plan refuses them with advice).
func (o *checkOptions) addManifestsFlag(cmd *cobra.Command, streams Streams) {
	cliflag.AddManifests(cmd, &o.manifests)
	o.stdin, o.flags = streams.In, cmd.Flags()
}

// command names the command these options belong to, for error advice.
func (o *checkOptions) command() string {
	if o.cmdName == "" {
		return cmdCheck
	}
	return o.cmdName
}

func (o *checkOptions) validate() error {
	if o.argo.ref != "" && o.release != "" && !o.flags.Changed("release") {
		return couldNot("--%s and release %q do not go together: Argo CD keeps no Helm release, and the Application names the release; drop %q",
			argoAppFlag, o.release, o.release)
	}
	if o.argo.ref != "" {
		return o.argo.validate(o.flags, nil, "release", "rollback", "to-revision")
	}
	if o.manifests != "" {
		return o.validateManifests()
	}
	switch {
	case o.rollback && o.chart.Ref != "":
		return couldNot("--rollback and --chart do not go together: a rollback's CRDs come from the stored revision")
	case o.rollback && o.release == "":
		return couldNot("--rollback needs --release NAME (and -n NAMESPACE)")
	case !o.rollback && o.chart.Ref == "":
		return couldNot("nothing to check: pass --chart REF for an upgrade, or --rollback --release NAME")
	case !o.rollback && o.toRevision != 0:
		return couldNot("--to-revision only applies with --rollback")
	case o.toRevision < 0:
		return couldNot("--to-revision must be a positive revision number")
	}
	return nil
}

// validateManifests refuses what does not go with --manifests: rendered manifests are the
// whole incoming side, applied whole.
func (o *checkOptions) validateManifests() error {
	switch {
	case o.flags.Changed(cliflag.CRDPolicyFlag):
		return couldNot("--%s does not apply to --%s: applying rendered manifests writes every CRD in them, from crds/ or templates/ "+
			"(create-replace); drop --%s", cliflag.CRDPolicyFlag, cliflag.ManifestsFlag, cliflag.CRDPolicyFlag)
	case o.release != "" && !o.flags.Changed("release"):
		return couldNot("--%s and release %q do not go together: rendered manifests are judged without a release; drop the release, "+
			"or drop --%s to check a chart upgrade of the release", cliflag.ManifestsFlag, o.release, cliflag.ManifestsFlag)
	}
	if err := cliflag.ManifestsConflict(o.flags, "release", "rollback", "to-revision", cliflag.HelmDriverFlag, "no-stepping-stone"); err != nil {
		return couldNot("%w", err)
	}
	return nil
}

func (o *checkOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	rep, err := o.predict(ctx, conn)
	if err != nil {
		return err
	}
	return finishReport(streams, o.output, rep, func(w io.Writer) error { return renderText(w, o.verbose, rep) }, rep.FindingReport, !rep.Safe)
}

// predict runs the upgrade or rollback prediction the flags describe: one check.Predict.
func (o *checkOptions) predict(ctx context.Context, conn *connection) (*check.Report, error) {
	if o.manifests != "" {
		return o.predictManifests(ctx, conn)
	}
	if o.argo.ref != "" {
		return o.predictArgoApp(ctx, conn)
	}
	o.chart.ReleaseName, o.chart.Namespace, o.chart.KubeVersion = o.release, conn.namespace, conn.serverVersion
	return o.predictChart(ctx, conn)
}

// predictArgoApp judges --argocd-app: the Application's chart, release name, namespace
// and CRD policy in place of the flags, then the one prediction of a chart upgrade. There
// is no Helm release: Argo CD renders with helm template and keeps no release record.
func (o *checkOptions) predictArgoApp(ctx context.Context, conn *connection) (*check.Report, error) {
	c, err := o.argo.resolve(ctx, o.command(), conn)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	o.chart, o.crdPolicy, o.release, o.argoChart = c.Options, c.Policy, "", c
	o.upgrade, o.deployer, o.current = c.Upgrade, c.Deployer, c.Current
	rep, err := o.predictChart(ctx, conn)
	if err != nil {
		return nil, err
	}
	rep.Application, rep.Namespace = o.argo.ref, c.Options.Namespace
	return rep, nil
}

// predictChart predicts the upgrade to o.chart, or the rollback, of o.release.
func (o *checkOptions) predictChart(ctx context.Context, conn *connection) (*check.Report, error) {
	s := check.Sources{Cluster: conn.cluster, Release: o.release, Namespace: o.chart.Namespace, Policy: o.crdPolicy,
		Rollback: o.rollback, ToRevision: o.toRevision, Upgrade: o.upgrade, Deployer: o.deployer, Current: o.current}
	if o.argoChart == nil {
		s.ChartRef = o.chart.Ref
	}
	if o.release != "" {
		reader, err := helmrelease.NewReader(conn.clientset, conn.namespace, o.helmDriver.Driver())
		if err != nil {
			return nil, couldNot("%w", err)
		}
		s.Releases = reader
	}
	if !o.rollback {
		s.Chart = chartsource.CheckChart(chartsource.Helm{}, o.chart)
		if !o.noHistory {
			s.SteppingStones = &chartsource.History{Options: o.chart}
		}
	}
	p, err := check.Predict(ctx, s)
	err = o.argoChart.Explain(err)
	var load *chartsource.LoadError
	if errors.As(err, &load) {
		return nil, chartFailed(o.command(), err)
	}
	if err != nil {
		return nil, classifyAs(o.command(), err, conn)
	}
	return p.Report, nil
}

// predictManifests judges --manifests: check.PredictManifests, the upgrade prediction
// with every CRD of the manifests applied.
func (o *checkOptions) predictManifests(ctx context.Context, conn *connection) (*check.Report, error) {
	stdin := o.stdin
	if stdin == nil {
		stdin = os.Stdin
	}
	r, err := chartcrds.ReadRendered(o.manifests, stdin)
	if err != nil {
		return nil, couldNot("read --%s: %w; fix the manifests, or the command that renders them", cliflag.ManifestsFlag, err)
	}
	p, err := check.PredictManifests(ctx, check.Sources{Cluster: conn.cluster}, r)
	if err != nil {
		return nil, classifyAs(o.command(), err, conn)
	}
	return p.Report, nil
}

// connection is the CLI's target: the livecluster.Target of the kubeconfig, and the
// namespace it names.
type connection struct {
	config        *rest.Config
	clientset     kubernetes.Interface
	cluster       *livecluster.KubeCluster
	namespace     string
	serverVersion string
	host          string
}

// connect loads the kubeconfig and connects to its cluster as every front end does
// (livecluster.Connect), which checks that the API server answers, so that an
// unreachable cluster is reported once, clearly, before any other work.
func connect(ctx context.Context, kube *genericclioptions.ConfigFlags) (*connection, error) {
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, couldNot("load kubeconfig: %w (set --kubeconfig or KUBECONFIG, and --context)", err)
	}
	ns, _, err := kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, couldNot("read namespace from kubeconfig: %w", err)
	}
	t, err := livecluster.Connect(ctx, cfg)
	var unreachable *livecluster.UnreachableError
	switch {
	case errors.As(err, &unreachable):
		return nil, couldNot("%w (check --kubeconfig, --context and that the cluster is up)", err)
	case err != nil:
		return nil, couldNot("build client: %w", err)
	}
	return &connection{config: t.Config, clientset: t.Clientset, cluster: t.Cluster, namespace: ns, serverVersion: t.Version, host: cfg.Host}, nil
}
