package shard_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/upgradeguard/upgradeguard/internal/shard"
)

// fleet is a simulated set of replicas sharing targets through Leases as Shard does:
// each replica renews its member Lease, decides from one snapshot of every Lease, then
// writes with the snapshot's version (a write to a Lease changed since fails, as an
// update with a stale resourceVersion does).
type fleet struct {
	t        *testing.T
	now      time.Time
	d, r     time.Duration
	wanted   []string
	leases   map[string]*simLease
	members  map[string]time.Time // identity -> expiry
	replicas []*simReplica
	rng      *rand.Rand
	// transitions counts every change of holder.
	transitions int
}

type simLease struct {
	shard.Lease
	version int
}

type simReplica struct {
	id       string
	phase    time.Duration // when in each period it ticks
	alive    bool
	ticks    int
	cooldown map[string]time.Time
}

func newFleet(t *testing.T, targets int, seed uint64) *fleet {
	f := &fleet{t: t, now: time.Unix(1_800_000_000, 0), d: 30 * time.Second, r: 10 * time.Second,
		leases: map[string]*simLease{}, members: map[string]time.Time{}, rng: rand.New(rand.NewPCG(seed, seed))}
	for i := range targets {
		f.wanted = append(f.wanted, fmt.Sprintf("fleet/cluster-%02d", i))
	}
	return f
}

func (f *fleet) add(id string) *simReplica {
	r := &simReplica{id: id, phase: time.Duration(f.rng.Int64N(int64(f.r))), alive: true, cooldown: map[string]time.Time{}}
	f.replicas = append(f.replicas, r)
	return r
}

// run advances the clock by d in steps of one second; every live replica ticks once per
// period, at its phase. Replicas ticking in the same second decide from one snapshot.
func (f *fleet) run(d time.Duration) {
	for end := f.now.Add(d); f.now.Before(end); f.now = f.now.Add(time.Second) {
		var due []*simReplica
		for _, r := range f.replicas {
			if r.alive && f.now.Sub(time.Unix(0, 0))%f.r/time.Second == r.phase/time.Second {
				due = append(due, r)
			}
		}
		for _, r := range due {
			f.members[r.id] = f.now.Add(f.d)
		}
		snapshot := map[string]simLease{}
		for k, l := range f.leases {
			snapshot[k] = *l
		}
		plans := map[string]shard.Plan{}
		for _, r := range due {
			plans[r.id] = shard.Decide(f.state(r, snapshot))
		}
		f.rng.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
		for _, r := range due {
			f.apply(r, plans[r.id], snapshot)
		}
	}
}

func (f *fleet) state(r *simReplica, snapshot map[string]simLease) shard.State {
	s := shard.State{Me: r.id, Now: f.now, Wanted: f.wanted, Targets: map[string]shard.Lease{}, Cooldown: map[string]bool{}}
	for k, l := range snapshot {
		s.Targets[k] = l.Lease
	}
	for id, exp := range f.members {
		if f.now.Before(exp) {
			s.Live = append(s.Live, id)
		}
	}
	for k, until := range r.cooldown {
		if f.now.Before(until) {
			s.Cooldown[k] = true
		}
	}
	return s
}

// apply writes a plan as Shard does, each write conditional on the snapshot's version.
func (f *fleet) apply(r *simReplica, p shard.Plan, snapshot map[string]simLease) {
	first := r.ticks == 0
	r.ticks++
	write := func(k string, l shard.Lease) bool {
		cur, ok := f.leases[k]
		seen, was := snapshot[k]
		if ok != was || ok && cur.version != seen.version {
			return false // changed since the snapshot: a conflict
		}
		if !ok {
			cur = &simLease{}
			f.leases[k] = cur
		}
		if cur.Holder != l.Holder {
			f.transitions++
		}
		cur.Lease, cur.version = l, cur.version+1
		return true
	}
	for _, k := range p.Keep {
		write(k, shard.Lease{Holder: r.id, Expires: f.now.Add(f.d)})
	}
	for _, k := range p.Release {
		if write(k, shard.Lease{Expires: f.now.Add(f.d), For: p.Handoff[k]}) {
			r.cooldown[k] = f.now.Add(f.d)
		}
	}
	if first {
		return
	}
	room := p.Room
	for _, k := range p.Acquire {
		if room == 0 {
			break
		}
		if write(k, shard.Lease{Holder: r.id, Expires: f.now.Add(f.d)}) {
			room--
		}
	}
}

// kill stops a replica as a crash does: it writes nothing more.
func (f *fleet) kill(r *simReplica) { r.alive = false }

// leave stops a replica as a graceful stop does: its Leases released, its member Lease
// deleted.
func (f *fleet) leave(r *simReplica) {
	r.alive = false
	delete(f.members, r.id)
	for _, l := range f.leases {
		if l.Holder == r.id {
			l.Holder, l.Expires, l.version = "", f.now, l.version+1
			f.transitions++
		}
	}
}

// owners counts the targets each live replica holds at f.now, and the wanted targets
// no live replica holds or is being handed.
func (f *fleet) owners() (count map[string]int, orphans []string) {
	count = map[string]int{}
	alive := map[string]bool{}
	for _, r := range f.replicas {
		if r.alive {
			alive[r.id] = true
			count[r.id] = 0
		}
	}
	for _, k := range f.wanted {
		l := f.leases[k]
		switch {
		case l != nil && l.HeldAt(f.now) && alive[l.Holder]:
			count[l.Holder]++
		case l != nil && l.Holder == "" && alive[l.For] && f.now.Before(l.Expires):
			// Handed over to a live replica, which takes it at its next tick.
		default:
			orphans = append(orphans, k)
		}
	}
	return count, orphans
}

// balanced fails the test unless every target is held by a live replica and the
// counts differ by at most one.
func (f *fleet) balanced(when string) {
	f.t.Helper()
	count, orphans := f.owners()
	if len(orphans) > 0 {
		f.t.Fatalf("%s: targets %v have no live owner (counts %v)", when, orphans, count)
	}
	lo, hi := len(f.wanted), 0
	for _, n := range count {
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > 1 {
		f.t.Fatalf("%s: counts %v differ by %d, want at most 1", when, count, hi-lo)
	}
}

// TestDecideSpreads: replicas that start together, one that joins later, one that
// crashes and one that stops gracefully. After each event every target has exactly one
// live owner within the stated bound and the counts even out; once they have, no target
// changes hands.
func TestDecideSpreads(t *testing.T) {
	for seed := range uint64(40) {
		targets := []int{1, 3, 10, 25}[seed%4]
		t.Run(fmt.Sprintf("%d targets, seed %d", targets, seed), func(t *testing.T) {
			f := newFleet(t, targets, seed)
			a, b, c := f.add("a"), f.add("b"), f.add("c")
			// The first tick announces, the second takes; then hand-overs even it out.
			f.run(2*f.r + time.Second)
			if count, orphans := f.owners(); len(orphans) > 0 {
				t.Fatalf("two periods after the start: counts %v, targets %v without an owner", count, orphans)
			}
			f.run(5 * f.r)
			f.balanced("three replicas started together")

			// Once even, nothing moves.
			before := f.transitions
			f.run(10 * f.r)
			if f.transitions != before {
				t.Fatalf("%d hand-overs among balanced replicas, want none", f.transitions-before)
			}

			// A fourth replica joins: it gets its share (the others hand targets over).
			d := f.add("d")
			f.run(10 * f.r)
			f.balanced("a fourth replica joined")
			if count, _ := f.owners(); count["d"] < targets/4 {
				t.Fatalf("the replica that joined holds %d targets, want at least %d of %d among 4", count["d"], targets/4, targets)
			}

			// b crashes: its targets are held by the others within lease duration plus
			// one renew period of its last renewal (it renewed at most a period ago).
			f.kill(b)
			f.run(f.d + f.r + time.Second)
			if _, orphans := f.owners(); len(orphans) > 0 {
				t.Fatalf("targets %v still without a live owner %s after the crash", orphans, f.d+f.r+time.Second)
			}
			f.run(10 * f.r)
			f.balanced("after the crash")

			// c stops gracefully: its targets are taken at the others' next tick.
			f.leave(c)
			f.run(f.r + time.Second)
			if _, orphans := f.owners(); len(orphans) > 0 {
				t.Fatalf("targets %v without an owner one period after a graceful stop", orphans)
			}
			f.run(10 * f.r)
			f.balanced("after the graceful stop")
			if count, _ := f.owners(); count[a.id]+count[d.id] != targets {
				t.Fatalf("counts %v, want the two live replicas to hold all %d", count, targets)
			}
		})
	}
}

// TestDecideStartAlone: one replica holds everything (share = all, so a single replica
// is the unsharded controller); a second one takes half within a few periods.
func TestDecideStartAlone(t *testing.T) {
	f := newFleet(t, 7, 1)
	f.add("a")
	f.run(2*f.r + time.Second)
	if count, orphans := f.owners(); count["a"] != 7 || len(orphans) != 0 {
		t.Fatalf("alone: counts %v, orphans %v; want all 7 held", count, orphans)
	}
	f.add("b")
	f.run(10 * f.r)
	f.balanced("a second replica joined")
}

// TestDecidePlan: the rules one at a time.
func TestDecidePlan(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	held := func(h string) shard.Lease { return shard.Lease{Holder: h, Expires: now.Add(time.Minute)} }
	expired := func(h string) shard.Lease { return shard.Lease{Holder: h, Expires: now.Add(-time.Second)} }
	keys := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("ns/t%d", i))
		}
		return out
	}
	for _, tc := range []struct {
		desc  string
		s     shard.State
		check func(p shard.Plan) error
	}{
		{"a target no policy wants is given up", shard.State{Me: "a", Now: now, Wanted: keys(1),
			Targets: map[string]shard.Lease{"ns/t0": held("a"), "ns/gone": held("a")}},
			func(p shard.Plan) error {
				if !slices.Equal(p.Release, []string{"ns/gone"}) || !slices.Equal(p.Keep, []string{"ns/t0"}) {
					return fmt.Errorf("release %v keep %v", p.Release, p.Keep)
				}
				return nil
			}},
		{"over share+1 the rest is given up", shard.State{Me: "a", Now: now, Wanted: keys(6), Live: []string{"a", "b", "c"},
			Targets: map[string]shard.Lease{"ns/t0": held("a"), "ns/t1": held("a"), "ns/t2": held("a"), "ns/t3": held("a"), "ns/t4": held("a"), "ns/t5": held("a")}},
			func(p shard.Plan) error {
				if p.Share != 2 || len(p.Keep) != 3 || len(p.Release) != 3 || p.Room != 0 {
					return fmt.Errorf("share %d keep %v release %v room %d; want share 2, 3 kept, 3 given up", p.Share, p.Keep, p.Release, p.Room)
				}
				return nil
			}},
		{"a live replica's Lease is not taken; an expired one is", shard.State{Me: "a", Now: now, Wanted: keys(3), Live: []string{"a", "b"},
			Targets: map[string]shard.Lease{"ns/t0": held("b"), "ns/t1": expired("b")}},
			func(p shard.Plan) error {
				if slices.Contains(p.Acquire, "ns/t0") || !slices.Contains(p.Acquire, "ns/t1") || !slices.Contains(p.Acquire, "ns/t2") || p.Room != 2 {
					return fmt.Errorf("acquire %v room %d", p.Acquire, p.Room)
				}
				return nil
			}},
		{"a dead replica's Lease waits for its expiry", shard.State{Me: "a", Now: now, Wanted: keys(1), Live: []string{"a"},
			Targets: map[string]shard.Lease{"ns/t0": held("dead")}},
			func(p shard.Plan) error {
				if len(p.Acquire) != 0 {
					return fmt.Errorf("acquire %v before the Lease expired", p.Acquire)
				}
				return nil
			}},
		{"a hand-over goes to the replica it names", shard.State{Me: "a", Now: now, Wanted: keys(1), Live: []string{"a", "b"},
			Targets: map[string]shard.Lease{"ns/t0": {Expires: now.Add(time.Minute), For: "b"}}},
			func(p shard.Plan) error {
				if len(p.Acquire) != 0 {
					return fmt.Errorf("a takes %v, handed to b", p.Acquire)
				}
				return nil
			}},
		{"a hand-over to a replica that is gone is free", shard.State{Me: "a", Now: now, Wanted: keys(1), Live: []string{"a"},
			Targets: map[string]shard.Lease{"ns/t0": {Expires: now.Add(time.Minute), For: "b"}}},
			func(p shard.Plan) error {
				if !slices.Equal(p.Acquire, []string{"ns/t0"}) {
					return fmt.Errorf("acquire %v", p.Acquire)
				}
				return nil
			}},
		{"one target is handed to a replica holding two fewer", shard.State{Me: "a", Now: now, Wanted: keys(5), Live: []string{"a", "b"},
			Targets: map[string]shard.Lease{"ns/t0": held("a"), "ns/t1": held("a"), "ns/t2": held("a"), "ns/t3": held("a"), "ns/t4": held("b")}},
			func(p shard.Plan) error {
				if len(p.Release) != 1 || p.Handoff[p.Release[0]] != "b" || len(p.Keep) != 3 {
					return fmt.Errorf("release %v handoff %v keep %v", p.Release, p.Handoff, p.Keep)
				}
				return nil
			}},
		{"no hand-over while a target is free", shard.State{Me: "a", Now: now, Wanted: keys(5), Live: []string{"a", "b"},
			Targets: map[string]shard.Lease{"ns/t0": held("a"), "ns/t1": held("a"), "ns/t2": held("a")}},
			func(p shard.Plan) error {
				if len(p.Release) != 0 {
					return fmt.Errorf("release %v while targets are free", p.Release)
				}
				return nil
			}},
		{"a target given up lately is not taken back", shard.State{Me: "a", Now: now, Wanted: keys(2), Cooldown: map[string]bool{"ns/t0": true}},
			func(p shard.Plan) error {
				if !slices.Equal(p.Acquire, []string{"ns/t1"}) {
					return fmt.Errorf("acquire %v", p.Acquire)
				}
				return nil
			}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := shard.Decide(tc.s)
			if err := tc.check(p); err != nil {
				t.Error(err)
			}
			// Whatever the rule, the plan keeps, gives up and takes distinct keys.
			seen := map[string]bool{}
			for _, k := range slices.Concat(p.Keep, p.Release, p.Acquire) {
				if seen[k] {
					t.Errorf("%s twice in %+v", k, p)
				}
				seen[k] = true
			}
		})
	}
}
