// Package cliflag holds the typed flags several commands share: --helm-driver,
// --crd-policy, --engine, the chart-source flag set and --manifests (rendered manifests
// in place of a chart). Each one registers its flag, its default and its shell completion in one
// call, and turns the text into the library's type when the flags are parsed, so a wrong
// value fails before the command connects anywhere and no command parses it a second
// time. Every -o flag is internal/output's.
package cliflag

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"helm.sh/helm/v4/pkg/cli/values"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// HelmDriverFlag is the name of the Helm storage driver flag.
const HelmDriverFlag = "helm-driver"

// HelmDriverEnv is the environment variable Helm reads its storage driver from, and the
// flag's default.
const HelmDriverEnv = "HELM_DRIVER"

// HelmDriver is --helm-driver: the Helm release storage a command reads, as the library's
// helmrelease.Driver. It is a pflag.Value; Set accepts what helmrelease.ParseDriver does.
type HelmDriver struct {
	name   string             // as given: the flag's value, else $HELM_DRIVER ("" when neither)
	driver helmrelease.Driver // name parsed
	envErr error              // $HELM_DRIVER names no driver (and the flag was not given)
}

// AddHelmDriver registers --helm-driver on cmd, with its default ($HELM_DRIVER, else
// secret) and its completion (the driver names). A wrong --helm-driver fails when the
// flags are parsed; a wrong $HELM_DRIVER, when the flag does not replace it, fails
// before the command runs.
func AddHelmDriver(cmd *cobra.Command) *HelmDriver {
	d := &HelmDriver{name: os.Getenv(HelmDriverEnv)}
	if d.driver, d.envErr = helmrelease.ParseDriver(d.name); d.envErr != nil {
		d.envErr = fmt.Errorf("%s=%s: %w, or pass --%s", HelmDriverEnv, d.name, d.envErr, HelmDriverFlag)
	}
	cmd.Flags().Var(d, HelmDriverFlag, "Helm release storage: secret or configmap (default $HELM_DRIVER, else secret)")
	names := make([]string, len(helmrelease.Drivers))
	for i, n := range helmrelease.Drivers {
		names[i] = string(n)
	}
	_ = cmd.RegisterFlagCompletionFunc(HelmDriverFlag, cobra.FixedCompletions(names, cobra.ShellCompDirectiveNoFileComp))
	beforeRun(cmd, func() error {
		if d.envErr != nil && !cmd.Flags().Changed(HelmDriverFlag) {
			return d.envErr
		}
		return nil
	})
	return d
}

// Driver is the driver to read releases with. A nil HelmDriver (a command without the
// flag) is Helm's default, secret.
func (d *HelmDriver) Driver() helmrelease.Driver {
	if d == nil || d.driver == "" {
		return helmrelease.DriverSecret
	}
	return d.driver
}

// String is the value as given, "" when neither the flag nor $HELM_DRIVER set it (help
// then shows no default beside the usage's own words).
func (d *HelmDriver) String() string { return d.name }

// Type is the flag's type in help.
func (d *HelmDriver) Type() string { return "string" }

// Set parses a --helm-driver value.
func (d *HelmDriver) Set(s string) error {
	driver, err := helmrelease.ParseDriver(s)
	if err != nil {
		return err
	}
	d.name, d.driver, d.envErr = string(driver), driver, nil
	return nil
}

// DriverOf is the Helm driver a parsed command line asks for: its --helm-driver, or, for a
// command without the flag, $HELM_DRIVER (secret when unset or not a driver). Shell
// completion reads releases with it.
func DriverOf(fs *pflag.FlagSet) helmrelease.Driver {
	if f := fs.Lookup(HelmDriverFlag); f != nil {
		if d, ok := f.Value.(*HelmDriver); ok {
			return d.Driver()
		}
	}
	d, err := helmrelease.ParseDriver(os.Getenv(HelmDriverEnv))
	if err != nil {
		return helmrelease.DriverSecret
	}
	return d
}

// beforeRun makes check run before cmd's own pre-run hook.
func beforeRun(cmd *cobra.Command, check func() error) {
	prevE, prev := cmd.PreRunE, cmd.PreRun
	cmd.PreRun = nil
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if err := check(); err != nil {
			return err
		}
		switch {
		case prevE != nil:
			return prevE(c, args)
		case prev != nil:
			prev(c, args)
		}
		return nil
	}
}

// CRDPolicyFlag is the name of the CRD policy flag.
const CRDPolicyFlag = "crd-policy"

// CRDPolicyUsage is --crd-policy's help for an upgrade.
const CRDPolicyUsage = "which CRDs are applied: helm (crds/ never upgraded) or create-replace (Flux upgrade.crds=CreateReplace)"

// AddCRDPolicy registers --crd-policy on cmd, bound to policy and set to helm, with usage
// as its help and the policies as its completion. A value check.ParsePolicy rejects
// fails when the flags are parsed.
func AddCRDPolicy(cmd *cobra.Command, policy *check.CRDPolicy, usage string) {
	*policy = check.PolicyHelm
	cmd.Flags().Var((*crdPolicyValue)(policy), CRDPolicyFlag, usage)
	_ = cmd.RegisterFlagCompletionFunc(CRDPolicyFlag, cobra.FixedCompletions(
		[]string{string(check.PolicyHelm), string(check.PolicyCreateReplace)}, cobra.ShellCompDirectiveNoFileComp))
}

type crdPolicyValue check.CRDPolicy

func (p *crdPolicyValue) String() string { return string(*p) }
func (p *crdPolicyValue) Type() string   { return "string" }
func (p *crdPolicyValue) Set(s string) error {
	policy, err := check.ParsePolicy(s)
	if err != nil {
		return err
	}
	*p = crdPolicyValue(policy)
	return nil
}

// EngineFlag is the name of the migration engine flag.
const EngineFlag = "engine"

// EngineUse is what an --engine flag chooses: its values (the first is its default), how
// pkg/migrate reads them, and its help.
type EngineUse struct {
	Engines []migrate.Engine
	Parse   func(string) (migrate.Engine, error)
	Usage   string
}

// The two --engine flags: the engine a migration runs with (migrate), and the engine a
// role is for (rbac; auto has no role of its own).
var (
	RunEngine = EngineUse{Engines: migrate.Engines, Parse: migrate.ParseEngine,
		Usage: "who re-persists the objects: client (this process patches them), builtin (a StorageVersionMigration run by kube-controller-manager), " +
			"or auto (client when you may patch them, else builtin)"}
	RoleEngine = EngineUse{Engines: migrate.RoleEngines, Parse: migrate.ParseRoleEngine,
		Usage: "the role for this migrate --engine: client (patch on the custom resources) or builtin (StorageVersionMigrations; only list on the custom resources)"}
)

// AddEngine registers --engine on cmd as use describes it, bound to engine and set to
// use's first engine, with use's engines as its completion. A value use.Parse rejects
// fails when the flags are parsed.
func AddEngine(cmd *cobra.Command, use EngineUse, engine *migrate.Engine) {
	*engine = use.Engines[0]
	cmd.Flags().Var(&engineValue{engine: engine, parse: use.Parse}, EngineFlag, use.Usage)
	names := make([]string, len(use.Engines))
	for i, e := range use.Engines {
		names[i] = string(e)
	}
	_ = cmd.RegisterFlagCompletionFunc(EngineFlag, cobra.FixedCompletions(names, cobra.ShellCompDirectiveNoFileComp))
}

type engineValue struct {
	engine *migrate.Engine
	parse  func(string) (migrate.Engine, error)
}

func (v *engineValue) String() string { return string(*v.engine) }
func (v *engineValue) Type() string   { return "string" }
func (v *engineValue) Set(s string) error {
	e, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.engine = e
	return nil
}

// ChartRef is the flag that names the chart: its name and help.
type ChartRef struct{ Name, Usage string }

// The chart reference flags: --chart, the chart to upgrade to (check, plan, migrate,
// rbac, release apply-check), --to-chart, the chart a release moves to (release
// migrate), and crd adopt's --chart, the chart of the release a CRD joins.
var (
	Chart      = ChartRef{Name: "chart", Usage: "chart to upgrade to: " + chartRefForms}
	ToChart    = ChartRef{Name: "to-chart", Usage: "the new chart: " + chartRefForms}
	AdoptChart = ChartRef{Name: "chart", Usage: "the chart --to is installed or upgraded with (default: --to's installed revision): " +
		"it must render the CRD from templates/; " + chartRefForms}
)

const chartRefForms = "a directory, a .tgz, repo/name, a name with --repo, or oci://registry/path"

// chartSourceFlags are the flags AddChartSource registers besides the chart reference
// (whose name is the command's: --chart or --to-chart).
var chartSourceFlags = []string{"chart", "to-chart", "version", "repo", "values", "set", "set-string", "set-file", "set-json",
	"username", "password", "ca-file", "cert-file", "key-file", "insecure-skip-tls-verify-chart", "plain-http"}

// AddChartSource registers the chart-source flag set on fs, bound to src: the chart
// (ref), --version and --repo; the values (-f, --set, --set-string, --set-file,
// --set-json) into src.Values; and the repository or registry credentials and TLS
// settings (--username, --password, --ca-file, --cert-file, --key-file,
// --insecure-skip-tls-verify-chart, --plain-http). Every command that loads a chart
// takes the same set.
func AddChartSource(fs *pflag.FlagSet, ref ChartRef, src *chartsource.Options) {
	fs.StringVar(&src.Ref, ref.Name, "", ref.Usage)
	fs.StringVar(&src.Version, "version", "", "chart version or semver range (default: newest stable)")
	fs.StringVar(&src.RepoURL, "repo", "", "chart repository URL")
	AddValues(fs, &src.Values)
	fs.StringVar(&src.Username, "username", "", "chart repository or registry username")
	fs.StringVar(&src.Password, "password", "", "chart repository or registry password")
	fs.StringVar(&src.CAFile, "ca-file", "", "verify the chart server's certificate with this CA bundle")
	fs.StringVar(&src.CertFile, "cert-file", "", "client certificate for the chart server")
	fs.StringVar(&src.KeyFile, "key-file", "", "client key for the chart server")
	fs.BoolVar(&src.InsecureSkipTLSVerify, "insecure-skip-tls-verify-chart", false, "skip TLS verification of the chart server")
	fs.BoolVar(&src.PlainHTTP, "plain-http", false, "use plain HTTP for an OCI registry")
}

// AddValues registers the chart values flags (-f/--values, --set, --set-string,
// --set-file, --set-json) on fs, bound to v: the values every command that renders a
// chart takes the same way.
func AddValues(fs *pflag.FlagSet, v *values.Options) {
	fs.StringArrayVarP(&v.ValueFiles, "values", "f", nil, "values file (can repeat)")
	fs.StringArrayVar(&v.Values, "set", nil, "set values on the command line (can repeat: key1=val1,key2=val2)")
	fs.StringArrayVar(&v.StringValues, "set-string", nil, "set STRING values on the command line (can repeat)")
	fs.StringArrayVar(&v.FileValues, "set-file", nil, "set values from files (can repeat: key=path)")
	fs.StringArrayVar(&v.JSONValues, "set-json", nil, "set JSON values on the command line (can repeat)")
}

// ManifestsFlag is the name of the rendered-manifests flag.
const ManifestsFlag = "manifests"

// AddManifests registers --manifests on cmd, bound to path: rendered manifests (a file, a
// directory, or - for standard input) judged instead of a chart, with completion of
// directories and YAML and JSON files. The command checks that no other chart or release
// source is given with it (ManifestsConflict).
func AddManifests(cmd *cobra.Command, path *string) {
	cmd.Flags().StringVar(path, ManifestsFlag, "", "rendered manifests instead of a chart: a file, a directory (its *.yaml, *.yml, *.json) or - for stdin; "+
		"every CRD in them is applied, as kubectl apply and Argo CD do (create-replace)")
	_ = cmd.MarkFlagFilename(ManifestsFlag, "yaml", "yml", "json")
}

// ManifestsConflict is the error for --manifests given with a flag of the chart-source
// set (AddChartSource) or one of others (flag names without dashes: a command's release
// flags), or nil when none is set. It says what to do.
func ManifestsConflict(fs *pflag.FlagSet, others ...string) error {
	set := ChartSourceSet(fs, others...)
	if len(set) == 0 {
		return nil
	}
	return fmt.Errorf("--%s and %s do not go together: rendered manifests are the whole incoming side and are judged without a chart or release; "+
		"drop %s, or drop --%s to check a chart or release", ManifestsFlag, strings.Join(set, ", "), strings.Join(set, ", "), ManifestsFlag)
}

// ChartSourceSet lists, as --name, the flags of the chart-source set (AddChartSource)
// and of others (flag names without dashes) that the command line sets: what a command
// that reads its chart from elsewhere (--manifests, --argocd-app) refuses beside it.
func ChartSourceSet(fs *pflag.FlagSet, others ...string) []string {
	var set []string
	for _, name := range append(slices.Clone(chartSourceFlags), others...) {
		if f := fs.Lookup(name); f != nil && f.Changed {
			set = append(set, "--"+name)
		}
	}
	return set
}
