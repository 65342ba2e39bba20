package controller

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/shard"
)

// IsFleetMigration says whether o is a StorageMigration a policy's targets made (labels
// upgradeguard.io/cluster and upgradeguard.io/policy, and a kubeConfig): it is run by the
// replica that owns its target.
func IsFleetMigration(o client.Object) bool {
	sm, ok := o.(*v1alpha1.StorageMigration)
	return ok && sm.Spec.KubeConfig != nil && sm.Labels[LabelCluster] != "" && sm.Labels[LabelPolicy] != ""
}

// TargetOf is the shard key of a fleet StorageMigration's target: its kubeconfig Secret.
func TargetOf(sm *v1alpha1.StorageMigration) string {
	ref := sm.Spec.KubeConfig.SecretRef
	return shard.Key(ref.Namespace, ref.Name)
}

// FleetMigrationReconciler runs the StorageMigrations of fleet targets, on every replica:
// each on the replica that owns its target (shard.Shard.Hold), so that a migration moves
// with its target and resumes there from its saved place. A migration whose target no
// policy selects any more is the leader's, as every migration was before targets were
// shared, so that it still ends.
type FleetMigrationReconciler struct {
	*StorageMigrationReconciler
	Shard *shard.Shard
	// Elected is closed once this replica leads (ctrl.Manager.Elected).
	Elected <-chan struct{}

	kick chan event.TypedGenericEvent[*v1alpha1.StorageMigration]
}

// SetupWithManager registers the reconciler (not leader-elected) and what wakes it: a
// change of the targets this replica owns, and becoming the leader.
func (r *FleetMigrationReconciler) SetupWithManager(mgr ctrl.Manager, o ctrlcontroller.Options) error {
	r.kick = make(chan event.TypedGenericEvent[*v1alpha1.StorageMigration], 1024)
	var stop <-chan struct{}
	ready := make(chan struct{})
	if err := mgr.Add(runnable{leader: false, start: func(ctx context.Context) error {
		stop = ctx.Done()
		close(ready)
		<-ctx.Done()
		return nil
	}}); err != nil {
		return err
	}
	enqueue := func(match func(*v1alpha1.StorageMigration) bool) {
		<-ready
		var list v1alpha1.StorageMigrationList
		if err := mgr.GetClient().List(context.Background(), &list, client.HasLabels{LabelCluster}); err != nil {
			log.Log.Error(err, "listing the fleet's StorageMigrations")
			return
		}
		for i := range list.Items {
			sm := &list.Items[i]
			if !IsFleetMigration(sm) || !match(sm) {
				continue
			}
			select {
			case r.kick <- event.TypedGenericEvent[*v1alpha1.StorageMigration]{Object: sm}:
			case <-stop:
				return
			}
		}
	}
	r.Shard.OnChange(func(keys []string) {
		go enqueue(func(sm *v1alpha1.StorageMigration) bool { return slices.Contains(keys, TargetOf(sm)) })
	})
	// The new leader looks at every fleet migration once, for those no policy selects.
	if err := mgr.Add(runnable{leader: true, start: func(context.Context) error {
		go enqueue(func(*v1alpha1.StorageMigration) bool { return true })
		return nil
	}}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.StorageMigration{}, builder.WithPredicates(predicate.NewPredicateFuncs(IsFleetMigration))).
		WatchesRawSource(source.Channel(r.kick, &handler.TypedEnqueueRequestForObject[*v1alpha1.StorageMigration]{})).
		Named("storagemigration-fleet").WithOptions(o).Complete(r)
}

// Reconcile runs the StorageMigration if this replica owns its target (or, for a target
// no policy selects, leads), with a context that ends when the ownership does.
func (r *FleetMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	sm := &v1alpha1.StorageMigration{}
	if err := r.Client.Get(ctx, req.NamespacedName, sm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !IsFleetMigration(sm) {
		return ctrl.Result{}, nil
	}
	selected, err := r.selected(ctx, sm)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !selected {
		select {
		case <-r.Elected:
			return r.StorageMigrationReconciler.Reconcile(ctx, req)
		default:
			return ctrl.Result{}, nil
		}
	}
	hctx, done, ok := r.Shard.Hold(ctx, TargetOf(sm))
	if !ok {
		return ctrl.Result{}, nil // another replica's; this one is told if it takes the target
	}
	defer done()
	return r.StorageMigrationReconciler.Reconcile(hctx, req)
}

// selected says whether the policy that made sm still selects its target's Secret.
func (r *FleetMigrationReconciler) selected(ctx context.Context, sm *v1alpha1.StorageMigration) (bool, error) {
	p := &v1alpha1.StorageMigrationPolicy{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: sm.Labels[LabelPolicy]}, p); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	ref := sm.Spec.KubeConfig.SecretRef
	if p.Spec.Targets == nil || !p.DeletionTimestamp.IsZero() || p.Spec.Targets.Namespace != ref.Namespace {
		return false, nil
	}
	sel, err := p.TargetSelector()
	if err != nil {
		return false, nil
	}
	s := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, s); apierrors.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(s.Labels)), nil
}

// runnable is a manager Runnable, leader-elected or not.
type runnable struct {
	leader bool
	start  func(ctx context.Context) error
}

func (f runnable) Start(ctx context.Context) error { return f.start(ctx) }
func (f runnable) NeedLeaderElection() bool        { return f.leader }
