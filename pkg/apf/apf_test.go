package apf_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/apf"
)

// TestObjectsDefaults: zero options give the documented defaults, and the FlowSchema names
// the level and matches PATCH only.
func TestObjectsDefaults(t *testing.T) {
	pl, fs := apf.Objects(apf.Options{Subjects: []flowcontrolv1.Subject{apf.User("alice")}})
	l := pl.Spec.Limited
	if pl.Name != apf.Name || *l.NominalConcurrencyShares != apf.DefaultNominalConcurrencyShares || *l.LendablePercent != 0 ||
		*l.BorrowingLimitPercent != 0 || l.LimitResponse.Queuing.Queues != apf.DefaultQueues {
		t.Errorf("level %+v", pl)
	}
	r := fs.Spec.Rules[0].ResourceRules[0]
	if fs.Spec.PriorityLevelConfiguration.Name != pl.Name || fs.Spec.MatchingPrecedence != apf.DefaultMatchingPrecedence ||
		len(r.Verbs) != 1 || r.Verbs[0] != "patch" || fs.Spec.Rules[0].Subjects[0].User.Name != "alice" {
		t.Errorf("FlowSchema %+v", fs.Spec)
	}
	if pl, _ := apf.Objects(apf.Options{Name: "x-migrations"}); pl.Name != "x-migrations" {
		t.Errorf("Name not used: %s", pl.Name)
	}
}

// TestObserverRecordsTheFirstPatch: the Observer keeps the FlowSchema and level of the
// first PATCH response, not of other verbs, and Placement names them from the cluster's
// objects.
func TestObserverRecordsTheFirstPatch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fs := "uid-get"
		if r.Method == http.MethodPatch {
			fs = "uid-ours"
		}
		w.Header().Set(apf.HeaderFlowSchemaUID, fs)
		w.Header().Set(apf.HeaderPriorityLevelUID, "level-"+fs)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"a"}}`))
	}))
	defer srv.Close()
	cfg, seen := apf.Observe(&rest.Config{Host: srv.URL})
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	cluster := fake.NewClientset(
		&flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: apf.Name, UID: "uid-ours"}},
		&flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: apf.Name, UID: "level-uid-ours"}})

	if _, err := cs.CoreV1().Namespaces().Get(ctx, "a", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if p := seen.Placement(ctx, cluster, apf.Name); p != nil {
		t.Errorf("placement after a GET only: %+v, want none", p)
	}
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, "a", types.MergePatchType, []byte("{}"), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	want := apf.Placement{FlowSchema: apf.Name, PriorityLevel: apf.Name, FlowSchemaUID: "uid-ours", Ours: true}
	if p := seen.Placement(ctx, cluster, apf.Name); p == nil || *p != want {
		t.Errorf("placement %+v, want %+v", p, want)
	}
	if p := seen.Placement(ctx, cluster, "someone-elses"); p == nil || p.Ours {
		t.Errorf("placement against another FlowSchema: %+v, want not ours", p)
	}
}
