package controller_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// replica is one controller replica run in the test process, with its own user and its
// own switch on its connections.
type replica struct {
	id     string
	cut    *testenv.Cutoff
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, id string, o controller.Options) *replica {
	t.Helper()
	cfg, err := cp.AddUser("ug-"+id, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{id: id, cut: &testenv.Cutoff{}, done: make(chan error, 1)}
	o.ReplicaID, o.WrapTransport = id, r.cut.Wrap
	o.MetricsAddr, o.ProbeAddr, o.SkipNameValidation = "0", "0", true
	mgr, err := controller.NewManager(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	r.cancel = cancel
	go func() { r.done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// kill stops the replica as a crash does: first its connections are cut, so nothing it
// would write on the way out (its Leases released, its place saved) arrives; then it is
// stopped.
func (r *replica) kill() {
	r.cut.Cut()
	r.cancel()
	<-r.done
	r.done <- nil // for the cleanup
}

// patches is how many PATCH requests cluster's API server has served for resource.
func patches(ctx context.Context, cluster *testenv.ControlPlane, resource string) (int, error) {
	raw, err := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="`+resource+`"`) ||
			!strings.Contains(line, `verb="PATCH"`) || !strings.Contains(line, `subresource=""`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", line, err)
		}
		total += int(v)
	}
	return total, sc.Err()
}

// TestShardFleetFailover: three replicas share a fleet of two target clusters. The
// replica that owns the big one is killed in the middle of its migration, held after its
// third page with its place saved. Another replica takes the target within lease
// duration plus one renew period and finishes the migration from that place: the
// StorageMigration names the new replica, counts each object once, and the target's API
// server served one PATCH per object, not the first pages' again.
func TestShardFleetFailover(t *testing.T) {
	e := setup(t)
	f := testenv.FleetForTest(t, 2)
	const n, small, pageSize, heldAt = 100, 20, 10, 30
	g, gctx := errgroup.WithContext(e.ctx)
	g.Go(func() error { return fluxIncident(gctx, f.Clusters[0], n) })
	g.Go(func() error { return fluxIncident(gctx, f.Clusters[1], small) })
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	const ns, leaseNS = "shard-fleet", "shard-leases"
	for _, name := range []string{ns, leaseNS} {
		if err := e.c.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	selected := map[string]string{"fleet.example.com/sharded": "true"}
	for i, name := range []string{"c0", "c1"} {
		data, err := os.ReadFile(f.Clusters[i].Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: selected}, Data: map[string][]byte{"value": data}}
		if err := e.c.Create(e.ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), s) })
	}
	p := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fleet"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"source.toolkit.fluxcd.io"}, Proactive: ptr.To(true),
			Rate:    v1alpha1.RateSettings{PageSize: pageSize, Concurrency: 1},
			Targets: &v1alpha1.FleetTargets{Namespace: ns, Selector: metav1.LabelSelector{MatchLabels: selected}}}}
	if err := e.c.Create(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), p) })

	// The first replica to reach the big migration's third page stops there, its place
	// saved, until it is killed.
	big := controller.FleetName("c0", helmrepos)
	var once sync.Once
	held := make(chan string, 1)
	hook := func(id string) func(context.Context, *v1alpha1.StorageMigration) {
		return func(ctx context.Context, sm *v1alpha1.StorageMigration) {
			if sm.Name != big || sm.Status.Resources[0].Objects < heldAt {
				return
			}
			first := false
			once.Do(func() { first = true })
			if first {
				held <- id
				<-ctx.Done()
			}
		}
	}
	const leaseDuration, renewEvery = 3 * time.Second, time.Second
	replicas := map[string]*replica{}
	for _, id := range []string{"replica-0", "replica-1", "replica-2"} {
		replicas[id] = startReplica(t, id, controller.WithProgressHook(controller.Options{
			// The migration Leases are on each target, in a namespace every cluster has.
			LeaderElect: true, LeaderElectionNamespace: leaseNS, MigrationLeaseNamespace: "default", MaxConcurrentMigrations: 2,
			TargetLeaseDuration: leaseDuration, TargetRenewEvery: renewEvery, MigrationLeaseDuration: leaseDuration, SaveEvery: time.Nanosecond,
			Fleet: controller.FleetOptions{ProbeEvery: time.Second, ProbeTimeout: 3 * time.Second, MaxBackoff: 2 * time.Second},
		}, hook(id)))
	}

	var owner string
	select {
	case owner = <-held:
	case <-time.After(3 * time.Minute):
		t.Fatal("no replica reached the third page of c0's migration")
	}
	sm := &v1alpha1.StorageMigration{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: big}, sm); err != nil {
		t.Fatal(err)
	}
	saved := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseRunning || sm.Status.Replica != owner || saved.Objects != heldAt || saved.Continue == "" || saved.Attempts != 1 {
		t.Fatalf("before the kill: phase %s, replica %q, progress %+v; want Running on %s with %d objects and a saved place", sm.Status.Phase, sm.Status.Replica, saved, owner, heldAt)
	}
	if got, err := storedVersionsOn(e.ctx, f.Clusters[0]); err != nil || !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("c0's storedVersions %v (%v) mid-way, want untouched", got, err)
	}
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	lease, err := kube.CoordinationV1().Leases(leaseNS).Get(e.ctx, shard.TargetLeaseName(shard.Key(ns, "c0")), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(lease.Spec.HolderIdentity, ""); !strings.HasPrefix(h, owner+"_") {
		t.Fatalf("c0's target Lease is held by %q while %s migrates it", h, owner)
	}
	before, err := patches(e.ctx, f.Clusters[0], "helmrepositories")
	if err != nil {
		t.Fatal(err)
	}

	replicas[owner].kill()
	killed := time.Now()
	var survivors []string
	for id := range replicas {
		if id != owner {
			survivors = append(survivors, id)
		}
	}

	waitFor(t, 2*time.Minute, "c0's migration finished on another replica", func() (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: big}, sm)
		return err == nil && terminalPhase(sm.Status.Phase), err
	})
	rp := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseSucceeded || !slices.Contains(survivors, sm.Status.Replica) {
		t.Fatalf("c0's migration %s on replica %q (%s), want Succeeded on one of %v", sm.Status.Phase, sm.Status.Replica, rp.Message, survivors)
	}
	// Resumed, not started over: the first 30 objects, rewritten by the killed replica,
	// are neither listed nor counted again.
	if rp.Attempts != 2 || rp.Objects != n || rp.Rewritten != n || rp.AlreadyCurrent != 0 || rp.FailedCount != 0 {
		t.Errorf("progress %+v; want a second attempt that carried on from object %d: %d objects, each rewritten once", rp, heldAt, n)
	}
	after, err := patches(e.ctx, f.Clusters[0], "helmrepositories")
	if err != nil {
		t.Fatal(err)
	}
	if resumed := after - before; resumed < n-heldAt || resumed >= n-heldAt+pageSize {
		t.Errorf("c0 served %d PATCHes after the kill (%d before it), want the %d objects after the saved place written once (a start over writes %d)",
			resumed, before, n-heldAt, n)
	}
	if got, err := storedVersionsOn(e.ctx, f.Clusters[0]); err != nil || !slices.Equal(got, []string{"v1"}) {
		t.Errorf("c0's storedVersions %v (%v), want [v1]", got, err)
	}
	lease, err = kube.CoordinationV1().Leases(leaseNS).Get(e.ctx, shard.TargetLeaseName(shard.Key(ns, "c0")), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taker := strings.SplitN(ptr.Deref(lease.Spec.HolderIdentity, ""), "_", 2)[0]
	if !slices.Contains(survivors, taker) || ptr.Deref(lease.Spec.LeaseTransitions, 0) < 1 {
		t.Errorf("c0's target Lease held by %q after %d transitions, want one of %v", taker, ptr.Deref(lease.Spec.LeaseTransitions, 0), survivors)
	}
	// The killed replica renewed at most a renew period before the kill.
	took := lease.Spec.AcquireTime.Sub(killed)
	if bound := leaseDuration + renewEvery; took > bound+3*time.Second {
		t.Errorf("c0 taken %s after the kill, want within lease duration + renew period (%s) and 3s of slack", took, bound)
	}
	t.Logf("%s killed mid-migration; %s took c0 %s later and finished it (%d PATCHes before the kill, %d after)", owner, taker, took, before, after-before)

	// The small target's migration finished too, and every target is owned by a live
	// replica, which reports it in status.clusters and in its metric.
	waitFor(t, time.Minute, "c1's migration finished", func() (bool, error) {
		sm := &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: controller.FleetName("c1", helmrepos)}, sm)
		return err == nil && sm.Status.Phase == v1alpha1.PhaseSucceeded, client.IgnoreNotFound(err)
	})
	waitFor(t, time.Minute, "both targets Ready in status.clusters, each under a live replica", func() (bool, error) {
		p := &v1alpha1.StorageMigrationPolicy{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: "fleet"}, p); err != nil {
			return false, err
		}
		for _, c := range p.Status.Clusters {
			if c.State != v1alpha1.ClusterReady || !slices.Contains(survivors, c.Replica) || len(c.PendingCRDs) != 0 {
				return false, nil
			}
		}
		return len(p.Status.Clusters) == 2, nil
	})
	waitFor(t, 30*time.Second, "the survivors' metrics adding up to both targets", func() (bool, error) {
		sum := 0.0
		for _, id := range survivors {
			sum += testutil.ToFloat64(metrics.FleetTargetsOwned.WithLabelValues(id))
		}
		return sum == 2, nil
	})
	waitFor(t, 30*time.Second, "the MigrationResumed event naming both replicas", func() (bool, error) {
		evs, err := kube.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		want := fmt.Sprintf("replica %s resuming where replica %s stopped", sm.Status.Replica, owner)
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == big && ev.Reason == controller.EventResumed && ev.Note == want
		}), nil
	})
}
