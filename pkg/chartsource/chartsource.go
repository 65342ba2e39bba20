// Package chartsource owns getting a chart and the CRDs it brings: from a local directory,
// a packaged .tgz, an HTTP(S) chart repository or an oci:// registry, rendered with the
// chart defaults, values files and --set, exactly as Helm would. Everything is done by the
// Helm SDK; this package only wires it and names failures so an operator can act on them.
//
// It is built in layers around one port, Loader: Helm loads with the Helm SDK every time
// and knows nothing of keeping, and a Cache wraps any Loader to keep what it fetched and
// rendered. History and CheckChart load through whichever Loader the caller gives them.
package chartsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	chartapi "helm.sh/helm/v4/pkg/chart"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	"helm.sh/helm/v4/pkg/registry"
	release "helm.sh/helm/v4/pkg/release/v1"
	repo "helm.sh/helm/v4/pkg/repo/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// Options say which chart to load and how to render it. The field names follow the helm
// flags they mirror.
type Options struct {
	// Ref is a chart directory, a .tgz, "repo/name" from the local repositories file, a
	// chart name together with RepoURL, or an oci:// reference.
	Ref string
	// Version is an exact version or a semver range; empty means the newest stable one.
	Version string
	// RepoURL is the chart repository URL (--repo).
	RepoURL string

	Values values.Options
	// BaseValues are used instead of chart-default overrides when Values sets nothing:
	// for example a release's stored values, to render an upgrade the way `helm upgrade
	// --reuse-values` would.
	BaseValues map[string]any

	Username, Password        string
	CertFile, KeyFile, CAFile string
	InsecureSkipTLSVerify     bool
	PlainHTTP                 bool
	PassCredentialsAll        bool
	// CredentialsID names the credentials above for a Loader that keeps what it fetched
	// (Cache), for example a Secret's namespace, name, UID and resourceVersion. It must
	// change when they change and must never hold them. With credentials and no
	// CredentialsID, nothing is kept.
	CredentialsID string

	// ReleaseName and Namespace are the .Release values templates see.
	ReleaseName string
	Namespace   string
	// KubeVersion is the .Capabilities.KubeVersion to render for, normally the live
	// cluster's. Empty uses Helm's default.
	KubeVersion string
	// IsUpgrade renders with .Release.IsUpgrade=true, as helm upgrade does.
	IsUpgrade bool

	// Settings carries Helm's cache and config paths. Nil uses the HELM_* environment.
	Settings *cli.EnvSettings
}

// Chart is a loaded and rendered chart.
type Chart struct {
	Name    string
	Version string
	// Path is where the chart was loaded from (a cached download for remote sources);
	// empty when it came from a Cache.
	Path string
	// Chart is the loaded chart; nil when a Cache served the render it kept.
	Chart *chart.Chart
	// Manifest is the rendered non-hook manifest.
	Manifest string
	// Hooks are the rendered hooks, with the events they run on.
	Hooks []*release.Hook
	CRDs  []chartcrds.CRD
	// Migrations are the StorageVersionMigrations the chart renders with its CRDs.
	Migrations []chartcrds.Migration
}

// ErrNoChart says that no chart reference was given.
var ErrNoChart = errors.New("no chart given: name a directory, .tgz, repo/name or oci:// reference")

// LoadError says that the chart could not be fetched, loaded or rendered. It is a
// "could not run" error: the prediction never started.
type LoadError struct {
	Ref  string
	Step string
	Err  error
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("chart %s: %s: %v", e.Ref, e.Step, e.Err)
}

func (e *LoadError) Unwrap() error { return e.Err }

// The steps of a LoadError that reach a chart server: a failure there is about the
// repository or registry (its address, credentials or protocol), not the chart.
const (
	StepFetch    = "fetch"
	StepVersions = "list versions"
)

// Remote says whether the chart server failed the load: fetching the chart or listing
// its versions, as opposed to loading or rendering what was fetched.
func (e *LoadError) Remote() bool { return e.Step == StepFetch || e.Step == StepVersions }

// AnsweredPlainHTTP says whether err is a registry that answered plain HTTP to an
// HTTPS request: an OCI registry without TLS, which needs PlainHTTP. Go's HTTP client
// reports it only in its message.
func AnsweredPlainHTTP(err error) bool {
	return err != nil && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

// Loader gets the chart that Options name and renders it. Helm does every step with the
// Helm SDK each time; a Cache is a Loader that wraps another and keeps what it got. A
// Loader returns a *LoadError when the chart cannot be had, except from Index (see there).
type Loader interface {
	// Load fetches, loads and renders the chart.
	Load(ctx context.Context, o Options) (*Chart, error)
	// Locate downloads the chart when it is remote and returns its local path.
	Locate(ctx context.Context, o Options) (string, error)
	// Render renders a chart already loaded, with o's values and release fields.
	Render(ctx context.Context, ch *chart.Chart, o Options) (*Chart, error)
	// Index reads the index of the HTTP(S) chart repository at o.RepoURL, with o's
	// credentials. Its error is a plain one: the caller says, in a *LoadError, which step
	// needed the index.
	Index(ctx context.Context, o Options) (*repo.IndexFile, error)
}

// Helm is the Loader that asks the Helm SDK at every call and keeps nothing.
type Helm struct{}

// Load fetches, loads and renders the chart with the Helm SDK (Helm.Load); a caller that
// loads the same remote charts again and again loads through a Cache instead.
func Load(ctx context.Context, o Options) (*Chart, error) { return Helm{}.Load(ctx, o) }

// Load fetches, loads and renders the chart.
func (Helm) Load(ctx context.Context, o Options) (*Chart, error) {
	if strings.TrimSpace(o.Ref) == "" {
		return nil, &LoadError{Ref: "(none)", Step: "locate", Err: ErrNoChart}
	}
	settings := o.settings()
	path, err := o.Locate(settings)
	if err != nil {
		return nil, err
	}
	ch, err := loadChart(o.Ref, path)
	if err != nil {
		return nil, err
	}
	return o.render(ctx, settings, path, ch)
}

// Locate downloads the chart when it is remote and returns its local path
// (Options.Locate).
func (Helm) Locate(_ context.Context, o Options) (string, error) { return o.Locate(nil) }

// Render renders a chart already loaded (the package's Render).
func (Helm) Render(ctx context.Context, ch *chart.Chart, o Options) (*Chart, error) {
	return Render(ctx, ch, o)
}

// Index downloads the repository's index into a directory of its own under Helm's
// repository cache, reads it and removes it, so that concurrent reads of one repository
// never meet in a file.
func (Helm) Index(_ context.Context, o Options) (*repo.IndexFile, error) {
	settings := o.settings()
	if err := os.MkdirAll(settings.RepositoryCache, 0o755); err != nil {
		return nil, fmt.Errorf("prepare the repository cache: %w", err)
	}
	dir, err := os.MkdirTemp(settings.RepositoryCache, "upgradeguard-index-")
	if err != nil {
		return nil, fmt.Errorf("prepare the repository cache: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	r, err := repo.NewChartRepository(&repo.Entry{
		Name: "upgradeguard", URL: o.RepoURL,
		Username: o.Username, Password: o.Password, PassCredentialsAll: o.PassCredentialsAll,
		CertFile: o.CertFile, KeyFile: o.KeyFile, CAFile: o.CAFile, InsecureSkipTLSVerify: o.InsecureSkipTLSVerify,
	}, getter.All(settings))
	if err != nil {
		return nil, err
	}
	r.CachePath = dir
	file, err := r.DownloadIndexFile()
	if err != nil {
		return nil, fmt.Errorf("index of %s: %w (check the URL and that the repository is reachable)", o.RepoURL, err)
	}
	return repo.LoadIndexFile(file)
}

// Fetch fetches and loads the chart without rendering it, for a caller that installs it
// itself (with the Helm SDK) and renders it with Render.
func Fetch(o Options) (*chart.Chart, error) {
	if strings.TrimSpace(o.Ref) == "" {
		return nil, &LoadError{Ref: "(none)", Step: "locate", Err: ErrNoChart}
	}
	path, err := o.Locate(o.settings())
	if err != nil {
		return nil, err
	}
	return loadChart(o.Ref, path)
}

// Render renders a chart the caller has already loaded, with o's values and release
// fields, and returns the CRDs it brings. o.Ref only names the chart in errors (the chart
// name when empty); the fetch fields are not used.
func Render(ctx context.Context, ch *chart.Chart, o Options) (*Chart, error) {
	if ch == nil || ch.Metadata == nil {
		return nil, &LoadError{Ref: orDefault(o.Ref, "(none)"), Step: "render", Err: errors.New("no chart given: load it first (chartsource.Fetch or the Helm SDK loader)")}
	}
	o.Ref = orDefault(o.Ref, ch.Name())
	if err := checkDependencies(o.Ref, o.Ref, ch); err != nil {
		return nil, err
	}
	return o.render(ctx, o.settings(), "", ch)
}

// Locate downloads the chart when it is remote and returns its local path.
func (o Options) Locate(settings *cli.EnvSettings) (string, error) {
	if settings == nil {
		settings = o.settings()
	}
	rc, err := o.registryClient(settings)
	if err != nil {
		return "", &LoadError{Ref: o.Ref, Step: "registry client", Err: err}
	}
	install := action.NewInstall(action.NewConfiguration())
	install.ChartPathOptions = o.pathOptions()
	install.SetRegistryClient(rc)
	if err := os.MkdirAll(settings.RepositoryCache, 0o755); err != nil {
		return "", &LoadError{Ref: o.Ref, Step: "prepare cache", Err: err}
	}
	path, err := install.LocateChart(o.Ref, settings)
	if err != nil {
		return "", &LoadError{Ref: o.Ref, Step: StepFetch, Err: fmt.Errorf("%w (check the chart reference, its version and repository URL, and that the repository or registry is reachable)", err)}
	}
	return path, nil
}

func loadChart(ref, path string) (*chart.Chart, error) {
	charter, err := loader.Load(path)
	if err != nil {
		return nil, &LoadError{Ref: ref, Step: "load", Err: fmt.Errorf("%w (run `%s` to see what is wrong)", err, cmdline.HelmLint{Path: path})}
	}
	ch, ok := charter.(*chart.Chart)
	if !ok {
		return nil, &LoadError{Ref: ref, Step: "load", Err: fmt.Errorf("unsupported chart API version %T", charter)}
	}
	if err := checkDependencies(ref, path, ch); err != nil {
		return nil, err
	}
	return ch, nil
}

func checkDependencies(ref, path string, ch *chart.Chart) error {
	ac, err := chartapi.NewAccessor(ch)
	if err != nil {
		return &LoadError{Ref: ref, Step: "load", Err: err}
	}
	if err := action.CheckDependencies(ch, ac.MetaDependencies()); err != nil {
		return &LoadError{Ref: ref, Step: "dependencies", Err: fmt.Errorf("%w (run `%s`)", err, cmdline.HelmDependencyBuild{Path: path})}
	}
	return nil
}

func (o Options) render(ctx context.Context, settings *cli.EnvSettings, path string, ch *chart.Chart) (*Chart, error) {
	vals, err := o.Values.MergeValues(getter.All(settings))
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: "values", Err: err}
	}
	if len(vals) == 0 && o.BaseValues != nil {
		vals = o.BaseValues
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.DisableHooks = false
	install.IsUpgrade = o.IsUpgrade
	install.ReleaseName = orDefault(o.ReleaseName, "release-name")
	install.Namespace = orDefault(o.Namespace, "default")
	if o.KubeVersion != "" {
		kv, err := common.ParseKubeVersion(o.KubeVersion)
		if err != nil {
			return nil, &LoadError{Ref: o.Ref, Step: "render", Err: err}
		}
		install.KubeVersion = kv
	}
	rel, err := install.RunWithContext(ctx, ch, vals)
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: "render", Err: err}
	}
	r, ok := rel.(*release.Release)
	if !ok {
		return nil, &LoadError{Ref: o.Ref, Step: "render", Err: fmt.Errorf("unexpected release type %T", rel)}
	}
	crds, err := chartcrds.All(ch, r.Manifest)
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: "read CRDs", Err: err}
	}
	migrations, err := chartcrds.MigrationsFromManifest(r.Manifest)
	if err != nil {
		return nil, &LoadError{Ref: o.Ref, Step: "read StorageVersionMigrations", Err: err}
	}
	return &Chart{Name: ch.Name(), Version: ch.Metadata.Version, Path: path, Chart: ch, Manifest: r.Manifest, Hooks: r.Hooks,
		CRDs: crds, Migrations: migrations}, nil
}

func (o Options) pathOptions() action.ChartPathOptions {
	return action.ChartPathOptions{
		CaFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile,
		InsecureSkipTLSVerify: o.InsecureSkipTLSVerify, PlainHTTP: o.PlainHTTP,
		Password: o.Password, Username: o.Username, PassCredentialsAll: o.PassCredentialsAll,
		RepoURL: o.RepoURL, Version: o.Version,
	}
}

func (o Options) registryClient(settings *cli.EnvSettings) (*registry.Client, error) {
	opts := []registry.ClientOption{
		registry.ClientOptEnableCache(true),
		registry.ClientOptWriter(io.Discard),
		registry.ClientOptCredentialsFile(settings.RegistryConfig),
		registry.ClientOptBasicAuth(o.Username, o.Password),
	}
	if o.PlainHTTP {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	return registry.NewClient(opts...)
}

// WithStoredCredentials is o with the credentials and TLS files that `helm repo add`
// stored (Helm's repositories file, o's settings) for the repository at o.RepoURL, as
// `helm dependency build` uses them for a dependency's repository: o as it is when it
// names a username or a client certificate itself, names no repository URL, or the file
// holds no entry for it.
func (o Options) WithStoredCredentials() Options {
	if o.RepoURL == "" || o.Username != "" || o.CertFile != "" {
		return o
	}
	f, err := repo.LoadFile(o.settings().RepositoryConfig)
	if err != nil {
		return o
	}
	want := strings.TrimSuffix(o.RepoURL, "/")
	for _, e := range f.Repositories {
		if strings.TrimSuffix(e.URL, "/") == want {
			o.Username, o.Password, o.PassCredentialsAll = e.Username, e.Password, e.PassCredentialsAll
			o.CertFile, o.KeyFile, o.CAFile, o.InsecureSkipTLSVerify = e.CertFile, e.KeyFile, e.CAFile, e.InsecureSkipTLSVerify
			return o
		}
	}
	return o
}

func (o Options) settings() *cli.EnvSettings {
	if o.Settings != nil {
		return o.Settings
	}
	return cli.New()
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
