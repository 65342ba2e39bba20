package argoapp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"helm.sh/helm/v4/pkg/cli"
	"sigs.k8s.io/yaml"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Kind is where an Application's chart comes from.
type Kind string

const (
	// HelmRepository is a chart of an HTTP(S) Helm chart repository (spec.source.chart).
	HelmRepository Kind = "helm-repository"
	// OCI is a chart of an OCI registry: an oci:// repoURL, or a bare registry host and
	// path as Argo CD writes OCI Helm repositories.
	OCI Kind = "oci"
	// Git is a chart directory at spec.source.path in a git repository.
	Git Kind = "git"
)

// DefaultNamespace is the namespace Argo CD runs in and keeps its repository Secrets in.
const DefaultNamespace = "argocd"

// Options say how to read an Application's source.
type Options struct {
	// Secrets reads Argo CD's repository Secrets for credentials; nil reads none.
	Secrets corev1client.SecretsGetter
	// Recorded says the cluster is read from a record of it (a snapshot), which holds no
	// repository Secret: the chart is fetched with Helm's own settings (Helm) alone, and
	// a chart server that cannot be read says so (RepositoryError.NoSecrets).
	Recorded bool
	// ConfigMaps reads Argo CD's settings (argocd-cm) for its resource tracking; nil reads
	// none, and every CRD of the Application's resource tree then counts as tracked.
	ConfigMaps corev1client.ConfigMapsGetter
	// Settings, when set, are Argo CD's settings as a record of the cluster (a snapshot)
	// holds them, read instead of argocd-cm.
	Settings *Settings
	// Helm carries Helm's settings for fetching the chart (its registry config and
	// cache); nil uses the HELM_* environment.
	Helm *cli.EnvSettings
	// Namespace is where Argo CD runs and keeps its settings and repository Secrets
	// (DefaultNamespace when empty).
	Namespace string
	// Refs are local copies of the sources that a multi-source Application's values files
	// name as $REF/PATH: a folder per ref (spec.sources[].ref). A $ref without one is an
	// *UnsupportedError.
	Refs map[string]string
	// GitCharts, when set, serves the chart folder of a git source (repoURL, path) from
	// elsewhere, its dependencies in charts/ (review reads the revision under review):
	// nothing is cloned and no credential read. ok false clones the source as usual; an
	// error is an *UnsupportedError with its message.
	GitCharts func(ctx context.Context, repoURL, path string) (dir string, ok bool, err error)
}

// Chart is an Application's Helm source as a chart source: Options load and render it
// the way Argo CD's repo-server does (chartsource.Load, chartsource.History). Close
// removes what Resolve wrote (a git clone, an unpacked chart, the inline values).
type Chart struct {
	// Subject is Application/<namespace>/<name>.
	Subject string
	Kind    Kind
	// RepoURL, Chart, Path and TargetRevision are the source's own fields.
	RepoURL, Chart, Path, TargetRevision string
	// Commit is the git commit the target revision resolved to (git sources only).
	Commit string
	// Options is the chart source, as --chart, --repo, --version and the values flags
	// would give it, with the release name and namespace Argo CD renders with.
	Options chartsource.Options
	// Policy is the CRD policy of Argo CD's sync: create-replace (every CRD, from crds/
	// or templates/, applied), or helm when helm.skipCrds leaves crds/ out.
	Policy check.CRDPolicy
	// Credentials is the repository Secret (namespace/name) whose credentials were used;
	// its data is never reported.
	Credentials string
	// Notes say what of the source was read but not applied.
	Notes []string
	// SourcePosition is the 1-based position of the Helm source in spec.sources (what
	// `argocd app set --source-position` takes); 0 for spec.source.
	SourcePosition int
	// Deployed is the chart version Argo CD last deployed, and DeployedFrom where it was
	// read (Application.Deployed); empty when the Application does not say.
	Deployed, DeployedFrom string
	// Deployer is Argo CD syncing the Application (Application.Deployer), and Current the
	// CRDs it manages today (Application.ManagedCRDs, each named only): what a prediction
	// needs to say which CRDs leave the Application and what its sync does with them.
	Deployer predict.Deployer
	Current  []chartcrds.CRD

	dir              string
	unpacked         bool
	secretsNamespace string
	// noSecrets is true when the cluster holds no repository Secret (Options.Recorded).
	noSecrets bool
	refs      map[string]string
	app       *Application
}

// Local says whether Options.Ref is a chart directory on disk (a git checkout, or a
// repository chart unpacked to read values files in it): its one version is all the
// source offers.
func (c *Chart) Local() bool { return c.Kind == Git || c.unpacked }

// Close removes the files Resolve wrote.
func (c *Chart) Close() error {
	if c == nil || c.dir == "" {
		return nil
	}
	return os.RemoveAll(c.dir)
}

// UnsupportedError says that the Application's source is not one upgradeguard reads,
// and what to run instead.
type UnsupportedError struct {
	Subject, Reason, Instead string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s: %s; instead: %s", e.Subject, e.Reason, e.Instead)
}

// ManifestsCommand is what judges any Application: its rendered manifests from Argo CD,
// checked as rendered manifests (the namespace is named only when it is not Argo CD's
// default).
func ManifestsCommand(app *Application) string {
	c := cmdline.CheckApplicationManifests{Name: app.Name}
	if app.Namespace != DefaultNamespace {
		c.Namespace = app.Namespace
	}
	return c.String()
}

func (a *Application) unsupported(format string, args ...any) error {
	return &UnsupportedError{Subject: a.Subject(), Reason: fmt.Sprintf(format, args...), Instead: ManifestsCommand(a)}
}

// Resolve turns the Application's Helm source into a chart source: it reads repository
// credentials, clones a git source at its target revision, and writes the inline values
// to a file, all in a temporary directory the caller removes with Chart.Close.
func Resolve(ctx context.Context, app *Application, o Options) (*Chart, error) {
	src, err := app.HelmSource()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "upgradeguard-argoapp-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", app.Subject(), err)
	}
	c := &Chart{Subject: app.Subject(), RepoURL: src.RepoURL, Chart: src.Chart, Path: src.Path, TargetRevision: src.TargetRevision,
		Policy: check.PolicyCreateReplace, dir: dir, secretsNamespace: o.namespace(), noSecrets: o.Recorded, refs: o.Refs, app: app}
	c.Options.Settings = o.Helm
	c.Deployed, c.DeployedFrom = app.Deployed()
	d := app.Deployer()
	if d.Sync.Tracking, err = Tracking(ctx, o, app); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %w", app.Subject(), err)
	}
	c.Deployer = d
	for _, name := range app.ManagedCRDs() {
		crd := &apiextv1.CustomResourceDefinition{}
		crd.Name = name
		c.Current = append(c.Current, chartcrds.CRD{CRD: crd})
	}
	_, pos := app.helmSourcePosition()
	c.SourcePosition = pos + 1
	if err := c.resolve(ctx, app, src, o); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Chart) resolve(ctx context.Context, app *Application, src *Source, o Options) error {
	if src.Chart == "" && o.GitCharts != nil {
		dir, ok, err := o.GitCharts(ctx, src.RepoURL, src.Path)
		if err != nil {
			return app.unsupported("path %q: %v", src.Path, err)
		}
		if ok {
			c.Kind, c.Options.Ref = Git, dir
			return c.helmOptions(app, src, dir)
		}
	}
	creds, err := credentialsFor(ctx, o, src.RepoURL)
	var unusable *unusableError
	if errors.As(err, &unusable) {
		return app.unsupported("%v", err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", app.Subject(), err)
	}
	c.Credentials = creds.secret
	chartDir := ""
	if src.Chart == "" {
		if chartDir, err = c.checkout(ctx, app, src, creds); err != nil {
			return err
		}
	} else if chartDir, err = c.helmChart(src, creds); err != nil {
		return c.Explain(err)
	}
	return c.helmOptions(app, src, chartDir)
}

// HelmSource is the one source Argo CD renders with Helm: spec.source, or the one
// source of spec.sources that names a chart or a path (sources with only a ref hold
// values files for the others). Other shapes are an *UnsupportedError.
func (a *Application) HelmSource() (*Source, error) {
	var candidates []*Source
	if a.Spec.Source != nil {
		candidates = append(candidates, a.Spec.Source)
	}
	for i := range a.Spec.Sources {
		if s := &a.Spec.Sources[i]; s.Chart != "" || s.Path != "" {
			candidates = append(candidates, s)
		}
	}
	switch {
	case len(candidates) == 0:
		return nil, a.unsupported("no source names a Helm chart (spec.source or spec.sources with chart or path)")
	case len(candidates) > 1:
		return nil, a.unsupported("%d sources render manifests; upgradeguard reads an Application with one Helm source", len(candidates))
	}
	s := candidates[0]
	switch {
	case s.Kustomize != nil:
		return nil, a.unsupported("the source is Kustomize (spec.source.kustomize); upgradeguard reads Helm sources")
	case s.Plugin != nil:
		return nil, a.unsupported("the source is a config management plugin (spec.source.plugin); upgradeguard reads Helm sources")
	case s.Directory != nil:
		return nil, a.unsupported("the source is a directory of manifests (spec.source.directory); upgradeguard reads Helm sources")
	case s.RepoURL == "":
		return nil, a.unsupported("the source has no repoURL")
	}
	return s, nil
}

// helmSourcePosition is the Helm source and its index in spec.sources (-1 for
// spec.source); nil when HelmSource refuses the Application.
func (a *Application) helmSourcePosition() (*Source, int) {
	src, err := a.HelmSource()
	if err != nil {
		return nil, -1
	}
	for i := range a.Spec.Sources {
		if &a.Spec.Sources[i] == src {
			return src, i
		}
	}
	return src, -1
}

// String names the source: its repository, chart or path, and target revision.
func (s *Source) String() string {
	return fmt.Sprintf("%s %s%s@%s", s.RepoURL, s.Chart, s.Path, orHEAD(s.TargetRevision))
}

// chartRef is the chartsource reference of a chart in a Helm or OCI repository, as
// Argo CD reads repoURL: http(s) is a chart repository, oci:// or a bare host and path
// an OCI registry.
func chartRef(repoURL, chart string) (kind Kind, ref, repo string) {
	switch {
	case strings.HasPrefix(repoURL, "oci://"):
		return OCI, strings.TrimSuffix(repoURL, "/") + "/" + chart, ""
	case strings.HasPrefix(repoURL, "http://"), strings.HasPrefix(repoURL, "https://"):
		return HelmRepository, chart, repoURL
	default:
		return OCI, "oci://" + strings.TrimSuffix(repoURL, "/") + "/" + chart, ""
	}
}

// helmChart fills in a chart of a Helm or OCI repository. When values files name
// paths in the chart, the chart is fetched and unpacked so they can be read, as the
// repo-server does; the directory is returned.
func (c *Chart) helmChart(src *Source, creds credentials) (string, error) {
	c.Kind, c.Options.Ref, c.Options.RepoURL = chartRef(src.RepoURL, src.Chart)
	if isDigest(src.TargetRevision) {
		return "", fmt.Errorf("%s: targetRevision %q is a digest: Argo CD resolves a Helm chart's targetRevision as a chart version, "+
			"a semver range or a tag, and fails to sync a digest; set targetRevision to the chart version", c.Subject, src.TargetRevision)
	}
	c.Options.Version = src.TargetRevision
	creds.apply(&c.Options)
	if src.Helm != nil {
		c.Options.PassCredentialsAll = src.Helm.PassCredentials
	}
	if !needsChartFiles(src.Helm) {
		return "", nil
	}
	dir, err := unpack(c.Options, filepath.Join(c.dir, "chart"), path.Base(src.Chart))
	if err != nil {
		return "", err
	}
	c.Options.Ref, c.Options.RepoURL, c.Options.Version, c.unpacked = dir, "", "", true
	return dir, nil
}

// isDigest says whether a target revision is a content digest (sha256:..., or
// TAG@sha256:...), which only OCI artifact sources without a chart resolve.
func isDigest(rev string) bool {
	d := rev[strings.LastIndex(rev, "@")+1:]
	return strings.HasPrefix(d, "sha256:") || strings.HasPrefix(d, "sha512:")
}

// needsChartFiles says whether values files or file parameters name files in the chart.
func needsChartFiles(h *Helm) bool {
	if h == nil {
		return false
	}
	for _, f := range h.ValueFiles {
		if !isURL(f) {
			return true
		}
	}
	return len(h.FileParameters) > 0
}

// helmOptions sets the release, namespace, values and CRD policy Argo CD renders with.
func (c *Chart) helmOptions(app *Application, src *Source, chartDir string) error {
	c.Options.ReleaseName, c.Options.Namespace = app.Name, app.Spec.Destination.Namespace
	h := src.Helm
	if h == nil {
		return nil
	}
	if h.ReleaseName != "" {
		c.Options.ReleaseName = h.ReleaseName
	}
	if h.Namespace != "" {
		c.Options.Namespace = h.Namespace
	}
	if h.SkipCrds {
		c.Policy = check.PolicyHelm
	}
	if h.KubeVersion != "" {
		c.Options.KubeVersion = h.KubeVersion
	}
	if len(h.APIVersions) > 0 {
		c.Notes = append(c.Notes, "helm.apiVersions is not applied: the chart renders with the cluster's own API versions")
	}
	return c.values(app, h, chartDir)
}

// values sets the values as the repo-server passes them to helm template: each values
// file, then the inline values (valuesObject over values), then --set and --set-string
// parameters, then --set-file.
func (c *Chart) values(app *Application, h *Helm, chartDir string) error {
	v := &c.Options.Values
	for _, f := range h.ValueFiles {
		p, err := c.chartFile(app, chartDir, f)
		if err != nil {
			return err
		}
		if _, statErr := os.Stat(p); statErr != nil && h.IgnoreMissingValueFiles && !isURL(p) {
			continue
		}
		v.ValueFiles = append(v.ValueFiles, p)
	}
	inline, err := inlineValues(h)
	if err != nil {
		return fmt.Errorf("%s: spec.source.helm.valuesObject: %w", app.Subject(), err)
	}
	if len(inline) > 0 {
		p := filepath.Join(c.dir, "values.yaml")
		if err := os.WriteFile(p, inline, 0o600); err != nil {
			return fmt.Errorf("%s: write its inline values: %w", app.Subject(), err)
		}
		v.ValueFiles = append(v.ValueFiles, p)
	}
	v.Values, v.StringValues = setParameters(h.Parameters)
	for _, fp := range h.FileParameters {
		p, err := c.chartFile(app, chartDir, fp.Path)
		if err != nil {
			return err
		}
		v.FileValues = append(v.FileValues, fp.Name+"="+p)
	}
	return nil
}

// inlineValues is valuesObject as YAML when it is set, else values.
func inlineValues(h *Helm) ([]byte, error) {
	if h.ValuesObject != nil && len(h.ValuesObject.Raw) > 0 {
		return yaml.JSONToYAML(h.ValuesObject.Raw)
	}
	return []byte(strings.TrimSpace(h.Values)), nil
}

// setParameters are the --set and --set-string values of helm.parameters, each escaped
// as the repo-server escapes them: commas are literal unless the value is a {list}.
func setParameters(params []Parameter) (set, setString []string) {
	for _, p := range params {
		kv := p.Name + "=" + escapeCommas(p.Value)
		if p.ForceString {
			setString = append(setString, kv)
		} else {
			set = append(set, kv)
		}
	}
	return set, setString
}

func escapeCommas(v string) string {
	if strings.HasPrefix(v, "{") && strings.HasSuffix(v, "}") {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == ',' && (i == 0 || v[i-1] != '\\') {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// chartFile resolves a values file or file parameter path as the repo-server does:
// a URL as is, a path relative to the chart directory, never outside the repository
// (or the unpacked chart). $ref/ paths, which read another source, are not supported.
func (c *Chart) chartFile(app *Application, chartDir, name string) (string, error) {
	if isURL(name) {
		return name, nil
	}
	if strings.HasPrefix(name, "$") {
		ref, rest, _ := strings.Cut(strings.TrimPrefix(name, "$"), "/")
		dir, ok := c.refs[ref]
		if !ok {
			return "", app.unsupported("values file %q reads another source ($ref): upgradeguard reads one source", name)
		}
		p := filepath.Join(dir, filepath.FromSlash(rest))
		if rel, err := filepath.Rel(dir, p); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "", fmt.Errorf("%s: values file %q is outside the source %s: Argo CD refuses it too", app.Subject(), name, ref)
		}
		return p, nil
	}
	root := chartDir
	if c.Kind == Git {
		root = filepath.Join(c.dir, "repo")
	}
	p := filepath.Join(chartDir, filepath.FromSlash(name))
	if filepath.IsAbs(name) {
		p = filepath.Join(root, filepath.FromSlash(name))
	}
	if rel, err := filepath.Rel(root, p); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s: values file %q is outside the %s: Argo CD refuses it too", app.Subject(), name, c.Kind)
	}
	return p, nil
}

func isURL(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}

// ErrNotHelm says that a git source's path holds no Chart.yaml.
var ErrNotHelm = errors.New("no Chart.yaml")
