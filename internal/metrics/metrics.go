// Package metrics holds upgradeguard's Prometheus metrics. They are registered with
// controller-runtime's registry, so the manager's metrics endpoint serves them.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Results of a migration of one CRD, the values of the result label.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
	ResultPartial   = "partial"   // the deadline ended the attempt; the next one resumes
	ResultRestarted = "restarted" // the CRD changed during the attempt; the next one starts over
	ResultRefused   = "refused"   // it would drop fields objects hold, which the spec does not allow
)

var (
	// Migrations counts CRD migrations by result.
	Migrations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upgradeguard_migrations_total",
		Help: "Storage-version migrations of one CRD, by target cluster and result (succeeded, failed, partial, restarted, refused).",
	}, []string{"cluster", "result"})

	// ObjectsRewritten counts objects re-persisted at the storage version, by CRD.
	ObjectsRewritten = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upgradeguard_objects_rewritten_total",
		Help: "Objects re-persisted at their CRD's storage version, by target cluster and CRD.",
	}, []string{"cluster", "crd"})

	// ConversionRetries counts the requests migrations repeated because the API server
	// could not convert objects through their CRD's conversion webhook (a webhook
	// repointed or restarting mid-run), by CRD: migrate.Result.ConversionRetries.
	ConversionRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upgradeguard_conversion_retries_total",
		Help: "Requests of storage-version migrations retried because the CRD's conversion webhook did not answer, by target cluster and CRD.",
	}, []string{"cluster", "crd"})

	// MigrationDuration observes how long one attempt at one CRD took.
	MigrationDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "upgradeguard_migration_duration_seconds",
		Help:    "Duration of one migration attempt at one CRD.",
		Buckets: []float64{0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900},
	})

	// SnapshotPushes counts the snapshots of this cluster the controller pushed on its
	// schedule, by result (succeeded, failed).
	SnapshotPushes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upgradeguard_snapshot_pushes_total",
		Help: "Snapshots of this cluster pushed to the OCI registry on the controller's schedule, by result (succeeded, failed).",
	}, []string{"result"})

	// SnapshotLastPush is when the last snapshot was pushed, as a Unix time: alert when it
	// grows old, since review then judges against an old state.
	SnapshotLastPush = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "upgradeguard_snapshot_last_push_timestamp_seconds",
		Help: "Unix time of the last snapshot of this cluster pushed on the controller's schedule.",
	})

	// PendingMigrations is the number of StorageMigrations not yet succeeded or failed.
	PendingMigrations = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "upgradeguard_pending_migrations",
		Help: "StorageMigrations that are pending or running.",
	})

	// FleetTargets is the number of target clusters of policies' spec.targets that this
	// replica runs, by state (Ready, Unreachable, Forbidden, Invalid). Every replica
	// reports the targets it owns; sum over replicas for the fleet.
	FleetTargets = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "upgradeguard_fleet_targets",
		Help: "Target clusters selected by StorageMigrationPolicies' spec.targets that this replica owns, by state.",
	}, []string{"state"})

	// FleetTargetsOwned is the number of fleet targets a replica owns (holds the target
	// Lease of), by replica (--replica-id). Every replica reports its own; their sum is
	// the number of targets owned at all.
	FleetTargetsOwned = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "upgradeguard_fleet_targets_owned",
		Help: "Fleet target clusters this replica owns (holds the target Lease of), by replica.",
	}, []string{"replica"})

	// GateDecisions counts the admission gate's decisions by outcome (admitted, migrating,
	// blocked, error).
	GateDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upgradeguard_gate_decisions_total",
		Help: "HelmRelease gate decisions, by outcome (admitted, migrating, blocked, error).",
	}, []string{"outcome"})

	// CRDDeletionsDenied counts the deletions of a CRD that the CRD deletion guard denied
	// because the CRD held objects, by CRD (bounded by the CRDs a cluster serves).
	CRDDeletionsDenied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upgradeguard_crd_deletions_denied_total",
		Help: "Deletions of a CRD that still held objects, denied by the CRD deletion guard, by CRD.",
	}, []string{"crd"})

	// BuildInfo is 1, labelled with the running binary's version, commit and Go version,
	// so that a rollout can be followed (and an old Pod told from a new one) by scrape.
	BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "upgradeguard_build_info",
		Help: "Always 1; the labels are the running binary's version, commit and Go version.",
	}, []string{"version", "commit", "goversion"})
)

// SetBuildInfo records the running binary's build in BuildInfo, once at start.
func SetBuildInfo(version, commit, goVersion string) {
	BuildInfo.Reset()
	BuildInfo.WithLabelValues(version, commit, goVersion).Set(1)
}

func init() {
	ctrlmetrics.Registry.MustRegister(SnapshotPushes, SnapshotLastPush, Migrations, ObjectsRewritten, ConversionRetries, MigrationDuration, PendingMigrations, FleetTargets, FleetTargetsOwned, GateDecisions, CRDDeletionsDenied, BuildInfo)
}

// MaxClusterLabels bounds the values of the cluster label: the first this many target
// clusters keep their name, later ones share the value "other", so a large fleet cannot
// grow the series without bound.
const MaxClusterLabels = 100

// LocalCluster is the cluster label of the cluster the controller runs in.
const LocalCluster = ""

var clusterLabels = struct {
	sync.Mutex
	seen map[string]bool
}{seen: map[string]bool{}}

// ClusterLabel is the cluster label value for a target cluster's name (see
// MaxClusterLabels).
func ClusterLabel(name string) string {
	if name == LocalCluster {
		return name
	}
	clusterLabels.Lock()
	defer clusterLabels.Unlock()
	if clusterLabels.seen[name] {
		return name
	}
	if len(clusterLabels.seen) >= MaxClusterLabels {
		return "other"
	}
	clusterLabels.seen[name] = true
	return name
}
