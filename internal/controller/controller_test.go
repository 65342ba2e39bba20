package controller_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4})))
	os.Exit(testenv.RunTests(m, &cp, testenv.Options{Audit: true}))
}

const helmrepos = "helmrepositories.source.toolkit.fluxcd.io"

var hrV1beta2 = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"}

type env struct {
	ctx  context.Context
	crds apiextclient.Interface
	c    client.Client
}

// setup empties the cluster, installs upgradeguard's CRDs and returns clients.
func setup(t *testing.T) env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	e := env{ctx: t.Context(), crds: apiextclient.NewForConfigOrDie(cp.Config)}
	if err := cp.DeleteAllCRDs(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(e.ctx)); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := testenv.ApplyUpgradeguardCRDs(e.ctx, cp.Config); err != nil {
		t.Fatal(err)
	}
	var err error
	e.c, err = client.New(cp.Config, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func apply(t *testing.T, e env, files ...string) {
	t.Helper()
	if err := testenv.ApplyFixtureCRDs(e.ctx, e.crds, files...); err != nil {
		t.Fatal(err)
	}
}

// startController runs the manager as user until the test ends or stop is called; stop
// waits for it to return.
func startController(t *testing.T, user string, o controller.Options) (stop func()) {
	t.Helper()
	cfg, err := cp.AddUser(user, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	o.MetricsAddr, o.ProbeAddr, o.SkipNameValidation = "0", "0", true
	if o.LeaderElectionNamespace == "" {
		o.LeaderElectionNamespace = "default"
	}
	if o.MigrationLeaseDuration == 0 {
		o.MigrationLeaseDuration = 5 * time.Second
	}
	mgr, err := controller.NewManager(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func helmreposStoredVersions(t *testing.T, e env) []string {
	t.Helper()
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd.Status.StoredVersions
}

// waitFor polls cond every 100ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond() })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func proactivePolicy(t *testing.T, e env, groups ...string) {
	t.Helper()
	p := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "all"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: groups, Proactive: ptr.To(true)}}
	if err := e.c.Create(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), p) })
}

// TestProactiveAfterStorageSwitch: HelmRepositories stored at v1beta2, then a chart
// switches the storage version to v1. Within seconds the proactive controller has
// re-persisted every object and storedVersions is [v1]; the metric counted it and the
// StorageMigration carries the event.
func TestProactiveAfterStorageSwitch(t *testing.T) {
	e := setup(t)
	apply(t, e, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: hrV1beta2, Kind: "HelmRepository", Namespaces: []string{"flux-system"}, PerNS: 25,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	proactivePolicy(t, e, "source.toolkit.fluxcd.io")
	succeeded := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.LocalCluster, metrics.ResultSucceeded))
	rewritten := testutil.ToFloat64(metrics.ObjectsRewritten.WithLabelValues(metrics.LocalCluster, helmrepos))
	startController(t, "ug-proactive", controller.Options{})

	// The storage switch: flux2 2.17.2 stores HelmRepositories at v1.
	apply(t, e, "charts/flux2-2.17.2/rendered/crds.yaml")
	switched := time.Now()
	waitFor(t, 30*time.Second, "storedVersions [v1]", func() (bool, error) {
		return slices.Equal(helmreposStoredVersions(t, e), []string{"v1"}), nil
	})
	t.Logf("storedVersions pruned %v after the storage switch", time.Since(switched).Round(10*time.Millisecond))

	sm := &v1alpha1.StorageMigration{}
	waitFor(t, 10*time.Second, "StorageMigration Succeeded", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: controller.ProactiveName(helmrepos)}, sm)
		return err == nil && sm.Status.Phase == v1alpha1.PhaseSucceeded, client.IgnoreNotFound(err)
	})
	rp := sm.Status.Resources[0]
	if rp.Objects != 25 || rp.Rewritten != 25 || !slices.Equal(rp.StoredVersionsBefore, []string{"v1beta2", "v1"}) || !slices.Equal(rp.StoredVersionsAfter, []string{"v1"}) {
		t.Errorf("progress %+v, want 25 objects rewritten and [v1beta2 v1] -> [v1]", rp)
	}
	for _, c := range []struct {
		typ  string
		want metav1.ConditionStatus
	}{{v1alpha1.ConditionSucceeded, metav1.ConditionTrue}, {v1alpha1.ConditionRunning, metav1.ConditionFalse},
		{v1alpha1.ConditionStorageMigrationRequired, metav1.ConditionFalse}, {v1alpha1.ConditionStorageMigrationInProgress, metav1.ConditionFalse}} {
		if got := condStatus(sm, c.typ); got != c.want {
			t.Errorf("condition %s = %s, want %s", c.typ, got, c.want)
		}
	}
	if got := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.LocalCluster, metrics.ResultSucceeded)) - succeeded; got < 1 {
		t.Errorf("upgradeguard_migrations_total{result=succeeded} grew by %v, want >= 1", got)
	}
	if got := testutil.ToFloat64(metrics.ObjectsRewritten.WithLabelValues(metrics.LocalCluster, helmrepos)) - rewritten; got != 25 {
		t.Errorf("upgradeguard_objects_rewritten_total{crd=%s} grew by %v, want 25", helmrepos, got)
	}
	waitFor(t, 10*time.Second, "the Migrated event", func() (bool, error) {
		evs, err := kubernetes.NewForConfigOrDie(cp.Config).EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == sm.Name && ev.Reason == controller.EventMigrated && strings.Contains(ev.Note, "25 rewritten")
		}), nil
	})

	// The policy's status shows the CRD as eligible and nothing pending.
	policy := &v1alpha1.StorageMigrationPolicy{}
	waitFor(t, 10*time.Second, "policy status", func() (bool, error) {
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: "all"}, policy); err != nil {
			return false, err
		}
		return policy.Status.EligibleCRDs > 0 && len(policy.Status.PendingCRDs) == 0, nil
	})

	// A view of the CRD from before the prune (a cache that has not caught up) does not
	// replace the succeeded StorageMigration while the CRD on the API server needs none.
	// With a live read that still needs one, it is replaced: the check above can fail.
	live, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stale := live.DeepCopy()
	stale.Status.StoredVersions = []string{"v1beta2", "v1"}
	for _, c := range []struct {
		live        *apiextv1.CustomResourceDefinition
		wantCreated bool
	}{{live, false}, {stale, true}} {
		read := func(context.Context) (*apiextv1.CustomResourceDefinition, error) { return c.live, nil }
		created, err := controller.EnsureProactive(e.ctx, e.c, stale, read, policy)
		if err != nil {
			t.Fatal(err)
		}
		now := &v1alpha1.StorageMigration{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: sm.Name}, now); err != nil {
			t.Fatal(err)
		}
		if created != c.wantCreated || (now.UID == sm.UID) == c.wantCreated {
			t.Errorf("live storedVersions %v: created %v (UID kept: %v), want created %v",
				c.live.Status.StoredVersions, created, now.UID == sm.UID, c.wantCreated)
		}
	}
}

// TestProactiveRetriesAfterCRDChange: a proactive migration fails (an admission policy
// refuses every update of the objects). It is not retried while nothing changes; once the
// cause is gone and an upgrade changes the CRD, proactive mode replaces it and succeeds.
func TestProactiveRetriesAfterCRDChange(t *testing.T) {
	e := setup(t)
	apply(t, e, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: hrV1beta2, Kind: "HelmRepository", Namespaces: []string{"frozen"}, PerNS: 5,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	vap := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "freeze-helmrepositories"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
				Operations: []admissionv1.OperationType{admissionv1.Update},
				Rule:       admissionv1.Rule{APIGroups: []string{"source.toolkit.fluxcd.io"}, APIVersions: []string{"*"}, Resources: []string{"helmrepositories"}},
			}}}},
			Validations: []admissionv1.Validation{{Expression: "false", Message: "frozen by the test"}},
		}}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "freeze-helmrepositories"},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: vap.Name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}}}
	if _, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(e.ctx, vap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.WithoutCancel(e.ctx), vap.Name, metav1.DeleteOptions{})
	})
	if _, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(e.ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	unbind := func() {
		_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.WithoutCancel(e.ctx), binding.Name, metav1.DeleteOptions{})
	}
	t.Cleanup(unbind)
	// The policy takes effect asynchronously: wait until a dry-run update is refused.
	frozen := func() bool {
		_, err := dynamic.NewForConfigOrDie(cp.Config).Resource(hrV1beta2).Namespace("frozen").Patch(e.ctx, "obj-0", types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"probe":"x"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "frozen by the test")
	}
	waitFor(t, 30*time.Second, "the admission policy in effect", func() (bool, error) { return frozen(), nil })

	proactivePolicy(t, e, "source.toolkit.fluxcd.io")
	startController(t, "ug-retry", controller.Options{})
	apply(t, e, "charts/flux2-2.17.2/rendered/crds.yaml")
	name := controller.ProactiveName(helmrepos)
	failed := &v1alpha1.StorageMigration{}
	waitFor(t, 30*time.Second, "the proactive migration Failed", func() (bool, error) {
		failed = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, failed)
		return err == nil && failed.Status.Phase == v1alpha1.PhaseFailed, client.IgnoreNotFound(err)
	})
	if rp := failed.Status.Resources[0]; rp.FailedCount != 5 || !strings.Contains(failed.Status.Resources[0].Message, "could not be migrated") {
		t.Fatalf("failed migration %+v, want the 5 refused objects", rp)
	}

	// The cause goes away; an upgrade changes the CRD.
	unbind()
	waitFor(t, 30*time.Second, "the admission policy gone", func() (bool, error) { return !frozen(), nil })
	still := &v1alpha1.StorageMigration{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, still); err != nil || still.UID != failed.UID || still.Status.Phase != v1alpha1.PhaseFailed {
		t.Fatalf("before the CRD changed, the failed migration was replaced or retried (%v): %+v", err, still.Status)
	}
	upgradeHelmrepos(t, e)
	waitFor(t, 30*time.Second, "a new proactive migration Succeeded", func() (bool, error) {
		sm := &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, sm)
		return err == nil && sm.UID != failed.UID && sm.Status.Phase == v1alpha1.PhaseSucceeded, client.IgnoreNotFound(err)
	})
	if got := helmreposStoredVersions(t, e); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
}

func condStatus(sm *v1alpha1.StorageMigration, typ string) metav1.ConditionStatus {
	for _, c := range sm.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// upgradeHelmrepos changes the HelmRepository CRD as a chart upgrade would: a new
// generation (v1beta2 deprecated, with a warning), the same storage version.
func upgradeHelmrepos(t *testing.T, e env) {
	t.Helper()
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Name == "v1beta2" {
			crd.Spec.Versions[i].Deprecated, crd.Spec.Versions[i].DeprecationWarning = true, ptr.To("v1beta2 is going away")
		}
	}
	if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Update(e.ctx, crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// storedAtV1beta2 is a cluster with n HelmRepositories in team-a stored at v1beta2, and
// the flux2 2.17.2 CRDs that store them at v1: storedVersions [v1beta2 v1].
func storedAtV1beta2(t *testing.T, n int) env {
	t.Helper()
	e := setup(t)
	apply(t, e, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: hrV1beta2, Kind: "HelmRepository", Namespaces: []string{"team-a"}, PerNS: n,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	apply(t, e, "charts/flux2-2.17.2/rendered/crds.yaml")
	return e
}

// TestResumeAfterRestart: a controller stopped mid-migration leaves its place in status;
// the next one resumes from exactly that continue token (the API server's audit log shows
// its first LIST carries it) and finishes.
func TestResumeAfterRestart(t *testing.T) {
	const n = 120
	e := storedAtV1beta2(t, n)
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "resume"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Rate: v1alpha1.RateSettings{QPS: 20, Burst: 1, PageSize: 10, Concurrency: 1}}}
	if err := e.c.Create(e.ctx, sm); err != nil {
		t.Fatal(err)
	}
	stop := startController(t, "ug-first", controller.Options{SaveEvery: time.Nanosecond})
	waitFor(t, 30*time.Second, "saved progress", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: "resume"}, sm)
		return err == nil && len(sm.Status.Resources) == 1 && sm.Status.Resources[0].Objects >= 30 && sm.Status.Resources[0].Continue != "", err
	})
	stop()
	sm = &v1alpha1.StorageMigration{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: "resume"}, sm); err != nil {
		t.Fatal(err)
	}
	saved := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseRunning || saved.Continue == "" || saved.Objects >= n {
		t.Fatalf("after the stop: phase %s, progress %+v; want Running with a saved token", sm.Status.Phase, saved)
	}
	if got := helmreposStoredVersions(t, e); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions %v after a stopped run, want untouched", got)
	}

	second := fmt.Sprintf("ug-second-%d", time.Now().UnixNano()) // its own audit trail, with -count too
	startController(t, second, controller.Options{})
	waitFor(t, 60*time.Second, "Succeeded", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: "resume"}, sm)
		return err == nil && sm.Status.Phase == v1alpha1.PhaseSucceeded, err
	})
	if got := helmreposStoredVersions(t, e); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	rp := sm.Status.Resources[0]
	// Objects the first attempt re-persisted after its last saved page are found already
	// current by the second (at most the page it was stopped in); none is counted twice.
	if rp.Attempts != 2 || rp.Objects != n || rp.Rewritten+rp.AlreadyCurrent != n || rp.AlreadyCurrent > 10 {
		t.Errorf("progress %+v, want two attempts that together counted each of the %d objects once", rp, n)
	}
	evs, err := cp.AuditEvents(second)
	if err != nil {
		t.Fatal(err)
	}
	var lists []string
	for _, ev := range evs {
		if ev.Verb == "list" && strings.Contains(ev.RequestURI, "/helmrepositories?") {
			lists = append(lists, ev.RequestURI)
		}
	}
	if len(lists) == 0 || !strings.Contains(lists[0], "continue="+url.QueryEscape(saved.Continue)) {
		t.Fatalf("the resumed controller's first LIST was %q, want it to carry the saved continue token", first(lists))
	}
	if slices.ContainsFunc(lists, func(u string) bool { return !strings.Contains(u, "continue=") }) {
		t.Errorf("the resumed controller listed from the start: %v", lists)
	}
}

// TestRestartWhenCRDChanges: a chart upgrade changes the CRD while a migration runs. The
// attempt does not prune storedVersions; the next one starts over on its own and
// finishes, with an event and the restarted metric saying so.
func TestRestartWhenCRDChanges(t *testing.T) {
	const n = 60
	e := storedAtV1beta2(t, n)
	restarted := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.LocalCluster, metrics.ResultRestarted))
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "restart"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Rate: v1alpha1.RateSettings{QPS: 10, Burst: 1, PageSize: 10, Concurrency: 1}}}
	if err := e.c.Create(e.ctx, sm); err != nil {
		t.Fatal(err)
	}
	startController(t, "ug-restart", controller.Options{SaveEvery: time.Nanosecond})
	waitFor(t, 30*time.Second, "the first attempt under way", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: "restart"}, sm)
		return err == nil && len(sm.Status.Resources) == 1 && sm.Status.Resources[0].Objects >= 10, err
	})
	if rp := sm.Status.Resources[0]; rp.Objects >= n || rp.Attempts != 1 {
		t.Fatalf("progress %+v when the CRD changes; want the first attempt part-way", rp)
	}
	upgradeHelmrepos(t, e)

	waitFor(t, 60*time.Second, "Succeeded", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: "restart"}, sm)
		return err == nil && terminalPhase(sm.Status.Phase), err
	})
	rp := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseSucceeded || rp.Attempts != 2 || rp.Objects != n || rp.Rewritten+rp.AlreadyCurrent != n {
		t.Errorf("phase %s, progress %+v; want Succeeded after a second attempt over all %d objects", sm.Status.Phase, rp, n)
	}
	if got := helmreposStoredVersions(t, e); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	if got := testutil.ToFloat64(metrics.Migrations.WithLabelValues(metrics.LocalCluster, metrics.ResultRestarted)) - restarted; got != 1 {
		t.Errorf("upgradeguard_migrations_total{result=restarted} grew by %v, want 1", got)
	}
	waitFor(t, 10*time.Second, "the MigrationRestarted event", func() (bool, error) {
		evs, err := kubernetes.NewForConfigOrDie(cp.Config).EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == "restart" && ev.Reason == controller.EventRestarted && strings.Contains(ev.Note, "changed during the run")
		}), nil
	})
}

func terminalPhase(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseSucceeded || p == v1alpha1.PhaseFailed
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// fixtureProject is one project's state before an upgrade that needs a migration, and
// that upgrade.
type fixtureProject struct {
	name     string
	steps    [][]string
	stored   map[string][]string
	incoming []string
}

// TestProactiveCoverage: for every fixture project that changes storage versions, a
// cluster under a proactive policy ends up with nothing that would block the project's
// next upgrade: the API server accepts every incoming CRD.
func TestProactiveCoverage(t *testing.T) {
	d := func(set string) []string { return fixtureDir(t, set) }
	projects := []fixtureProject{
		{name: "flux2 2.17.2->2.18.2", steps: [][]string{{"charts/flux2-2.17.2/rendered/crds.yaml"}},
			stored: map[string][]string{"buckets.source.toolkit.fluxcd.io": {"v1beta2", "v1"}, "gitrepositories.source.toolkit.fluxcd.io": {"v1beta2", "v1"},
				"helmcharts.source.toolkit.fluxcd.io": {"v1beta2", "v1"}, helmrepos: {"v1beta2", "v1"}, "ocirepositories.source.toolkit.fluxcd.io": {"v1beta2", "v1"},
				"kustomizations.kustomize.toolkit.fluxcd.io": {"v1beta2", "v1"}, "helmreleases.helm.toolkit.fluxcd.io": {"v2beta2", "v2"}},
			incoming: []string{"charts/flux2-2.18.2/rendered/crds.yaml"}},
		{name: "external-secrets 0.15.1->0.16.2", steps: [][]string{d("external-secrets/v0.15.1")},
			stored: map[string][]string{"externalsecrets.external-secrets.io": {"v1alpha1", "v1beta1"}, "secretstores.external-secrets.io": {"v1alpha1", "v1beta1"},
				"clustersecretstores.external-secrets.io": {"v1alpha1", "v1beta1"}},
			incoming: d("external-secrets/v0.16.2")},
		{name: "kyverno 1.12.6->1.13.4", steps: [][]string{d("kyverno/v1.10.7"), d("kyverno/v1.11.4"), d("kyverno/v1.12.6")}, incoming: d("kyverno/v1.13.4")},
		{name: "crossplane 1.20.0->2.0.0", steps: [][]string{d("crossplane/v1.20.0")},
			stored: map[string][]string{"environmentconfigs.apiextensions.crossplane.io": {"v1alpha1", "v1beta1"},
				"compositionrevisions.apiextensions.crossplane.io": {"v1alpha1", "v1beta1", "v1"}},
			incoming: d("crossplane/v2.0.0")},
		{name: "cert-manager 1.6.3->1.7.0", steps: [][]string{d("cert-manager/v1.6.3")},
			stored:   map[string][]string{"certificates.cert-manager.io": {"v1alpha2", "v1"}, "issuers.cert-manager.io": {"v1alpha2", "v1"}},
			incoming: d("cert-manager/v1.7.0")},
	}
	e := setup(t)
	proactivePolicy(t, e) // every group
	startController(t, "ug-coverage", controller.Options{MaxConcurrentMigrations: 4})
	for _, p := range projects {
		t.Run(p.name, func(t *testing.T) {
			// Even after a failure, so that the next project starts clean.
			t.Cleanup(func() { cleanProject(t, e) })
			for _, step := range p.steps {
				apply(t, e, step...)
			}
			for name, stored := range p.stored {
				if err := testenv.SetStoredVersions(e.ctx, e.crds, name, stored...); err != nil {
					t.Fatal(err)
				}
			}
			incoming, err := testenv.ReadCRDs(p.incoming...)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 60*time.Second, "no stale storedVersions", func() (bool, error) {
				list, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().List(e.ctx, metav1.ListOptions{})
				if err != nil {
					return false, err
				}
				for _, c := range list.Items {
					if len(c.Status.StoredVersions) != 1 {
						return false, nil
					}
				}
				return true, nil
			})
			for _, c := range incoming {
				if err := testenv.ApplyCRD(e.ctx, e.crds, c); err != nil {
					t.Errorf("the next upgrade's %s is rejected under proactive mode: %v", c.Name, err)
				}
			}
		})
	}
}

// cleanProject deletes a project's CRDs and objects (not upgradeguard's) between projects.
func cleanProject(t *testing.T, e env) {
	t.Helper()
	ours := func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group == v1alpha1.GroupVersion.Group }
	if err := cp.DeleteCRDs(context.WithoutCancel(e.ctx), ours); err != nil {
		t.Fatal(err)
	}
}

func fixtureDir(t *testing.T, set string) []string {
	t.Helper()
	files, err := testenv.FixtureSet(set)
	if err != nil {
		t.Fatal(err)
	}
	return files
}
