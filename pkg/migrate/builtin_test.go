package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// svmServed says whether this minor serves StorageVersionMigrations with no flags: GA
// and on by default from 1.37; beta and off by default in 1.35 and 1.36; alpha before.
func svmServed() bool { return cp.Minor >= 37 }

// svmControllers run the built-in migrator: it needs the garbage collector's informers.
var svmControllers = []string{"garbage-collector-controller", "storage-version-migrator-controller"}

// withControllerManager runs kube-controller-manager with controllers until the test ends.
func withControllerManager(t *testing.T, controllers ...string) {
	t.Helper()
	if err := cp.StartControllerManager(controllers...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.StopControllerManager(); err != nil {
			t.Error(err)
		}
	})
}

// builtinUser is a user bound to exactly the builtin engine's role for crd (it may list the
// custom resources, to judge field loss, and never write them).
func builtinUser(t *testing.T, e env, name, crd string) *rest.Config {
	t.Helper()
	c, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, crd, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := migrate.BuiltinRBAC(name, "default", []*apiextv1.CustomResourceDefinition{c}, false)
	for _, r := range p.ClusterRole.Rules {
		if slices.Contains(r.Verbs, "patch") {
			t.Fatalf("the builtin role grants patch: %+v", r)
		}
	}
	cp.BindRoles(t, name, p.ClusterRole, p.Role)
	cfg, err := cp.AddUser(name)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func builtinOpts(engine migrate.Engine) migrate.Options {
	o := opts()
	o.Engine, o.Deadline = engine, 4*time.Minute
	return o
}

// svmGone asserts that no StorageVersionMigration is left behind.
func svmGone(t *testing.T, name string) {
	t.Helper()
	if !svmServed() {
		return
	}
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	_, err := cs.StoragemigrationV1().StorageVersionMigrations().Get(t.Context(), name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("StorageVersionMigration %s: %v, want deleted", name, err)
	}
}

// TestBuiltinEngine: on a minor that serves StorageVersionMigrations, a user holding only
// the builtin role migrates the Flux incident (auto picks builtin for it) and storedVersions
// ends pruned; an admin's auto run picks the client engine. Where the API is not served,
// builtin fails saying so, and auto picks client.
func TestBuiltinEngine(t *testing.T) {
	e := fluxState(t, []string{"a", "b"}, 5)
	admin := newMigrator(t, cp.Config)

	if !svmServed() {
		_, err := admin.Migrate(e.ctx, migrate.Target{Name: helmrepos}, builtinOpts(migrate.EngineBuiltin))
		var ns *migrate.BuiltinNotServedError
		if !errors.As(err, &ns) || !strings.Contains(err.Error(), "not served on this server") {
			t.Fatalf("builtin on 1.%d: %v, want BuiltinNotServedError", cp.Minor, err)
		}
		o := builtinOpts(migrate.EngineAuto)
		o.DryRun = true
		res, err := admin.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
		if err != nil || res.Engine != migrate.EngineClient {
			t.Fatalf("auto on 1.%d: %+v, %v; want the client engine", cp.Minor, res, err)
		}
		return
	}
	withControllerManager(t, svmControllers...)
	user := newMigrator(t, builtinUser(t, e, "svm-only", helmrepos))
	before, _ := snapshot(t, e, hrV1)
	storedAt(t, "before any migration", "v1beta2")

	for _, engine := range []migrate.Engine{migrate.EngineAuto} {
		o := builtinOpts(engine)
		var progress []migrate.Progress
		o.Progress = func(p migrate.Progress) { progress = append(progress, p) }
		res, err := user.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
		if err != nil {
			t.Fatalf("%s: %v", engine, err)
		}
		if len(progress) == 0 || progress[len(progress)-1].Total != 10 || res.Objects != 10 {
			t.Errorf("%s: progress %+v, objects %d; want the migrator's count of 10 objects reported", engine, progress, res.Objects)
		}
		t.Logf("%s: %+v", engine, res)
		// The whole reason: "may not patch" alone is in every builtin choice auto makes.
		if want := "auto: may not patch helmrepositories.source.toolkit.fluxcd.io but may create StorageVersionMigrations"; res.Engine != migrate.EngineBuiltin || !strings.HasPrefix(res.EngineReason, want) {
			t.Errorf("%s: engine %s (%s), want builtin, the reason beginning %q", engine, res.Engine, res.EngineReason, want)
		}
		if res.Status != migrate.Migrated || res.PrunedBy == "" {
			t.Errorf("%s: status %s, prunedBy %q, message %q; want migrated and pruned", engine, res.Status, res.PrunedBy, res.Message)
		}
		if got := storedVersions(t, e, helmrepos); !slices.Equal(got, []string{"v1"}) {
			t.Errorf("%s: storedVersions %v, want [v1]", engine, got)
		}
		svmGone(t, res.StorageVersionMigration)
		storedAt(t, string(engine)+" as the builtin-role user", "v1")
	}
	// The gate's in-process migrator runs the builtin engine too, a budget at a time: a
	// call cut short leaves the StorageVersionMigration running, the next one follows it.
	unmigrate(t, e)
	ip := &gate.InProcess{Target: builtinUser(t, e, "svm-gate", helmrepos), Budget: 15 * time.Second, Options: builtinOpts(migrate.EngineBuiltin)}
	var p *gate.Progress
	err := wait.PollUntilContextTimeout(e.ctx, 0, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		p, err = ip.Migrate(ctx, []string{helmrepos})
		if err != nil || p.State == gate.MigrationFailed {
			return false, fmt.Errorf("gate: %+v, %w", p, err)
		}
		return p.State == gate.MigrationDone, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Results[0]; r.Engine != migrate.EngineBuiltin || r.Status != migrate.Migrated || !slices.Equal(storedVersions(t, e, helmrepos), []string{"v1"}) {
		t.Errorf("gate: %+v; want migrated by the builtin engine, storedVersions [v1]", r)
	} else {
		svmGone(t, r.StorageVersionMigration)
	}
	storedAt(t, "the gate's builtin engine", "v1")

	after, _ := snapshot(t, e, hrV1)
	if len(after) != 10 || len(before) != len(after) {
		t.Errorf("objects readable at v1: %d before, %d after, want 10", len(before), len(after))
	}

	// An admin may patch: auto picks the client engine.
	unmigrate(t, e)
	res, err := admin.Migrate(e.ctx, migrate.Target{Name: helmrepos}, builtinOpts(migrate.EngineAuto))
	if err != nil {
		t.Fatal(err)
	}
	if res.Engine != migrate.EngineClient || !strings.Contains(res.EngineReason, "may patch") || res.Status != migrate.Migrated {
		t.Errorf("admin auto: engine %s (%s), status %s; want client because it may patch", res.Engine, res.EngineReason, res.Status)
	}
	storedAt(t, "the admin's auto (client engine)", "v1")
}

// storedAt asserts what etcd holds after when: exactly the 10 HelmRepositories
// TestBuiltinEngine created, each stored at source.toolkit.fluxcd.io/version. Read through the API every object looks the same at
// any storage version; only etcd shows which the engine rewrote.
func storedAt(t *testing.T, when, version string) {
	const n = 10
	t.Helper()
	stored, err := cp.StoredVersions(t.Context(), hrV1.GroupResource())
	if err != nil {
		t.Fatal(err)
	}
	want := hrV1.Group + "/" + version
	var other []string
	for key, v := range stored {
		if v != want {
			other = append(other, key+" at "+v)
		}
	}
	slices.Sort(other)
	if len(stored) != n || len(other) > 0 {
		t.Errorf("%s: etcd holds %d HelmRepositories, want %d; not stored at %s: %v", when, len(stored), n, want, other)
	}
}

// unmigrate stores every HelmRepository at v1beta2 again, storedVersions [v1beta2 v1], so
// the next engine has every object to rewrite.
func unmigrate(t *testing.T, e env) {
	t.Helper()
	if err := cp.Unmigrate(e.ctx, helmrepos, "v1beta2"); err != nil {
		t.Fatal(err)
	}
	storedAt(t, "undone", "v1beta2")
}

// TestBuiltinMigratorNotRunning: kube-controller-manager runs without the migrator. The
// builtin engine, and auto for a user who may not patch, stop after the start timeout
// with an error naming the controller, delete their StorageVersionMigration and leave
// storedVersions alone.
func TestBuiltinMigratorNotRunning(t *testing.T) {
	e := fluxState(t, []string{"a"}, 3)
	if !svmServed() {
		_, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, builtinOpts(migrate.EngineBuiltin))
		if !errors.As(err, new(*migrate.BuiltinNotServedError)) {
			t.Fatalf("builtin on 1.%d: %v, want BuiltinNotServedError", cp.Minor, err)
		}
		return
	}
	withControllerManager(t, "garbage-collector-controller")
	user := newMigrator(t, builtinUser(t, e, "svm-idle", helmrepos))
	for _, engine := range []migrate.Engine{migrate.EngineBuiltin, migrate.EngineAuto} {
		o := builtinOpts(engine)
		o.BuiltinStartTimeout = 3 * time.Second
		_, err := user.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
		var nr *migrate.BuiltinNotRunningError
		if !errors.As(err, &nr) || !strings.Contains(err.Error(), "storage-version-migrator-controller") || !strings.Contains(err.Error(), "not running") {
			t.Fatalf("%s: %v, want BuiltinNotRunningError naming storage-version-migrator-controller", engine, err)
		}
		svmGone(t, nr.StorageVersionMigration)
		if got := storedVersions(t, e, helmrepos); !slices.Equal(got, []string{"v1beta2", "v1"}) {
			t.Errorf("%s: storedVersions %v, want untouched", engine, got)
		}
	}
}

// TestBuiltinConversionWebhookFails: objects stored at v1alpha1 need a conversion webhook
// that is down (a loopback port bound but not listening). The built-in migrator fails; the run reports its
// Failed condition and message, names the webhook, and leaves storedVersions alone.
func TestBuiltinConversionWebhookFails(t *testing.T) {
	e := emptyCluster(t)
	crd := testenv.TwoVersionCRD("example.com", "gadgets", "Gadget")
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1alpha1", Resource: "gadgets"},
		Kind: "Gadget", Namespaces: []string{"g"}, PerNS: 3, Spec: map[string]any{"size": int64(1)}}); err != nil {
		t.Fatal(err)
	}
	closed := closedPort(t)
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	crd.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter, Webhook: &apiextv1.WebhookConversion{
		ConversionReviewVersions: []string{"v1"},
		ClientConfig:             &apiextv1.WebhookClientConfig{URL: ptr.To("https://" + closed + "/convert")},
	}}
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Without the webhook the objects read again, so the cluster can be emptied.
		crd.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.NoneConverter}
		if err := testenv.ApplyCRD(context.WithoutCancel(e.ctx), e.crds, crd); err != nil {
			t.Error(err)
		}
	})
	if !svmServed() {
		_, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: crd.Name}, builtinOpts(migrate.EngineBuiltin))
		if !errors.As(err, new(*migrate.BuiltinNotServedError)) {
			t.Fatalf("builtin on 1.%d: %v, want BuiltinNotServedError", cp.Minor, err)
		}
		return
	}
	withControllerManager(t, svmControllers...)

	// The test watches the StorageVersionMigrations itself, to know the Failed condition the
	// server wrote, independently of what the run reports.
	watched := watchSVMs(t)
	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: crd.Name}, builtinOpts(migrate.EngineBuiltin))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	failed := watched.failedUntilDeleted(t, res.StorageVersionMigration)
	if failed == nil || failed.Reason != "StorageVersionMigrationFailed" {
		t.Fatalf("StorageVersionMigration %q: Failed condition %+v, want the server's StorageVersionMigrationFailed", res.StorageVersionMigration, failed)
	}
	if want := fmt.Sprintf("Failed=True, reason %s: %s", failed.Reason, failed.Message); res.Status != migrate.Incomplete ||
		res.BuiltinFailure != want || !strings.Contains(res.Message, failed.Message) {
		t.Errorf("status %s, failure %q, message %q; want incomplete, the failure %q as the server wrote it, quoted in the message",
			res.Status, res.BuiltinFailure, res.Message, want)
	}
	if !slices.Equal(res.StoredVersionsAfter, []string{"v1alpha1", "v1"}) {
		t.Errorf("the run reports storedVersions %v after it, want [v1alpha1 v1] as they were", res.StoredVersionsAfter)
	}
	// The CRD's spec names a conversion webhook whatever happens: only a LIST made after
	// the failure meets the webhook down, at its address, and says so.
	down := "listing gadgets.example.com fails: "
	if _, after, ok := strings.Cut(res.Message, down); !ok || !strings.Contains(after, "conversion webhook for example.com/v1alpha1, Kind=Gadget failed") ||
		!strings.Contains(after, closed+"/convert") || !strings.Contains(after, "connection refused") {
		t.Errorf("message %q; want %q with the conversion webhook at %s refusing the connection", res.Message, down, closed)
	}
	if got := storedVersions(t, e, crd.Name); !slices.Equal(got, []string{"v1alpha1", "v1"}) {
		t.Errorf("storedVersions %v, want untouched", got)
	}
	svmGone(t, res.StorageVersionMigration)
}

// svmWatch is a watch of StorageVersionMigrations opened before a run.
type svmWatch struct{ w watch.Interface }

func watchSVMs(t *testing.T) svmWatch {
	t.Helper()
	api := kubernetes.NewForConfigOrDie(cp.Config).StoragemigrationV1().StorageVersionMigrations()
	list, err := api.List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := api.Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return svmWatch{w: w}
}

// failedUntilDeleted reads the watch until name is deleted and returns the last Failed=True
// condition the server wrote on it (nil if none). The run deletes it before it returns, so
// the watch holds the deletion once a read finds it gone.
func (s svmWatch) failedUntilDeleted(t *testing.T, name string) *metav1.Condition {
	t.Helper()
	_, err := kubernetes.NewForConfigOrDie(cp.Config).StoragemigrationV1().StorageVersionMigrations().Get(t.Context(), name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("StorageVersionMigration %q: %v, want deleted by the run", name, err)
	}
	var failed *metav1.Condition
	for ev := range s.w.ResultChan() {
		m, ok := ev.Object.(*svmv1.StorageVersionMigration)
		if !ok || m.Name != name {
			continue
		}
		if c := meta.FindStatusCondition(m.Status.Conditions, string(svmv1.MigrationFailed)); c != nil && c.Status == metav1.ConditionTrue {
			failed = c
		}
		if ev.Type == watch.Deleted {
			return failed
		}
	}
	t.Fatalf("the watch of StorageVersionMigrations ended before %s was deleted", name)
	return nil
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	// A socket bound to the port but never listening: a connection to it is refused, and
	// no other listener can take the port while the test runs (it has no SO_REUSEADDR).
	// A port that is merely closed can be reused by another test's server meanwhile.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// TestStorageVersionMigrationInProgress: a StorageVersionMigration made by hand (nobody
// runs it here) is migrating the CRD. check shows it and says to wait, the gate holds the
// upgrade, and a client-engine run stops saying who migrates it, or waits for it with
// Wait.
func TestStorageVersionMigrationInProgress(t *testing.T) {
	e := fluxState(t, []string{"a"}, 2)
	if !svmServed() {
		gvr, err := svm.Resource(kubernetes.NewForConfigOrDie(cp.Config).Discovery())
		if err != nil || !gvr.Empty() {
			t.Fatalf("1.%d serves StorageVersionMigrations as %v (%v), want none", cp.Minor, gvr, err)
		}
		return
	}
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	hand, err := cs.StoragemigrationV1().StorageVersionMigrations().Create(e.ctx, &svmv1.StorageVersionMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "by-hand"},
		Spec:       svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: hrV1.Group, Resource: hrV1.Resource}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.StoragemigrationV1().StorageVersionMigrations().Delete(context.WithoutCancel(e.ctx), hand.Name, metav1.DeleteOptions{})
	})

	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	incoming, err := testenv.ReadCRDs("charts/flux2-2.18.2/rendered/crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	req := check.Request{Operation: predict.Upgrade}
	for _, c := range incoming {
		req.Incoming = append(req.Incoming, chartcrds.CRD{CRD: c, Source: predict.Templates})
	}
	rep, err := check.Run(e.ctx, cluster, req)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rep.CRDs, func(c check.CRDReport) bool { return c.Name == helmrepos })
	if i < 0 {
		t.Fatalf("check reported %d CRDs without %s", len(rep.CRDs), helmrepos)
	}
	if c := rep.CRDs[i]; !slices.Equal(c.MigratingBy, []string{"by-hand"}) || !strings.HasPrefix(c.Action, "wait: StorageVersionMigration by-hand") {
		t.Errorf("check: %s migratingBy %v, action %q; want by-hand and wait", c.Name, c.MigratingBy, c.Action)
	}

	m := newMigrator(t, cp.Config)
	o := opts()
	o.Engine = migrate.EngineClient
	_, err = m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	var ip *migrate.InProgressError
	if !errors.As(err, &ip) || !strings.Contains(err.Error(), "by-hand") {
		t.Fatalf("client run: %v, want InProgressError naming by-hand", err)
	}
	p, err := (&gate.InProcess{Target: cp.Config, Budget: 5 * time.Second, Options: o}).Migrate(e.ctx, []string{helmrepos})
	if err != nil || p.State != gate.MigrationRunning || !strings.Contains(p.Message, "by-hand") {
		t.Fatalf("gate: %+v, %v; want Running naming by-hand", p, err)
	}
	if got := storedVersions(t, e, helmrepos); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Errorf("storedVersions %v, want untouched while another migration runs", got)
	}

	// With Wait, the run goes on once the other migration is gone.
	o.Wait = true
	go func() {
		// Once the run holds its Lease it is waiting for by-hand: end that migration.
		_ = wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			l, err := cs.CoordinationV1().Leases("default").Get(ctx, "upgradeguard-migrate-"+helmrepos, metav1.GetOptions{})
			return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
		})
		_ = cs.StoragemigrationV1().StorageVersionMigrations().Delete(context.WithoutCancel(e.ctx), hand.Name, metav1.DeleteOptions{})
	}()
	res, err := m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil || res.Status != migrate.Migrated {
		t.Fatalf("waiting run: %+v, %v; want migrated once by-hand is gone", res, err)
	}
}

// TestBuiltinCRDChangedMidRun: the CRD changes (a new generation: a description added to
// its schema) while the built-in migrator works through the objects. The migrator then
// skips pruning storedVersions (kubernetes#135297); the builtin engine sees it, runs a new
// StorageVersionMigration for the CRD as it is now, and the run ends migrated and pruned
// in one call, its Result naming the migration whose prune was skipped.
func TestBuiltinCRDChangedMidRun(t *testing.T) {
	e := fluxState(t, []string{"a", "b"}, 150)
	if !svmServed() {
		_, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, builtinOpts(migrate.EngineBuiltin))
		if !errors.As(err, new(*migrate.BuiltinNotServedError)) {
			t.Fatalf("builtin on 1.%d: %v, want BuiltinNotServedError", cp.Minor, err)
		}
		return
	}
	withControllerManager(t, svmControllers...)
	before, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	changed := make(chan error, 1)
	var changedAt int64
	go func() {
		// Once the migrator has marked the CRD as migrating, and before it finished,
		// change its spec.
		changed <- wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, helmrepos, metav1.GetOptions{})
			if err != nil || !slices.ContainsFunc(crd.Status.Conditions, func(c apiextv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextv1.StorageMigrating && c.Status == apiextv1.ConditionTrue
			}) {
				return false, nil
			}
			for i := range crd.Spec.Versions {
				if s := crd.Spec.Versions[i].Schema; s != nil && s.OpenAPIV3Schema != nil {
					s.OpenAPIV3Schema.Description += " (described during the migration)"
				}
			}
			updated, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{})
			if err == nil {
				changedAt = updated.Generation
			}
			return err == nil, nil
		})
	}()
	m := newMigrator(t, cp.Config)
	res, err := m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, builtinOpts(migrate.EngineBuiltin))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-changed; err != nil {
		t.Fatalf("changing the CRD mid-run: %v", err)
	}
	t.Logf("%+v", res)
	if changedAt <= before.Generation {
		t.Fatalf("generation %d after the change, want above %d", changedAt, before.Generation)
	}
	if res.Status != migrate.Migrated || res.Restart || res.PrunedBy != migrate.PrunedByServer {
		t.Errorf("status %s, restart %v, pruned by %q; want migrated by the server in one run", res.Status, res.Restart, res.PrunedBy)
	}
	if got := storedVersions(t, e, helmrepos); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	if len(res.BuiltinReruns) != 1 {
		t.Fatalf("builtin re-runs %+v, want the one migration whose prune was skipped", res.BuiltinReruns)
	}
	r := res.BuiltinReruns[0]
	if r.StorageVersionMigration == "" || r.StorageVersionMigration == res.StorageVersionMigration ||
		r.GenerationBefore != before.Generation || r.GenerationAfter != changedAt ||
		!strings.Contains(r.ServerCondition, "generation mismatch") {
		t.Errorf("re-run %+v (last StorageVersionMigration %s); want the first migration, generation %d -> %d and the server's generation-mismatch condition",
			r, res.StorageVersionMigration, before.Generation, changedAt)
	}
	if !strings.Contains(res.Message, "skipped the prune after StorageVersionMigration "+r.StorageVersionMigration) ||
		!strings.Contains(res.Message, "upgradeguard ran "+res.StorageVersionMigration) {
		t.Errorf("message %q, want it to name the skipped prune and the re-run", res.Message)
	}
	svmGone(t, r.StorageVersionMigration)
	svmGone(t, res.StorageVersionMigration)
	// Every object is readable at v1 once v1beta2 is gone from storedVersions.
	for _, ns := range []string{"a", "b"} {
		list, err := e.dyn.Resource(hrV1).Namespace(ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Errorf("list %s at v1: %v", ns, err)
		} else if len(list.Items) != 150 {
			t.Errorf("list %s at v1: %d objects, want 150", ns, len(list.Items))
		}
	}
}
