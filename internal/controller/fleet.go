package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// Fleet targets watch their kubeconfig Secrets, so that a rotated or deleted one is seen
// at once.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

const (
	// LabelCluster names the target cluster of a StorageMigration a policy's targets made.
	LabelCluster = v1alpha1.LabelCluster
	// LabelCAPICluster is the label Cluster API puts on a <cluster>-kubeconfig Secret.
	LabelCAPICluster = kubeclient.LabelCAPICluster
)

// FleetOptions tune the fleet reconciler.
type FleetOptions struct {
	// ProbeEvery is how often a Ready target is probed (one LIST of CRD metadata), on top
	// of its CRD watch. Default 30s.
	ProbeEvery time.Duration
	// ProbeTimeout bounds one probe. Default 10s.
	ProbeTimeout time.Duration
	// MaxBackoff caps a failing target's backoff. Default 1m.
	MaxBackoff time.Duration
}

// FleetReconciler keeps, for every StorageMigrationPolicy with spec.targets, one running
// target per selected kubeconfig Secret: a goroutine with its own context and backoff
// that keeps the cluster's CRDs in an informer (livecluster.Clusters), probes it, reports its
// state in status.clusters and creates a StorageMigration (run by the
// StorageMigrationReconciler against that cluster, with its Leases, events and metrics)
// for every selected CRD with stale storedVersions. A target is keyed by a hash of its
// kubeconfig: a rotated Secret replaces it, a deleted one stops it.
//
// Every replica runs it, for the targets it owns: Shard shares the targets (keyed by
// their Secret) between the replicas, and each replica writes the entries of its own
// targets into status.clusters.
type FleetReconciler struct {
	Client client.Client
	// Reader reads policies uncached, for the status writes.
	Reader   client.Reader
	Clusters *livecluster.Clusters
	Options  FleetOptions
	Shard    *shard.Shard
	// WrapTarget, when set, wraps the transport of the clients to target clusters.
	WrapTarget transport.WrapperFunc

	kick    chan event.TypedGenericEvent[*v1alpha1.StorageMigrationPolicy]
	resync  chan struct{}
	mu      sync.Mutex
	targets map[string]*fleetTarget    // policy/secret -> target
	wanted  map[string]map[string]bool // policy -> shard keys it selects
}

// SetupWithManager registers the reconciler and the Clusters it runs targets in.
func (r *FleetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Options.ProbeEvery <= 0 {
		r.Options.ProbeEvery = 30 * time.Second
	}
	if r.Options.ProbeTimeout <= 0 {
		r.Options.ProbeTimeout = 10 * time.Second
	}
	if r.Options.MaxBackoff <= 0 {
		r.Options.MaxBackoff = time.Minute
	}
	r.kick = make(chan event.TypedGenericEvent[*v1alpha1.StorageMigrationPolicy], 64)
	r.resync = make(chan struct{}, 1)
	r.targets = map[string]*fleetTarget{}
	r.wanted = map[string]map[string]bool{}
	if r.Reader == nil {
		r.Reader = r.Client
	}
	if err := mgr.Add(r.Clusters); err != nil {
		return err
	}
	// A change of the targets this replica owns looks at every fleet policy again.
	r.Shard.OnChange(func([]string) {
		select {
		case r.resync <- struct{}{}:
		default:
		}
	})
	// Stop every target when the manager stops.
	if err := mgr.Add(runnable{start: func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				r.stopAll()
				return nil
			case <-r.resync:
				r.kickAll(ctx)
			}
		}
	}}); err != nil {
		return err
	}
	leader := false
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.StorageMigrationPolicy{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.policiesOfSecret)).
		WatchesRawSource(source.Channel(r.kick, &handler.TypedEnqueueRequestForObject[*v1alpha1.StorageMigrationPolicy]{})).
		Named("fleet").
		// Every replica runs the targets it owns.
		WithOptions(ctrlcontroller.Options{NeedLeaderElection: &leader}).
		Complete(r)
}

// kickAll asks for every fleet policy to be reconciled.
func (r *FleetReconciler) kickAll(ctx context.Context) {
	var list v1alpha1.StorageMigrationPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing policies")
		return
	}
	for _, p := range list.Items {
		if p.Spec.Targets == nil {
			continue
		}
		select {
		case r.kick <- event.TypedGenericEvent[*v1alpha1.StorageMigrationPolicy]{Object: &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: p.Name}}}:
		case <-ctx.Done():
			return
		}
	}
}

func (r *FleetReconciler) policiesOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.StorageMigrationPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing policies")
		return nil
	}
	var out []reconcile.Request
	for _, p := range list.Items {
		if p.Spec.Targets != nil && p.Spec.Targets.Namespace == o.GetNamespace() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
		}
	}
	return out
}

// Reconcile makes the running targets of one policy those of its Secrets that this
// replica owns, and writes their states into status.clusters.
func (r *FleetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := &v1alpha1.StorageMigrationPolicy{}
	err := r.Client.Get(ctx, req.NamespacedName, p)
	if apierrors.IsNotFound(err) || err == nil && (p.Spec.Targets == nil || !p.DeletionTimestamp.IsZero()) {
		r.want(req.Name, nil)
		r.sync(req.Name, nil)
		r.updateGauge()
		if err == nil && len(p.Status.Clusters) > 0 {
			return ctrl.Result{}, r.writeClusters(ctx, p.Name, nil, nil)
		}
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	want, err := r.desired(ctx, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	keys := make(map[string]bool, len(want))
	mine := make([]*fleetTarget, 0, len(want))
	for _, t := range want {
		keys[t.shardKey()] = true
		if r.Shard.Owns(t.shardKey()) {
			mine = append(mine, t)
		}
	}
	r.want(p.Name, keys)
	running := r.sync(p.Name, mine)
	for _, t := range running {
		t.poke() // the policy may have changed: look again
	}
	out := make([]v1alpha1.ClusterStatus, 0, len(running))
	for _, t := range running {
		out = append(out, t.status())
	}
	r.updateGauge()
	selected := make(map[string]bool, len(want))
	for _, t := range want {
		selected[t.secret] = true
	}
	return ctrl.Result{}, r.writeClusters(ctx, p.Name, out, selected)
}

// want records the shard keys policy selects (nil: none), and tells the Shard the
// union of every policy's.
func (r *FleetReconciler) want(policy string, keys map[string]bool) {
	r.mu.Lock()
	if keys == nil {
		delete(r.wanted, policy)
	} else {
		r.wanted[policy] = keys
	}
	all := map[string]bool{}
	for _, ks := range r.wanted {
		maps.Copy(all, ks)
	}
	r.mu.Unlock()
	r.Shard.Want(slices.Collect(maps.Keys(all)))
}

// writeClusters puts this replica's entries (mine) into the policy's status.clusters,
// keeps the other replicas' entries of Secrets the policy still selects (selected) and
// drops the rest. Replicas write at once, so it reads the policy uncached and writes with
// its resourceVersion, again after a conflict.
func (r *FleetReconciler) writeClusters(ctx context.Context, policy string, mine []v1alpha1.ClusterStatus, selected map[string]bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &v1alpha1.StorageMigrationPolicy{}
		if err := r.Reader.Get(ctx, client.ObjectKey{Name: policy}, p); err != nil {
			return client.IgnoreNotFound(err)
		}
		clusters := mergeClusters(p.Status.Clusters, mine, selected)
		if equality.Semantic.DeepEqual(p.Status.Clusters, clusters) {
			return nil
		}
		base := p.DeepCopy()
		p.Status.Clusters = clusters
		return r.Client.Status().Patch(ctx, p, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
}

// mergeClusters is status.clusters with this replica's entries (mine) in, the others'
// kept while their Secret is selected, sorted by name.
func mergeClusters(cur, mine []v1alpha1.ClusterStatus, selected map[string]bool) []v1alpha1.ClusterStatus {
	own := make(map[string]bool, len(mine))
	for _, c := range mine {
		own[c.Secret] = true
	}
	out := slices.Clone(mine)
	for _, c := range cur {
		if selected[c.Secret] && !own[c.Secret] {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b v1alpha1.ClusterStatus) int { return strings.Compare(a.Name, b.Name) })
	if len(out) == 0 {
		return nil
	}
	return out
}

// desired reads the Secrets the policy selects into targets (not yet running).
func (r *FleetReconciler) desired(ctx context.Context, p *v1alpha1.StorageMigrationPolicy) ([]*fleetTarget, error) {
	sel, err := p.TargetSelector()
	if err != nil {
		return nil, err
	}
	var secrets corev1.SecretList
	if err := r.Client.List(ctx, &secrets, client.InNamespace(p.Spec.Targets.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list kubeconfig Secrets in %s: %w", p.Spec.Targets.Namespace, err)
	}
	out := make([]*fleetTarget, 0, len(secrets.Items))
	for i := range secrets.Items {
		s := &secrets.Items[i]
		t := &fleetTarget{r: r, policy: p.Name, namespace: s.Namespace, secret: s.Name, cluster: kubeclient.ClusterName(s)}
		var kc kubeclient.Kubeconfig
		t.cfg, kc, t.cfgErr = kubeclient.ReadKubeconfig(s, p.Spec.Targets.Key)
		t.key, t.hash = kc.Key, kc.Hash
		if t.cfg != nil && r.WrapTarget != nil {
			t.cfg.Wrap(r.WrapTarget)
		}
		out = append(out, t)
	}
	return out, nil
}

// sync starts the wanted targets that do not run yet (or run an older kubeconfig) and
// stops the policy's others. It returns the policy's running targets.
func (r *FleetReconciler) sync(policy string, want []*fleetTarget) []*fleetTarget {
	var running, stopping []*fleetTarget
	r.mu.Lock()
	keep := map[string]bool{}
	for _, t := range want {
		id := policy + "/" + t.secret
		keep[id] = true
		if old := r.targets[id]; old != nil {
			if old.hash == t.hash && old.key == t.key && old.cluster == t.cluster {
				running = append(running, old)
				continue
			}
			stopping = append(stopping, old)
		}
		t.start()
		r.targets[id] = t
		running = append(running, t)
	}
	for id, t := range r.targets {
		if t.policy == policy && !keep[id] {
			stopping = append(stopping, t)
			delete(r.targets, id)
		}
	}
	r.mu.Unlock()
	// Outside the lock: a target finishing a sync must not hold up the others.
	for _, t := range stopping {
		t.stop()
	}
	return running
}

func (r *FleetReconciler) stopAll() {
	r.mu.Lock()
	all := r.targets
	r.targets = map[string]*fleetTarget{}
	r.mu.Unlock()
	for _, t := range all {
		t.stop()
	}
}

func (r *FleetReconciler) updateGauge() {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := map[string]int{v1alpha1.ClusterReady: 0, v1alpha1.ClusterUnreachable: 0, v1alpha1.ClusterForbidden: 0, v1alpha1.ClusterInvalid: 0}
	for _, t := range r.targets {
		n[t.status().State]++
	}
	for state, c := range n {
		metrics.FleetTargets.WithLabelValues(state).Set(float64(c))
	}
}

// notify asks for the policy's status to be written again.
func (r *FleetReconciler) notify(policy string) {
	select {
	case r.kick <- event.TypedGenericEvent[*v1alpha1.StorageMigrationPolicy]{Object: &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: policy}}}:
	default:
		// The queue is full of kicks already; one of them covers this.
	}
}

// fleetTarget is one target cluster of one policy.
type fleetTarget struct {
	r                         *FleetReconciler
	policy, namespace, secret string
	cluster, key, hash        string
	cfg                       *rest.Config
	cfgErr                    error
	cancel                    context.CancelFunc
	done                      chan struct{}
	wake                      chan struct{}
	mu                        sync.Mutex
	state                     v1alpha1.ClusterStatus
}

// shardKey is the target's key in the Shard: its Secret.
func (t *fleetTarget) shardKey() string { return shard.Key(t.namespace, t.secret) }

func (t *fleetTarget) start() {
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel, t.done, t.wake = cancel, make(chan struct{}), make(chan struct{}, 1)
	t.state = v1alpha1.ClusterStatus{Name: t.cluster, Secret: t.secret, KubeconfigHash: t.hash, State: v1alpha1.ClusterUnreachable, Reason: "not probed yet",
		Replica: t.r.Shard.Replica()}
	go func() {
		defer close(t.done)
		t.run(ctx)
	}()
}

// stop cancels the target and waits for its goroutine, which stops its informer.
func (t *fleetTarget) stop() {
	t.cancel()
	<-t.done
}

func (t *fleetTarget) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (t *fleetTarget) status() v1alpha1.ClusterStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return *t.state.DeepCopy()
}

func (t *fleetTarget) set(st v1alpha1.ClusterStatus) {
	t.mu.Lock()
	prev := t.state
	st.Name, st.Secret, st.KubeconfigHash, st.Replica = t.cluster, t.secret, t.hash, t.r.Shard.Replica()
	st.LastTransitionTime = prev.LastTransitionTime
	if prev.State != st.State || st.LastTransitionTime == nil {
		now := metav1.Now()
		st.LastTransitionTime = &now
	}
	changed := !equality.Semantic.DeepEqual(prev, st)
	t.state = st
	t.mu.Unlock()
	if changed {
		t.r.notify(t.policy)
	}
}

// run looks after the target until ctx ends: sync, then wait for a CRD change, a poke,
// the next probe or, after a failure, this target's own backoff.
func (t *fleetTarget) run(ctx context.Context) {
	logger := log.FromContext(ctx).WithValues("policy", t.policy, "cluster", t.cluster)
	if t.cfgErr != nil {
		t.set(v1alpha1.ClusterStatus{State: v1alpha1.ClusterInvalid, Reason: t.cfgErr.Error()})
		<-ctx.Done()
		return
	}
	key := livecluster.Key("fleet", t.policy, t.namespace, t.secret, t.hash)
	defer t.r.Clusters.Remove(key)
	backoff := t.newBackoff()
	var unwatch func()
	defer func() {
		if unwatch != nil {
			unwatch()
		}
	}()
	for {
		err := t.syncOnce(ctx, key, &unwatch)
		wait := t.r.Options.ProbeEvery
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			t.set(stateOf(err))
			wait = backoff.Step()
			logger.V(1).Info("target not ready", "error", err.Error(), "retryIn", wait)
		default:
			backoff = t.newBackoff()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-t.wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

func (t *fleetTarget) newBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: t.r.Options.MaxBackoff}
}

// syncOnce reads the target's CRDs (from its informer, checked against one LIST of their
// metadata), records its state and makes sure a StorageMigration runs for each selected
// CRD with stale storedVersions.
func (t *fleetTarget) syncOnce(ctx context.Context, key string, unwatch *func()) error {
	pctx, cancel := context.WithTimeout(ctx, t.r.Options.ProbeTimeout)
	defer cancel()
	target, err := t.r.Clusters.Get(pctx, key, t.cfg, false)
	if err != nil {
		return err
	}
	if *unwatch == nil {
		if *unwatch, err = t.r.Clusters.OnCRDChange(key, t.poke); err != nil {
			return err
		}
	}
	crds, err := target.Cluster.CRDs(pctx)
	if err != nil {
		return err
	}
	p := &v1alpha1.StorageMigrationPolicy{}
	if err := t.r.Client.Get(ctx, client.ObjectKey{Name: t.policy}, p); err != nil {
		return client.IgnoreNotFound(err)
	}
	st := v1alpha1.ClusterStatus{State: v1alpha1.ClusterReady}
	names := slices.Sorted(maps.Keys(crds))
	selected, err := v1alpha1.Select([]*v1alpha1.StorageMigrationPolicy{p}, slices.Collect(maps.Values(crds)), nil)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		crd := crds[name]
		if selected[name] == nil {
			continue
		}
		st.EligibleCRDs++
		if !migrate.NeedsMigration(crd) {
			continue
		}
		st.PendingCRDs = append(st.PendingCRDs, name)
		if !p.IsProactive() || !established(crd) {
			continue
		}
		if err := t.ensure(ctx, p, crd, target.Cluster); err != nil {
			errs = append(errs, err)
		}
	}
	t.set(st)
	return errors.Join(errs...)
}

func (t *fleetTarget) ensure(ctx context.Context, p *v1alpha1.StorageMigrationPolicy, crd *apiextv1.CustomResourceDefinition, cluster *livecluster.KubeCluster) error {
	ref := &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: t.namespace, Name: t.secret, Key: t.key}}
	live := func(ctx context.Context) (*apiextv1.CustomResourceDefinition, error) {
		return cluster.CRD(ctx, crd.Name)
	}
	created, err := ensureMigration(ctx, t.r.Client, FleetName(t.cluster, crd.Name), crd, live, p, map[string]string{LabelCluster: t.cluster}, ref)
	if created {
		log.FromContext(ctx).Info("proactive migration created", "cluster", t.cluster, "crd", crd.Name, "storedVersions", crd.Status.StoredVersions, "policy", p.Name)
	}
	return err
}

// FleetName is the name of the StorageMigration proactive mode keeps for a CRD of a
// target cluster.
func FleetName(cluster, crd string) string {
	return kubename.Shorten("fleet-"+cluster+"."+crd, kubename.MaxName, cluster+"/"+crd)
}

// stateOf turns a failed sync into the target's state.
func stateOf(err error) v1alpha1.ClusterStatus {
	switch {
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		return v1alpha1.ClusterStatus{State: v1alpha1.ClusterForbidden, Reason: err.Error()}
	default:
		return v1alpha1.ClusterStatus{State: v1alpha1.ClusterUnreachable, Reason: err.Error()}
	}
}

// fleetSummary fills a fleet policy's totals and Ready condition from status.clusters.
func fleetSummary(p *v1alpha1.StorageMigrationPolicy, st *v1alpha1.StorageMigrationPolicyStatus, ready *metav1.Condition) {
	var notReady []string
	for _, c := range p.Status.Clusters {
		st.EligibleCRDs += c.EligibleCRDs
		for _, crd := range c.PendingCRDs {
			st.PendingCRDs = append(st.PendingCRDs, c.Name+"/"+crd)
		}
		if c.State != v1alpha1.ClusterReady {
			notReady = append(notReady, c.Name+" "+c.State)
		}
	}
	if len(notReady) > 0 {
		ready.Status, ready.Reason = metav1.ConditionFalse, v1alpha1.ReasonClustersNotReady
		ready.Message = fmt.Sprintf("%d of %d target clusters not ready: %s", len(notReady), len(p.Status.Clusters), strings.Join(notReady, ", "))
		return
	}
	ready.Reason = v1alpha1.ReasonSelected
	ready.Message = fmt.Sprintf("%d target clusters ready, %d CRDs selected, %d with stale storedVersions", len(p.Status.Clusters), st.EligibleCRDs, len(st.PendingCRDs))
}
