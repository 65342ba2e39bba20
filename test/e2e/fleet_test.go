//go:build e2e

package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/shard"
)

// TestFleetShardFailover: the chart with three replicas shares a fleet target between
// its Pods. The target is this cluster, with the Flux incident (2,400 HelmRepositories
// stored at v1beta2), reached through a kubeconfig Secret at the host's address as any
// remote cluster is; a StorageMigrationPolicy with spec.targets selects it, and the Pod
// that takes the target's Lease runs its migration, rate-limited so that it lasts. Once
// that Pod's StorageMigration status has saved a place past object 600, the Pod's process
// is killed with SIGKILL on the node, as the kernel's OOM killer does: nothing it would do
// on the way out (save its place, release its target and migration Leases) happens. The
// Pod is then deleted without grace, as after the loss of its node, so that the kubelet
// does not start it again in place, and the node is cordoned, so that its replacement
// waits. One of the two other Pods takes the target Lease once the dead one's has
// expired, and resumes the migration from the place saved in status: the
// StorageMigration names that Pod and counts each object once over two attempts,
// kube-apiserver's count of PATCH requests on HelmRepositories stays within two pages of
// 2,400 (from zero it would be 2,400 plus everything the killed Pod did), and the new
// owner's own rewritten-objects counter is at most what was left after the saved place.
// storedVersions goes from [v1beta2 v1] to [v1] once, at the end, and every object reads
// back intact, stored at v1 in etcd.
func TestFleetShardFailover(t *testing.T) {
	const (
		n        = 2400
		ns       = "fleet-failover"
		pageSize = 100
		qps      = 30 // 80 s for the whole migration, from one Pod
		// killAt is how far the first owner gets before it is killed: well past the
		// two pages a resumed run may redo, well short of the end.
		killAt   = 600
		secretNS = "fleet-targets"
		secret   = "c0"
	)
	started := time.Now()
	crds, _ := fluxIncident(t, ns, n)
	// No policy from the chart: the only migration is the fleet's. The target Lease and
	// its renew period are the chart's defaults (30 s, 10 s).
	rel := installChart(t, "ug-fleet", "--set", "replicas=3", "--set", "policy.create=false")
	ctx, cs := t.Context(), rel.cs
	if len(rel.pods) != 3 {
		t.Fatalf("%d upgradeguard pods, want 3", len(rel.pods))
	}
	pods := make([]string, 0, len(rel.pods))
	for _, p := range rel.pods {
		pods = append(pods, p.Name)
	}
	// Every Pod is a live member of the shard before the fleet has a target.
	var members []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		members = members[:0]
		for _, p := range pods {
			l, err := cs.CoordinationV1().Leases(rel.ns).Get(ctx, shard.ReplicaLeaseName(p), metav1.GetOptions{})
			if err == nil && live(l) && strings.HasPrefix(ptr.Deref(l.Spec.HolderIdentity, ""), p+"_") {
				members = append(members, p)
			}
		}
		return len(members) == len(pods), nil
	})
	must(t, err, "waiting for the member Leases of %v (live: %v)", pods, members)

	// The target: this cluster, by the address the Pods reach it at (the host's), as a
	// remote cluster in a kubeconfig Secret.
	kubectl(t, "create", "namespace", secretNS)
	t.Cleanup(func() {
		if err := client.IgnoreNotFound(cs.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), secretNS, metav1.DeleteOptions{})); err != nil {
			t.Errorf("cleanup: delete namespace %s: %v", secretNS, err)
		}
	})
	selected := map[string]string{"fleet.example.com/sharded": "true"}
	c := ugClient(t)
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: secretNS, Labels: selected},
		Data: map[string][]byte{"value": kubeconfigAt(t, rel.node.IP)}}
	must(t, c.Create(ctx, s), "create the target's kubeconfig Secret")
	versions := watchStoredVersions(t, crds)
	patchesBefore := helmrepoPatches(t, cs)
	p := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fleet"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"source.toolkit.fluxcd.io"}, Proactive: ptr.To(true),
			Rate:    v1alpha1.RateSettings{PageSize: pageSize, QPS: qps},
			Targets: &v1alpha1.FleetTargets{Namespace: secretNS, Selector: metav1.LabelSelector{MatchLabels: selected}}}}
	must(t, c.Create(ctx, p), "create StorageMigrationPolicy %s", p.Name)
	// Before helm uninstall (clean-ups run last first): the next test's chart must not
	// find this policy.
	t.Cleanup(func() {
		if err := client.IgnoreNotFound(c.Delete(context.WithoutCancel(ctx), p)); err != nil {
			t.Errorf("cleanup: delete StorageMigrationPolicy %s: %v", p.Name, err)
		}
	})

	name := controller.FleetName(secret, helmrepos)
	sm := waitMigration(t, name, 5*time.Minute, "to save a place past object "+strconv.Itoa(killAt), func(sm *v1alpha1.StorageMigration) bool {
		return len(sm.Status.Resources) == 1 && sm.Status.Resources[0].Objects >= killAt && sm.Status.Resources[0].Continue != ""
	})
	owner := sm.Status.Replica
	targetLease := shard.TargetLeaseName(shard.Key(secretNS, secret))
	lease, err := cs.CoordinationV1().Leases(rel.ns).Get(ctx, targetLease, metav1.GetOptions{})
	must(t, err, "read the target Lease %s", targetLease)
	if h := ptr.Deref(lease.Spec.HolderIdentity, ""); !slices.Contains(pods, owner) || !strings.HasPrefix(h, owner+"_") || !live(lease) {
		t.Fatalf("the target Lease is held by %q while status.replica %q migrates it; want one of the Pods %v holding it", h, owner, pods)
	}
	saved := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseRunning || saved.Attempts != 1 || saved.Objects >= n {
		t.Fatalf("before the kill: phase %s, progress %+v; want the first attempt part-way", sm.Status.Phase, saved)
	}
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions %v part-way through, want [v1beta2 v1]", got)
	}
	survivors := slices.DeleteFunc(slices.Clone(pods), func(p string) bool { return p == owner })
	t.Logf("%s owns the target, %d objects saved (%d rewritten); the others: %v", owner, saved.Objects, saved.Rewritten, survivors)

	// The kill: SIGKILL to the container's process, from the host.
	kubectl(t, "cordon", rel.node.Name) // the node and its Node object go when the test ends
	pod, err := cs.CoreV1().Pods(rel.ns).Get(ctx, owner, metav1.GetOptions{})
	must(t, err, "read Pod %s", owner)
	pid := containerPID(t, rel.node, pod)
	must(t, syscall.Kill(pid, syscall.SIGKILL), "SIGKILL %s's process %d", owner, pid)
	killed := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), nil
	})
	must(t, err, "waiting for %s's process %d to be gone", owner, pid)
	must(t, cs.CoreV1().Pods(rel.ns).Delete(ctx, owner, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}), "delete the killed Pod %s", owner)

	// Another Pod takes the target once the dead one's Lease has expired.
	var taker string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoordinationV1().Leases(rel.ns).Get(ctx, targetLease, metav1.GetOptions{})
		if err != nil {
			return false, nil // read again; the timeout bounds the wait
		}
		taker, _, _ = strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "_")
		return taker != owner && live(l), nil
	})
	must(t, err, "waiting for another Pod to take the target Lease (held by %q)", taker)
	if !slices.Contains(survivors, taker) {
		t.Fatalf("the target Lease went to %q, want one of the other Pods %v", taker, survivors)
	}
	t.Logf("%s took the target %v after the kill", taker, time.Since(killed).Round(time.Millisecond))

	done := waitMigration(t, name, 10*time.Minute, "to finish", terminal)
	rp := assertSucceeded(t, done, n)
	if done.Status.Replica != taker {
		t.Errorf("the migration finished on %q, want %s, which holds the target", done.Status.Replica, taker)
	}
	if rp.Attempts != 2 {
		t.Errorf("%d attempts, want 2: the killed Pod's and %s's", rp.Attempts, taker)
	}

	// Resumed, not started over.
	assertResumed(t, cs, rel.ns, resumption{by: taker, from: "the killed Pod " + owner, labels: map[string]string{"crd": helmrepos},
		saved: saved, final: rp, n: n, pageSize: pageSize, patches: helmrepoPatches(t, cs) - patchesBefore})

	// storedVersions was pruned once, at the end.
	seen, closed := versions.stop()
	if want := [][]string{{"v1beta2", "v1"}, {"v1"}}; !slices.EqualFunc(seen, want, slices.Equal) || closed {
		t.Errorf("storedVersions went %v (watch ended early: %v), want %v", seen, closed, want)
	}
	evs, err := cs.EventsV1().Events("").List(ctx, metav1.ListOptions{})
	must(t, err, "list events")
	note := fmt.Sprintf("replica %s resuming where replica %s stopped", taker, owner)
	if !slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
		return e.Regarding.Name == name && e.Reason == controller.EventResumed && e.Note == note
	}) {
		t.Errorf("no %s event on %s saying %q", controller.EventResumed, name, note)
	}
	// The policy reports the target Ready under its new owner.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err
		}
		cl := p.Status.Clusters
		return len(cl) == 1 && cl[0].State == v1alpha1.ClusterReady && cl[0].Replica == taker && len(cl[0].PendingCRDs) == 0, nil
	})
	if err != nil {
		t.Errorf("the policy's status.clusters %+v, want the target Ready under %s with nothing pending: %v", p.Status.Clusters, taker, err)
	}

	assertIntact(t, ns, n)
	t.Logf("TestFleetShardFailover took %v", time.Since(started).Round(time.Second))
}

// live says whether a Lease is held and its last renewal has not expired.
func live(l *coordinationv1.Lease) bool {
	return ptr.Deref(l.Spec.HolderIdentity, "") != "" && l.Spec.RenewTime != nil &&
		time.Since(l.Spec.RenewTime.Time) < time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second
}

// kubeconfigAt is the control plane's admin kubeconfig with the server at host, on the
// same port: the host's address, which Pods on the node reach (the API server's serving
// certificate names it).
func kubeconfigAt(t *testing.T, host string) []byte {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	must(t, err, "read the admin kubeconfig")
	for name, cl := range cfg.Clusters {
		u, err := url.Parse(cl.Server)
		must(t, err, "cluster %s's server %q", name, cl.Server)
		u.Host = net.JoinHostPort(host, u.Port())
		cl.Server = u.String()
	}
	data, err := clientcmd.Write(*cfg)
	must(t, err, "write the kubeconfig")
	return data
}
