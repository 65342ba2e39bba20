package controller

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	_ "github.com/upgradeguard/upgradeguard/internal/metrics" // registers the metrics
	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// LeaderElectionID is the name of the controller's leader-election Lease. `audit` looks
// for it to tell whether the controller is running.
const LeaderElectionID = "upgradeguard-controller"

// Options configure the controller manager. The zero value of each field means its
// documented default (see `upgradeguard controller --help`).
type Options struct {
	LeaderElect             bool
	LeaderElectionNamespace string
	MetricsAddr             string
	ProbeAddr               string
	EnableWebhook           bool
	WebhookPort             int
	WebhookCertDir          string
	// MigrationLeaseNamespace holds the per-CRD migration Leases shared with
	// `upgradeguard migrate`, so a CLI run and the controller never overlap.
	MigrationLeaseNamespace string
	// MaxConcurrentMigrations is how many StorageMigrations run at once.
	MaxConcurrentMigrations int
	// MigrationLeaseDuration: a restarted controller waits at most this long for the
	// Lease of a run that died. Defaults to 30s.
	MigrationLeaseDuration time.Duration
	// SaveEvery bounds how often a running migration saves its place (default 2s).
	SaveEvery time.Duration
	// JobImage is the image of Job-mode migrations (the chart's image); JobNamespace is
	// where they run on the target (default upgradeguard-migrate).
	JobImage     string
	JobNamespace string
	// Fleet tunes how the target clusters of policies' spec.targets are probed.
	Fleet FleetOptions
	// ReplicaID names this replica: in the Leases that share the fleet's targets between
	// replicas, in a StorageMigration's status.replica and in a policy's
	// status.clusters[].replica. Two running replicas must not share it. Default: the
	// host name (the Pod's name in a cluster).
	ReplicaID string
	// TargetLeaseDuration and TargetRenewEvery time the Leases of fleet targets: a
	// replica that stops renewing loses its targets TargetLeaseDuration after its last
	// renewal, and another replica takes them at its next tick, at most TargetRenewEvery
	// later. Defaults 30s and 10s.
	TargetLeaseDuration time.Duration
	TargetRenewEvery    time.Duration
	// QPS and Burst limit the manager's requests to this cluster (reads, watches, status
	// writes, Events), when the config sets no limit of its own. Defaults DefaultQPS and
	// DefaultBurst; client-go's own fallback (5 and 10) throttles a replica that saves
	// the status of many fleet migrations at once. The Leases of fleet targets have a
	// client of their own with no client-side limit: their rate is bounded by
	// construction (one write per target per TargetRenewEvery), and a renewal that
	// waited behind other requests would let the target's Lease expire.
	QPS   float32
	Burst int
	// WrapTransport, when set, wraps the transport of every client the manager makes:
	// to this cluster and to each target cluster (an egress proxy, request accounting; the
	// tests cut a replica off with it as a crash would).
	WrapTransport transport.WrapperFunc
	// HoldsObjectsLabel keeps crdguard.LabelHoldsObjects on this cluster's CRDs for the
	// CRD deletion guard's admission policies (HoldsObjectsReconciler).
	HoldsObjectsLabel bool
	// SkipNameValidation allows more than one manager in a process (tests, embedding).
	SkipNameValidation bool
	// Snapshot, when its Push is set, pushes a snapshot of this cluster on a schedule.
	Snapshot SnapshotOptions

	// progressHook is called after each page a migration saved its place at (tests).
	progressHook func(ctx context.Context, sm *v1alpha1.StorageMigration)
}

// The manager's client-side limit when its config sets none: Flux's controllers' defaults,
// for a replica that reconciles hundreds of fleet migrations (client-go's own fallback is
// 5 requests per second).
const (
	DefaultQPS   = 50
	DefaultBurst = 300
)

// NewScheme is the scheme the manager works with.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextv1.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// DefaultNamespace is $POD_NAMESPACE, else kube-system.
func DefaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "kube-system"
}

// DefaultReplicaID is the host name (the Pod's name in a cluster).
func DefaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "upgradeguard"
	}
	return host
}

// defaults fills in what o leaves unset.
func (o *Options) defaults() {
	o.LeaderElectionNamespace = cmp.Or(o.LeaderElectionNamespace, DefaultNamespace())
	o.ReplicaID = cmp.Or(o.ReplicaID, DefaultReplicaID())
	o.MigrationLeaseNamespace = cmp.Or(o.MigrationLeaseNamespace, o.LeaderElectionNamespace)
	o.QPS, o.Burst = cmp.Or(o.QPS, DefaultQPS), cmp.Or(o.Burst, DefaultBurst)
	if o.MaxConcurrentMigrations <= 0 {
		o.MaxConcurrentMigrations = 1
	}
	if o.MigrationLeaseDuration <= 0 {
		o.MigrationLeaseDuration = 30 * time.Second
	}
	if o.SaveEvery <= 0 {
		o.SaveEvery = 2 * time.Second
	}
}

// NewManager builds the manager with the reconcilers registered. Webhooks are added by
// the caller (internal/webhook) when EnableWebhook is set.
//
// The leader (controller-runtime leader election, Lease upgradeguard-controller) runs
// what belongs to this cluster: its StorageMigrations, proactive mode over its CRDs and
// the policies' status. The fleet's targets are shared between all replicas
// (internal/shard): each target is run, with its StorageMigrations, by the replica that
// holds its Lease. Every replica serves the webhooks.
func NewManager(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	o.defaults()
	mgr, err := newControllerManager(cfg, o)
	if err != nil {
		return nil, err
	}
	sh, err := addShard(mgr, o)
	if err != nil {
		return nil, err
	}
	if err := addMigrationControllers(mgr, o, sh); err != nil {
		return nil, err
	}
	if err := addClusterControllers(mgr, o, sh); err != nil {
		return nil, err
	}
	if err := addChecks(mgr, o); err != nil {
		return nil, err
	}
	if err := addSnapshotPusher(mgr, o); err != nil {
		return nil, err
	}
	return mgr, nil
}

// newControllerManager is controller-runtime's manager on cfg, with o's transport and
// client-side limit, leader election, metrics, probes and (when enabled) the webhook
// server.
func newControllerManager(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	cfg = rest.CopyConfig(cfg)
	if o.WrapTransport != nil {
		cfg.Wrap(o.WrapTransport)
	}
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = o.QPS, o.Burst
	}
	mo := ctrl.Options{
		Scheme:                        NewScheme(),
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.ProbeAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    ctrlconfig.Controller{SkipNameValidation: &o.SkipNameValidation},
	}
	if o.EnableWebhook {
		mo.WebhookServer = webhook.NewServer(webhook.Options{Port: o.WebhookPort, CertDir: o.WebhookCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		return nil, fmt.Errorf("controller manager: %w", err)
	}
	return mgr, nil
}

// addShard runs, with the manager, the share of the fleet's targets between replicas.
// Its Leases have a client with no client-side limit (see Options.QPS).
func addShard(mgr ctrl.Manager, o Options) (*shard.Shard, error) {
	leases, err := kubernetes.NewForConfig(kubeclient.NoRateLimit(mgr.GetConfig()))
	if err != nil {
		return nil, err
	}
	sh, err := shard.New(leases.CoordinationV1(), shard.Options{Namespace: o.LeaderElectionNamespace, Replica: o.ReplicaID,
		LeaseDuration: o.TargetLeaseDuration, RenewEvery: o.TargetRenewEvery})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(sh); err != nil {
		return nil, err
	}
	return sh, nil
}

// addMigrationControllers registers the two StorageMigration controllers: this
// cluster's, run by the leader, and the fleet targets', each run by the replica that
// owns its target.
func addMigrationControllers(mgr ctrl.Manager, o Options, sh *shard.Shard) error {
	// This cluster's StorageMigrations (and any a person points at another cluster): the
	// leader's.
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.StorageMigration{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return !IsFleetMigration(o) }))).
		Named("storagemigration").WithOptions(migrationOptions(o, true)).Complete(newMigrationReconciler(mgr, o)); err != nil {
		return err
	}
	// The fleet targets' StorageMigrations: each on the replica that owns its target.
	return (&FleetMigrationReconciler{StorageMigrationReconciler: newMigrationReconciler(mgr, o), Shard: sh, Elected: mgr.Elected()}).
		SetupWithManager(mgr, migrationOptions(o, false))
}

// newMigrationReconciler is a StorageMigration reconciler with the manager's clients and
// o's Leases, Jobs and replica.
func newMigrationReconciler(mgr ctrl.Manager, o Options) *StorageMigrationReconciler {
	r := &StorageMigrationReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Config: mgr.GetConfig(), Recorder: mgr.GetEventRecorder("upgradeguard"),
		// Unique per process: a restarted replica waits for the Leases of the run it
		// replaces to expire rather than taking them over as its own.
		LeaseNamespace: o.MigrationLeaseNamespace, Holder: fmt.Sprintf("upgradeguard-controller/%s/%d", o.ReplicaID, time.Now().UnixNano()),
		LeaseDuration: o.MigrationLeaseDuration, SaveEvery: o.SaveEvery, JobImage: o.JobImage, JobNamespace: o.JobNamespace,
		Replica: o.ReplicaID, WrapTarget: o.WrapTransport, progressHook: o.progressHook,
	}
	if r.JobNamespace == "" {
		r.JobNamespace = DefaultJobNamespace
	}
	return r
}

// migrationOptions are a StorageMigration controller's options; leader says whether only
// the leader runs it.
func migrationOptions(o Options, leader bool) ctrlcontroller.Options {
	return ctrlcontroller.Options{MaxConcurrentReconciles: o.MaxConcurrentMigrations, NeedLeaderElection: &leader,
		// A migration whose target cluster is away retries within a minute of its return.
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, time.Minute)}
}

// addClusterControllers registers proactive mode over this cluster's CRDs, the CRD
// deletion guard's label when asked, the probes of the fleet's targets and the policies'
// status.
func addClusterControllers(mgr ctrl.Manager, o Options, sh *shard.Shard) error {
	if err := (&ProactiveReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
		return err
	}
	if o.HoldsObjectsLabel {
		md, err := metadata.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		if err := (&HoldsObjectsReconciler{Client: mgr.GetClient(), Metadata: md}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	fleet := &FleetReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Options: o.Fleet, Shard: sh, WrapTarget: o.WrapTransport,
		// Its own Clusters, large enough never to evict a target a policy selects.
		Clusters: livecluster.NewClusters(livecluster.ClustersOptions{MaxTargets: 4096,
			// Each sync is the target's probe: its CRDs are checked against one LIST, so a
			// target that stopped answering is reported Unreachable, not read from memory.
			VerifyCRDs: true})}
	if err := fleet.SetupWithManager(mgr); err != nil {
		return err
	}
	return (&PolicyStatusReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}).SetupWithManager(mgr)
}

// addChecks serves /healthz, and /readyz once the webhook server (when enabled) has
// started.
func addChecks(mgr ctrl.Manager, o Options) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	readyz := healthz.Ping
	if o.EnableWebhook {
		readyz = mgr.GetWebhookServer().StartedChecker()
	}
	return mgr.AddReadyzCheck("ready", readyz)
}

// Preflight checks that the cluster serves the upgradeguard.io API, so that a controller
// started before its CRDs fails at once with what to do, instead of waiting on caches.
func Preflight(cfg *rest.Config) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	res, err := dc.ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("the cluster does not serve %s: install the CRDs first (%s)", v1alpha1.GroupVersion, installCRDs)
		}
		return fmt.Errorf("discover %s: %w", v1alpha1.GroupVersion, err)
	}
	have := map[string]bool{}
	for _, r := range res.APIResources {
		have[r.Name] = true
	}
	for _, want := range []string{"storagemigrations", "storagemigrationpolicies"} {
		if !have[want] {
			return fmt.Errorf("the cluster does not serve %s %s: install the CRDs (%s)", v1alpha1.GroupVersion, want, installCRDs)
		}
	}
	return nil
}

// installCRDs is the command that installs upgradeguard's CRDs from the chart.
var installCRDs = cmdline.Apply{File: "charts/upgradeguard/crds/", ServerSide: true}
