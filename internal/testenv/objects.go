package testenv

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Objects describes custom resources to create for a scenario.
type Objects struct {
	GVR        schema.GroupVersionResource
	Kind       string
	Namespaces []string // empty for cluster-scoped resources
	PerNS      int
	Spec       map[string]any
}

// CreateObjects creates the objects (and their namespaces) at GVR.Version, which makes the
// API server store them at the CRD's storage version of that moment. It writes with 16
// workers and no client-side rate limit, so scenarios and benchmarks with many objects
// set up quickly.
func CreateObjects(ctx context.Context, cfg *rest.Config, o Objects) error {
	cfg = rest.CopyConfig(cfg)
	cfg.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// A CRD created a moment ago (by `helm install` from templates/, which Helm does not
	// wait for) is served only once the API server has accepted its names; until then a
	// create is a 404. Wait until a LIST is answered.
	var last error
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = dyn.Resource(o.GVR).List(ctx, metav1.ListOptions{Limit: 1})
		return !apierrors.IsNotFound(last), nil
	})
	if err != nil {
		return fmt.Errorf("%s is not served: %w (last answer: %w)", o.GVR, err, last)
	}
	namespaces := o.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	for _, ns := range namespaces {
		if ns != "" {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(o.GVR)
		if ns != "" {
			ri = dyn.Resource(o.GVR).Namespace(ns)
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range o.PerNS {
			g.Go(func() error {
				obj := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": o.GVR.GroupVersion().String(),
					"kind":       o.Kind,
					"metadata":   map[string]any{"name": fmt.Sprintf("obj-%d", i)},
					"spec":       o.Spec,
				}}
				if _, err := ri.Create(gctx, obj, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("create %s %s/obj-%d: %w", o.Kind, ns, i, err)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	return nil
}
