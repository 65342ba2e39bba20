package check_test

import (
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestMoveModel judges a CRD that moves between two Helm releases, kyverno and
// kyverno-crds, by the Helm ownership metadata of the live CRD on the real API server:
// from the side it joins (an upgrade of kyverno-crds that renders it for the first time:
// move, while a rollback, which checks no ownership, and the owner's own upgrade are
// not), and from the side it leaves (kyverno's upgrade without it once the ownership
// names kyverno-crds: move until the live CRD is kept, then ok naming the move).
func TestMoveModel(t *testing.T) {
	ctx, cs, cluster, current := kyvernoCluster(t)
	owner := func(release string, keep bool) {
		t.Helper()
		annotations := map[string]any{predict.ReleaseNameAnnotation: release, predict.ReleaseNamespaceAnnotation: "kyverno"}
		if keep {
			annotations[predict.KeepAnnotation] = predict.KeepValue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations,
			"labels": map[string]any{predict.ManagedByLabel: predict.ManagedByHelm}}})
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, reports, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	judge := func(name string, req check.Request, verdict predict.Verdict, move bool, reason ...string) *check.Report {
		t.Helper()
		rep, err := check.Run(ctx, cluster, req)
		if err != nil {
			t.Fatal(err)
		}
		c := find(t, rep, reports)
		if c.Verdict != verdict || (c.Move != nil) != move {
			t.Errorf("%s: %s (move %+v), want %s, move %v: %s", name, c.Verdict, c.Move, verdict, move, c.Reason)
		}
		reasonSays(t, name, c.Reason, reason...)
		return rep
	}

	owner("kyverno", false)
	joins := check.Request{Operation: predict.Upgrade, Release: "kyverno-crds", Namespace: "kyverno", ChartRef: "kyverno/kyverno-crds",
		Incoming: templates(mustRead(t, dir(t, "kyverno/v1.12.6")...))}
	rep := judge("kyverno-crds takes it", joins, predict.Move, true, "moves from release kyverno/kyverno to release kyverno/kyverno-crds", "invalid ownership metadata")
	want := "upgradeguard crd adopt " + reports + " --from kyverno/kyverno --to kyverno/kyverno-crds --chart kyverno/kyverno-crds --apply"
	if !strings.Contains(strings.Join(rep.NextSteps, "\n"), want) || rep.Safe {
		t.Errorf("next steps %q (safe %v), want %q among them", rep.NextSteps, rep.Safe, want)
	}
	rollback := joins
	rollback.Operation = predict.Rollback
	judge("kyverno-crds rolls back to it", rollback, predict.OK, false)
	own := joins
	own.Release = "kyverno"
	judge("kyverno upgrades it", own, predict.OK, false)

	leaves := check.Request{Operation: predict.Upgrade, Release: "kyverno", Namespace: "kyverno", Current: templates(current),
		Incoming: templates(mustRead(t, dir(t, "kyverno/v1.13.4")...))}
	judge("kyverno drops it, still its owner", leaves, predict.OK, false, "holds no AdmissionReport objects")
	owner("kyverno-crds", false)
	judge("kyverno drops it, kyverno-crds owns it", leaves, predict.Move, true, "it moved to release kyverno/kyverno-crds", "still lists it")
	owner("kyverno-crds", true)
	judge("kyverno drops it, kept", leaves, predict.OK, true, "it moved to release kyverno/kyverno-crds", "helm.sh/resource-policy=keep")
}
