package livecluster_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// svmDiscovery counts discovery requests for the StorageVersionMigration API.
func svmDiscovery(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/apis/"+svm.Group) && !strings.HasSuffix(r.URL.Path, "/storageversionmigrations")
}

// TestRepeatedChecksReadWhatChanged: checks repeated through one KubeCluster (a process
// that checks again: plan, review) list the CRDs whole once, and after that only their
// metadata, reading again the CRDs that changed; so a CRD installed, migrated and
// deleted between two checks is seen by the next one, each time. Findings look for
// StorageVersionMigrations in progress without asking discovery first.
func TestRepeatedChecksReadWhatChanged(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	const group = "repeat.example.io"
	// Live: storage switched to v1, objects still stored at v1alpha1 (storedVersions
	// [v1alpha1 v1]). Incoming: v1 alone, so the upgrade needs a migration first.
	live := testenv.TwoVersionCRD(group, "gizmos", "Gizmo")
	live.Spec.Versions[0].Storage, live.Spec.Versions[1].Storage = false, true
	next := testenv.TwoVersionCRD(group, "gizmos", "Gizmo")
	next.Spec.Versions = next.Spec.Versions[1:]
	next.Spec.Versions[0].Storage = true
	t.Cleanup(func() {
		_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), live.Name, metav1.DeleteOptions{})
	})

	var lists, discovery atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return counted{rt: rt, n: &lists, count: crdLists} })
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return counted{rt: rt, n: &discovery, count: svmDiscovery}
	})
	kc, err := livecluster.NewKubeCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := check.Request{Operation: predict.Upgrade, NoSchemaCheck: true, NoAdmission: true,
		Incoming: []chartcrds.CRD{{CRD: next, Source: predict.Templates, File: "gizmos.yaml"}}}
	run := func(step string) check.CRDReport {
		t.Helper()
		rep, err := check.Run(ctx, kc, req)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if len(rep.CRDs) != 1 {
			t.Fatalf("%s: %d CRDs reported, want 1", step, len(rep.CRDs))
		}
		return rep.CRDs[0]
	}

	if c := run("not installed"); c.Verdict != predict.OK || c.Objects != nil {
		t.Errorf("not installed: verdict %s, objects %v; want ok and no count (the CRD is new)", c.Verdict, c.Objects)
	}
	if err := testenv.ApplyCRD(ctx, cs, live); err != nil {
		t.Fatal(err)
	}
	if err := testenv.SetStoredVersions(ctx, cs, live.Name, "v1alpha1", "v1"); err != nil {
		t.Fatal(err)
	}
	if c := run("installed since"); c.Verdict != predict.Migrate || c.Objects == nil {
		t.Errorf("installed since the last check: verdict %s, objects %v; want migrate, counted", c.Verdict, c.Objects)
	}
	if err := testenv.SetStoredVersions(ctx, cs, live.Name, "v1"); err != nil {
		t.Fatal(err)
	}
	if c := run("migrated since"); c.Verdict != predict.OK || c.Objects == nil {
		t.Errorf("migrated since the last check: verdict %s, objects %v; want ok, counted", c.Verdict, c.Objects)
	}
	if c := run("unchanged"); c.Verdict != predict.OK || c.Objects == nil {
		t.Errorf("unchanged: verdict %s, objects %v; want ok, counted", c.Verdict, c.Objects)
	}
	if err := cs.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, live.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the deleted CRD gone", func() (bool, error) {
		_, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, live.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if c := run("deleted since"); c.Verdict != predict.OK || c.Objects != nil {
		t.Errorf("deleted since the last check: verdict %s, objects %v; want ok and no count (new again)", c.Verdict, c.Objects)
	}
	if n := lists.Load(); n != 1 {
		t.Errorf("%d full CRD LISTs over five checks through one KubeCluster, want 1 (then metadata only)", n)
	}
	if n := discovery.Load(); n != 0 {
		t.Errorf("%d discovery requests for %s, want 0 (the StorageVersionMigrations are listed directly)", n, svm.Group)
	}
}
