package cli

import (
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

func newControllerCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := controller.Options{}
	gate := webhook.Options{}
	var jsonLogs, debug bool
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: StorageMigrations, proactive mode and the HelmRelease gate",
		Long: `Run upgradeguard as a controller (normally in-cluster, installed by the chart in
charts/upgradeguard).

It runs StorageMigration resources with the same engine as 'upgradeguard migrate', saving
its place (the LIST continue token and the counts) in status so that a restarted or
newly elected controller resumes where the last one stopped. With a
StorageMigrationPolicy whose spec.proactive is true, it creates a StorageMigration for
every selected CRD whose status.storedVersions holds more than its storage version, so
stale storedVersions never accumulate. With --enable-webhook it serves the admission gate
for Flux HelmReleases.

Metrics (on --metrics-bind-address, /metrics): upgradeguard_migrations_total{cluster,result},
upgradeguard_objects_rewritten_total{cluster,crd}, upgradeguard_migration_duration_seconds,
upgradeguard_pending_migrations, upgradeguard_fleet_targets{state}, upgradeguard_gate_decisions_total{outcome}.
Health probes (on --health-probe-bind-address): /healthz and /readyz.`,
		Example: `  # Out of cluster, against the current kubeconfig context, without the webhook:
  upgradeguard controller --enable-webhook=false --leader-election-namespace upgradeguard-system`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			var h slog.Handler = slog.NewTextHandler(streams.ErrOut, &slog.HandlerOptions{Level: level})
			if jsonLogs {
				h = slog.NewJSONHandler(streams.ErrOut, &slog.HandlerOptions{Level: level})
			}
			logger := logr.FromSlogHandler(h)
			ctrl.SetLogger(logger)
			klog.SetLogger(logger)
			cfg, err := kube.ToRESTConfig()
			if err != nil {
				return couldNot("cluster: %v (set --kubeconfig or --context; in a pod the service account is used)", err)
			}
			if err := controller.Preflight(cfg); err != nil {
				return couldNot("%v", err)
			}
			mgr, err := controller.NewManager(cfg, o)
			if err != nil {
				return couldNot("%v", err)
			}
			if o.EnableWebhook {
				if err := webhook.Setup(mgr, gate); err != nil {
					return couldNot("webhook: %v", err)
				}
			}
			if err := mgr.Start(cmd.Context()); err != nil {
				return couldNot("controller stopped: %v", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.LeaderElect, "leader-elect", true, "elect one active controller through the Lease "+controller.LeaderElectionID)
	f.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease (default $POD_NAMESPACE, else kube-system)")
	f.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	f.BoolVar(&o.EnableWebhook, "enable-webhook", true, "serve the HelmRelease admission gate")
	f.IntVar(&o.WebhookPort, "webhook-port", 9443, "port of the admission webhook server")
	f.StringVar(&o.WebhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with tls.crt and tls.key for the webhook (reloaded when they change)")
	f.StringVar(&o.MigrationLeaseNamespace, "migration-lease-namespace", "", "namespace of the per-CRD migration Leases shared with 'upgradeguard migrate' (default: the leader-election namespace)")
	f.DurationVar(&gate.Timeout, "gate-timeout", 25*time.Second, "bound on one gate decision (chart fetch, target read, check); keep it below the webhook's timeoutSeconds")
	f.BoolVar(&gate.AllowOnError, "gate-allow-on-error", false, "admit a chart change the gate could not check (repository down, target unreachable) with a warning, instead of denying it")
	f.BoolVar(&gate.GateValuesChanges, "gate-values-changes", false, "also decide HelmRelease updates that change only spec.values or spec.valuesFrom (a value can switch a chart's CRDs on or off); the webhook configuration must send them too (chart value webhook.gateValuesChanges)")
	f.IntVar(&o.MaxConcurrentMigrations, "max-concurrent-migrations", 1, "StorageMigrations run at once")
	f.StringVar(&o.JobImage, "job-image", os.Getenv("UPGRADEGUARD_JOB_IMAGE"), "image of Job-mode migrations (runs `upgradeguard migrate` on the target cluster; default $UPGRADEGUARD_JOB_IMAGE)")
	f.StringVar(&o.JobNamespace, "job-namespace", controller.DefaultJobNamespace, "namespace of Job-mode migrations on their target cluster")
	f.BoolVar(&jsonLogs, "log-json", false, "log JSON lines")
	f.BoolVar(&debug, "debug", false, "log at debug level")
	return cmd
}
