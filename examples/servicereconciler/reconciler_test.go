package servicereconciler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"helm.sh/helm/v4/pkg/cli"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sr "github.com/upgradeguard/upgradeguard/examples/servicereconciler"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	os.Exit(testenv.RunTests(m, &cp))
}

const (
	helmRepositories = "helmrepositories.source.toolkit.fluxcd.io"
	// service is the DemoService every test drives (one namespace per test).
	service = "flux"
)

// sourceCharts serves a chart repository with one chart, "source-controller", whose
// versions carry the real HelmRepository CRD of that source-controller tag: 1.2.0 stores
// v1beta2, 1.6.0 stores v1 and still serves v1beta2, 1.8.0 serves v1 only.
func sourceCharts(t *testing.T) sr.RepoCharts {
	t.Helper()
	repo := t.TempDir()
	for _, v := range []string{"1.2.0", "1.6.0", "1.8.0"} {
		dir, err := testenv.FixtureChart(t.TempDir(), "source-controller", v,
			"crds/flux-source-controller/v"+v+"/source.toolkit.fluxcd.io_helmrepositories.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.Package(dir, repo); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepo(repo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	helm := t.TempDir()
	settings := cli.New()
	settings.RepositoryCache = filepath.Join(helm, "repository")
	settings.RepositoryConfig = filepath.Join(helm, "repositories.yaml")
	settings.RegistryConfig = filepath.Join(helm, "registry.json")
	settings.ContentCache = filepath.Join(helm, "content")
	return sr.RepoCharts{Options: chartsource.Options{Ref: "source-controller", RepoURL: url, Settings: settings}}
}

// harness is an empty cluster with the DemoService CRD and the example controller
// running in a manager.
type harness struct {
	c   client.WithWatch
	crd apiextclient.Interface
	ns  string
}

func start(t *testing.T, ns string, o gate.Options) *harness {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	if err := cp.DeleteAllCRDs(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteAllCRDs(context.WithoutCancel(t.Context())) })
	crds := apiextclient.NewForConfigOrDie(cp.Config)
	demo, err := sr.CRD()
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(t.Context(), crds, demo); err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Namespaces().Create(t.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	scheme := runtime.NewScheme()
	if err := sr.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Each test starts its own manager with the same controller.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &sr.Reconciler{
		Client: mgr.GetClient(),
		// A client-side rate limit makes the migration take a few seconds, as on a
		// cluster with many objects.
		Target:       migrate.RateLimit(cp.Config, 40, 1),
		Charts:       sourceCharts(t),
		Gate:         o,
		RequeueAfter: 200 * time.Millisecond,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.RunManager(t, mgr)
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{c: c, crd: crds, ns: ns}
}

func (h *harness) create(t *testing.T, version string) {
	t.Helper()
	svc := &sr.DemoService{ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: h.ns}, Spec: sr.DemoServiceSpec{ChartVersion: version}}
	if err := h.c.Create(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) bump(t *testing.T, version string) {
	t.Helper()
	var svc sr.DemoService
	if err := h.c.Get(t.Context(), client.ObjectKey{Namespace: h.ns, Name: service}, &svc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(svc.DeepCopy())
	svc.Spec.ChartVersion = version
	if err := h.c.Patch(t.Context(), &svc, patch); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls the DemoService until ok holds, and returns it.
func (h *harness) waitFor(t *testing.T, what string, ok func(*sr.DemoService) bool) *sr.DemoService {
	t.Helper()
	var svc sr.DemoService
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := h.c.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: service}, &svc); err != nil {
			return false, err
		}
		return ok(&svc), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last status %+v", what, err, svc.Status)
	}
	return &svc
}

func applied(version string) func(*sr.DemoService) bool {
	return func(s *sr.DemoService) bool {
		return s.Status.AppliedVersion == version && meta.IsStatusConditionTrue(s.Status.Conditions, sr.ConditionReady)
	}
}

// record watches the DemoService and keeps every status the API server stored, in order,
// so that a state that lasts only a moment is still seen.
func (h *harness) record(t *testing.T) func() []sr.DemoServiceStatus {
	t.Helper()
	w, err := h.c.Watch(t.Context(), &sr.DemoServiceList{}, client.InNamespace(h.ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var mu sync.Mutex
	var seen []sr.DemoServiceStatus
	go func() {
		for ev := range w.ResultChan() {
			svc, ok := ev.Object.(*sr.DemoService)
			if !ok || ev.Type == watch.Error || svc.Name != service {
				continue
			}
			mu.Lock()
			seen = append(seen, svc.DeepCopy().Status)
			mu.Unlock()
		}
	}()
	return func() []sr.DemoServiceStatus {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

func cond(s sr.DemoServiceStatus, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(s.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func (h *harness) liveCRD(t *testing.T) *apiextv1.CustomResourceDefinition {
	t.Helper()
	crd, err := h.crd.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), helmRepositories, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd
}

func servedVersions(crd *apiextv1.CustomResourceDefinition) []string {
	var out []string
	for _, v := range crd.Spec.Versions {
		out = append(out, v.Name)
	}
	return out
}

// helmRepos creates n HelmRepositories through v1beta2 while it is the storage version.
func helmRepos(t *testing.T, ns string, n int) {
	t.Helper()
	// Helm applied the CRD from templates/ without waiting for it to be served.
	if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), helmRepositories); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{ns}, PerNS: n,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}); err != nil {
		t.Fatal(err)
	}
}

// runningAt160 installs the DemoService at 1.2.0, creates n HelmRepositories stored at
// v1beta2, and moves it to 1.6.0, which needs no migration: storedVersions is then
// [v1beta2 v1], the state a long-lived cluster is in before a release drops v1beta2.
func (h *harness) runningAt160(t *testing.T, ns string, n int) {
	t.Helper()
	h.create(t, "1.2.0")
	h.waitFor(t, "install of 1.2.0", applied("1.2.0"))
	if got := crdversions.StorageVersion(h.liveCRD(t)); got != "v1beta2" {
		t.Fatalf("1.2.0 stores %s, want v1beta2", got)
	}
	helmRepos(t, ns, n)

	h.bump(t, "1.6.0")
	svc := h.waitFor(t, "upgrade to 1.6.0", applied("1.6.0"))
	if c := cond(svc.Status, gate.ConditionRequired); c.Status != metav1.ConditionFalse || c.Reason != gate.ReasonNotRequired {
		t.Errorf("1.6.0 keeps v1beta2 and needs no migration, but %s = %+v", gate.ConditionRequired, c)
	}
	if got := h.liveCRD(t).Status.StoredVersions; !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions after 1.6.0 = %v, want [v1beta2 v1]", got)
	}
}

// TestVersionBumpMigratesThenUpgrades: the service runs source-controller 1.2.0 with
// HelmRepositories stored at v1beta2, moves to 1.6.0 (storage v1, v1beta2 still
// served), then to 1.8.0, which drops v1beta2. The controller reports the migration in
// progress on the DemoService, the gate migrates, Helm upgrades, and the conditions clear.
func TestVersionBumpMigratesThenUpgrades(t *testing.T) {
	h := start(t, "svc-upgrade", gate.Options{AutoMigrate: true, Budget: time.Minute,
		Migrate: migrate.Options{LeaseNamespace: "svc-upgrade", Holder: "demo-service-controller"}})

	h.runningAt160(t, "tenant", 200)

	statuses := h.record(t)
	h.bump(t, "1.8.0")
	svc := h.waitFor(t, "upgrade to 1.8.0", applied("1.8.0"))

	// The API server's side: migrated, pruned, and the chart's CRD applied by Helm.
	crd := h.liveCRD(t)
	if !slices.Equal(crd.Status.StoredVersions, []string{"v1"}) {
		t.Errorf("storedVersions = %v, want [v1]", crd.Status.StoredVersions)
	}
	if got := servedVersions(crd); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("live spec.versions = %v, want the 1.8.0 chart's [v1]", got)
	}
	if got, want := history(t, h.ns, service), []string{"1 superseded source-controller-1.2.0", "2 superseded source-controller-1.6.0", "3 deployed source-controller-1.8.0"}; !slices.Equal(got, want) {
		t.Errorf("helm history = %q, want %q", got, want)
	}

	// The DemoService's side: InProgress True while the upgrade was held, then cleared.
	var held bool
	for _, s := range statuses() {
		c := cond(s, gate.ConditionInProgress)
		if c.Status == metav1.ConditionTrue && c.Reason == gate.ReasonMigrating && s.AppliedVersion == "1.6.0" &&
			cond(s, gate.ConditionRequired).Reason == gate.ReasonMigrationRequired &&
			cond(s, sr.ConditionReady).Reason == sr.ReasonMigrationPending {
			held = true
		}
		if held && s.AppliedVersion == "1.8.0" {
			break
		}
	}
	if !held {
		t.Errorf("no status with %s True (%s) while 1.6.0 still ran; saw %+v", gate.ConditionInProgress, gate.ReasonMigrating, statuses())
	}
	for typ, reason := range map[string]string{gate.ConditionInProgress: gate.ReasonMigrated, gate.ConditionRequired: gate.ReasonMigrated} {
		if c := cond(svc.Status, typ); c.Status != metav1.ConditionFalse || c.Reason != reason || c.ObservedGeneration != svc.Generation {
			t.Errorf("after the upgrade %s = %+v, want False %s at generation %d", typ, c, reason, svc.Generation)
		}
	}
}

// TestBlockedUpgradeStops: from 1.2.0 straight to 1.8.0 drops v1beta2, the live storage
// version, while objects are stored in it; no migration fixes that. The controller stops
// before Helm runs and surfaces the gate's reason.
func TestBlockedUpgradeStops(t *testing.T) {
	h := start(t, "svc-blocked", gate.Options{AutoMigrate: true,
		Migrate: migrate.Options{LeaseNamespace: "svc-blocked", Holder: "demo-service-controller"}})

	h.create(t, "1.2.0")
	h.waitFor(t, "install of 1.2.0", applied("1.2.0"))
	helmRepos(t, "tenant-b", 10)

	h.bump(t, "1.8.0")
	svc := h.waitFor(t, "the gate's verdict on 1.8.0", func(s *sr.DemoService) bool {
		return cond(s.Status, sr.ConditionReady).Reason == sr.ReasonUpgradeBlocked
	})
	if c := cond(svc.Status, gate.ConditionRequired); c.Status != metav1.ConditionTrue || c.Reason != gate.ReasonBridgeRequired {
		t.Errorf("%s = %+v, want True %s", gate.ConditionRequired, c, gate.ReasonBridgeRequired)
	}
	if c := cond(svc.Status, gate.ConditionInProgress); c.Status != metav1.ConditionFalse {
		t.Errorf("%s = %+v, want False: nothing can be migrated", gate.ConditionInProgress, c)
	}
	if svc.Status.AppliedVersion != "1.2.0" || svc.Status.ObservedGeneration != svc.Generation {
		t.Errorf("status %+v: want 1.2.0 still applied, generation %d observed", svc.Status, svc.Generation)
	}
	if ready := cond(svc.Status, sr.ConditionReady); ready.Status != metav1.ConditionFalse ||
		!strings.Contains(ready.Message, helmRepositories) || !strings.Contains(ready.Message, "go through a chart version whose CRD serves v1beta2") {
		t.Errorf("Ready = %+v, want False with the CRD and the way out", ready)
	}
	crd := h.liveCRD(t)
	if got := crdversions.StorageVersion(crd); got != "v1beta2" || !slices.Equal(crd.Status.StoredVersions, []string{"v1beta2"}) {
		t.Errorf("the blocked upgrade touched the CRD: storage %s, storedVersions %v", got, crd.Status.StoredVersions)
	}
	if got, want := history(t, h.ns, service), []string{"1 deployed source-controller-1.2.0"}; !slices.Equal(got, want) {
		t.Errorf("helm history = %q, want %q: the blocked upgrade must not reach Helm", got, want)
	}
}

// history is the release's history as the real Helm CLI reports it.
func history(t *testing.T, ns, release string) []string {
	t.Helper()
	out, err := cp.Helm("history", release, "-n", ns, "-o", "json").Output()
	if err != nil {
		t.Fatalf("helm history: %v", err)
	}
	var revs []struct {
		Revision int    `json:"revision"`
		Status   string `json:"status"`
		Chart    string `json:"chart"`
	}
	if err := json.Unmarshal(out, &revs); err != nil {
		t.Fatalf("helm history output: %v", err)
	}
	var lines []string
	for _, r := range revs {
		lines = append(lines, fmt.Sprintf("%d %s %s", r.Revision, r.Status, r.Chart))
	}
	return lines
}

// TestMigratingRequeues: another run (the CLI) holds the CRD's migration Lease. The gate
// answers Migrating, the controller shows it and requeues; when the Lease is released,
// a requeued reconcile migrates and upgrades.
func TestMigratingRequeues(t *testing.T) {
	h := start(t, "svc-requeue", gate.Options{AutoMigrate: true, Budget: time.Minute,
		Migrate: migrate.Options{LeaseNamespace: "svc-requeue", Holder: "demo-service-controller"}})
	h.runningAt160(t, "tenant-r", 20)

	leases := kubernetes.NewForConfigOrDie(cp.Config).CoordinationV1().Leases(h.ns)
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "upgradeguard-migrate-" + helmRepositories},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("upgradeguard-cli"), LeaseDurationSeconds: ptr.To(int32(600)),
			AcquireTime: &now, RenewTime: &now},
	}
	if _, err := leases.Create(t.Context(), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	h.bump(t, "1.8.0")
	svc := h.waitFor(t, "the held Lease on the status", func(s *sr.DemoService) bool {
		c := cond(s.Status, gate.ConditionInProgress)
		return c.Status == metav1.ConditionTrue && c.Reason == gate.ReasonMigrating && strings.Contains(c.Message, "upgradeguard-cli")
	})
	if svc.Status.AppliedVersion != "1.6.0" || cond(svc.Status, sr.ConditionReady).Reason != sr.ReasonMigrationPending {
		t.Errorf("while the Lease is held: %+v, want 1.6.0 applied and Ready=%s", svc.Status, sr.ReasonMigrationPending)
	}
	if got := h.liveCRD(t).Status.StoredVersions; !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Errorf("storedVersions while another run holds the Lease = %v, want them untouched", got)
	}

	// The other run finishes without migrating and gives the Lease up, as migrate does.
	cur, err := leases.Get(t.Context(), lease.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.HolderIdentity, cur.Spec.RenewTime = nil, nil
	if _, err := leases.Update(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc = h.waitFor(t, "upgrade to 1.8.0 after the Lease is released", applied("1.8.0"))
	if c := cond(svc.Status, gate.ConditionInProgress); c.Status != metav1.ConditionFalse || c.Reason != gate.ReasonMigrated {
		t.Errorf("%s = %+v, want False %s", gate.ConditionInProgress, c, gate.ReasonMigrated)
	}
	if got := h.liveCRD(t).Status.StoredVersions; !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions = %v, want [v1]", got)
	}
}
