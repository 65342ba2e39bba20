// Package fluxtest sets up the Flux storage-version incidents with the real
// source-controller and helm-controller (internal/testenv/flux Start), one builder per
// path by which helm-controller upgrades a release: a pinned version bump, a semver range
// that the repository satisfies anew, an OCIRepository whose semver or tag moves, a
// remediation rollback, crds/ applied by `upgrade.crds`, and a values change that turns a
// chart's CRDs on.
//
// Every builder leaves a kyverno release that has lived since kyverno 1.10 (chart 3.0.0)
// and is at 1.12 (chart 3.2.8): policyexceptions and cleanuppolicies have
// storedVersions [v2alpha1 v2beta1], with objects stored at v2alpha1. The scenario's
// Trigger then starts the upgrade to chart 3.3.7 (kyverno 1.13, kyverno#12633), whose
// CRDs drop v2alpha1, the way production starts it. The tests in this package assert what
// happens without upgradeguard; the gate's tests reuse the builders with upgradeguard
// running.
//
// The charts are the real kyverno CRDs from the fixtures plus one ConfigMap that records
// the chart version (to show which objects a failed upgrade changed). The kyverno chart's
// post-upgrade migration hook and its workloads are left out: there is no kubelet, so
// nothing would run them.
package fluxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
)

// Kyverno chart versions and the kyverno CRDs (fixture sets) each one carries.
const (
	// Old is kyverno 1.10: PolicyException and CleanupPolicy store v2alpha1.
	Old = "3.0.0"
	// From is kyverno 1.12, where every scenario stands before its trigger:
	// storage v2beta1, v2alpha1 still in spec.versions (served: false).
	From = "3.2.8"
	// To is kyverno 1.13, which removes v2alpha1 from spec.versions (kyverno#12633).
	To = "3.3.7"
)

// KyvernoCRDs maps a chart version to its fixture CRD set.
var KyvernoCRDs = map[string]string{Old: "kyverno/v1.10.7", From: "kyverno/v1.12.6", To: "kyverno/v1.13.4"}

// BreakingCRDs are the CRDs whose update to To the API server rejects on
// status.storedVersions.
var BreakingCRDs = []string{"cleanuppolicies.kyverno.io", "policyexceptions.kyverno.io"}

// ChartName is the chart's name in the repositories.
const ChartName = "kyverno"

// VersionConfigMap is the ConfigMap every chart version writes its version into
// (data.version), in the release namespace.
const VersionConfigMap = "kyverno-chart-version"

// Layout says where a chart keeps its CRDs.
type Layout int

const (
	// Templates renders the CRDs from templates/, as the kyverno chart does (its crds
	// subchart): Helm upgrades them with the release.
	Templates Layout = iota
	// CRDsDir puts them in crds/, which Helm itself never upgrades; helm-controller
	// applies them by `install.crds` / `upgrade.crds`.
	CRDsDir
	// Switchable renders them from templates/ only when the value crds.install is true,
	// with `helm.sh/resource-policy: keep` so that turning them off leaves them in the
	// cluster (the way cert-manager's installCRDs and crds.keep work).
	Switchable
)

// Env is the control plane and Flux a scenario runs on. One Env can hold one scenario at
// a time: the kyverno CRDs are cluster-scoped.
type Env struct {
	CP   *testenv.ControlPlane
	Flux *flux.Flux
	// UG reads upgradeguard's objects (StorageMigrations) where upgradeguard runs: the
	// checks in held.go need it.
	UG client.Client
	// RepoHost is the address the scenario's chart repository listens on: loopback when
	// empty. Where the gate runs in a node's Pod, it fetches charts from there too, and a
	// Pod reaches the host's address (testenv.HostIP), not its loopback.
	RepoHost string
}

// Scenario is a kyverno HelmRelease at From, ready for its Trigger.
type Scenario struct {
	Env
	// Name names the scenario; it is also the namespace, the HelmRelease's name and the
	// Helm release's name.
	Name string
	// HelmRelease is the HelmRelease's key.
	HelmRelease types.NamespacedName
	// Source is the Flux source the HelmRelease reads (a HelmRepository or an
	// OCIRepository).
	Source client.Object
	// Repo is the HTTP chart repository (nil for OCI scenarios); Registry and OCIURL
	// the OCI registry's host and the chart's oci:// URL (empty for HTTP ones).
	Repo     *servers.ChartRepo
	Registry string
	OCIURL   string
	// Charts maps each chart version to its chart directory.
	Charts map[string]string
	// Objects are the custom resources created while storage was v2alpha1.
	Objects []Object
	// Trigger starts the upgrade to To the way production does for this path. It returns
	// once the change is written; wait on the HelmRelease for the outcome.
	Trigger func(ctx context.Context) error
	// ReleaseRevision is the Helm release's revision before Trigger (From deployed).
	ReleaseRevision int
}

// Object is one custom resource of a scenario.
type Object struct {
	GVR             schema.GroupVersionResource
	Kind, Namespace string
	Name            string
}

// Options tune a scenario.
type Options struct {
	// Layout is where the chart keeps its CRDs (Templates by default).
	Layout Layout
	// Mutate changes the HelmRelease before it is created (remediation, crds policy).
	Mutate func(*helmv2.HelmRelease)
}

// VersionBump sets up a HelmRelease pinned to From whose spec.chart.spec.version is bumped to To
// (what a Git commit does). Trigger updates the HelmRelease.
func VersionBump(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	s := newScenario(t, env, name, opts)
	s.serveRepo(t, Old, From, To)
	hr := flux.HelmReleaseFromRepository(s.Name, s.Name, "kyverno", ChartName, Old)
	s.install(t, hr, opts)
	s.step(t, s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = From }))
	s.Trigger = s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = To })
	s.premise(t)
	return s
}

// SemverRange sets up a HelmRelease with `version: "3.x"` that never changes. The repository
// starts with Old, gains From (upgraded to, successfully), and Trigger publishes To and
// asks source-controller to fetch the index (what the HelmRepository's interval does).
func SemverRange(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	s := newScenario(t, env, name, opts)
	s.serveRepo(t, Old)
	hr := flux.HelmReleaseFromRepository(s.Name, s.Name, "kyverno", ChartName, "3.x")
	s.install(t, hr, opts)
	s.step(t, func(ctx context.Context) error { return s.publish(ctx, From) })
	s.Trigger = func(ctx context.Context) error { return s.publish(ctx, To) }
	s.premise(t)
	return s
}

// OCISemver sets up a HelmRelease whose chartRef is an OCIRepository with `semver: "3.x"`. The
// registry gains From, then Trigger pushes To and asks source-controller to look.
func OCISemver(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	s := newScenario(t, env, name, opts)
	s.serveOCI(t)
	if err := s.push(Old); err != nil {
		t.Fatal(err)
	}
	s.Source = flux.OCIRepository(s.Name, "kyverno", s.OCIURL, sourcev1.OCIRepositoryRef{SemVer: "3.x"})
	s.install(t, flux.HelmReleaseFromOCIRepository(s.Name, s.Name, "kyverno"), opts)
	s.step(t, func(ctx context.Context) error { return s.pushAndReconcile(ctx, From) })
	s.Trigger = func(ctx context.Context) error { return s.pushAndReconcile(ctx, To) }
	s.premise(t)
	return s
}

// OCIMovedTag sets up an OCIRepository that follows the tag "stable", which the publisher moves from
// one chart version to the next. Trigger moves it to To.
func OCIMovedTag(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	s := newScenario(t, env, name, opts)
	s.serveOCI(t)
	for _, v := range []string{Old, From, To} {
		if err := s.push(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.moveTag(t.Context(), Old); err != nil {
		t.Fatal(err)
	}
	s.Source = flux.OCIRepository(s.Name, "kyverno", s.OCIURL, sourcev1.OCIRepositoryRef{Tag: "stable"})
	s.install(t, flux.HelmReleaseFromOCIRepository(s.Name, s.Name, "kyverno"), opts)
	s.step(t, func(ctx context.Context) error { return s.moveTagAndReconcile(ctx, From) })
	s.Trigger = func(ctx context.Context) error { return s.moveTagAndReconcile(ctx, To) }
	s.premise(t)
	return s
}

// RemediationRollback is VersionBump with `upgrade.remediation.strategy: rollback` and
// `retries: 1`: after the failed upgrade helm-controller rolls back to From by itself.
func RemediationRollback(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	mutate := opts.Mutate
	opts.Mutate = func(hr *helmv2.HelmRelease) {
		strategy := helmv2.RollbackRemediationStrategy
		hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: 1, Strategy: &strategy}}
		if mutate != nil {
			mutate(hr)
		}
	}
	return VersionBump(t, env, name, opts)
}

// CRDsPolicy is VersionBump for a chart with its CRDs in crds/: helm-controller applies
// them itself, with `install.crds: Create` and `upgrade.crds: CreateReplace` up to From,
// and Trigger bumps to To with `upgrade.crds: policy`.
func CRDsPolicy(t testing.TB, env Env, name string, policy helmv2.CRDsPolicy, opts Options) *Scenario {
	t.Helper()
	opts.Layout = CRDsDir
	mutate := opts.Mutate
	opts.Mutate = func(hr *helmv2.HelmRelease) {
		hr.Spec.Install = &helmv2.Install{CRDs: helmv2.Create}
		hr.Spec.Upgrade = &helmv2.Upgrade{CRDs: helmv2.CreateReplace}
		if mutate != nil {
			mutate(hr)
		}
	}
	s := newScenario(t, env, name, opts)
	s.serveRepo(t, Old, From, To)
	s.install(t, flux.HelmReleaseFromRepository(s.Name, s.Name, "kyverno", ChartName, Old), opts)
	s.step(t, s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = From }))
	s.Trigger = s.setHelmRelease(func(hr *helmv2.HelmRelease) {
		hr.Spec.Chart.Spec.Version = To
		if hr.Spec.Upgrade == nil {
			hr.Spec.Upgrade = &helmv2.Upgrade{}
		}
		hr.Spec.Upgrade.CRDs = policy
	})
	s.premise(t)
	return s
}

// ValuesSwitch sets up a chart whose CRDs are behind the value crds.install and kept when turned
// off. The release installed Old with CRDs on, went to From, turned CRDs off (they stay,
// kept), and moved to To with CRDs still off, which succeeds. Trigger turns them on again:
// To's CRDs now render and meet the live ones.
func ValuesSwitch(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	opts.Layout = Switchable
	s := newScenario(t, env, name, opts)
	s.serveRepo(t, Old, From, To)
	hr := flux.HelmReleaseFromRepository(s.Name, s.Name, "kyverno", ChartName, Old)
	hr.Spec.Values = crdsValues(true)
	s.install(t, hr, opts)
	s.step(t, s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = From }))
	s.step(t, s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Values = crdsValues(false) }))
	s.step(t, s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = To }))
	s.Trigger = s.setHelmRelease(func(hr *helmv2.HelmRelease) { hr.Spec.Values = crdsValues(true) })
	s.premise(t)
	return s
}

// premise checks what every scenario stands on before its trigger: the breaking CRDs at
// kyverno 1.12 with v2alpha1 still in storedVersions.
func (s *Scenario) premise(t testing.TB) {
	t.Helper()
	crds := s.CRDs(t)
	for _, name := range BreakingCRDs {
		if got := crds[name]; got.Storage != "v2beta1" || !slices.Equal(got.StoredVersions, []string{"v2alpha1", "v2beta1"}) {
			t.Fatalf("%s before the trigger: storage %s, storedVersions %v; want v2beta1 and [v2alpha1 v2beta1]", name, got.Storage, got.StoredVersions)
		}
	}
}

func crdsValues(install bool) *apiextv1.JSON {
	return &apiextv1.JSON{Raw: fmt.Appendf(nil, `{"crds":{"install":%t}}`, install)}
}

func newScenario(t testing.TB, env Env, name string, opts Options) *Scenario {
	t.Helper()
	s := &Scenario{Env: env, Name: name, HelmRelease: types.NamespacedName{Namespace: name, Name: name}, Charts: map[string]string{}}
	if err := env.Flux.EnsureNamespace(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, v := range []string{Old, From, To} {
		path, err := KyvernoChart(filepath.Join(dir, "charts", v), v, opts.Layout)
		if err != nil {
			t.Fatal(err)
		}
		s.Charts[v] = path
	}
	t.Cleanup(func() { s.cleanup(t) })
	return s
}

// KyvernoChart writes the chart of one kyverno chart version (Old, From or To) into dir
// with its CRDs laid out as layout says, and returns its directory.
func KyvernoChart(dir, version string, layout Layout) (string, error) {
	fixtures, err := testenv.FixtureSet(KyvernoCRDs[version])
	if err != nil {
		return "", err
	}
	root, err := testenv.Fixtures()
	if err != nil {
		return "", err
	}
	files := map[string]string{
		"templates/version.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + VersionConfigMap + "\ndata:\n  version: {{ .Chart.Version | quote }}\n",
		"values.yaml":            "crds:\n  install: true\n",
	}
	for _, f := range fixtures {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		base := filepath.Base(f)
		switch layout {
		case Templates:
			files["templates/"+base] = string(data)
		case CRDsDir:
			files["crds/"+base] = string(data)
		case Switchable:
			kept, err := withKeepPolicy(data)
			if err != nil {
				return "", fmt.Errorf("%s: %w", f, err)
			}
			files["templates/"+base] = "{{- if .Values.crds.install }}\n" + string(kept) + "{{- end }}\n"
		}
	}
	return testenv.WriteChart(dir, ChartName, version, files)
}

// withKeepPolicy adds `helm.sh/resource-policy: keep` to a CRD manifest (what the
// cert-manager chart's crds.keep and kyverno's crds.annotations do).
func withKeepPolicy(data []byte) ([]byte, error) {
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return nil, err
	}
	md, _ := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	ann["helm.sh/resource-policy"] = "keep"
	md["annotations"] = ann
	return yaml.Marshal(obj)
}

func (s *Scenario) serveRepo(t testing.TB, versions ...string) {
	t.Helper()
	repo, err := servers.NewChartRepoAt(filepath.Join(t.TempDir(), "repo"), s.RepoHost)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	s.Repo = repo
	for _, v := range versions {
		if err := repo.Add(s.Charts[v]); err != nil {
			t.Fatal(err)
		}
	}
	s.Source = flux.HelmRepository(s.Name, "kyverno", repo.URL)
}

func (s *Scenario) serveOCI(t testing.TB) {
	t.Helper()
	host, stop := servers.ServeOCI()
	t.Cleanup(stop)
	s.Registry = host
	s.OCIURL = "oci://" + host + "/charts/" + ChartName
}

func (s *Scenario) push(version string) error {
	tgz, err := testenv.Package(s.Charts[version], filepath.Join(filepath.Dir(s.Charts[version]), "pkg"))
	if err != nil {
		return err
	}
	_, err = servers.PushOCI(tgz, s.Registry, "charts")
	return err
}

func (s *Scenario) pushAndReconcile(ctx context.Context, version string) error {
	if err := s.push(version); err != nil {
		return err
	}
	_, err := s.Flux.RequestReconcile(ctx, s.Source)
	return err
}

func (s *Scenario) moveTagAndReconcile(ctx context.Context, version string) error {
	if err := s.moveTag(ctx, version); err != nil {
		return err
	}
	_, err := s.Flux.RequestReconcile(ctx, s.Source)
	return err
}

// moveTag points the tag "stable" at the chart version, as a publisher who moves a
// channel tag does.
func (s *Scenario) moveTag(_ context.Context, version string) error {
	tgz, err := testenv.Package(s.Charts[version], filepath.Join(filepath.Dir(s.Charts[version]), "pkg"))
	if err != nil {
		return err
	}
	_, err = servers.PushOCITag(tgz, s.Registry, "charts", "stable")
	return err
}

// publish adds version to the HTTP repository and asks source-controller to fetch the
// index, as the HelmRepository's interval would.
func (s *Scenario) publish(ctx context.Context, version string) error {
	if err := s.Repo.Add(s.Charts[version]); err != nil {
		return err
	}
	_, err := s.Flux.RequestReconcile(ctx, s.Source)
	return err
}

// install creates the source and the HelmRelease (at Old), waits for Ready=True, and
// creates the objects stored at v2alpha1.
func (s *Scenario) install(t testing.TB, hr *helmv2.HelmRelease, opts Options) {
	t.Helper()
	ctx := t.Context()
	if opts.Mutate != nil {
		opts.Mutate(hr)
	}
	if err := s.Flux.Client.Create(ctx, s.Source); err != nil {
		t.Fatal(err)
	}
	if err := s.Flux.Client.Create(ctx, hr); err != nil {
		t.Fatal(err)
	}
	s.waitDeployed(t, Old)
	for _, o := range []Object{
		{GVR: schema.GroupVersionResource{Group: "kyverno.io", Version: "v2alpha1", Resource: "policyexceptions"}, Kind: "PolicyException", Namespace: s.Name, Name: "allow-debug"},
		{GVR: schema.GroupVersionResource{Group: "kyverno.io", Version: "v2alpha1", Resource: "cleanuppolicies"}, Kind: "CleanupPolicy", Namespace: s.Name, Name: "old-pods"},
	} {
		spec := map[string]any{"exceptions": []any{}, "match": map[string]any{}}
		if o.Kind == "CleanupPolicy" {
			spec = map[string]any{"match": map[string]any{}, "schedule": "0 0 * * *"}
		}
		if err := testenv.CreateObjects(ctx, s.CP.Config, testenv.Objects{GVR: o.GVR, Kind: o.Kind, Namespaces: []string{s.Name}, PerNS: 1, Spec: spec}); err != nil {
			t.Fatal(err)
		}
		o.Name = "obj-0"
		s.Objects = append(s.Objects, o)
	}
	// AdmissionReports, which Kyverno writes all the time: the CRD To no longer renders
	// holds objects, so deleting it loses data (droppedCRD).
	if err := testenv.CreateObjects(ctx, s.CP.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "kyverno.io", Version: "v1alpha2", Resource: "admissionreports"},
		Kind: "AdmissionReport", Namespaces: []string{s.Name}, PerNS: 2,
		Spec: map[string]any{"owner": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}},
	}); err != nil {
		t.Fatal(err)
	}
}

// step makes a change (to the HelmRelease or to its source) and waits until
// helm-controller has deployed a new revision because of it.
func (s *Scenario) step(t testing.TB, change func(context.Context) error) {
	t.Helper()
	ctx := t.Context()
	before := s.latest(t)
	if err := change(ctx); err != nil {
		t.Fatal(err)
	}
	hr, err := s.Flux.WaitHelmRelease(ctx, s.HelmRelease.Namespace, s.HelmRelease.Name, 3*time.Minute, func(hr *helmv2.HelmRelease) bool {
		l := hr.Status.History.Latest()
		return flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && l != nil && l.Version > before
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Flux.LogTail(10))
	}
	s.ReleaseRevision = hr.Status.History.Latest().Version
}

func (s *Scenario) latest(t testing.TB) int {
	hr := &helmv2.HelmRelease{}
	if err := s.Flux.Client.Get(t.Context(), s.HelmRelease, hr); err != nil {
		t.Fatal(err)
	}
	if l := hr.Status.History.Latest(); l != nil {
		return l.Version
	}
	return 0
}

func (s *Scenario) waitDeployed(t testing.TB, version string) {
	t.Helper()
	hr, err := s.Flux.WaitHelmRelease(t.Context(), s.HelmRelease.Namespace, s.HelmRelease.Name, 3*time.Minute, func(hr *helmv2.HelmRelease) bool {
		l := hr.Status.History.Latest()
		return flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && l != nil && flux.ChartSemver(l.ChartVersion) == version
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Flux.LogTail(10))
	}
	s.ReleaseRevision = hr.Status.History.Latest().Version
}

// setHelmRelease returns a change that re-reads the HelmRelease, applies change and
// writes it back.
func (s *Scenario) setHelmRelease(change func(*helmv2.HelmRelease)) func(context.Context) error {
	return func(ctx context.Context) error {
		hr := &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: s.HelmRelease.Namespace, Name: s.HelmRelease.Name}}
		return s.Flux.Update(ctx, hr, func() { change(hr) })
	}
}

// cleanup deletes the HelmRelease (helm-controller uninstalls it) and the kyverno CRDs,
// keeping every other (Flux's own, upgradeguard's when it runs), so that the next
// scenario starts clean.
func (s *Scenario) cleanup(t testing.TB) {
	ctx := context.WithoutCancel(t.Context())
	kyverno := func(crd *apiextv1.CustomResourceDefinition) bool { return crd.Spec.Group == "kyverno.io" }
	// They are deleted below with their objects anyway: upgradeguard's CRD deletion guard,
	// where it runs, lets helm-controller's uninstall delete them too.
	if err := s.CP.AllowCRDDeletion(ctx, kyverno); err != nil {
		t.Errorf("allow the deletion of the kyverno CRDs after %s: %v", s.Name, err)
	}
	hr := &helmv2.HelmRelease{}
	if err := s.Flux.Client.Get(ctx, s.HelmRelease, hr); err == nil {
		_ = s.Flux.Client.Delete(ctx, hr)
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := s.Flux.Client.Get(ctx, s.HelmRelease, &helmv2.HelmRelease{})
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if err != nil {
			// The uninstall did not finish: drop the finalizer so the next scenario runs.
			_ = s.Flux.Update(ctx, hr, func() { hr.Finalizers = nil })
		}
	}
	if s.Source != nil {
		_ = s.Flux.Client.Delete(ctx, s.Source)
	}
	if err := s.CP.DeleteCRDs(ctx, func(crd *apiextv1.CustomResourceDefinition) bool { return !kyverno(crd) }); err != nil {
		t.Errorf("delete the kyverno CRDs after %s: %v", s.Name, err)
	}
}

// HelmReleaseNow reads the HelmRelease.
func (s *Scenario) HelmReleaseNow(t testing.TB) *helmv2.HelmRelease {
	t.Helper()
	hr := &helmv2.HelmRelease{}
	if err := s.Flux.Client.Get(t.Context(), s.HelmRelease, hr); err != nil {
		t.Fatal(err)
	}
	return hr
}

// Revision is one entry of `helm history -o json` (no values, no manifest).
type Revision struct {
	Revision    int    `json:"revision"`
	Status      string `json:"status"`
	Chart       string `json:"chart"`
	AppVersion  string `json:"app_version"`
	Description string `json:"description"`
}

// History returns the Helm release's history, read by the real Helm CLI.
func (s *Scenario) History(t testing.TB) []Revision {
	t.Helper()
	return History(t, s.Env, s.Name, s.Name)
}

// History returns the history of the Helm release name in ns, read by the real Helm CLI.
func History(t testing.TB, env Env, ns, name string) []Revision {
	t.Helper()
	out, err := env.CP.Helm("history", name, "-n", ns, "-o", "json", "--max", "100").Output()
	if err != nil {
		t.Fatalf("helm history %s/%s: %v", ns, name, err)
	}
	var revs []Revision
	if err := json.Unmarshal(out, &revs); err != nil {
		t.Fatalf("helm history %s/%s: %v", ns, name, err)
	}
	return revs
}

// CRDState is what the API server holds for one kyverno CRD.
type CRDState struct {
	Storage        string
	Versions       []string // spec.versions, in order
	StoredVersions []string
}

// CRDs returns the state of every kyverno.io CRD, by name.
func (s *Scenario) CRDs(t testing.TB) map[string]CRDState {
	t.Helper()
	list := &apiextv1.CustomResourceDefinitionList{}
	if err := s.Flux.Client.List(t.Context(), list); err != nil {
		t.Fatal(err)
	}
	out := map[string]CRDState{}
	for _, crd := range list.Items {
		if crd.Spec.Group != "kyverno.io" {
			continue
		}
		st := CRDState{StoredVersions: crd.Status.StoredVersions}
		for _, v := range crd.Spec.Versions {
			st.Versions = append(st.Versions, v.Name)
			if v.Storage {
				st.Storage = v.Name
			}
		}
		slices.Sort(st.StoredVersions)
		out[crd.Name] = st
	}
	return out
}

// ChartVersionInCluster is data.version of VersionConfigMap: which chart version last
// wrote the release's ordinary objects.
func (s *Scenario) ChartVersionInCluster(t testing.TB) string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := s.Flux.Client.Get(t.Context(), types.NamespacedName{Namespace: s.Name, Name: VersionConfigMap}, cm); err != nil {
		t.Fatal(err)
	}
	return flux.ChartSemver(cm.Data["version"])
}

// ReadObjects reads every scenario object at its CRD's storage version and returns the
// errors, one per unreadable object.
func (s *Scenario) ReadObjects(t testing.TB) []error {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(s.CP.Config)
	crds := s.CRDs(t)
	var errs []error
	for _, o := range s.Objects {
		gvr := o.GVR
		gvr.Version = crds[o.GVR.Resource+"."+o.GVR.Group].Storage
		if _, err := dyn.Resource(gvr).Namespace(o.Namespace).Get(t.Context(), o.Name, metav1.GetOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", o.Kind, o.Namespace, o.Name, err))
		}
	}
	return errs
}

// WaitFailed waits until the HelmRelease's Ready condition is False with a message that
// contains want, and returns the release.
func (s *Scenario) WaitFailed(t testing.TB, want string) *helmv2.HelmRelease {
	t.Helper()
	return s.WaitCondition(t, meta.ReadyCondition, metav1.ConditionFalse, want)
}

// WaitCondition waits until the HelmRelease has condition typ at status with a message
// that contains want, and returns the release.
func (s *Scenario) WaitCondition(t testing.TB, typ string, status metav1.ConditionStatus, want string) *helmv2.HelmRelease {
	t.Helper()
	hr, err := s.Flux.WaitHelmRelease(t.Context(), s.HelmRelease.Namespace, s.HelmRelease.Name, 3*time.Minute, func(hr *helmv2.HelmRelease) bool {
		c := apimeta.FindStatusCondition(hr.Status.Conditions, typ)
		return c != nil && c.Status == status && strings.Contains(c.Message, want)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Flux.LogTail(10))
	}
	return hr
}

// WaitFailures waits until the HelmRelease has failed at least n times in a row
// (status.failures) with Ready=False, and returns the release.
func (s *Scenario) WaitFailures(t testing.TB, n int64) *helmv2.HelmRelease {
	t.Helper()
	hr, err := s.Flux.WaitHelmRelease(t.Context(), s.HelmRelease.Namespace, s.HelmRelease.Name, 3*time.Minute, func(hr *helmv2.HelmRelease) bool {
		return hr.Status.Failures >= n && apimeta.IsStatusConditionFalse(hr.Status.Conditions, meta.ReadyCondition)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Flux.LogTail(10))
	}
	return hr
}

// WaitDeployed waits until the HelmRelease is Ready=True at its generation with chart
// version (OCI build metadata ignored) as its latest release, and returns it: what a test
// with upgradeguard running waits for after Trigger (version To).
func (s *Scenario) WaitDeployed(t testing.TB, version string) *helmv2.HelmRelease {
	t.Helper()
	s.waitDeployed(t, version)
	return s.HelmReleaseNow(t)
}
