package fluxgate_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// waitRollbackHeld waits until helm-controller's Ready message carries the
// release-record gate's denial of its remediation rollback and the gate has recorded a
// blocked decision on the HelmRelease, and returns the HelmRelease.
func waitRollbackHeld(t *testing.T, ns, name string) *helmv2.HelmRelease {
	t.Helper()
	var msgs []string
	last, err := env.Flux.WaitHelmRelease(t.Context(), ns, name, 4*time.Minute, func(hr *helmv2.HelmRelease) bool {
		m := fluxtest.ReadyMessage(hr)
		if len(msgs) == 0 || msgs[len(msgs)-1] != m {
			msgs = append(msgs, m)
		}
		// helm-controller writes the denial into Ready, and the gate records its decision on
		// the HelmRelease after answering: two writers, in either order.
		return strings.Contains(m, `admission webhook "release.upgradeguard.io" denied the request`) &&
			webhook.ParseState(&hr.ObjectMeta).Decision == webhook.OutcomeBlocked
	})
	if err != nil {
		t.Fatalf("the remediation rollback was not held: %v\nReady messages:\n%s\n%s", err, strings.Join(msgs, "\n"), env.Flux.LogTail(30))
	}
	t.Logf("Ready messages:\n  %s", strings.Join(msgs, "\n  "))
	return last
}

// noRollbackStored asserts that helm history holds no rollback revision: the failed
// upgrade is still the last revision.
func noRollbackStored(t *testing.T, ns, name string) {
	t.Helper()
	for _, r := range fluxtest.History(t, env, ns, name) {
		if strings.HasPrefix(r.Description, "Rollback to") {
			t.Errorf("a rollback revision was stored: %+v", r)
		}
	}
}

// TestRemediationRollbackNeedsReverseMigration: helm-controller upgrades sprockets 1.0.0
// (v1alpha1 only) to 2.0.0 (v1alpha1 and v1, storage v1), which the gates admit: the CRD
// is applied, storage moves to v1, and then the upgrade fails on another object. Its
// remediation (strategy rollback) rolls back to 1.0.0, whose CRD drops the live storage
// version v1: the API server would reject it half-way. The release-record gate denies
// helm-controller's pending-rollback record with the reverse migration to run; the
// rollback applies nothing (the CRD keeps 2.0.0's spec, every object stays readable) and
// the reason is on the HelmRelease.
func TestRemediationRollbackNeedsReverseMigration(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	ns := "rollback-reverse"
	crdName := "sprockets." + fluxtest.RollbackGroup
	hr := fluxtest.RemediatedRelease(t, env, ns, "sprockets", "1.0.0", 0, []string{
		fluxtest.TemplatesChart(t, "sprockets", "1.0.0", map[string]string{"crd.yaml": fluxtest.CRDDoc("Sprocket", "v1alpha1")}),
		fluxtest.TemplatesChart(t, "sprockets", "2.0.0", map[string]string{"crd.yaml": fluxtest.CRDDoc("Sprocket", "v1alpha1", "v1"), "broken.yaml": fluxtest.BrokenService}),
	}, crdName)
	dyn := dynamic.NewForConfigOrDie(env.CP.Config)
	gvr := schema.GroupVersionResource{Group: fluxtest.RollbackGroup, Resource: "sprockets"}
	for i := range 2 {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": fluxtest.RollbackGroup + "/v1alpha1", "kind": "Sprocket",
			"metadata": map[string]any{"name": fmt.Sprintf("s-%d", i)}, "spec": map[string]any{"teeth": int64(12)}}}
		gvr.Version = "v1alpha1"
		if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	if err := env.Flux.Update(ctx, hr, func() { hr.Spec.Chart.Spec.Version = "2.0.0" }); err != nil {
		t.Fatalf("the version bump to 2.0.0 (safe for its CRD): %v", err)
	}
	last := waitRollbackHeld(t, ns, "sprockets")
	msg := fluxtest.ReadyMessage(last)
	for _, want := range []string{
		"upgradeguard denied the rollback of release rollback-reverse/sprockets to revision 1 (chart sprockets@1.0.0",
		"before anything was applied", "live storage version v1 is dropped by the incoming CRD",
		"upgradeguard migrate --rollback --release sprockets -n rollback-reverse --to-revision 1 --allow-storage-switch",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Ready message lacks %q:\n%s", want, msg)
		}
	}
	// The rollback applied nothing: 2.0.0's CRD is live, storage v1, objects readable.
	var crd apiextv1.CustomResourceDefinition
	if err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: crdName}, &crd); err != nil {
		t.Fatal(err)
	}
	var served []string
	for _, v := range crd.Spec.Versions {
		served = append(served, v.Name)
	}
	if !slices.Equal(served, []string{"v1alpha1", "v1"}) || !slices.Equal(crd.Status.StoredVersions, []string{"v1alpha1", "v1"}) {
		t.Errorf("the CRD after the held rollback: versions %v storedVersions %v, want 2.0.0's", served, crd.Status.StoredVersions)
	}
	gvr.Version = "v1"
	if list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 2 {
		t.Errorf("sprockets at v1 after the held rollback: %v", err)
	}
	noRollbackStored(t, ns, "sprockets")
	st := webhook.ParseState(&last.ObjectMeta)
	if st.Decision != webhook.OutcomeBlocked || !strings.Contains(st.Message, "rollback of release rollback-reverse/sprockets") {
		t.Errorf("gate annotation on the HelmRelease = %+v, want blocked with the rollback's reason", st)
	}
}

// TestRemediationRollbackWouldDeleteCRD: gears 1.0.0 renders a ConfigMap; 2.0.0 adds the
// Gear CRD to templates/ and a Deployment that never becomes ready. helm-controller's
// upgrade applies both, the Gear objects are created while it waits, and the wait times
// out. Its remediation rolls back to 1.0.0, which no longer renders the CRD: Helm would
// delete the CRD and every Gear with it. The release-record gate denies the
// pending-rollback record with that reason and the way out (keep the CRD); the CRD and
// its objects stay, and the reason is on the HelmRelease.
func TestRemediationRollbackWouldDeleteCRD(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	ns := "rollback-delete"
	crdName := fluxtest.GearsCRD
	_, gears := fluxtest.GearsInUse(t, env, ns)

	last := waitRollbackHeld(t, ns, "gears")
	msg := fluxtest.ReadyMessage(last)
	for _, want := range []string{
		"upgradeguard denied the rollback of release rollback-delete/gears to revision 1 (chart gears@1.0.0",
		"before anything was applied", crdName + ": the rollback target no longer renders it, so Helm deletes the CRD and",
		"kubectl annotate crd " + crdName + " helm.sh/resource-policy=keep",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Ready message lacks %q:\n%s", want, msg)
		}
	}
	// The rollback applied nothing: the CRD and both Gears are there.
	if err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: crdName}, &apiextv1.CustomResourceDefinition{}); err != nil {
		t.Errorf("the CRD after the held rollback: %v", err)
	}
	if list, err := gears.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 2 {
		t.Errorf("Gears after the held rollback: %v", err)
	}
	noRollbackStored(t, ns, "gears")
	st := webhook.ParseState(&last.ObjectMeta)
	if st.Decision != webhook.OutcomeBlocked || !strings.Contains(st.Message, "rollback of release rollback-delete/gears") {
		t.Errorf("gate annotation on the HelmRelease = %+v, want blocked with the rollback's reason", st)
	}
}
