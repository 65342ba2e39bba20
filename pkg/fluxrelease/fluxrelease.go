// Package fluxrelease owns reading a Flux HelmRelease the way helm-controller does: which
// chart an update asks for (HelmRepository over HTTP or OCI, or an OCIRepository through
// spec.chartRef, honouring semver ranges), which cluster it installs to
// (spec.kubeConfig.secretRef or the local one), which Helm release and storage namespace it
// owns, which values it installs with (spec.valuesFrom then spec.values, composed as
// helm-controller composes them), and whether an update is an upgrade or a move back to an
// older chart. Check joins
// these with package check, so the admission gate and any other caller predict a
// HelmRelease change exactly as `upgradeguard check` predicts a helm upgrade or rollback.
package fluxrelease

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Reader reads the HelmRelease's sources and Secrets on the cluster that holds it.
type Reader = client.Reader

// ChartChanged reports whether an update changes what chart helm-controller installs:
// spec.chart.spec.{chart,version,sourceRef} or spec.chartRef. Interval, values files,
// verification and every metadata or status change leave it false.
func ChartChanged(old, updated *helmv2.HelmRelease) bool {
	return chartKey(old) != chartKey(updated)
}

// ValuesChanged reports whether an update changes the values helm-controller installs
// with, as far as the HelmRelease shows: spec.values (compared as data, so formatting and
// key order do not count) or spec.valuesFrom. A change inside a referenced ConfigMap or
// Secret is not an update of the HelmRelease and is not seen here.
func ValuesChanged(old, updated *helmv2.HelmRelease) bool {
	a, b := old.GetValues(), updated.GetValues()
	values := (len(a) != 0 || len(b) != 0) && !reflect.DeepEqual(a, b)
	from := (len(old.Spec.ValuesFrom) != 0 || len(updated.Spec.ValuesFrom) != 0) && !reflect.DeepEqual(old.Spec.ValuesFrom, updated.Spec.ValuesFrom)
	return values || from
}

// key is what names the chart: the template's chart, version and source, or the chartRef.
type key struct {
	field, chart, version           string
	srcAPI, srcKind, srcName, srcNS string
}

func chartKey(hr *helmv2.HelmRelease) key {
	if c := hr.Spec.Chart; c != nil {
		r := c.Spec.SourceRef
		return key{field: "chart", chart: c.Spec.Chart, version: c.Spec.Version,
			srcAPI: r.APIVersion, srcKind: r.Kind, srcName: r.Name, srcNS: orDefault(r.Namespace, hr.Namespace)}
	}
	if r := hr.Spec.ChartRef; r != nil {
		return key{field: "chartRef", srcAPI: r.APIVersion, srcKind: r.Kind, srcName: r.Name, srcNS: orDefault(r.Namespace, hr.Namespace)}
	}
	return key{}
}

// Describe names the chart a HelmRelease asks for, for messages: "flux2@2.18.2 from
// HelmRepository flux-system/charts" or "OCIRepository flux-system/podinfo".
func Describe(hr *helmv2.HelmRelease) string {
	if c := hr.Spec.Chart; c != nil {
		v := c.Spec.Version
		if v == "" {
			v = "*"
		}
		return fmt.Sprintf("%s@%s from %s %s/%s", c.Spec.Chart, v, c.Spec.SourceRef.Kind, c.GetNamespace(hr.Namespace), c.Spec.SourceRef.Name)
	}
	if r := hr.Spec.ChartRef; r != nil {
		return fmt.Sprintf("%s %s/%s", r.Kind, orDefault(r.Namespace, hr.Namespace), r.Name)
	}
	return "no chart"
}

// ReleaseName is the Helm release name helm-controller uses: status.history's latest
// snapshot when there is one, else spec.releaseName or [targetNamespace-]name, shortened
// to 53 characters with a hash the way helm-controller shortens it.
func ReleaseName(hr *helmv2.HelmRelease) string {
	if s := hr.Status.History.Latest(); s != nil && s.Name != "" {
		return s.Name
	}
	return shortenName(hr.GetReleaseName())
}

// StorageNamespace is where helm-controller keeps the release's revisions on the target.
func StorageNamespace(hr *helmv2.HelmRelease) string { return hr.GetStorageNamespace() }

func shortenName(name string) string { return kubename.Shorten(name, 53, name) }

// Release is a HelmRelease as helm-controller reads it for an upgrade: the Helm release
// it owns and where it keeps its revisions, the chart it asks for rendered the way
// helm-controller renders it, and the CRD policy of its upgrades.
type Release struct {
	// Name and StorageNamespace name the Helm release (ReleaseName, StorageNamespace).
	Name, StorageNamespace string
	// Source fetches the chart (Source) with the release name, the target namespace and
	// the composed values (Values) set.
	Source chartsource.Options
	// Policy says which CRDs its upgrades apply (CRDPolicy).
	Policy predict.Policy
}

// Read resolves what an upgrade of hr reads, the way helm-controller does. It composes
// the values first, as helm-controller does before it loads the chart: a reference it
// cannot resolve fails the release (a *ValuesError) whatever the chart. An
// *UnsupportedError means the chart's source is not one Source resolves.
func Read(ctx context.Context, r Reader, hr *helmv2.HelmRelease) (*Release, error) {
	values, err := Values(ctx, r, hr)
	if err != nil {
		return nil, err
	}
	src, err := Source(ctx, r, hr)
	if err != nil {
		return nil, err
	}
	rel := &Release{Name: ReleaseName(hr), StorageNamespace: StorageNamespace(hr), Policy: CRDPolicy(hr)}
	src.BaseValues, src.ReleaseName, src.Namespace = values, rel.Name, hr.GetReleaseNamespace()
	rel.Source = src
	return rel, nil
}

// UnsupportedError says that the HelmRelease's chart comes from a source the gate cannot
// resolve (a GitRepository or Bucket, say). It is not a finding and not an outage: callers
// decide whether to let such releases through.
type UnsupportedError struct{ Reason string }

func (e *UnsupportedError) Error() string { return e.Reason }

// Source returns the chartsource options that fetch the chart the HelmRelease asks for,
// with the same version rule as source-controller (an exact version, or the highest
// version matching a semver range; "*" or empty is the newest stable one). It reads the
// HelmRepository or OCIRepository and, for a HelmRepository's secretRef, the username and
// password keys of the Secret. A GitRepository's chart resolves only through a Reader
// that holds the repository's files (GitChartReader): a cluster's client does not.
func Source(ctx context.Context, r Reader, hr *helmv2.HelmRelease) (chartsource.Options, error) {
	switch {
	case hr.Spec.Chart != nil:
		return templateSource(ctx, r, hr)
	case hr.Spec.ChartRef != nil:
		return chartRefSource(ctx, r, hr)
	}
	return chartsource.Options{}, &UnsupportedError{Reason: "the HelmRelease sets neither spec.chart nor spec.chartRef"}
}

// GitChartReader is a Reader that also holds the files of GitRepository sources: a Git
// change read before Flux fetches it (package review reads the head revision). Source
// resolves a HelmRelease whose chart comes from a GitRepository only through one.
type GitChartReader interface {
	Reader
	// GitChart returns the local folder of the chart at chartPath in the GitRepository's
	// files, with its dependencies in charts/ as source-controller builds them. An
	// *UnsupportedError says why the GitRepository's files are not at hand.
	GitChart(ctx context.Context, repo *sourcev1.GitRepository, chartPath string) (string, error)
}

func templateSource(ctx context.Context, r Reader, hr *helmv2.HelmRelease) (chartsource.Options, error) {
	spec := hr.Spec.Chart.Spec
	ref := spec.SourceRef
	ns := hr.Spec.Chart.GetNamespace(hr.Namespace)
	if g, ok := r.(GitChartReader); ok && ref.Kind == sourcev1.GitRepositoryKind {
		// spec.chart.spec.version does not apply: the chart is the one at the path.
		var repo sourcev1.GitRepository
		if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &repo); err != nil {
			return chartsource.Options{}, fmt.Errorf("GitRepository %s/%s: %w", ns, ref.Name, err)
		}
		dir, err := g.GitChart(ctx, &repo, spec.Chart)
		if err != nil {
			return chartsource.Options{}, err
		}
		return chartsource.Options{Ref: dir}, nil
	}
	if ref.Kind != sourcev1.HelmRepositoryKind {
		return chartsource.Options{}, &UnsupportedError{Reason: fmt.Sprintf("chart source kind %s is not resolved by the gate (only HelmRepository, and OCIRepository through spec.chartRef)", ref.Kind)}
	}
	var repo sourcev1.HelmRepository
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &repo); err != nil {
		return chartsource.Options{}, fmt.Errorf("HelmRepository %s/%s: %w", ns, ref.Name, err)
	}
	version := spec.Version
	if version == "*" {
		version = ""
	}
	o := chartsource.Options{Version: version, PassCredentialsAll: repo.Spec.PassCredentials}
	if repo.Spec.Type == sourcev1.HelmRepositoryTypeOCI {
		o.Ref = strings.TrimSuffix(repo.Spec.URL, "/") + "/" + spec.Chart
		o.PlainHTTP = repo.Spec.Insecure
	} else {
		o.Ref, o.RepoURL = spec.Chart, repo.Spec.URL
	}
	if repo.Spec.SecretRef != nil {
		user, pass, id, err := basicAuth(ctx, r, ns, repo.Spec.SecretRef.Name)
		if err != nil {
			return chartsource.Options{}, fmt.Errorf("HelmRepository %s/%s: %w", ns, ref.Name, err)
		}
		o.Username, o.Password, o.CredentialsID = user, pass, id
	}
	return o, nil
}

func chartRefSource(ctx context.Context, r Reader, hr *helmv2.HelmRelease) (chartsource.Options, error) {
	ref := hr.Spec.ChartRef
	if ref.Kind != sourcev1.OCIRepositoryKind {
		return chartsource.Options{}, &UnsupportedError{Reason: fmt.Sprintf("spec.chartRef kind %s is not resolved by the gate (only OCIRepository)", ref.Kind)}
	}
	ns := orDefault(ref.Namespace, hr.Namespace)
	var repo sourcev1.OCIRepository
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &repo); err != nil {
		return chartsource.Options{}, fmt.Errorf("OCIRepository %s/%s: %w", ns, ref.Name, err)
	}
	o := chartsource.Options{Ref: repo.Spec.URL, PlainHTTP: repo.Spec.Insecure}
	if rr := repo.Spec.Reference; rr != nil {
		switch {
		case rr.Digest != "":
			o.Ref += "@" + rr.Digest
		case rr.SemVer != "":
			o.Version = rr.SemVer
		case rr.Tag != "":
			o.Version = rr.Tag
		}
	}
	if repo.Spec.SecretRef != nil {
		return chartsource.Options{}, &UnsupportedError{Reason: fmt.Sprintf("OCIRepository %s/%s uses a docker-config secretRef, which the gate does not read", ns, ref.Name)}
	}
	return o, nil
}

// basicAuth reads the Secret's username and password, and an identity for them (the
// Secret's namespace, name, UID and resourceVersion) that changes whenever they may have
// changed, for keying caches without holding the credentials.
func basicAuth(ctx context.Context, r Reader, ns, name string) (user, pass, id string, err error) {
	var s corev1.Secret
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
		return "", "", "", fmt.Errorf("secretRef %s: %w", name, err)
	}
	user, pass = string(s.Data["username"]), string(s.Data["password"])
	if user == "" || pass == "" {
		return "", "", "", fmt.Errorf("secretRef %s has no username and password keys: the gate supports basic auth only", name)
	}
	return user, pass, fmt.Sprintf("Secret %s/%s uid=%s resourceVersion=%s", ns, name, s.UID, s.ResourceVersion), nil
}

// Target returns the REST config of the cluster helm-controller installs to: the
// kubeconfig in spec.kubeConfig.secretRef (key "value", then "value.yaml", unless the
// reference names a key), or local when there is none.
func Target(ctx context.Context, r Reader, hr *helmv2.HelmRelease, local *rest.Config) (cfg *rest.Config, remote bool, err error) {
	cfg, remote, _, err = target(ctx, r, hr, local)
	return cfg, remote, err
}

// target is Target with the key of the target in livecluster.Clusters and Connections:
// the local cluster's (livecluster.LocalKey), or a hash of the API server's address and
// the kubeConfig Secret's namespace, name, key, UID and resourceVersion (never its
// content).
func target(ctx context.Context, r Reader, hr *helmv2.HelmRelease, local *rest.Config) (cfg *rest.Config, remote bool, key string, err error) {
	kc := hr.Spec.KubeConfig
	if kc == nil {
		return local, false, livecluster.LocalKey(local), nil
	}
	if kc.SecretRef == nil {
		return nil, true, "", &UnsupportedError{Reason: "spec.kubeConfig without secretRef (a ConfigMap reference) is not resolved by the gate"}
	}
	cfg, s, err := kubeclient.ConfigFromSecretRef(ctx, r, hr.Namespace, kc.SecretRef.Name, kc.SecretRef.Key)
	if err != nil {
		return nil, true, "", err
	}
	id := fmt.Sprintf("Secret %s/%s key=%s uid=%s resourceVersion=%s", s.Namespace, s.Name, kc.SecretRef.Key, s.UID, s.ResourceVersion)
	return cfg, true, livecluster.Key(cfg.Host, id), nil
}

// CRDPolicy is which CRDs the HelmRelease's upgrades apply: the chart's crds/ folder too
// under spec.upgrade.crds: CreateReplace, else only templates/ as plain Helm.
func CRDPolicy(hr *helmv2.HelmRelease) predict.Policy {
	if hr.GetUpgrade().CRDs == helmv2.CreateReplace {
		return predict.PolicyCreateReplace
	}
	return predict.PolicyHelm
}

// RollbackRemediation reports whether a failed upgrade makes helm-controller roll back
// (spec.upgrade.remediation with strategy rollback and retries, or remediateLastFailure).
func RollbackRemediation(hr *helmv2.HelmRelease) bool {
	up, ok := hr.GetUpgrade().GetRemediation().(helmv2.UpgradeRemediation)
	return ok && up.GetStrategy() == helmv2.RollbackRemediationStrategy && (up.Retries != 0 || up.MustRemediateLastFailure())
}

// UninstallRemediation reports whether a failed upgrade makes helm-controller uninstall
// the release (spec.upgrade.remediation.strategy: uninstall, with retries or
// remediateLastFailure).
func UninstallRemediation(hr *helmv2.HelmRelease) bool {
	up, ok := hr.GetUpgrade().GetRemediation().(helmv2.UpgradeRemediation)
	return ok && up.GetStrategy() == helmv2.UninstallRemediationStrategy && (up.Retries != 0 || up.MustRemediateLastFailure())
}

// Older reports whether version is a lower semver than than; false when either does not
// parse.
func Older(version, than string) bool { return check.Older(version, than) }

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
