package shard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// TestAcquireAllBatchesWithinBudget: a replica takes its free targets renewers at a time
// (never more Lease writes in flight, never more than Room), and starts none once half
// the claims' grace has passed since the time the Leases are written with. The Lease
// writes are a fake clientset's: what is under test is this package's own scheduling.
func TestAcquireAllBatchesWithinBudget(t *testing.T) {
	var inflight, peak atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	leases := countingLeases{LeasesGetter: fake.NewClientset().CoordinationV1(), create: func() func() {
		n := inflight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n == renewers { // the first batch is all in flight at once: let them all go
			once.Do(func() { close(release) })
		}
		select { // held until the whole first batch is in flight; a test that batches less fails below
		case <-release:
		case <-time.After(2 * time.Second):
		}
		return func() { inflight.Add(-1) }
	}}
	s, err := New(leases, Options{Namespace: "ns", Replica: "r0", LeaseDuration: 30 * time.Second, RenewEvery: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var free []string
	for i := range 3 * renewers {
		free = append(free, fmt.Sprintf("fleet/t%d", i))
	}
	now := time.Now()
	taken := s.acquireAll(t.Context(), Plan{Acquire: free, Room: 2*renewers + 3}, nil, now)
	if len(taken) != 2*renewers+3 {
		t.Errorf("took %d targets, want Room (%d)", len(taken), 2*renewers+3)
	}
	if p := peak.Load(); p != renewers {
		t.Errorf("%d Lease creates in flight at most, want %d (renewers)", p, renewers)
	}
	if got := len(s.Owned()); got != len(taken) {
		t.Errorf("%d claims after taking %d targets", got, len(taken))
	}

	// Half the grace (10 s of 20 s) already gone since the Leases' time: take nothing.
	late := s.acquireAll(t.Context(), Plan{Acquire: free[len(taken):], Room: renewers}, nil, now.Add(-s.grace()/2-time.Second))
	if len(late) != 0 {
		t.Errorf("took %v with the budget spent, want none (the next tick takes them)", late)
	}
}

// countingLeases calls create around every Lease create (the fake clientset runs its
// reactors under one lock, so the count is taken outside it).
type countingLeases struct {
	coordclient.LeasesGetter
	create func() (done func())
}

func (c countingLeases) Leases(ns string) coordclient.LeaseInterface {
	return countingLease{c.LeasesGetter.Leases(ns), c.create}
}

type countingLease struct {
	coordclient.LeaseInterface
	create func() (done func())
}

func (c countingLease) Create(ctx context.Context, l *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	defer c.create()()
	return c.LeaseInterface.Create(ctx, l, o)
}
