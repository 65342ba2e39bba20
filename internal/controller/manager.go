package controller

import (
	"fmt"
	"os"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	_ "github.com/upgradeguard/upgradeguard/internal/metrics" // registers the metrics
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
	// SkipNameValidation allows more than one manager in a process (tests, embedding).
	SkipNameValidation bool
}

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

// NewManager builds the manager with the reconcilers registered. Webhooks are added by
// the caller (internal/webhook) when EnableWebhook is set.
func NewManager(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if o.LeaderElectionNamespace == "" {
		o.LeaderElectionNamespace = DefaultNamespace()
	}
	if o.MigrationLeaseNamespace == "" {
		o.MigrationLeaseNamespace = o.LeaderElectionNamespace
	}
	if o.MaxConcurrentMigrations <= 0 {
		o.MaxConcurrentMigrations = 1
	}
	if o.MigrationLeaseDuration <= 0 {
		o.MigrationLeaseDuration = 30 * time.Second
	}
	if o.SaveEvery <= 0 {
		o.SaveEvery = 2 * time.Second
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
	host, _ := os.Hostname()
	sm := &StorageMigrationReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Config: mgr.GetConfig(), Recorder: mgr.GetEventRecorder("upgradeguard"),
		LeaseNamespace: o.MigrationLeaseNamespace, Holder: fmt.Sprintf("upgradeguard-controller/%s/%d", host, time.Now().UnixNano()),
		LeaseDuration: o.MigrationLeaseDuration, SaveEvery: o.SaveEvery, JobImage: o.JobImage, JobNamespace: o.JobNamespace,
	}
	if sm.JobNamespace == "" {
		sm.JobNamespace = DefaultJobNamespace
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.StorageMigration{}).Named("storagemigration").
		WithOptions(ctrlcontroller.Options{MaxConcurrentReconciles: o.MaxConcurrentMigrations,
			// A migration whose target cluster is away retries within a minute of its return.
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, time.Minute)}).Complete(sm); err != nil {
		return nil, err
	}
	if err := (&ProactiveReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	fleet := &FleetReconciler{Client: mgr.GetClient(), Options: o.Fleet,
		// Its own Clusters, large enough never to evict a target a policy selects.
		Clusters: livecluster.NewClusters(livecluster.ClustersOptions{MaxTargets: 4096,
			// Each sync is the target's probe: its CRDs are checked against one LIST, so a
			// target that stopped answering is reported Unreachable, not read from memory.
			VerifyCRDs: true})}
	if err := fleet.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&PolicyStatusReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	readyz := healthz.Ping
	if o.EnableWebhook {
		readyz = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("ready", readyz); err != nil {
		return nil, err
	}
	return mgr, nil
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
			return fmt.Errorf("the cluster does not serve %s: install the CRDs first (kubectl apply --server-side -f charts/upgradeguard/crds/)", v1alpha1.GroupVersion)
		}
		return fmt.Errorf("discover %s: %w", v1alpha1.GroupVersion, err)
	}
	have := map[string]bool{}
	for _, r := range res.APIResources {
		have[r.Name] = true
	}
	for _, want := range []string{"storagemigrations", "storagemigrationpolicies"} {
		if !have[want] {
			return fmt.Errorf("the cluster does not serve %s %s: install the CRDs (kubectl apply --server-side -f charts/upgradeguard/crds/)", v1alpha1.GroupVersion, want)
		}
	}
	return nil
}
