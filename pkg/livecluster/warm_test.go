package livecluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// TestWarmPastAForbiddenResource: a warm-up whose identity may list one CRD's objects but
// not another's waits for the forbidden resource's informer (which never syncs) only
// SyncTimeout from that informer's start, not until its caller gives up: it returns with
// the allowed resource's informers synced, the forbidden one's not, and the forbidden
// LIST as its error.
func TestWarmPastAForbiddenResource(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	const allowed, forbidden = "allowed.warm.example.io", "forbidden.warm.example.io"
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	for _, group := range []string{allowed, forbidden} {
		if err := testenv.ApplyCRD(ctx, cs, testenv.TwoVersionCRD(group, "gadgets", "Gadget")); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = cp.DeleteCRDs(context.Background(), func(c *apiextv1.CustomResourceDefinition) bool {
			return c.Spec.Group != allowed && c.Spec.Group != forbidden
		})
	})
	const user = "warm-limited"
	cp.Grant(t, user, []rbacv1.PolicyRule{
		{APIGroups: []string{apiextv1.GroupName}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"storagemigration.k8s.io"}, Resources: []string{"storageversionmigrations"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{allowed}, Resources: []string{"gadgets"}, Verbs: []string{"list", "watch"}},
	}...)
	cfg, err := cp.AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	const syncTimeout = 5 * time.Second
	target, _ := testenv.CountedTarget(t, cfg, livecluster.ClustersOptions{SyncTimeout: syncTimeout}, false)

	// Well before the gate's 30-second limit: waiting for every informer of the target,
	// the warm-up would still be waiting for the forbidden one when this ends.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = target.Cluster.Warm(wctx, check.Warming{CRDs: []string{"gadgets." + allowed, "gadgets." + forbidden}, PageLimit: 500})
	if wctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the warm-up waited for the forbidden resource until its caller gave up (error: %v)", err)
	}
	if !apierrors.IsForbidden(err) {
		t.Errorf("error %v, want the forbidden LIST of %s", err, forbidden)
	}
	synced := livecluster.Synced(target.Cluster)
	for _, v := range []string{"v1alpha1", "v1"} {
		if key := "objects/" + allowed + "/" + v + ", Resource=gadgets"; !synced[key] {
			t.Errorf("informer %s not synced after the warm-up (informers: %v)", key, synced)
		}
		if key := "objects/" + forbidden + "/" + v + ", Resource=gadgets"; synced[key] {
			t.Errorf("informer %s synced, but its identity may not list it", key)
		} else if _, ok := synced[key]; !ok {
			t.Errorf("no informer %s: the warm-up did not start it (informers: %v)", key, synced)
		}
	}
}
