package migrate_test

import (
	"context"
	"net/http"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/apf"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// TestAPFObjectsHoldTheMigrationsWrites: with the objects of pkg/apf for the controller's
// ServiceAccount, the real API server classifies every PATCH of a migration under
// upgradeguard's FlowSchema and priority level (its dispatched-requests counter grows by
// the objects migrated, and the Observer reads the same from the responses), while the
// same identity's reads stay where they were, and another user's migration is not held.
func TestAPFObjectsHoldTheMigrationsWrites(t *testing.T) {
	e := fluxState(t, []string{"a", "b"}, 20)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	pl, fs := apf.Objects(apf.Options{Subjects: []flowcontrolv1.Subject{apf.ServiceAccount("upgradeguard-system", "upgradeguard")}})
	t.Cleanup(func() {
		ctx := context.WithoutCancel(e.ctx)
		_ = cs.FlowcontrolV1().FlowSchemas().Delete(ctx, apf.Name, metav1.DeleteOptions{})
		_ = cs.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, apf.Name, metav1.DeleteOptions{})
	})
	// Apply returns once the API server has taken the FlowSchema in.
	if err := apf.Apply(e.ctx, cs, pl, fs); err != nil {
		t.Fatal(err)
	}

	// The controller's identity as the API server sees a ServiceAccount token's; outside
	// system:masters, whose requests are exempt from Priority and Fairness.
	user := "system:serviceaccount:upgradeguard-system:upgradeguard"
	sa, err := cp.AddUser(user, "system:serviceaccounts", "system:serviceaccounts:upgradeguard-system")
	if err != nil {
		t.Fatal(err)
	}
	other, err := cp.AddUser("apf-other")
	if err != nil {
		t.Fatal(err)
	}
	cp.GrantClusterAdmin(t, user, "system:serviceaccounts", "system:serviceaccounts:upgradeguard-system")
	cp.GrantClusterAdmin(t, "apf-other")

	// Another user's write is not held by the FlowSchema.
	otherCfg, otherSeen := apf.Observe(other)
	if _, err := dynamic.NewForConfigOrDie(otherCfg).Resource(hrV1).Namespace("a").Patch(e.ctx, "obj-0", types.MergePatchType, []byte("{}"), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if p := otherSeen.Placement(e.ctx, cs, apf.Name); p == nil || p.Ours || p.FlowSchema == "" {
		t.Errorf("another user's PATCH ran under %+v, want a FlowSchema other than %s", p, apf.Name)
	}

	before := flowMetric(t, cs, "apiserver_flowcontrol_dispatched_requests_total", apf.Name)
	cfg, seen := apf.Observe(sa)
	res, err := newMigrator(t, cfg).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil || res.Status != migrate.Migrated || res.Rewritten != 39 { // obj-0 was written above
		t.Fatalf("the controller's migration: %v %+v", err, res)
	}
	want := apf.Placement{FlowSchema: apf.Name, PriorityLevel: apf.Name, Ours: true}
	if p := seen.Placement(e.ctx, cs, apf.Name); p == nil || p.FlowSchema != want.FlowSchema || p.PriorityLevel != want.PriorityLevel || !p.Ours {
		t.Errorf("the controller's writes ran under %+v, want %+v", p, want)
	}
	if got := flowMetric(t, cs, "apiserver_flowcontrol_dispatched_requests_total", apf.Name) - before; got < 39 {
		t.Errorf("apiserver_flowcontrol_dispatched_requests_total{flow_schema=%q} grew by %v, want at least the 39 PATCHes of the objects it rewrote", apf.Name, got)
	}

	// The same identity's reads keep their level.
	var readFlowSchema string
	read := *sa
	read.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil {
				readFlowSchema = resp.Header.Get(apf.HeaderFlowSchemaUID)
			}
			return resp, err
		})
	})
	if _, err := kubernetes.NewForConfigOrDie(&read).CoreV1().Namespaces().Get(e.ctx, "a", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	ours, err := cs.FlowcontrolV1().FlowSchemas().Get(e.ctx, apf.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if readFlowSchema == "" || readFlowSchema == string(ours.UID) {
		t.Errorf("a GET by the controller's identity ran under FlowSchema UID %q (ours is %s), want another", readFlowSchema, ours.UID)
	}
}
