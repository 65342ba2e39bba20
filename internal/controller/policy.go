package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// +kubebuilder:rbac:groups=upgradeguard.io,resources=storagemigrationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=upgradeguard.io,resources=storagemigrationpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions/status,verbs=get;update;patch
// The admission gates evaluate the admission policies that match the CRD writes they predict (livecluster.KubeCluster.PolicyDenials), from informers.
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,verbs=get;list;watch

// Labels on the StorageMigrations the proactive mode creates.
const (
	LabelPolicy    = "upgradeguard.io/policy"
	LabelProactive = "upgradeguard.io/proactive"
	// AnnotationCRD names the CRD a proactive StorageMigration is for.
	AnnotationCRD = "upgradeguard.io/crd"
	// AnnotationCRDGeneration is the CRD's generation when the proactive
	// StorageMigration was created.
	AnnotationCRDGeneration = "upgradeguard.io/crd-generation"
)

// ProactiveReconciler watches CRDs and, for every CRD a proactive StorageMigrationPolicy
// selects whose storedVersions hold more than its storage version, makes sure a
// StorageMigration is migrating it. Migrating to the live storage version is always safe.
type ProactiveReconciler struct {
	Client client.Client
	// Reader reads a CRD uncached, before a succeeded StorageMigration is replaced: the
	// cache may not hold the prune that ended it yet. Unset, Client is used.
	Reader client.Reader
}

// SetupWithManager registers the reconciler: keyed by CRD name, triggered by CRDs,
// policies (every CRD) and the StorageMigrations it created (their CRD).
func (r *ProactiveReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiextv1.CustomResourceDefinition{}).
		Watches(&v1alpha1.StorageMigrationPolicy{}, handler.EnqueueRequestsFromMapFunc(r.allCRDs)).
		Watches(&v1alpha1.StorageMigration{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if crd := o.GetAnnotations()[AnnotationCRD]; crd != "" && o.GetLabels()[LabelCluster] == "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: crd}}}
			}
			return nil
		})).
		Named("proactive").
		Complete(r)
}

func (r *ProactiveReconciler) allCRDs(ctx context.Context, _ client.Object) []reconcile.Request {
	var list apiextv1.CustomResourceDefinitionList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing CRDs")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, c := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: c.Name}})
	}
	return out
}

// Reconcile looks at one CRD.
func (r *ProactiveReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	crd := &apiextv1.CustomResourceDefinition{}
	if err := r.Client.Get(ctx, req.NamespacedName, crd); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	policy, err := r.policyFor(ctx, crd)
	if err != nil || policy == nil {
		return ctrl.Result{}, err
	}
	if !migrate.NeedsMigration(crd) || !established(crd) {
		return ctrl.Result{}, nil
	}
	live := func(ctx context.Context) (*apiextv1.CustomResourceDefinition, error) {
		reader := r.Reader
		if reader == nil {
			reader = r.Client
		}
		now := &apiextv1.CustomResourceDefinition{}
		return now, reader.Get(ctx, req.NamespacedName, now)
	}
	created, err := ensureMigration(ctx, r.Client, ProactiveName(crd.Name), crd, live, policy, nil, nil)
	if err != nil || !created {
		return ctrl.Result{}, err
	}
	log.FromContext(ctx).Info("proactive migration created", "crd", crd.Name, "storedVersions", crd.Status.StoredVersions, "policy", policy.Name)
	return ctrl.Result{}, nil
}

// ensureMigration makes sure a StorageMigration named name is migrating crd (of the
// cluster kubeConfig points at, the local one when nil) for policy: it creates one, or
// replaces one that succeeded earlier (a later storage switch), or that failed before the
// CRD last changed or under another allowFieldLoss than the policy's now (an operator who
// accepts the loss a refusal named). A pending or running one, or one that failed
// otherwise, is kept: a failed one waits for an operator or a change to the CRD
// (docs/operator-guide.md). crd may come from a cache that has not seen the prune which
// ended a succeeded one yet, so a succeeded one is replaced only when live, the CRD read
// from its API server now, still needs a migration. It reports whether it created one.
func ensureMigration(ctx context.Context, c client.Client, name string, crd *apiextv1.CustomResourceDefinition,
	live func(context.Context) (*apiextv1.CustomResourceDefinition, error),
	policy *v1alpha1.StorageMigrationPolicy, labels map[string]string, kubeConfig *v1alpha1.KubeConfigReference) (bool, error) {
	generation := strconv.FormatInt(crd.Generation, 10)
	l := map[string]string{LabelPolicy: policy.Name, LabelProactive: "true"}
	for k, v := range labels {
		l[k] = v
	}
	want := &v1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      l,
			Annotations: map[string]string{AnnotationCRD: crd.Name, AnnotationCRDGeneration: generation},
		},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{crd.Name}, KubeConfig: kubeConfig, Rate: policy.Spec.Rate, Deadline: policy.Spec.Deadline,
			Mode: policy.Spec.Mode, Engine: policy.Spec.Engine, AllowFieldLoss: policy.Spec.AllowFieldLoss},
	}
	_, created, err := storagemigration.Ensure(ctx, c, c, want, storagemigration.Options{
		Replace: func(existing *v1alpha1.StorageMigration) bool {
			// It failed, and the CRD or the allowance has changed since (an upgrade that
			// may have fixed the cause): try again.
			replace := storagemigration.Failed(existing) && (existing.Annotations[AnnotationCRDGeneration] != generation ||
				existing.Spec.AllowFieldLoss != policy.Spec.AllowFieldLoss)
			if replace {
				log.FromContext(ctx).Info("replacing a failed StorageMigration: the CRD or the policy's allowFieldLoss changed since",
					"storageMigration", name, "crd", crd.Name)
			}
			return replace
		},
		ReplaceSucceeded: func(*v1alpha1.StorageMigration) (bool, error) {
			now, err := live(ctx)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("read CustomResourceDefinition %s: %w", crd.Name, err)
			}
			if !migrate.NeedsMigration(now) {
				return false, nil
			}
			log.FromContext(ctx).Info("replacing a succeeded StorageMigration: the CRD lists stale storedVersions again",
				"storageMigration", name, "crd", crd.Name, "storedVersions", now.Status.StoredVersions)
			return true, nil
		},
	})
	if err != nil {
		return false, fmt.Errorf("StorageMigration for %s: %w", crd.Name, err)
	}
	return created, nil
}

// policyFor is the first proactive policy (by name, v1alpha1.Select) that selects crd, or
// nil. A policy whose selector is invalid is a terminal error: it is logged, and the
// policy's correction (a policy event) reconciles every CRD again.
func (r *ProactiveReconciler) policyFor(ctx context.Context, crd *apiextv1.CustomResourceDefinition) (*v1alpha1.StorageMigrationPolicy, error) {
	var list v1alpha1.StorageMigrationPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	selected, err := v1alpha1.Select(list.Policies(), []*apiextv1.CustomResourceDefinition{crd}, func(p *v1alpha1.StorageMigrationPolicy) bool {
		// A policy with targets looks after those clusters (FleetReconciler).
		return p.IsProactive() && p.Spec.Targets == nil
	})
	if err != nil {
		return nil, reconcile.TerminalError(err)
	}
	return selected[crd.Name], nil
}

func established(crd *apiextv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextv1.Established {
			return c.Status == apiextv1.ConditionTrue
		}
	}
	return false
}

// ProactiveName is the name of the StorageMigration proactive mode keeps for a CRD.
func ProactiveName(crd string) string {
	return kubename.Shorten("proactive-"+crd, kubename.MaxName, crd)
}

// PolicyStatusReconciler keeps StorageMigrationPolicy status: how many CRDs it selects
// and which of them still need a migration.
type PolicyStatusReconciler struct {
	Client client.Client
	Reader client.Reader // uncached, for the policy itself
}

// SetupWithManager registers the reconciler; CRD changes refresh every policy.
func (r *PolicyStatusReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.StorageMigrationPolicy{}).
		Watches(&apiextv1.CustomResourceDefinition{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			var list v1alpha1.StorageMigrationPolicyList
			if err := r.Client.List(ctx, &list); err != nil {
				return nil
			}
			out := make([]reconcile.Request, 0, len(list.Items))
			for _, p := range list.Items {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
			}
			return out
		})).
		Named("policystatus").
		Complete(r)
}

// Reconcile recomputes one policy's status.
func (r *PolicyStatusReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := &v1alpha1.StorageMigrationPolicy{}
	if err := r.Reader.Get(ctx, req.NamespacedName, p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var crds apiextv1.CustomResourceDefinitionList
	if err := r.Client.List(ctx, &crds); err != nil {
		return ctrl.Result{}, err
	}
	// status.clusters belongs to the fleet reconciler.
	st := v1alpha1.StorageMigrationPolicyStatus{ObservedGeneration: p.Generation, Conditions: p.Status.Conditions, PendingCRDs: []string{}, Clusters: p.Status.Clusters}
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSelected, ObservedGeneration: p.Generation}
	if p.Spec.Targets != nil {
		fleetSummary(p, &st, &ready)
		crds.Items = nil
	}
	all := make([]*apiextv1.CustomResourceDefinition, 0, len(crds.Items))
	for i := range crds.Items {
		all = append(all, &crds.Items[i])
	}
	selected, err := v1alpha1.Select([]*v1alpha1.StorageMigrationPolicy{p}, all, nil)
	if err != nil {
		ready = metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalidSelector, Message: err.Error(), ObservedGeneration: p.Generation}
	}
	for _, crd := range all {
		if selected[crd.Name] == nil {
			continue
		}
		st.EligibleCRDs++
		if migrate.NeedsMigration(crd) {
			st.PendingCRDs = append(st.PendingCRDs, crd.Name)
		}
	}
	if ready.Status == metav1.ConditionTrue && p.Spec.Targets == nil {
		ready.Message = fmt.Sprintf("%d CRDs selected, %d with stale storedVersions", st.EligibleCRDs, len(st.PendingCRDs))
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	slices.Sort(st.PendingCRDs)
	if equality.Semantic.DeepEqual(p.Status, st) {
		return ctrl.Result{}, nil
	}
	// A merge patch of the fields this reconciler owns: status.clusters is written by the
	// fleet reconciler at the same time.
	base := p.DeepCopy()
	p.Status = st
	return ctrl.Result{}, r.Client.Status().Patch(ctx, p, client.MergeFrom(base))
}
