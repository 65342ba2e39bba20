package check_test

import (
	"context"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestDeletionModel judges the CRDs an upgrade takes out of a release with the deletion
// model (predict.Removals) against the real API server: the Kyverno AdmissionReport CRD,
// rendered from templates/ today, either dropped by the incoming chart or moved to its
// crds/ folder. A deleted CRD is a finding while it holds objects (counted even when the
// caller asks for no counts, as the admission gate does) and when the chart still ships
// it in crds/; an empty CRD the chart no longer brings goes with a note; the live keep
// annotation keeps it.
func TestDeletionModel(t *testing.T) {
	ctx, cs, cluster, current := kyvernoCluster(t)
	crd := current[0]
	for _, c := range current {
		if c.Name == reports {
			crd = c
		}
	}
	dropped := check.Request{Operation: predict.Upgrade, Current: templates(current), Incoming: templates(mustRead(t, dir(t, "kyverno/v1.13.4")...))}
	moved := check.Request{Operation: predict.Upgrade, Current: templates(current),
		Incoming: append(templates(mustRead(t, dir(t, "kyverno/v1.13.4")...)), chartcrds.CRD{CRD: crd, Source: predict.CRDsDir, File: "kyverno/crds/reports.yaml"})}

	judge := func(name string, req check.Request, verdict predict.Verdict, objects int64, reason ...string) *check.Report {
		t.Helper()
		rep, err := check.Run(ctx, cluster, req)
		if err != nil {
			t.Fatal(err)
		}
		c := find(t, rep, reports)
		if c.Verdict != verdict || c.Objects == nil || *c.Objects != objects || rep.Safe != (verdict == predict.OK) {
			t.Errorf("%s: %s with objects %v (safe %v), want %s with %d", name, c.Verdict, c.Objects, rep.Safe, verdict, objects)
		}
		reasonSays(t, name, c.Reason, reason...)
		return rep
	}

	judge("dropped, empty", dropped, predict.OK, 0, "deletes the CRD", "holds no AdmissionReport objects, so nothing is lost")
	judge("moved to crds/, empty", moved, predict.Delete, 0, "moves it from templates/ to crds/", "now kyverno/crds/reports.yaml", "does not create it again", "left without the CRD its chart ships")

	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "kyverno.io", Version: "v1alpha2", Resource: "admissionreports"},
		Kind: "AdmissionReport", Namespaces: []string{"deletion"}, PerNS: 3,
		Spec: map[string]any{"owner": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}},
	}); err != nil {
		t.Fatal(err)
	}
	judge("dropped, with objects", dropped, predict.Delete, 3, "all 3 AdmissionReport objects")
	rep := judge("moved to crds/, with objects", moved, predict.Delete, 3, "to crds/", "all 3 AdmissionReport objects")
	if want := "kubectl annotate crd " + reports + " helm.sh/resource-policy=keep"; len(rep.NextSteps) != 1 || rep.NextSteps[0] != want {
		t.Errorf("next steps %q, want [%q]", rep.NextSteps, want)
	}
	if c := find(t, rep, reports); !strings.Contains(c.Action, "before the upgrade") {
		t.Errorf("action %q does not say when to annotate", c.Action)
	}
	// The gate asks for no counts; a deletion is counted all the same.
	noCounts := moved
	noCounts.NoObjectCounts = true
	judge("moved to crds/, no counts asked", noCounts, predict.Delete, 3, "all 3 AdmissionReport objects")

	// The fix the report names: the live annotation keeps the CRD and its objects.
	patch := []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, reports, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := check.Run(ctx, cluster, moved)
	if err != nil {
		t.Fatal(err)
	}
	if c := find(t, rep, reports); c.Verdict != predict.OK || !rep.Safe || !strings.Contains(c.Reason, "helm.sh/resource-policy=keep") {
		t.Errorf("kept, moved to crds/: %s (safe %v) %q, want ok naming the keep annotation", c.Verdict, rep.Safe, c.Reason)
	}
	judge("kept, dropped", dropped, predict.OK, 3, "helm.sh/resource-policy=keep", "outside the release")
}

// reports is the Kyverno CRD the deletion and move models judge.
const reports = "admissionreports.kyverno.io"

// kyvernoCluster is a fresh cluster holding Kyverno 1.12.6's CRDs, which it returns
// (reports among them, rendered from templates/ by that chart).
func kyvernoCluster(t *testing.T) (context.Context, apiextclient.Interface, *livecluster.KubeCluster, []*apiextv1.CustomResourceDefinition) {
	t.Helper()
	ctx, cs, cluster := freshCluster(t)
	current := mustRead(t, dir(t, "kyverno/v1.12.6")...)
	applyAll(t, ctx, cs, current)
	return ctx, cs, cluster, current
}

// reasonSays wants reason to say each of want.
func reasonSays(t *testing.T, name, reason string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(reason, w) {
			t.Errorf("%s: reason %q does not say %q", name, reason, w)
		}
	}
}
