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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
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
type FleetReconciler struct {
	Client   client.Client
	Clusters *livecluster.Clusters
	Options  FleetOptions

	kick    chan event.TypedGenericEvent[*v1alpha1.StorageMigrationPolicy]
	mu      sync.Mutex
	targets map[string]*fleetTarget // policy/secret -> target
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
	r.targets = map[string]*fleetTarget{}
	if err := mgr.Add(r.Clusters); err != nil {
		return err
	}
	// Stop every target when the manager stops.
	if err := mgr.Add(ctrlRunnable(func(ctx context.Context) error {
		<-ctx.Done()
		r.stopAll()
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.StorageMigrationPolicy{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.policiesOfSecret)).
		WatchesRawSource(source.Channel(r.kick, &handler.TypedEnqueueRequestForObject[*v1alpha1.StorageMigrationPolicy]{})).
		Named("fleet").
		Complete(r)
}

type ctrlRunnable func(ctx context.Context) error

func (f ctrlRunnable) Start(ctx context.Context) error { return f(ctx) }

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

// Reconcile makes the running targets of one policy those its Secrets name now, and
// writes their states into status.clusters.
func (r *FleetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := &v1alpha1.StorageMigrationPolicy{}
	err := r.Client.Get(ctx, req.NamespacedName, p)
	if apierrors.IsNotFound(err) || err == nil && (p.Spec.Targets == nil || !p.DeletionTimestamp.IsZero()) {
		r.sync(req.Name, nil)
		if err == nil && len(p.Status.Clusters) > 0 {
			return ctrl.Result{}, r.writeClusters(ctx, p, nil)
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
	running := r.sync(p.Name, want)
	for _, t := range running {
		t.poke() // the policy may have changed: look again
	}
	out := make([]v1alpha1.ClusterStatus, 0, len(running))
	for _, t := range running {
		out = append(out, t.status())
	}
	slices.SortFunc(out, func(a, b v1alpha1.ClusterStatus) int { return strings.Compare(a.Name, b.Name) })
	r.updateGauge()
	return ctrl.Result{}, r.writeClusters(ctx, p, out)
}

func (r *FleetReconciler) writeClusters(ctx context.Context, p *v1alpha1.StorageMigrationPolicy, clusters []v1alpha1.ClusterStatus) error {
	if equality.Semantic.DeepEqual(p.Status.Clusters, clusters) {
		return nil
	}
	base := p.DeepCopy()
	p.Status.Clusters = clusters
	return r.Client.Status().Patch(ctx, p, client.MergeFrom(base))
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

func (t *fleetTarget) start() {
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel, t.done, t.wake = cancel, make(chan struct{}), make(chan struct{}, 1)
	t.state = v1alpha1.ClusterStatus{Name: t.cluster, Secret: t.secret, KubeconfigHash: t.hash, State: v1alpha1.ClusterUnreachable, Reason: "not probed yet"}
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
	st.Name, st.Secret, st.KubeconfigHash = t.cluster, t.secret, t.hash
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
		if err := t.ensure(ctx, p, crd); err != nil {
			errs = append(errs, err)
		}
	}
	t.set(st)
	return errors.Join(errs...)
}

func (t *fleetTarget) ensure(ctx context.Context, p *v1alpha1.StorageMigrationPolicy, crd *apiextv1.CustomResourceDefinition) error {
	ref := &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: t.namespace, Name: t.secret, Key: t.key}}
	created, err := ensureMigration(ctx, t.r.Client, FleetName(t.cluster, crd.Name), crd, p, map[string]string{LabelCluster: t.cluster}, ref)
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
