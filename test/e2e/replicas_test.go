//go:build e2e

package e2e_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
)

// TestTwoReplicasHandOver: the chart with two replicas and its PodDisruptionBudget. While
// the leader migrates 20,000 HelmRepositories, the node is drained of it the way
// `kubectl drain` does: cordoned (so the Pod that replaces it waits, and the hand-over is
// between the two replicas the chart started) and the leader evicted through the
// Eviction API, which the budget allows with the other replica Ready. The other replica
// takes the leader-election Lease and resumes the migration from the place the leader
// saved: kube-apiserver's count of PATCH requests on HelmRepositories over the whole
// migration stays within a page or two of 20,000 (from zero it would be 20,000 plus
// everything the first leader did), the new leader's own rewritten-objects counter is at
// most what was left after the saved place, and the StorageMigration counts every object
// once over two attempts. storedVersions goes from [v1beta2 v1] to [v1] once, at the end,
// and every object reads back intact, stored at v1 in etcd.
func TestTwoReplicasHandOver(t *testing.T) {
	const (
		n        = 20000
		ns       = "hand-over"
		pageSize = 500 // the migration's default LIST page
		// evictAt is how far the first leader gets before it is evicted: well past the
		// slack a resumed run may redo (the page in flight), well short of the end.
		evictAt = 4000
	)
	started := time.Now()
	crds, _ := fluxIncident(t, ns, n)
	// No policy: the only migration is the test's StorageMigration.
	rel := installChart(t, "ug-replicas", "--set", "replicas=2", "--set", "podDisruptionBudget.enabled=true", "--set", "policy.create=false")
	ctx, cs := t.Context(), rel.cs
	if len(rel.pods) != 2 {
		t.Fatalf("%d upgradeguard pods, want 2", len(rel.pods))
	}
	leader := waitLeader(t, rel, func(string) bool { return true })
	i := slices.IndexFunc(rel.pods, func(p corev1.Pod) bool { return p.Name != leader })
	survivor := rel.pods[i].Name
	t.Logf("leader %s, standby %s", leader, survivor)

	versions := watchStoredVersions(t, crds)
	patchesBefore := helmrepoPatches(t, cs)
	c := ugClient(t)
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "hand-over"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Rate: v1alpha1.RateSettings{PageSize: pageSize}}}
	must(t, c.Create(ctx, sm), "create StorageMigration %s", sm.Name)
	migrationStarted := time.Now()

	saved := waitMigration(t, sm.Name, 5*time.Minute, "to save a place past object "+strconv.Itoa(evictAt), func(sm *v1alpha1.StorageMigration) bool {
		return len(sm.Status.Resources) == 1 && sm.Status.Resources[0].Objects >= evictAt && sm.Status.Resources[0].Continue != ""
	}).Status.Resources[0]
	if saved.Phase != v1alpha1.PhaseRunning || saved.Attempts != 1 || saved.Objects >= n {
		t.Fatalf("before the eviction: progress %+v; want the first attempt part-way", saved)
	}
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions %v part-way through, want [v1beta2 v1]", got)
	}

	// Drain the leader off the node.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pdb, err := cs.PolicyV1().PodDisruptionBudgets(rel.ns).Get(ctx, "upgradeguard", metav1.GetOptions{})
		return err == nil && pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.DisruptionsAllowed == 1, err
	})
	must(t, err, "waiting for the PodDisruptionBudget to allow one disruption with both replicas Ready")
	kubectl(t, "cordon", rel.node.Name)
	t.Cleanup(func() { _ = kubectlOut("uncordon", rel.node.Name) })
	evicted := time.Now()
	must(t, cs.CoreV1().Pods(rel.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: leader, Namespace: rel.ns}}),
		"evict the leader %s (the PodDisruptionBudget must allow it with the other replica Ready)", leader)
	if got := waitLeader(t, rel, func(p string) bool { return p != leader }); got != survivor {
		t.Fatalf("the Lease went to %s, want the other replica %s", got, survivor)
	}
	t.Logf("%s took the lead %v after the eviction", survivor, time.Since(evicted).Round(time.Millisecond))

	done := waitMigration(t, sm.Name, 15*time.Minute, "to finish", terminal)
	rp := assertSucceeded(t, done, n)
	t.Logf("20,000 objects migrated in %v, hand-over included", done.Status.CompletionTime.Sub(migrationStarted).Round(time.Second))
	if rp.Attempts != 2 {
		t.Errorf("%d attempts, want 2: the first leader's and the survivor's", rp.Attempts)
	}
	body := assertResumed(t, cs, rel.ns, resumption{by: survivor, from: "the first leader " + leader, labels: map[string]string{"cluster": "", "crd": helmrepos},
		saved: saved, final: rp, n: n, pageSize: pageSize, patches: helmrepoPatches(t, cs) - patchesBefore})
	if succeeded, _ := metricSum(t, body, "upgradeguard_migrations_total", map[string]string{"cluster": "", "result": "succeeded"}); succeeded != 1 {
		t.Errorf("the survivor's upgradeguard_migrations_total{result=succeeded} = %v, want 1", succeeded)
	}

	// storedVersions was pruned once, at the end; not by the evicted leader.
	seen, closed := versions.stop()
	if want := [][]string{{"v1beta2", "v1"}, {"v1"}}; !slices.EqualFunc(seen, want, slices.Equal) || closed {
		t.Errorf("storedVersions went %v (watch ended early: %v), want %v", seen, closed, want)
	}
	evs, err := cs.EventsV1().Events("").List(ctx, metav1.ListOptions{})
	must(t, err, "list events")
	count := func(reason string) int {
		return len(slices.DeleteFunc(slices.Clone(evs.Items), func(e eventsv1.Event) bool { return e.Regarding.Name != sm.Name || e.Reason != reason }))
	}
	if count(controller.EventMigrated) != 1 || count(controller.EventResumed) < 1 {
		t.Errorf("events on %s: %d %s, %d %s; want one migration and a resumption", sm.Name,
			count(controller.EventMigrated), controller.EventMigrated, count(controller.EventResumed), controller.EventResumed)
	}

	assertIntact(t, ns, n)

	// The drain ends: the replacement Pod schedules, and two replicas serve again.
	kubectl(t, "uncordon", rel.node.Name)
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cs.AppsV1().Deployments(rel.ns).Get(ctx, "upgradeguard", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == 2 && d.Status.UpdatedReplicas == 2, err
	})
	if err != nil {
		t.Errorf("after uncordon, the Deployment never had 2 ready replicas again: %v", err)
	}
	t.Logf("TestTwoReplicasHandOver took %v", time.Since(started).Round(time.Second))
}

// waitLeader waits until the controller's leader-election Lease is held, and not expired,
// by a Pod of the release that accept takes, and returns that Pod's name.
// controller-runtime's holder identity is the Pod's hostname, its name, then "_" and a
// UID.
func waitLeader(t *testing.T, rel *release, accept func(pod string) bool) string {
	t.Helper()
	var holder string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := rel.cs.CoordinationV1().Leases(rel.ns).Get(ctx, controller.LeaderElectionID, metav1.GetOptions{})
		if err != nil {
			return false, nil // not created yet
		}
		holder = ptr.Deref(l.Spec.HolderIdentity, "")
		pod, _, _ := strings.Cut(holder, "_")
		if pod == "" || !accept(pod) || l.Spec.RenewTime == nil ||
			time.Since(l.Spec.RenewTime.Time) > time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second {
			return false, nil
		}
		holder = pod
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for a leader: %v (last holder %q)", err, holder)
	}
	return holder
}
