package fluxtest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// TestRemediationRollbackDeletesCRD reproduces the data loss a remediation rollback
// causes without upgradeguard: gears 2.0.0 adds a CRD to templates/, the CRD is put to
// use while helm-controller waits for the upgrade, the wait times out, and
// helm-controller's remediation rolls back to 1.0.0. The rollback succeeds, and Helm
// deletes the CRD it no longer renders, and every Gear with it.
func TestRemediationRollbackDeletesCRD(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	ns := "rollback-delete"
	_, gears := fluxtest.GearsInUse(t, env, ns)

	var conds []string
	hr, err := env.Flux.WaitHelmRelease(ctx, ns, "gears", 4*time.Minute, func(hr *helmv2.HelmRelease) bool {
		if c := condition(hr, meta.ReadyCondition); len(conds) == 0 || conds[len(conds)-1] != c {
			conds = append(conds, c)
		}
		l := hr.Status.History.Latest()
		return l != nil && l.Version == 3 && strings.Contains(condition(hr, meta.ReadyCondition), "RollbackSucceeded")
	})
	if err != nil {
		t.Fatalf("no remediation rollback: %v\nReady conditions:\n%s\n%s", err, strings.Join(conds, "\n"), env.Flux.LogTail(30))
	}
	t.Logf("Ready conditions: %s", strings.Join(conds, "\n  "))
	var got []string
	for _, r := range fluxtest.History(t, env, ns, "gears") {
		got = append(got, fmt.Sprintf("%d %s %s %s", r.Revision, r.Status, r.Chart, r.Description))
	}
	want := []string{"1 superseded gears-1.0.0 Install complete", "2 failed gears-2.0.0 ", "3 deployed gears-1.0.0 Rollback to 1"}
	if len(got) != 3 || got[0] != want[0] || !strings.HasPrefix(got[1], want[1]) || got[2] != want[2] {
		t.Errorf("helm history:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// helm-controller reports the rollback as a success.
	if got, want := condition(hr, meta.ReadyCondition), "False RollbackSucceeded: Helm rollback to previous release rollback-delete/gears.v1 with chart gears@1.0.0 succeeded"; got != want {
		t.Errorf("Ready = %s, want %s", got, want)
	}
	// Helm deleted the CRD, and the API server every Gear with it.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: fluxtest.GearsCRD}, &apiextv1.CustomResourceDefinition{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("%s after the rollback: %v, want it deleted", fluxtest.GearsCRD, err)
	}
	if _, err := gears.List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("listing Gears after the rollback: %v, want NotFound (the type is gone)", err)
	}
}
