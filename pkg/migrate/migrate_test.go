package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(testenv.RunTests(m, &cp, testenv.Options{Audit: true, Tokens: map[string]string{"migrator": "migrator-token"}}))
}

const helmrepos = "helmrepositories.source.toolkit.fluxcd.io"

var hrV1 = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "helmrepositories"}

type env struct {
	ctx  context.Context
	crds apiextclient.Interface
	dyn  dynamic.Interface
}

// fluxState reproduces the incident's starting point: n HelmRepositories per namespace
// stored at v1beta2 by source-controller 1.2.0 (each with a status), then the flux2
// 2.17.2 CRDs, so storedVersions is [v1beta2, v1].
func fluxState(t *testing.T, namespaces []string, n int) env {
	t.Helper()
	e := emptyCluster(t)
	apply(t, e, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")
	old := hrV1
	old.Version = "v1beta2"
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: old, Kind: "HelmRepository", Namespaces: namespaces, PerNS: n,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces {
		list, err := e.dyn.Resource(old).Namespace(ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			obj := &list.Items[i]
			_ = unstructured.SetNestedField(obj.Object, "http://source-controller/"+obj.GetName(), "status", "url")
			if _, err := e.dyn.Resource(old).Namespace(ns).UpdateStatus(e.ctx, obj, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(t, e, "charts/flux2-2.17.2/rendered/crds.yaml")
	return e
}

// emptyCluster gives a test the package's control plane with no CRDs, and empties it again
// after the test.
func emptyCluster(t *testing.T) env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	e := env{ctx: t.Context(), crds: apiextclient.NewForConfigOrDie(cp.Config), dyn: dynamic.NewForConfigOrDie(cp.Config)}
	if err := cp.DeleteAllCRDs(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(e.ctx)); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return e
}

func apply(t *testing.T, e env, files ...string) {
	t.Helper()
	crds, err := testenv.ReadCRDs(files...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		if err := testenv.ApplyCRD(e.ctx, e.crds, c); err != nil {
			t.Fatalf("apply %s: %v", c.Name, err)
		}
	}
}

func applyErr(t *testing.T, e env, file, name string) error {
	t.Helper()
	crds, err := testenv.ReadCRDs(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		if c.Name == name {
			return testenv.ApplyCRD(e.ctx, e.crds, c)
		}
	}
	t.Fatalf("%s not in %s", name, file)
	return nil
}

func storedVersions(t *testing.T, e env, name string) []string {
	t.Helper()
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd.Status.StoredVersions
}

// snapshot reads every object at gvr: name -> spec and status, and name -> resourceVersion.
func snapshot(t *testing.T, e env, gvr schema.GroupVersionResource) (map[string]any, map[string]string) {
	t.Helper()
	list, err := e.dyn.Resource(gvr).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, rvs := map[string]any{}, map[string]string{}
	for _, o := range list.Items {
		key := o.GetNamespace() + "/" + o.GetName()
		data[key] = map[string]any{"spec": o.Object["spec"], "status": o.Object["status"]}
		rvs[key] = o.GetResourceVersion()
	}
	return data, rvs
}

func newMigrator(t *testing.T, cfg *rest.Config) *migrate.Migrator {
	t.Helper()
	m, err := migrate.New(migrate.RateLimit(cfg, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func opts() migrate.Options {
	return migrate.Options{PageSize: 7, Concurrency: 4, Deadline: time.Minute, LeaseNamespace: "default", LeaseDuration: 15 * time.Second}
}

// TestIncidentFixedAndIdempotent: the Flux upgrade incident goes from rejected to
// accepted, every object reads back unchanged, and a re-run writes nothing (audit log).
func TestIncidentFixedAndIdempotent(t *testing.T) {
	e := fluxState(t, []string{"flux-system", "team-a"}, 12)
	if err := applyErr(t, e, "charts/flux2-2.18.2/rendered/crds.yaml", helmrepos); err == nil || !strings.Contains(err.Error(), "storedVersions") {
		t.Fatalf("before migration the 2.18.2 CRD must be rejected, got %v", err)
	}
	before, _ := snapshot(t, e, hrV1)

	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil {
		t.Fatal(err)
	}
	want := migrate.Result{Name: helmrepos, Status: migrate.Migrated, StorageVersion: "v1", StoredVersionsBefore: []string{"v1beta2", "v1"},
		StoredVersionsAfter: []string{"v1"}, Objects: 24, Rewritten: 24, Failed: []migrate.ObjectError{},
		Engine: migrate.EngineClient, EngineReason: "auto: may patch " + helmrepos + " (SelfSubjectAccessReview)"}
	res.DurationSeconds = 0
	if diff := cmp.Diff(&want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if err := applyErr(t, e, "charts/flux2-2.18.2/rendered/crds.yaml", helmrepos); err != nil {
		t.Fatalf("after migration the 2.18.2 CRD is still rejected: %v", err)
	}
	after, rvs := snapshot(t, e, hrV1)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("objects changed by the migration (-before +after):\n%s", diff)
	}

	// Re-run as its own user, so the audit log shows exactly its requests.
	rerunCfg, err := cp.AddUser("migrate-rerun", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	res, err = newMigrator(t, rerunCfg).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil || res.Status != migrate.AlreadyMigrated {
		t.Fatalf("re-run: %v %+v", err, res)
	}
	_, rvsAgain := snapshot(t, e, hrV1)
	if diff := cmp.Diff(rvs, rvsAgain); diff != "" {
		t.Errorf("resourceVersions changed on a re-run (-before +after):\n%s", diff)
	}
	events, err := cp.AuditEvents("migrate-rerun")
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Verb != "get" {
		t.Errorf("re-run made %d requests (%+v), want exactly one GET of the CRD", len(events), events)
	}

}

// TestDeadlineNeverPrunesAndResumes: a run cut short by its deadline leaves
// storedVersions untouched and its place in the migration Lease; a re-run resumes there
// (it never lists the first pages again) and finishes; with NoResume a run starts over
// and counts what was done as already current.
func TestDeadlineNeverPrunesAndResumes(t *testing.T) {
	e := fluxState(t, []string{"a"}, 60)
	m, err := migrate.New(migrate.RateLimit(cp.Config, 20, 1))
	if err != nil {
		t.Fatal(err)
	}
	o := opts()
	o.Deadline = time.Second
	res, err := m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != migrate.Incomplete || !res.Interrupted || res.Restart || !strings.Contains(res.Message, "deadline") || res.Rewritten >= 60 {
		t.Fatalf("status %s interrupted %v restart %v rewritten %d message %q, want incomplete by deadline, to be resumed", res.Status, res.Interrupted, res.Restart, res.Rewritten, res.Message)
	}
	if got := storedVersions(t, e, helmrepos); !cmp.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions %v after a partial run, want untouched", got)
	}
	first := res.Rewritten
	lease, err := kubernetes.NewForConfigOrDie(cp.Config).CoordinationV1().Leases("default").Get(e.ctx, "upgradeguard-migrate-"+helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Annotations["upgradeguard.io/resume-continue"] == "" || lease.Annotations["upgradeguard.io/resume-storage-version"] != "v1" {
		t.Fatalf("Lease annotations %v, want the place the run stopped at v1", lease.Annotations)
	}

	// NoResume: from the start, everything done so far is already current.
	o = opts()
	o.NoResume, o.DryRun = true, false
	o.Deadline = time.Second
	again, err := m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil || again.Resumed {
		t.Fatalf("NoResume run: %v %+v", err, again)
	}
	if again.AlreadyCurrent == 0 {
		t.Errorf("NoResume run found nothing already current: %+v", again)
	}
	first += again.Rewritten

	res, err = newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil || res.Status != migrate.Migrated {
		t.Fatalf("re-run: %v %+v", err, res)
	}
	if !res.Resumed || res.Objects >= 60 {
		t.Errorf("re-run resumed=%v and saw %d objects, want it to resume and skip the pages done", res.Resumed, res.Objects)
	}
	// Each object is re-persisted once, by one of the runs, and a successful patch is
	// counted exactly; only a patch in flight when a deadline cancels it (at most one
	// per worker) may land on the server without being counted.
	if total, inFlight := first+res.Rewritten, int64(2*o.Concurrency); total > 60 || total < 60-inFlight {
		t.Errorf("the runs rewrote %d objects in all (re-run %d), want 60 (less at most %d patches cut off by the deadlines)", total, res.Rewritten, inFlight)
	}
	lease, err = kubernetes.NewForConfigOrDie(cp.Config).CoordinationV1().Leases("default").Get(e.ctx, "upgradeguard-migrate-"+helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := lease.Annotations["upgradeguard.io/resume-continue"]; ok {
		t.Errorf("a finished run left a resume point: %v", lease.Annotations)
	}
}

// TestStorageVersionChangeDuringRun: someone switches the storage version mid-run.
func TestStorageVersionChangeDuringRun(t *testing.T) {
	e := fluxState(t, []string{"a"}, 30)
	o := opts()
	var once sync.Once
	o.Progress = func(migrate.Progress) {
		once.Do(func() {
			crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			for i := range crd.Spec.Versions {
				crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == "v1beta2"
			}
			if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Update(e.ctx, crd, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
			}
		})
	}
	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != migrate.Incomplete || !res.Restart || !strings.Contains(res.Message, "storage version v1 -> v1beta2") {
		t.Errorf("status %s restart %v message %q, want incomplete, to be restarted, naming the storage change", res.Status, res.Restart, res.Message)
	}
	if got := storedVersions(t, e, helmrepos); !cmp.Equal(got, []string{"v1beta2", "v1"}) {
		t.Errorf("storedVersions %v, want untouched", got)
	}
}

// TestConcurrentRunsExclude: while one run holds the Lease, a second one fails with a
// clear message, or waits for it with Wait.
func TestConcurrentRunsExclude(t *testing.T) {
	e := fluxState(t, []string{"a"}, 30)
	m := newMigrator(t, cp.Config)
	o := opts()
	var once sync.Once
	var secondErr error
	var waited *migrate.Result
	var wg sync.WaitGroup
	o.Progress = func(migrate.Progress) {
		once.Do(func() {
			second := opts()
			second.Holder = "second"
			_, secondErr = m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, second)
			second.Wait = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if waited, err = m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, second); err != nil {
					t.Error(err)
				}
			}()
		})
	}
	o.Holder = "first"
	res, err := m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil || res.Status != migrate.Migrated {
		t.Fatalf("first run: %v %+v", err, res)
	}
	var held *migrate.LeaseHeldError
	if !errors.As(secondErr, &held) || held.Holder != "first" || !strings.Contains(secondErr.Error(), "held until") {
		t.Errorf("second run: %v, want a LeaseHeldError naming the first run and its Lease", secondErr)
	}
	wg.Wait()
	if waited == nil || waited.Status != migrate.AlreadyMigrated {
		t.Errorf("waiting run: %+v, want alreadyMigrated once the first finished", waited)
	}
}

// TestChurn: objects are deleted and created while the run pages through them.
func TestChurn(t *testing.T) {
	e := fluxState(t, []string{"a"}, 40)
	o := opts()
	var once sync.Once
	o.Progress = func(migrate.Progress) {
		once.Do(func() {
			ri := e.dyn.Resource(hrV1).Namespace("a")
			for i := 30; i < 40; i++ {
				if err := ri.Delete(e.ctx, fmt.Sprintf("obj-%d", i), metav1.DeleteOptions{}); err != nil {
					t.Error(err)
				}
			}
			if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: hrV1, Kind: "HelmRepository", Namespaces: []string{"b"}, PerNS: 5,
				Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
				t.Error(err)
			}
		})
	}
	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil || res.Status != migrate.Migrated {
		t.Fatalf("%v %+v", err, res)
	}
	if res.FailedCount != 0 || res.Rewritten+res.Deleted < 30 || res.Deleted > 10 {
		t.Errorf("rewritten %d deleted %d current %d failed %d", res.Rewritten, res.Deleted, res.AlreadyCurrent, res.FailedCount)
	}
	if err := applyErr(t, e, "charts/flux2-2.18.2/rendered/crds.yaml", helmrepos); err != nil {
		t.Errorf("2.18.2 CRD rejected after a migration with churn: %v", err)
	}
	if _, rvs := snapshot(t, e, hrV1); len(rvs) != 35 {
		t.Errorf("%d objects read back, want 35", len(rvs))
	}
}

// TestReverseMigrationUnblocksRollback: Crossplane 1.11.1 -> 1.10.2 with real objects.
func TestReverseMigrationUnblocksRollback(t *testing.T) {
	e := emptyCluster(t)
	const revs = "compositionrevisions.apiextensions.crossplane.io"
	oldFile, newFile := "crds/crossplane/v1.10.2/apiextensions.crossplane.io_compositionrevisions.yaml", "crds/crossplane/v1.11.1/apiextensions.crossplane.io_compositionrevisions.yaml"
	ssa := func(file string) error {
		crds, err := testenv.ReadCRDs(file)
		if err != nil {
			t.Fatal(err)
		}
		return testenv.ApplyCRDServerSide(e.ctx, cp.Config, crds[0], "helm")
	}
	// Applied as Helm 4 applies: server-side, field manager "helm", no force.
	if err := ssa(oldFile); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{"revision": int64(1), "compositeTypeRef": map[string]any{"apiVersion": "example.org/v1", "kind": "XThing"}, "resources": []any{}}
	gvr := schema.GroupVersionResource{Group: "apiextensions.crossplane.io", Version: "v1alpha1", Resource: "compositionrevisions"}
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: gvr, Kind: "CompositionRevision", PerNS: 5, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if err := ssa(newFile); err != nil {
		t.Fatal(err)
	}
	before, _ := snapshot(t, e, gvr)
	if err := ssa(oldFile); err == nil {
		t.Fatal("rollback CRD accepted before the reverse migration")
	}

	m := newMigrator(t, cp.Config)
	if _, err := m.Migrate(e.ctx, migrate.Target{Name: revs, StorageVersion: "v1alpha1"}, opts()); !errors.As(err, new(*migrate.StorageSwitchError)) {
		t.Fatalf("storage switch without confirmation: %v", err)
	}
	o := opts()
	o.AllowStorageSwitch = true
	res, err := m.Migrate(e.ctx, migrate.Target{Name: revs, StorageVersion: "v1alpha1"}, o)
	if err != nil || res.Status != migrate.Migrated || res.StorageSwitchedFrom != "v1beta1" || !cmp.Equal(res.StoredVersionsAfter, []string{"v1alpha1"}) {
		t.Fatalf("reverse migration: %v %+v", err, res)
	}
	// The rollback applies as Helm does; the storage switch must not have left upgradeguard
	// owning spec.versions, or this apply fails on a field conflict.
	if err := ssa(oldFile); err != nil {
		t.Fatalf("rollback CRD still rejected: %v", err)
	}
	after, _ := snapshot(t, e, gvr)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("objects changed (-before +after):\n%s", diff)
	}
}

// TestResumeFromContinueToken: a run stopped after two pages resumes from the token it
// reported, lists only the rest, and prunes when the rest is done.
func TestResumeFromContinueToken(t *testing.T) {
	e := fluxState(t, []string{"a"}, 40)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var last migrate.Progress
	o := opts()
	o.Concurrency = 1
	o.Progress = func(p migrate.Progress) {
		last = p
		if p.Done >= 14 {
			cancel()
		}
	}
	res, err := newMigrator(t, cp.Config).Migrate(ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != migrate.Incomplete || last.Continue == "" || last.Done != 14 || last.Rewritten != 14 {
		t.Fatalf("first run: status %s, last progress %+v; want incomplete after two pages of 7 with a token", res.Status, last)
	}
	// Someone writes 6 objects after the token: they are stored at v1 now, but pages
	// continued from the token show them as the first run's snapshot had them.
	later, err := e.dyn.Resource(hrV1).List(e.ctx, metav1.ListOptions{Limit: 6, Continue: last.Continue}) // the token is for a list of all namespaces
	if err != nil {
		t.Fatal(err)
	}
	if len(later.Items) != 6 {
		t.Fatalf("%d objects after the token, want 6", len(later.Items))
	}
	for _, it := range later.Items {
		if _, err := e.dyn.Resource(hrV1).Namespace("a").Patch(e.ctx, it.GetName(), types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	o = opts()
	o.Continue = last.Continue
	res, err = newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil || res.Status != migrate.Migrated {
		t.Fatalf("resumed run: %v %+v", err, res)
	}
	if res.Objects != 40-14 || res.Rewritten != 40-14-6 || res.AlreadyCurrent != 6 {
		t.Errorf("resumed run saw %d objects, rewrote %d, found %d current; want the remaining %d, of which the 6 written since are current",
			res.Objects, res.Rewritten, res.AlreadyCurrent, 40-14)
	}
	if got := storedVersions(t, e, helmrepos); !cmp.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v after the resumed run, want [v1]", got)
	}
}
