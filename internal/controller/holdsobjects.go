package controller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/upgradeguard/upgradeguard/pkg/crdguard"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// HoldsObjectsReconciler keeps crdguard.LabelHoldsObjects=true on every established CRD
// of this cluster that holds objects, and removes it from every one that holds none: the
// label the CRD deletion guard's admission policies read (pkg/crdguard). It counts each
// CRD's objects with an informer of its own on their metadata (livecluster.ObjectsInformer,
// at the version the CRD serves and stores), and is told of the first object created and
// the last one deleted as the informer's watch delivers them; it then writes the label
// with one PATCH. So the label follows within the watch's delay and one request, well
// under a second on a healthy connection (docs/operator-guide.md states the bound and its
// exceptions: a controller that is down or not yet elected, a watch being re-established,
// objects its RBAC may not list). Only the leader runs it.
type HoldsObjectsReconciler struct {
	Client client.Client
	// Metadata lists and watches the objects' metadata.
	Metadata metadata.Interface

	mu      sync.Mutex
	counted map[string]*counted // by CRD name
	ctx     context.Context     // the informers' (the controller's run)
	queue   workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// counted is one CRD's objects informer and its count of objects.
type counted struct {
	gvr  schema.GroupVersionResource
	stop context.CancelFunc
	// n counts the objects, from the informer's notifications in their order (an add
	// +1, a delete -1; a relist delivers what changed as adds, updates and deletes), so
	// it moves through 0 exactly when the label must change.
	n      atomic.Int64
	synced func() bool
}

// SetupWithManager registers the reconciler: keyed by CRD name, triggered by CRDs and by
// their objects informers when a CRD's count of objects leaves or reaches zero.
func (r *HoldsObjectsReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.counted = map[string]*counted{}
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiextv1.CustomResourceDefinition{}).
		WatchesRawSource(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.ctx, r.queue = ctx, q
			return nil
		})).
		Named("holdsobjects").
		Complete(r)
}

// Reconcile sets or removes the label of one CRD.
func (r *HoldsObjectsReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	crd := &apiextv1.CustomResourceDefinition{}
	if err := r.Client.Get(ctx, req.NamespacedName, crd); err != nil {
		r.forget(req.Name)
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	version := crdversions.ServedVersion(crd)
	if crd.DeletionTimestamp != nil || !established(crd) || version == "" {
		// Being deleted (the API server deletes its objects), not serving yet, or
		// serving nothing to count: the label is left as it is.
		r.forget(req.Name)
		return ctrl.Result{}, nil
	}
	c := r.count(req.Name, schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural})
	if c == nil || !c.synced() {
		return ctrl.Result{}, nil // the informer enqueues the CRD once it has synced
	}
	holds := c.n.Load() > 0
	if holds == (crd.Labels[crdguard.LabelHoldsObjects] == "true") {
		return ctrl.Result{}, nil
	}
	value := "null"
	if holds {
		value = `"true"`
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%s}}}`, crdguard.LabelHoldsObjects, value)
	if err := r.Client.Patch(ctx, crd, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return ctrl.Result{}, fmt.Errorf("label CustomResourceDefinition %s %s=%t: %w", crd.Name, crdguard.LabelHoldsObjects, holds, err)
	}
	log.FromContext(ctx).V(1).Info("CRD deletion guard label updated", "crd", crd.Name, "holdsObjects", holds)
	return ctrl.Result{}, nil
}

// count is the objects informer of CRD name at gvr, started on first use (and started
// again when the CRD serves its objects at another version); nil before the controller
// has started.
func (r *HoldsObjectsReconciler) count(name string, gvr schema.GroupVersionResource) *counted {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil {
		return nil
	}
	if c := r.counted[name]; c != nil {
		if c.gvr == gvr {
			return c
		}
		c.stop()
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}
	c := &counted{gvr: gvr}
	var ctx context.Context
	ctx, c.stop = context.WithCancel(r.ctx)
	inf := livecluster.ObjectsInformer(r.Metadata, gvr)
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			if c.n.Add(1) == 1 {
				r.queue.Add(req)
			}
		},
		DeleteFunc: func(any) {
			if c.n.Add(-1) == 0 {
				r.queue.Add(req)
			}
		},
	})
	if err != nil {
		c.stop()
		return nil
	}
	c.synced = reg.HasSynced
	go inf.RunWithContext(ctx)
	go func() {
		if toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			r.queue.Add(req)
		}
	}()
	r.counted[name] = c
	return c
}

// forget stops the objects informer of CRD name, if any.
func (r *HoldsObjectsReconciler) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.counted[name]; c != nil {
		c.stop()
		delete(r.counted, name)
	}
}
