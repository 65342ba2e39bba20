package controller_test

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

// TestSnapshotSchedule: with Snapshot.Push set, the controller's leader pushes a snapshot
// of its cluster to a real OCI registry on loopback at start and again every
// Snapshot.Every, and review reads it from there.
func TestSnapshotSchedule(t *testing.T) {
	setup(t)
	host, stop := servers.ServeOCI()
	t.Cleanup(stop)
	reg := snapshot.Registry{PlainHTTP: true}
	ref := "oci://" + host + "/fleet/snapshots:envtest"
	before := testutil.ToFloat64(metrics.SnapshotPushes.WithLabelValues(metrics.ResultSucceeded))
	startController(t, "snapshot-schedule", controller.Options{Snapshot: controller.SnapshotOptions{Push: ref, Every: 2 * time.Second, Registry: reg}})

	var first *snapshot.Snapshot
	waitFor(t, time.Minute, "a first snapshot in the registry", func() (bool, error) {
		s, err := reg.Pull(t.Context(), ref)
		first = s
		return err == nil, nil
	})
	if first.Server.Minor != cp.Minor || !slices.ContainsFunc(first.CRDs, func(c snapshot.CRD) bool { return c.Name == "storagemigrations.upgradeguard.io" }) {
		t.Errorf("snapshot of Kubernetes %+v with %d CRDs, want minor %d and the cluster's CRDs", first.Server, len(first.CRDs), cp.Minor)
	}
	waitFor(t, time.Minute, "a later snapshot, on the schedule", func() (bool, error) {
		s, err := reg.Pull(t.Context(), ref)
		return err == nil && s.TakenAt.After(first.TakenAt), nil
	})
	if got := testutil.ToFloat64(metrics.SnapshotPushes.WithLabelValues(metrics.ResultSucceeded)) - before; got < 2 {
		t.Errorf("upgradeguard_snapshot_pushes_total{result=succeeded} rose by %v, want at least 2", got)
	}
	if testutil.ToFloat64(metrics.SnapshotLastPush) < float64(first.TakenAt.Unix()) {
		t.Errorf("upgradeguard_snapshot_last_push_timestamp_seconds is older than the first push")
	}
}
