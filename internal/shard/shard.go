// Package shard shares a controller's fleet targets between its replicas: each target
// has a coordination.k8s.io Lease (upgradeguard-target-<hash>) that names the replica
// owning it, and each replica a member Lease (upgradeguard-replica-<id>) that says it is
// live. A Shard takes, renews and gives up target Leases so that every target has one
// owner and the targets spread over the live replicas (Decide); the owner runs the
// target and its migrations. See docs/design/2026-12-05-sharding.md.
package shard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
)

// Labels and annotations of the shard's Leases.
const (
	// LabelShard is on every shard Lease: KindTarget or KindReplica.
	LabelShard  = "upgradeguard.io/shard"
	KindTarget  = "target"
	KindReplica = "replica"
	// AnnotationTarget names the target (the kubeconfig Secret, namespace/name) of a
	// target Lease.
	AnnotationTarget = "upgradeguard.io/target"
	// AnnotationReplica names the replica (--replica-id) of a holder identity.
	AnnotationReplica = "upgradeguard.io/replica"
	// AnnotationFor names the replica a released target Lease was handed to.
	AnnotationFor = "upgradeguard.io/handed-to"
)

// firstTakeAfter is how long after its first tick a replica first takes targets.
const firstTakeAfter = 2 * time.Second

// renewers bounds the target Leases renewed at once.
const renewers = 8

// Defaults of Options.
const (
	DefaultLeaseDuration = 30 * time.Second
	DefaultRenewEvery    = 10 * time.Second
)

// Options configure a Shard.
type Options struct {
	// Namespace holds the shard's Leases (the controller's namespace).
	Namespace string
	// Replica names this replica (--replica-id, the Pod's name in the chart). Two live
	// replicas must not share it.
	Replica string
	// LeaseDuration of the target and member Leases (whole seconds): a replica that stops
	// renewing loses its targets this long after its last renewal.
	LeaseDuration time.Duration
	// RenewEvery is the tick: renewals, and the look for targets to take or give up.
	// At most half of LeaseDuration.
	RenewEvery time.Duration
}

// Shard is one replica's part in the sharing of targets. It is a controller-runtime
// Runnable that every replica runs (not only the leader).
type Shard struct {
	leases   coordclient.LeaseInterface
	o        Options
	identity string

	kick chan struct{}

	mu        sync.Mutex
	wanted    map[string]bool
	claims    map[string]*claim
	cooldown  map[string]time.Time
	listeners []func(keys []string)
	ticks     int
	base      context.Context
	member    *coordinationv1.Lease
}

// claim is a target this replica holds the Lease of.
type claim struct {
	lease   string
	ctx     context.Context
	cancel  context.CancelFunc
	holders sync.WaitGroup
	renewed time.Time
	// deadline drops the claim LeaseDuration - RenewEvery after its last renewal, on
	// time rather than at the next tick.
	deadline *time.Timer
	// releasing: given up; the Lease is released once the holders have returned.
	releasing bool
}

// New returns a Shard working with the Leases of leases in o.Namespace.
func New(leases coordclient.LeasesGetter, o Options) (*Shard, error) {
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewEvery <= 0 {
		o.RenewEvery = DefaultRenewEvery
	}
	o.LeaseDuration = o.LeaseDuration.Round(time.Second)
	if o.LeaseDuration < time.Second || o.RenewEvery*2 > o.LeaseDuration {
		return nil, fmt.Errorf("target lease duration %s must be at least twice the renew period %s (and at least 1s)", o.LeaseDuration, o.RenewEvery)
	}
	if o.Namespace == "" || o.Replica == "" {
		return nil, errors.New("a shard needs a namespace and a replica id")
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	return &Shard{
		leases: leases.Leases(o.Namespace), o: o,
		// A restarted process under the same replica id is a new holder: it waits for the
		// Leases of the one before to expire instead of taking them over unchecked.
		identity: o.Replica + "_" + hex.EncodeToString(suffix),
		kick:     make(chan struct{}, 1),
		wanted:   map[string]bool{}, claims: map[string]*claim{}, cooldown: map[string]time.Time{},
	}, nil
}

// Replica is this replica's id (Options.Replica).
func (s *Shard) Replica() string { return s.o.Replica }

// Identity is this replica's holder identity in the Leases: its id and a suffix of its
// own.
func (s *Shard) Identity() string { return s.identity }

// Options are the Shard's options, defaults filled in.
func (s *Shard) Options() Options { return s.o }

// Key is the key of the target whose kubeconfig is in Secret namespace/name.
func Key(namespace, name string) string { return namespace + "/" + name }

// TargetLeaseName is the name of the Lease of the target key.
func TargetLeaseName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "upgradeguard-target-" + hex.EncodeToString(sum[:])[:16]
}

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// ReplicaLeaseName is the name of the member Lease of replica.
func ReplicaLeaseName(replica string) string {
	name := "upgradeguard-replica-" + strings.Trim(notDNS.ReplaceAllString(strings.ToLower(replica), "-"), "-")
	return kubename.Shorten(name, 63, replica)
}

// OnChange registers f, called with the keys whose ownership changed (taken, lost or
// given up) after each tick that changed any. Register before Start.
func (s *Shard) OnChange(f func(keys []string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, f)
}

// Want sets the keys of every target the policies select now (all policies'); a change
// is acted on at once.
func (s *Shard) Want(keys []string) {
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	s.mu.Lock()
	changed := !maps.Equal(want, s.wanted)
	s.wanted = want
	s.mu.Unlock()
	if changed {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Wanted says whether key is among the wanted targets.
func (s *Shard) Wanted(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wanted[key]
}

// Owns says whether this replica owns key now.
func (s *Shard) Owns(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[key]
	return c != nil && !c.releasing
}

// Owned are the keys this replica owns, sorted.
func (s *Shard) Owned() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, c := range s.claims {
		if !c.releasing {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Hold is for work on the target key: when this replica owns it, it returns a context
// that ends when ctx does or ownership ends, and done, to call when the work stops. A
// target is given up (its Lease released for another replica) only after every holder
// has called done, so the work can save its place first. ok is false when this replica
// does not own key.
func (s *Shard) Hold(ctx context.Context, key string) (hctx context.Context, done func(), ok bool) {
	s.mu.Lock()
	c := s.claims[key]
	if c == nil || c.releasing {
		s.mu.Unlock()
		return ctx, func() {}, false
	}
	c.holders.Add(1)
	s.mu.Unlock()
	hctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	var once sync.Once
	return hctx, func() {
		once.Do(func() {
			stop()
			cancel()
			c.holders.Done()
		})
	}, true
}

// NeedLeaderElection is false: every replica takes its share.
func (s *Shard) NeedLeaderElection() bool { return false }

// Start runs the replica's part until ctx ends; then it stops the work on its targets,
// waits for it, and releases their Leases and its member Lease so the other replicas
// take the targets at their next tick instead of after the Leases expire.
func (s *Shard) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithValues("replica", s.o.Replica)
	s.mu.Lock()
	s.base = ctx
	s.mu.Unlock()
	defer metrics.FleetTargetsOwned.WithLabelValues(s.o.Replica).Set(0)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			s.shutdown(logger)
			return nil
		case <-timer.C:
		case <-s.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		started := time.Now()
		s.tick(ctx)
		next := s.o.RenewEvery
		s.mu.Lock()
		if s.ticks == 1 {
			// The first tick only announced this replica: take targets soon after, once
			// replicas that started with it have announced themselves too.
			next = min(next, firstTakeAfter)
		}
		s.mu.Unlock()
		// A period from the tick's start, not its end: the Leases were written with the
		// start's time, and a long tick (many targets, a slow API server) must not push
		// their next renewal past the claims' grace.
		timer.Reset(max(next-time.Since(started), 0))
	}
}

// tick is one round: renew the member Lease, read every shard Lease, then renew, give
// up and take target Leases as Decide plans.
func (s *Shard) tick(ctx context.Context) {
	logger := log.FromContext(ctx).WithValues("replica", s.o.Replica)
	now := time.Now()
	if err := s.renewMember(ctx, now); err != nil && ctx.Err() == nil {
		logger.Error(err, "renewing the member Lease")
	}
	r, err := s.read(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "listing the shard Leases")
		}
		s.settle(s.expire(now))
		return
	}

	s.mu.Lock()
	first := s.ticks == 0
	s.ticks++
	wanted := slices.Sorted(maps.Keys(s.wanted))
	releasing, cooldown := map[string]bool{}, map[string]bool{}
	var lost []string
	for k, c := range s.claims {
		if c.releasing {
			releasing[k] = true
			continue
		}
		// Taken by another replica or deleted: this replica lost it.
		if l, ok := r.targets[k]; !ok || l.Holder != s.identity {
			lost = append(lost, k)
		}
	}
	for k, until := range s.cooldown {
		if now.After(until) {
			delete(s.cooldown, k)
		} else {
			cooldown[k] = true
		}
	}
	s.mu.Unlock()
	changed := s.lose(lost)

	plan := Decide(State{Me: s.identity, Now: now, Wanted: wanted, Targets: r.targets, Live: r.live, Releasing: releasing, Cooldown: cooldown})
	// Renew what is kept, and what is being given up (until it is released).
	renew := slices.DeleteFunc(append(slices.Clone(plan.Keep), slices.Sorted(maps.Keys(releasing))...),
		func(k string) bool { return r.objs[k] == nil || slices.Contains(lost, k) })
	changed = append(changed, s.renewAll(ctx, renew, r.objs, releasing, now)...)
	for _, k := range plan.Release {
		switch {
		case s.release(k, plan.Handoff[k]):
			changed = append(changed, k)
		case r.objs[k] != nil:
			// Held on the server but not here (dropped after failed renewals).
			if err := s.writeRelease(ctx, r.objs[k].Name, plan.Handoff[k], !slices.Contains(wanted, k)); err != nil && ctx.Err() == nil {
				logger.Error(err, "releasing a target Lease", "target", k)
			}
		}
	}
	if !first { // the first tick only announces this replica, so that peers count it
		changed = append(changed, s.acquireAll(ctx, plan, r.objs, now)...)
	}
	// Unheld Leases of targets nobody here wants, released long since.
	for k, l := range r.targets {
		if !slices.Contains(wanted, k) && !l.HeldAt(now) && now.Sub(l.Expires) > 3*s.o.LeaseDuration {
			s.forget(ctx, r.objs[k])
		}
	}
	s.settle(append(changed, s.expire(now)...))
}

// reading is one LIST of the shard's Leases.
type reading struct {
	targets map[string]Lease
	objs    map[string]*coordinationv1.Lease
	live    []string
}

// read lists the shard's Leases, and deletes member Leases of replicas gone long since.
func (s *Shard) read(ctx context.Context, now time.Time) (*reading, error) {
	list, err := s.leases.List(ctx, metav1.ListOptions{LabelSelector: LabelShard})
	if err != nil {
		return nil, err
	}
	r := &reading{targets: map[string]Lease{}, objs: map[string]*coordinationv1.Lease{}}
	for i := range list.Items {
		l := &list.Items[i]
		v := view(l)
		switch l.Labels[LabelShard] {
		case KindReplica:
			if v.HeldAt(now) {
				r.live = append(r.live, v.Holder)
			} else if now.Sub(v.Expires) > 3*s.o.LeaseDuration {
				s.forget(ctx, l)
			}
		case KindTarget:
			if key := l.Annotations[AnnotationTarget]; key != "" {
				r.targets[key], r.objs[key] = v, l
			}
		}
	}
	return r, nil
}

// renewAll renews the Leases of keys that are due (renewers at a time), and returns the
// keys whose ownership changed: lost to another replica, or owned again.
func (s *Shard) renewAll(ctx context.Context, keys []string, objs map[string]*coordinationv1.Lease, releasing map[string]bool, now time.Time) []string {
	logger := log.FromContext(ctx).WithValues("replica", s.o.Replica)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var changed []string
	sem := make(chan struct{}, renewers)
	for _, k := range keys {
		s.mu.Lock()
		c := s.claims[k]
		due := c == nil || now.Sub(c.renewed) >= s.o.RenewEvery/2
		s.mu.Unlock()
		if !due {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ok, err := s.renew(ctx, objs[k], now)
			var gone []string
			switch {
			case err != nil && ctx.Err() == nil:
				logger.Error(err, "renewing a target Lease", "target", k)
			case err == nil && !ok:
				gone = s.lose([]string{k})
			case err == nil:
				s.mu.Lock()
				if c := s.claims[k]; c != nil {
					c.renewedAt(s, now)
				} else if !releasing[k] {
					// Still held on the server, though this replica had dropped it after
					// failed renewals: nobody took it meanwhile, so it owns it again.
					s.claims[k] = s.newClaim(k, objs[k].Name, now)
					gone = []string{k}
				}
				s.mu.Unlock()
			}
			mu.Lock()
			changed = append(changed, gone...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return changed
}

// acquireAll takes free targets in the plan's order until it has taken plan.Room,
// renewers at a time. It starts no more once half the claims' grace has passed since now,
// the time the Leases are written with: a claim taken later would have little left before
// its renewal is due, so the rest waits for the next tick.
func (s *Shard) acquireAll(ctx context.Context, plan Plan, objs map[string]*coordinationv1.Lease, now time.Time) []string {
	logger := log.FromContext(ctx).WithValues("replica", s.o.Replica)
	budget := now.Add(s.grace() / 2)
	var taken []string
	for rest := plan.Acquire; len(rest) > 0 && len(taken) < plan.Room && ctx.Err() == nil && time.Now().Before(budget); {
		batch := rest[:min(plan.Room-len(taken), renewers, len(rest))]
		rest = rest[len(batch):]
		ok := make([]bool, len(batch))
		var wg sync.WaitGroup
		for i, k := range batch {
			wg.Go(func() {
				var err error
				ok[i], err = s.acquire(ctx, k, objs[k], now)
				if err != nil && ctx.Err() == nil {
					logger.Error(err, "taking a target Lease", "target", k)
				}
			})
		}
		wg.Wait()
		for i, k := range batch {
			if ok[i] {
				taken = append(taken, k)
				logger.Info("took a fleet target", "target", k, "lease", TargetLeaseName(k), "share", plan.Share)
			}
		}
	}
	return taken
}

// settle publishes a change of ownership: the metric and the listeners.
func (s *Shard) settle(changed []string) {
	s.mu.Lock()
	n := 0
	for _, c := range s.claims {
		if !c.releasing {
			n++
		}
	}
	listeners := slices.Clone(s.listeners)
	s.mu.Unlock()
	metrics.FleetTargetsOwned.WithLabelValues(s.o.Replica).Set(float64(n))
	if len(changed) == 0 {
		return
	}
	slices.Sort(changed)
	changed = slices.Compact(changed)
	for _, f := range listeners {
		f(changed)
	}
}

// expire drops the claims not renewed for grace (their timers do it too, on time).
func (s *Shard) expire(now time.Time) []string {
	s.mu.Lock()
	var late []string
	for k, c := range s.claims {
		if !c.releasing && now.Sub(c.renewed) >= s.grace() {
			late = append(late, k)
		}
	}
	s.mu.Unlock()
	return s.lose(late)
}

// lose ends the claims on keys without writing their Leases (they are another's, gone,
// or could not be renewed): the work on them is cancelled.
func (s *Shard) lose(keys []string) []string {
	var out []string
	s.mu.Lock()
	for _, k := range keys {
		if c := s.claims[k]; c != nil {
			c.cancel()
			c.deadline.Stop()
			delete(s.claims, k)
			if !c.releasing {
				out = append(out, k)
			}
		}
	}
	s.mu.Unlock()
	return out
}

// newClaim is a claim on key renewed at now. Call with s.mu held.
func (s *Shard) newClaim(key, lease string, now time.Time) *claim {
	base := s.base
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(base))
	c := &claim{lease: lease, ctx: ctx, cancel: cancel, renewed: now}
	c.deadline = time.AfterFunc(time.Until(now.Add(s.grace())), func() {
		s.mu.Lock()
		late := s.claims[key] == c && !c.releasing && time.Since(c.renewed) >= s.grace()
		s.mu.Unlock()
		if late {
			s.settle(s.lose([]string{key}))
		}
	})
	return c
}

// grace is how long a claim outlives its last renewal: LeaseDuration - RenewEvery, so
// that the work on a target stops at least a renew period before another replica can
// take it (LeaseDuration after the last renewal, on its own clock).
func (s *Shard) grace() time.Duration { return s.o.LeaseDuration - s.o.RenewEvery }

// renewed records a renewal at now. Call with s.mu held.
func (c *claim) renewedAt(s *Shard, now time.Time) {
	c.renewed = now
	c.deadline.Reset(time.Until(now.Add(s.grace())))
}

// release gives key up: its work is cancelled at once; once the work has returned, the
// Lease is released (handed to for, when set), or deleted when no target wants it. It
// reports whether key was owned.
func (s *Shard) release(key, to string) bool {
	s.mu.Lock()
	c := s.claims[key]
	if c == nil || c.releasing {
		s.mu.Unlock()
		return false
	}
	c.releasing = true
	c.cancel()
	c.deadline.Stop()
	wanted := s.wanted[key]
	s.mu.Unlock()
	go func() {
		c.holders.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.writeRelease(ctx, c.lease, to, !wanted); err != nil {
			log.FromContext(ctx).Error(err, "releasing a target Lease", "target", key, "replica", s.o.Replica)
		}
		s.mu.Lock()
		if s.claims[key] == c {
			delete(s.claims, key)
		}
		s.cooldown[key] = time.Now().Add(s.o.LeaseDuration)
		s.mu.Unlock()
	}()
	return true
}

// writeRelease clears the holder of the Lease named name if it is still this replica's;
// with to, it names the replica it is handed to. drop deletes the Lease instead.
func (s *Shard) writeRelease(ctx context.Context, name, to string, drop bool) error {
	cur, err := s.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if ptr.Deref(cur.Spec.HolderIdentity, "") != s.identity {
		return nil
	}
	if drop {
		err := s.leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &cur.ResourceVersion}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	now := metav1.NewMicroTime(time.Now())
	cur.Spec.HolderIdentity, cur.Spec.RenewTime = nil, &now
	delete(cur.Annotations, AnnotationReplica)
	delete(cur.Annotations, AnnotationFor)
	if to != "" {
		cur.Annotations[AnnotationFor] = to
	}
	_, err = s.leases.Update(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // changed since: no longer this replica's to release
	}
	return err
}

// renew writes a new renewTime into l (as read), and reports false when the Lease has
// become another's.
func (s *Shard) renew(ctx context.Context, l *coordinationv1.Lease, now time.Time) (bool, error) {
	for range 2 {
		if ptr.Deref(l.Spec.HolderIdentity, "") != s.identity {
			return false, nil
		}
		next := l.DeepCopy()
		next.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
		next.Spec.LeaseDurationSeconds = ptr.To(int32(s.o.LeaseDuration / time.Second))
		_, err := s.leases.Update(ctx, next, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err == nil, err
		}
		if l, err = s.leases.Get(ctx, l.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	return false, fmt.Errorf("Lease %s keeps changing", l.Name)
}

// acquire takes the Lease of key (l as read, nil when there was none). It reports
// false, without an error, when another replica took or changed it first.
func (s *Shard) acquire(ctx context.Context, key string, l *coordinationv1.Lease, now time.Time) (bool, error) {
	name := TargetLeaseName(key)
	t := metav1.NewMicroTime(now)
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.identity), LeaseDurationSeconds: ptr.To(int32(s.o.LeaseDuration / time.Second)),
		AcquireTime: &t, RenewTime: &t}
	var err error
	if l == nil {
		_, err = s.leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.o.Namespace,
			Labels:      map[string]string{LabelShard: KindTarget, "app.kubernetes.io/managed-by": "upgradeguard"},
			Annotations: map[string]string{AnnotationTarget: key, AnnotationReplica: s.o.Replica}}, Spec: spec}, metav1.CreateOptions{})
	} else {
		next := l.DeepCopy()
		spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		next.Spec = spec
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[AnnotationReplica] = s.o.Replica
		delete(next.Annotations, AnnotationFor)
		_, err = s.leases.Update(ctx, next, metav1.UpdateOptions{})
	}
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	s.claims[key] = s.newClaim(key, name, now)
	s.mu.Unlock()
	return true, nil
}

// renewMember writes this replica's member Lease, creating it if need be.
func (s *Shard) renewMember(ctx context.Context, now time.Time) error {
	name := ReplicaLeaseName(s.o.Replica)
	t := metav1.NewMicroTime(now)
	for range 2 {
		s.mu.Lock()
		cur := s.member
		s.mu.Unlock()
		var err error
		if cur == nil {
			cur, err = s.leases.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				cur, err = s.leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.o.Namespace,
					Labels:      map[string]string{LabelShard: KindReplica, "app.kubernetes.io/managed-by": "upgradeguard"},
					Annotations: map[string]string{AnnotationReplica: s.o.Replica}},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.identity), LeaseDurationSeconds: ptr.To(int32(s.o.LeaseDuration / time.Second)),
						AcquireTime: &t, RenewTime: &t}}, metav1.CreateOptions{})
				if err == nil {
					s.mu.Lock()
					s.member = cur
					s.mu.Unlock()
					return nil
				}
			}
			if err != nil {
				return err
			}
		}
		next := cur.DeepCopy()
		if ptr.Deref(next.Spec.HolderIdentity, "") != s.identity {
			next.Spec.AcquireTime = &t
		}
		next.Spec.HolderIdentity, next.Spec.RenewTime = ptr.To(s.identity), &t
		next.Spec.LeaseDurationSeconds = ptr.To(int32(s.o.LeaseDuration / time.Second))
		out, err := s.leases.Update(ctx, next, metav1.UpdateOptions{})
		s.mu.Lock()
		if err == nil {
			s.member = out
		} else {
			s.member = nil // read it again
		}
		s.mu.Unlock()
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return fmt.Errorf("member Lease %s keeps changing", name)
}

// forget deletes a shard Lease nobody holds any more, if it is unchanged since read.
func (s *Shard) forget(ctx context.Context, l *coordinationv1.Lease) {
	err := s.leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &l.ResourceVersion, UID: ptr.To(l.UID)}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
		log.FromContext(ctx).Error(err, "deleting an unused shard Lease", "lease", l.Name)
	}
}

// shutdown stops the work on every target, waits for it, then releases the target
// Leases and deletes the member Lease.
func (s *Shard) shutdown(logger logr.Logger) {
	s.mu.Lock()
	claims := maps.Clone(s.claims)
	for _, c := range claims {
		c.releasing = true
		c.cancel()
		c.deadline.Stop()
	}
	s.mu.Unlock()
	for _, c := range claims {
		c.holders.Wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for k, c := range claims {
		wg.Go(func() {
			if err := s.writeRelease(ctx, c.lease, "", false); err != nil {
				logger.Error(err, "releasing a target Lease", "target", k)
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	s.claims = map[string]*claim{}
	member := s.member
	s.mu.Unlock()
	if member != nil {
		err := s.leases.Delete(ctx, member.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(member.UID)}})
		if err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "deleting the member Lease")
		}
	}
	if len(claims) > 0 {
		logger.Info("released fleet targets", "targets", len(claims))
	}
}

// view reads a Lease for Decide.
func view(l *coordinationv1.Lease) Lease {
	v := Lease{Holder: ptr.Deref(l.Spec.HolderIdentity, ""), For: l.Annotations[AnnotationFor]}
	if l.Spec.RenewTime != nil {
		v.Expires = l.Spec.RenewTime.Add(time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second)
	}
	return v
}
