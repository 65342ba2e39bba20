package shard_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4})))
	os.Exit(testenv.RunTests(m, &cp))
}

const (
	leaseDuration = 3 * time.Second
	renewEvery    = time.Second
)

// replica is one Shard under test, with its own clients to the API server.
type replica struct {
	s      *shard.Shard
	cut    *testenv.Cutoff
	cancel context.CancelFunc
	done   chan struct{}
}

func startReplica(t *testing.T, ns, id string, wanted []string) *replica {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	r := &replica{cut: &testenv.Cutoff{}, done: make(chan struct{})}
	cfg.Wrap(r.cut.Wrap)
	s, err := shard.New(kubernetes.NewForConfigOrDie(cfg).CoordinationV1(), shard.Options{Namespace: ns, Replica: id,
		LeaseDuration: leaseDuration, RenewEvery: renewEvery})
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	s.Want(wanted)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	r.cancel = cancel
	go func() {
		defer close(r.done)
		_ = s.Start(ctx)
	}()
	t.Cleanup(r.stop)
	return r
}

// stop stops the replica gracefully and waits for it.
func (r *replica) stop() {
	r.cancel()
	<-r.done
}

// leases reads the target Leases: key -> holder identity, for those held now.
func leases(t *testing.T, ns string) map[string]string {
	t.Helper()
	list, err := kubernetes.NewForConfigOrDie(cp.Config).CoordinationV1().Leases(ns).List(t.Context(), metav1.ListOptions{LabelSelector: shard.LabelShard + "=" + shard.KindTarget})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range list.Items {
		h := ptr.Deref(l.Spec.HolderIdentity, "")
		if h == "" || l.Spec.RenewTime == nil || time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			continue
		}
		out[l.Annotations[shard.AnnotationTarget]] = h
	}
	return out
}

// exclusive fails the test if two replicas believe they own one target.
func exclusive(t *testing.T, rs ...*replica) {
	t.Helper()
	seen := map[string]string{}
	for _, r := range rs {
		for _, k := range r.s.Owned() {
			if other, ok := seen[k]; ok {
				t.Fatalf("%s is owned by %s and %s at once", k, other, r.s.Replica())
			}
			seen[k] = r.s.Replica()
		}
	}
}

// settled reports whether every wanted key is held by exactly the replica that believes
// it owns it, and the counts differ by at most one.
func settled(t *testing.T, ns string, wanted []string, rs ...*replica) bool {
	t.Helper()
	exclusive(t, rs...)
	held := leases(t, ns)
	count := map[string]int{}
	for _, r := range rs {
		count[r.s.Identity()] = 0
		for _, k := range r.s.Owned() {
			if held[k] != r.s.Identity() {
				return false
			}
		}
	}
	for _, k := range wanted {
		h, ok := held[k]
		if _, live := count[h]; !ok || !live {
			return false
		}
		count[h]++
	}
	lo, hi := len(wanted), 0
	for _, n := range count {
		lo, hi = min(lo, n), max(hi, n)
	}
	return hi-lo <= 1
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestShardLeases: three replicas share seven targets through real Leases: each target
// is held by exactly the replica that believes it owns it, and the counts even out. A
// replica cut off from the API server stops its work on its targets before another
// replica takes them, and they are taken within lease duration plus one renew period of
// its last renewal. A replica that stops gracefully releases its targets, which the
// other takes at its next tick. A target no policy wants any more loses its Lease.
func TestShardLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ns := fmt.Sprintf("shard-%d", time.Now().UnixNano())
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().Namespaces().Delete(context.WithoutCancel(t.Context()), ns, metav1.DeleteOptions{})
	})
	var wanted []string
	for i := range 7 {
		wanted = append(wanted, shard.Key("fleet", fmt.Sprintf("cluster-%d", i)))
	}
	a := startReplica(t, ns, "replica-a", wanted)
	b := startReplica(t, ns, "replica-b", wanted)
	c := startReplica(t, ns, "replica-c", wanted)
	waitFor(t, 60*time.Second, "seven targets spread over three replicas", func() bool { return settled(t, ns, wanted, a, b, c) })
	for _, r := range []*replica{a, b, c} {
		if got := testutil.ToFloat64(metrics.FleetTargetsOwned.WithLabelValues(r.s.Replica())); int(got) != len(r.s.Owned()) {
			t.Errorf("upgradeguard_fleet_targets_owned{replica=%s} = %v, want %d", r.s.Replica(), got, len(r.s.Owned()))
		}
	}

	// Cut a off (a partition: it runs on but reaches no API server). Its work on each
	// target must end before another replica takes the target.
	victim := a.s.Owned()
	if len(victim) == 0 {
		t.Fatal("replica-a owns nothing")
	}
	var mu sync.Mutex
	ended := map[string]time.Time{}
	for _, k := range victim {
		ctx, done, ok := a.s.Hold(t.Context(), k)
		if !ok {
			t.Fatalf("replica-a cannot hold %s, which it owns", k)
		}
		context.AfterFunc(ctx, func() {
			mu.Lock()
			ended[k] = time.Now()
			mu.Unlock()
			done()
		})
	}
	cutAt := time.Now()
	a.cut.Cut()
	waitFor(t, 30*time.Second, "replica-a's targets taken by b and c", func() bool {
		exclusive(t, b, c)
		held := leases(t, ns)
		for _, k := range victim {
			if h := held[k]; h != b.s.Identity() && h != c.s.Identity() {
				return false
			}
		}
		return true
	})
	for _, k := range victim {
		l, err := kube.CoordinationV1().Leases(ns).Get(t.Context(), shard.TargetLeaseName(k), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		taken := l.Spec.AcquireTime.Time
		mu.Lock()
		stopped, ok := ended[k]
		mu.Unlock()
		if !ok || !stopped.Before(taken) {
			t.Errorf("%s: replica-a's work ended at %v (ended: %v), after %s took it at %v", k, stopped, ok, ptr.Deref(l.Spec.HolderIdentity, ""), taken)
		}
		// a renewed at most a period before the cut; the taker looks once a period.
		if bound := leaseDuration + renewEvery; taken.Sub(cutAt) > bound+2*time.Second {
			t.Errorf("%s taken %s after replica-a was cut off, want within lease duration + renew period (%s) and 2s of slack", k, taken.Sub(cutAt), bound)
		}
		t.Logf("%s: replica-a stopped %s after the cut, %s took it %s after the cut", k, stopped.Sub(cutAt), ptr.Deref(l.Spec.HolderIdentity, ""), taken.Sub(cutAt))
	}
	a.stop()
	waitFor(t, 60*time.Second, "seven targets spread over two replicas", func() bool { return settled(t, ns, wanted, b, c) })

	// b stops gracefully: it releases its Leases, and c takes them at its next tick.
	fromB := b.s.Owned()
	stoppedAt := time.Now()
	b.stop()
	for _, k := range fromB {
		l, err := kube.CoordinationV1().Leases(ns).Get(t.Context(), shard.TargetLeaseName(k), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h == b.s.Identity() {
			t.Errorf("%s still held by replica-b after it stopped", k)
		}
	}
	if _, err := kube.CoordinationV1().Leases(ns).Get(t.Context(), shard.ReplicaLeaseName("replica-b"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("replica-b's member Lease after it stopped: %v, want it deleted", err)
	}
	waitFor(t, 30*time.Second, "c holding all seven", func() bool { return settled(t, ns, wanted, c) })
	if took := time.Since(stoppedAt); took > leaseDuration {
		t.Errorf("c took replica-b's targets %s after its graceful stop, want within a renew period (well before the %s lease duration)", took, leaseDuration)
	}

	// A target nobody wants any more: its owner deletes its Lease.
	c.s.Want(wanted[1:])
	waitFor(t, 30*time.Second, "the unwanted target's Lease deleted", func() bool {
		_, err := kube.CoordinationV1().Leases(ns).Get(t.Context(), shard.TargetLeaseName(wanted[0]), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if slices.Contains(c.s.Owned(), wanted[0]) || len(c.s.Owned()) != 6 {
		t.Errorf("c owns %v, want the six still wanted", c.s.Owned())
	}
	if !strings.HasPrefix(c.s.Identity(), "replica-c_") {
		t.Errorf("identity %q, want the replica id and a suffix", c.s.Identity())
	}
}
