package shard

import (
	"hash/fnv"
	"slices"
	"time"
)

// Lease is what Decide needs to know of one target Lease.
type Lease struct {
	// Holder is the holderIdentity ("" when released).
	Holder string
	// Expires is renewTime + leaseDurationSeconds, read on the observer's clock.
	Expires time.Time
	// For names the replica a holder handed the target to when it gave it up to even out
	// the load; until Expires only that replica takes it (when it is live).
	For string
}

// HeldAt says whether the Lease has a holder at now.
func (l Lease) HeldAt(now time.Time) bool { return l.Holder != "" && now.Before(l.Expires) }

// State is one replica's view of the shard at one tick.
type State struct {
	// Me is this replica's holder identity.
	Me  string
	Now time.Time
	// Wanted are the keys of every target the policies select now.
	Wanted []string
	// Targets are the target Leases by key; a wanted key without one has no Lease yet.
	Targets map[string]Lease
	// Live are the holder identities of the replicas whose member Leases have not
	// expired (Me is counted whether or not it is among them).
	Live []string
	// Releasing are keys this replica is giving up already: it still holds their
	// Leases, but neither counts nor keeps them.
	Releasing map[string]bool
	// Cooldown are keys this replica gave up lately: it does not take them back at once.
	Cooldown map[string]bool
}

// Plan is what one replica does at one tick.
type Plan struct {
	// Share is ceil(wanted / live replicas): a replica takes targets until it holds
	// Share, and keeps at most Share+1 (the one of slack keeps it from giving targets up
	// and taking them back as replicas come and go).
	Share int
	// Keep are the held targets to renew.
	Keep []string
	// Release are the held targets to give up: no longer wanted, over Share+1, or one
	// handed to a live replica that holds two fewer (Handoff names it).
	Release []string
	// Handoff names, for a released key, the replica it is handed to.
	Handoff map[string]string
	// Acquire are the free targets, best first; take at most Room of them (a Lease
	// another replica takes first is skipped for the next).
	Acquire []string
	Room    int
}

// Decide plans one tick of one replica. Every replica decides from its own view; the
// Leases (created and updated with the resourceVersion read) make sure that only one of
// them takes a target, whatever they decided. Each replica orders targets by a hash of
// its identity and the key (rendezvous hashing), so that replicas prefer different
// targets and seldom race for one.
func Decide(s State) Plan {
	live := map[string]bool{s.Me: true}
	for _, l := range s.Live {
		live[l] = true
	}
	wanted := make(map[string]bool, len(s.Wanted))
	for _, k := range s.Wanted {
		wanted[k] = true
	}
	p := Plan{Handoff: map[string]string{}}
	if len(wanted) > 0 {
		p.Share = (len(wanted) + len(live) - 1) / len(live)
	}
	// What each live replica holds of the wanted targets.
	count := map[string]int{}
	for l := range live {
		count[l] = 0
	}
	var mine, free []string
	anyFree := false
	for k, l := range s.Targets {
		switch {
		case l.Holder == s.Me && s.Releasing[k]:
		case l.Holder == s.Me && !wanted[k]:
			p.Release = append(p.Release, k)
		case l.Holder == s.Me:
			// Held, even past its expiry: nobody took it, and renewing it (with the
			// resourceVersion read) either keeps it or finds that someone did.
			mine = append(mine, k)
		case wanted[k] && l.HeldAt(s.Now) && live[l.Holder]:
			count[l.Holder]++
		}
	}
	for _, k := range s.Wanted {
		l, ok := s.Targets[k]
		if s.Releasing[k] || ok && (l.Holder == s.Me || l.HeldAt(s.Now)) {
			continue
		}
		anyFree = true
		if s.Cooldown[k] || ok && l.For != "" && l.For != s.Me && live[l.For] && s.Now.Before(l.Expires) {
			continue
		}
		free = append(free, k)
	}
	byScore := func(a, b string) int {
		if sa, sb := score(s.Me, a), score(s.Me, b); sa != sb {
			if sa > sb {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		return 1
	}
	slices.SortFunc(mine, byScore)
	slices.SortFunc(free, byScore)
	slices.Sort(p.Release)
	if limit := p.Share + 1; len(mine) > limit {
		p.Release = append(p.Release, mine[limit:]...)
		mine = mine[:limit]
	}
	// Even out: when every wanted target is held and nothing else is given up, hand one
	// target to a live replica that holds at least two fewer. The sum of the squares of the counts falls with each
	// hand-over, so this ends.
	if !anyFree && len(p.Release) == 0 && len(mine) > 0 {
		peer, least := "", 0
		for l, n := range count {
			if l != s.Me && (peer == "" || n < least || n == least && l < peer) {
				peer, least = l, n
			}
		}
		if peer != "" && len(mine) >= least+2 {
			last := mine[len(mine)-1]
			mine = mine[:len(mine)-1]
			p.Release = append(p.Release, last)
			p.Handoff[last] = peer
		}
	}
	p.Keep = mine
	p.Acquire = free
	p.Room = max(p.Share-len(mine), 0)
	return p
}

// score ranks key for the replica me: the higher, the more me prefers it.
func score(me, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(me))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return h.Sum64()
}
