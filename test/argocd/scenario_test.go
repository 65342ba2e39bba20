//go:build argocd

// Package argocd_test runs the kyverno 1.12 -> 1.13 storage boundary (kyverno#12633: the
// 1.13 CRDs drop v2alpha1, which status.storedVersions still lists) through the real
// Argo CD: its repo-server renders the chart from a git repository with the real Helm
// CLI, and its application-controller syncs it into a real kube-apiserver with automated
// sync and retries, as in garage-operator#156. Each test asserts Argo CD's own status
// (operationState, sync status, conditions) besides what the API server holds.
//
// Build tag argocd: Argo CD's binary is not part of `make testbin` (a 203 MiB cgo build
// of 25-40 minutes). `make test-argocd` builds it and runs these tests.
package argocd_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane and Argo CD")
	}
}

// chartPath is the chart's directory in the git repository.
const chartPath = "kyverno"

// versionConfigMap records which chart version last wrote the release's ordinary
// objects (data.version).
const versionConfigMap = "kyverno-chart-version"

// breakingFiles are the fixture files of the CRDs the API server refuses at To: the
// chart holds only these (and a ConfigMap), so that every CRD it renders is in every
// version and Argo CD's sync status means what the test asks.
var breakingFiles = []string{"kyverno.io_cleanuppolicies.yaml", "kyverno.io_policyexceptions.yaml"}

// crdResync is Argo CD's resync period in the tests that wait for what Argo CD reads of a
// CRD it applied, once the CRD or its status changed. Argo CD sets no tracking annotation
// on a CRD (its repo-server leaves CRDs out), so a CRD's own watch events never bring its
// Application to compare again; only an operation's end, a tracked object's change and
// the resync do. With the harness's hour, a last comparison that ran before the CRD (or
// its latest status) reached Argo CD's cache is the last for an hour: after a sync, the
// refresh at the operation's end and the one the ConfigMap's watch event brings (Argo CD
// applies the ConfigMap first) can both come before the CRD's ADDED event, which Argo CD
// handles by reloading the API's discovery and schemas, slowly on a loaded machine.
const crdResync = 30 * time.Second

// scenario is an Application of the kyverno chart from a git repository, at From, with
// one object of each breaking CRD stored at v2alpha1.
type scenario struct {
	cp   *testenv.ControlPlane
	argo *argocd.ArgoCD
	name string // the Application's name and its destination namespace
	// commits maps a chart version to the Application's targetRevision for it: the
	// commit that holds it, or the version itself for a Helm repository.
	commits map[string]string
	objects []fluxtest.Object
}

// Promoted is the kyverno chart of kyverno 1.11, used by the rollback cases: its CRDs
// promote v2beta1 to the storage version and still serve v2alpha1, which Old (kyverno
// 1.10) stores at and lists alone.
const Promoted = "3.1.4"

// crdSets maps a chart version to its fixture CRD set.
var crdSets = map[string]string{fluxtest.Old: fluxtest.KyvernoCRDs[fluxtest.Old], Promoted: "kyverno/v1.11.4",
	fluxtest.From: fluxtest.KyvernoCRDs[fluxtest.From], fluxtest.To: fluxtest.KyvernoCRDs[fluxtest.To]}

// chartFiles is the kyverno chart of one version, as files of the git repository: the
// breaking CRDs of its fixture set in templates/ and the version ConfigMap.
func chartFiles(t *testing.T, version string) map[string]string {
	t.Helper()
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		chartPath + "/Chart.yaml":             fmt.Sprintf("apiVersion: v2\nname: kyverno\nversion: %s\nappVersion: %q\n", version, version),
		chartPath + "/templates/version.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + versionConfigMap + "\ndata:\n  version: {{ .Chart.Version | quote }}\n",
	}
	for _, f := range breakingFiles {
		data, err := os.ReadFile(filepath.Join(fx, "crds", crdSets[version], f))
		if err != nil {
			t.Fatal(err)
		}
		files[chartPath+"/templates/"+f] = string(data)
	}
	return files
}

// sourceKind is where an Application reads the chart from.
type sourceKind string

const (
	// fromGit is the chart's directory in a git repository (a file:// URL), one commit
	// per chart version; the Application's targetRevision is the commit.
	fromGit sourceKind = "git"
	// fromHelmRepo is a Helm chart repository over loopback HTTP holding every version;
	// the Application's targetRevision is the chart version.
	fromHelmRepo sourceKind = "helm-repository"
)

// newScenario publishes Old, From and To (to a git repository or a Helm repository),
// creates an Application at Old with automated sync and retry r, creates the objects
// (stored at v2alpha1), and moves the Application to From, which Argo CD syncs. It checks
// the premise: both breaking CRDs store v2beta1 with storedVersions [v2alpha1 v2beta1].
//
// Each of opts changes the Application before it is created
// (argocd.ServerSideApplyAndDiff, for example).
func newScenario(t *testing.T, cp *testenv.ControlPlane, argo *argocd.ArgoCD, name string, kind sourceKind, r argocd.SyncRetry, opts ...func(*unstructured.Unstructured)) *scenario {
	t.Helper()
	s := startScenario(t, cp, argo, name, kind, r, []string{fluxtest.Old, fluxtest.From, fluxtest.To}, opts...)
	s.bump(t, fluxtest.From)
	s.waitSynced(t, fluxtest.From)
	s.expectCRDs(t, fluxtest.From, "v2beta1", "v2alpha1", "v2beta1")
	if v := s.chartVersionInCluster(t); v != fluxtest.From {
		t.Fatalf("ConfigMap version at %s = %s", fluxtest.From, v)
	}
	return s
}

// expectCRDs fails the test unless both breaking CRDs store at storage with exactly
// stored in status.storedVersions, at chart version v.
func (s *scenario) expectCRDs(t *testing.T, v, storage string, stored ...string) {
	t.Helper()
	crds := s.crds(t)
	for _, n := range fluxtest.BreakingCRDs {
		if got := crds[n]; got.Storage != storage || !slices.Equal(got.StoredVersions, stored) {
			t.Fatalf("%s at %s: storage %s, storedVersions %v; want %s and %v", n, v, got.Storage, got.StoredVersions, storage, stored)
		}
	}
}

// startScenario publishes the chart versions (to a git repository or a Helm
// repository), creates an Application at the first with automated sync and retry r,
// waits until Argo CD synced it, and creates the objects, stored at v2alpha1 (every
// first version here is Old, kyverno 1.10). Each of opts changes the Application before
// it is created.
func startScenario(t *testing.T, cp *testenv.ControlPlane, argo *argocd.ArgoCD, name string, kind sourceKind, r argocd.SyncRetry, versions []string, opts ...func(*unstructured.Unstructured)) *scenario {
	t.Helper()
	ctx := t.Context()
	s := &scenario{cp: cp, argo: argo, name: name, commits: map[string]string{}}
	var source argocd.ApplicationSource
	switch kind {
	case fromGit:
		repo := servers.NewGitRepo(t)
		for _, v := range versions {
			s.commits[v] = repo.Commit("kyverno chart "+v, chartFiles(t, v)).String()
		}
		source = argocd.GitSource(repo.Dir, chartPath, s.commits[versions[0]])
	case fromHelmRepo:
		repo, err := servers.NewChartRepo(filepath.Join(t.TempDir(), "repo"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(repo.Close)
		for _, v := range versions {
			dir := filepath.Join(t.TempDir(), v)
			for path, content := range chartFiles(t, v) {
				p := filepath.Join(dir, path)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := repo.Add(filepath.Join(dir, chartPath)); err != nil {
				t.Fatal(err)
			}
			s.commits[v] = v
		}
		source = argocd.HelmRepoSource(repo.URL, "kyverno", versions[0])
	}
	app := argocd.AutomatedApplication(name, source, name, r)
	for _, o := range opts {
		o(app)
	}
	if err := argo.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	s.waitSynced(t, versions[0])
	for _, o := range []fluxtest.Object{
		{GVR: schema.GroupVersionResource{Group: "kyverno.io", Version: "v2alpha1", Resource: "policyexceptions"}, Kind: "PolicyException", Namespace: name},
		{GVR: schema.GroupVersionResource{Group: "kyverno.io", Version: "v2alpha1", Resource: "cleanuppolicies"}, Kind: "CleanupPolicy", Namespace: name},
	} {
		spec := map[string]any{"exceptions": []any{}, "match": map[string]any{}}
		if o.Kind == "CleanupPolicy" {
			spec = map[string]any{"match": map[string]any{}, "schedule": "0 0 * * *"}
		}
		if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: o.GVR, Kind: o.Kind, Namespaces: []string{name}, PerNS: 1, Spec: spec}); err != nil {
			t.Fatal(err)
		}
		o.Name = "obj-0"
		s.objects = append(s.objects, o)
	}
	return s
}

// bump points the Application at the commit of chart version v (a GitOps change of the
// Application's targetRevision).
func (s *scenario) bump(t *testing.T, v string) {
	t.Helper()
	if err := s.argo.SetTargetRevision(t.Context(), s.name, s.commits[v]); err != nil {
		t.Fatal(err)
	}
}

// synced says that Argo CD's last sync operation, of the commit of chart version v,
// succeeded, that Argo CD compared the Application at that commit since, and that it
// reports the version ConfigMap Synced.
//
// The Application's own sync status stays OutOfSync after a successful sync: Argo CD
// v3.6.1 reports the kyverno CRDs OutOfSync right after applying them (on 1.37.2, with
// client-side apply; with server-side apply and diff, in some runs, one of them stays
// OutOfSync, also after a refresh and without upgradeguard), so the tests do not ask for
// Synced.
func (s *scenario) synced(v string) func(*argocd.Application) bool {
	return func(app *argocd.Application) bool {
		op := app.Status.OperationState
		return op != nil && op.Phase == "Succeeded" && op.Operation.Sync.Revision == s.commits[v] &&
			app.Status.Sync.Revision == s.commits[v] && app.ResourceStatus("ConfigMap", versionConfigMap) == "Synced"
	}
}

// bumpFails moves the Application to chart version v and waits until automated sync
// gave up on it: the operation at v Failed, its retries spent, and a SyncError condition.
func (s *scenario) bumpFails(t *testing.T, v string) *argocd.Application {
	t.Helper()
	s.bump(t, v)
	app, err := s.argo.WaitApplication(t.Context(), s.name, 3*time.Minute, func(app *argocd.Application) bool {
		op := app.Status.OperationState
		_, syncError := app.Status.Condition("SyncError")
		return op != nil && op.Operation.Sync.Revision == s.commits[v] && op.Phase == "Failed" && syncError
	})
	if err != nil {
		t.Fatalf("the sync of %s did not fail with a SyncError: %v\n%s", v, err, s.argo.LogTail(30))
	}
	t.Logf("%s", app)
	return app
}

// waitSynced waits until Argo CD has synced chart version v.
func (s *scenario) waitSynced(t *testing.T, v string) *argocd.Application {
	t.Helper()
	app, err := s.argo.WaitApplication(t.Context(), s.name, 3*time.Minute, s.synced(v))
	if err != nil {
		t.Fatalf("sync of %s: %v\n%s", v, err, s.argo.LogTail(30))
	}
	return app
}

// crdState is what the API server holds for one kyverno CRD.
type crdState struct {
	Storage        string
	Versions       []string
	StoredVersions []string
}

func (s *scenario) crds(t *testing.T) map[string]crdState {
	t.Helper()
	cs := apiextclient.NewForConfigOrDie(s.cp.Config)
	out := map[string]crdState{}
	for _, n := range fluxtest.BreakingCRDs {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := crdState{StoredVersions: slices.Sorted(slices.Values(crd.Status.StoredVersions))}
		for _, v := range crd.Spec.Versions {
			st.Versions = append(st.Versions, v.Name)
			if v.Storage {
				st.Storage = v.Name
			}
		}
		out[n] = st
	}
	return out
}

// chartVersionInCluster is data.version of the version ConfigMap.
func (s *scenario) chartVersionInCluster(t *testing.T) string {
	t.Helper()
	cm, err := kubernetes.NewForConfigOrDie(s.cp.Config).CoreV1().ConfigMaps(s.name).Get(t.Context(), versionConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data["version"]
}

// expectLeft checks what a sync or rollback left (when says which): both breaking CRDs
// as want (storage version, spec.versions in order, storedVersions), every object
// readable at the storage version, and the version ConfigMap at chart.
func (s *scenario) expectLeft(t *testing.T, when string, want crdState, chart string) {
	t.Helper()
	crds := s.crds(t)
	for _, n := range fluxtest.BreakingCRDs {
		if got := crds[n]; got.Storage != want.Storage || !slices.Equal(got.Versions, want.Versions) || !slices.Equal(got.StoredVersions, want.StoredVersions) {
			t.Errorf("%s %s: %+v, want %+v", n, when, got, want)
		}
	}
	if errs := s.readObjects(t); len(errs) > 0 {
		t.Errorf("objects unreadable %s: %v", when, errs)
	}
	if v := s.chartVersionInCluster(t); v != chart {
		t.Errorf("ConfigMap version %s = %s, want %s", when, v, chart)
	}
}

// readObjects reads every object at its CRD's storage version and returns the errors.
func (s *scenario) readObjects(t *testing.T) []error {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(s.cp.Config)
	crds := s.crds(t)
	var errs []error
	for _, o := range s.objects {
		gvr := o.GVR
		gvr.Version = crds[o.GVR.Resource+"."+o.GVR.Group].Storage
		if _, err := dyn.Resource(gvr).Namespace(o.Namespace).Get(t.Context(), o.Name, metav1.GetOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", o.Kind, o.Namespace, o.Name, err))
		}
	}
	return errs
}

// resourceResults are the sync results of the breaking CRDs in op, by CRD name.
func resourceResults(op *argocd.OperationState) map[string]string {
	out := map[string]string{}
	if op == nil || op.SyncResult == nil {
		return out
	}
	for _, r := range op.SyncResult.Resources {
		if r.Kind == "CustomResourceDefinition" && slices.Contains(fluxtest.BreakingCRDs, r.Name) {
			out[r.Name] = r.Status + ": " + r.Message
		}
	}
	return out
}

// rejectedCRDs are the CRDs whose storedVersions rejection msg carries, with the
// version, in the wording of the running API server.
func rejectedCRDs(msg string, w crdversions.Wording) []string {
	var out []string
	for _, r := range crdversions.StoredVersionRejections(msg) {
		if r.Wording == w {
			out = append(out, r.CRD+"@"+r.Version)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
