package webhook

import (
	"context"
	"errors"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestWarmReadiness: the readiness check fails until the warm-up is over, and passes
// after it whether or not the HelmReleases could be read: a Pod that cannot warm is
// still Ready, and decides afresh. A release labelled gate=off is not warmed (the API
// server never sends it), and a cluster that serves no HelmReleases is not asked for them.
func TestWarmReadiness(t *testing.T) {
	s := runtime.NewScheme()
	if err := helmv2.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	off := &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "off", Labels: map[string]string{LabelGate: "off"}}}
	// Its source does not exist: its warm-up fails, and is only logged.
	on := &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "on"}}
	for _, tc := range []struct {
		name      string
		listFails bool
		noFlux    bool // the cluster serves no HelmReleases
		warmed    int64
	}{{"listed", false, false, 1}, {"list failed", true, false, 0}, {"no HelmRelease kind", false, true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(s).WithObjects(off.DeepCopy(), on.DeepCopy()).WithInterceptorFuncs(interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if tc.listFails {
						return errors.New("the cache is gone")
					}
					return c.List(ctx, list, opts...)
				}}).Build()
			w := &warmer{g: &Gate{reader: c}}
			if tc.noFlux {
				w.mapper = meta.NewDefaultRESTMapper(nil)
			}
			if w.ready(nil) == nil {
				t.Fatal("ready before the warm-up ran")
			}
			if err := w.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := w.ready(nil); err != nil {
				t.Fatalf("not ready after the warm-up: %v", err)
			}
			if n := w.releases.Load(); n != tc.warmed {
				t.Fatalf("warmed %d HelmReleases, want %d (one is labelled %s=off)", n, tc.warmed, LabelGate)
			}
		})
	}
}
