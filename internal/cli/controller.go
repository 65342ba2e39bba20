//go:build !nocontroller

package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

type controllerOptions struct {
	manager         controller.Options
	gate            webhook.Options
	jsonLogs, debug bool
}

func newControllerCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &controllerOptions{}
	cmd := command("controller", "Run the controller: StorageMigrations, proactive mode and the HelmRelease gate", controllerLong, controllerExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	o.addFlags(cmd.Flags())
	return cmd
}

func (o *controllerOptions) addFlags(f *pflag.FlagSet) {
	m := &o.manager
	f.BoolVar(&m.LeaderElect, "leader-elect", true, "elect one active controller through the Lease "+controller.LeaderElectionID)
	f.StringVar(&m.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease (default $POD_NAMESPACE, else kube-system)")
	f.StringVar(&m.MetricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.StringVar(&m.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	f.BoolVar(&m.EnableWebhook, "enable-webhook", true, "serve the HelmRelease admission gate")
	f.BoolVar(&m.HoldsObjectsLabel, "crd-holds-objects-label", false, "keep the label upgradeguard.io/holds-objects=true on every CRD that holds objects, for the CRD deletion guard's admission policies (chart value webhook.crdDeletion.mode policy or both)")
	f.IntVar(&m.WebhookPort, "webhook-port", 9443, "port of the admission webhook server")
	f.StringVar(&m.WebhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with tls.crt and tls.key for the webhook (reloaded when they change)")
	f.StringVar(&m.MigrationLeaseNamespace, "migration-lease-namespace", "", "namespace of the per-CRD migration Leases shared with 'upgradeguard migrate' (default: the leader-election namespace)")
	f.IntVar(&m.MaxConcurrentMigrations, "max-concurrent-migrations", 1, "StorageMigrations run at once by the leader (this cluster's), and again by each replica (its fleet targets')")
	f.StringVar(&m.ReplicaID, "replica-id", "", "this replica's name in the Leases that share the fleet's targets between replicas, in StorageMigration status.replica and in the metrics; unique per running replica (default: the host name; the chart passes the Pod's name)")
	f.DurationVar(&m.TargetLeaseDuration, "target-lease-duration", shard.DefaultLeaseDuration, "lease of a fleet target (whole seconds): a replica that stops renewing loses its targets this long after its last renewal")
	f.DurationVar(&m.TargetRenewEvery, "target-renew-period", shard.DefaultRenewEvery, "how often a replica renews its target Leases and looks for targets to take or hand over; at most half of --target-lease-duration")
	f.Float32Var(&m.QPS, "kube-api-qps", controller.DefaultQPS, "client-side limit of the controller's requests per second to this cluster (a fleet target's own limit is its policy's spec.rate; the Leases of fleet targets are not limited)")
	f.IntVar(&m.Burst, "kube-api-burst", controller.DefaultBurst, "client-side burst of the controller's requests to this cluster, with --kube-api-qps")
	f.StringVar(&m.JobImage, "job-image", os.Getenv("UPGRADEGUARD_JOB_IMAGE"), "image of Job-mode migrations (runs `upgradeguard migrate` on the target cluster; default $UPGRADEGUARD_JOB_IMAGE)")
	f.StringVar(&m.JobNamespace, "job-namespace", controller.DefaultJobNamespace, "namespace of Job-mode migrations on their target cluster")
	f.StringVar(&m.Snapshot.Push, "snapshot-push", "", "push a snapshot of this cluster (as upgradeguard snapshot takes it) to oci://REGISTRY/REPOSITORY:TAG at start and every --snapshot-every, for review --snapshot in CI (the leader pushes)")
	f.DurationVar(&m.Snapshot.Every, "snapshot-every", controller.DefaultSnapshotEvery, "how often to push the snapshot of --snapshot-push")
	f.StringVar(&m.Snapshot.Registry.Config, "snapshot-registry-config", "", "registry credentials file for --snapshot-push (Docker's config.json format: a kubernetes.io/dockerconfigjson Secret's .dockerconfigjson; default: Docker's)")
	f.BoolVar(&m.Snapshot.Registry.PlainHTTP, "snapshot-plain-http", false, "speak plain HTTP to the registry of --snapshot-push")
	f.StringVar(&m.Snapshot.Take.ArgoCDNamespace, "snapshot-argocd-namespace", argoapp.DefaultNamespace, "the namespace of Argo CD, whose argocd-cm tracking entries the snapshot of --snapshot-push records")
	f.BoolVar(&o.jsonLogs, "log-json", false, "log JSON lines")
	f.BoolVar(&o.debug, "debug", false, "log at debug level")
	o.addGateFlags(f)
}

func (o *controllerOptions) addGateFlags(f *pflag.FlagSet) {
	f.DurationVar(&o.gate.Timeout, "gate-timeout", 25*time.Second, "bound on one gate decision (chart fetch, target read, check); keep it below the webhook's timeoutSeconds")
	f.BoolVar(&o.gate.AllowOnError, "gate-allow-on-error", false, "admit a chart change the gate could not check (repository down, target unreachable) with a warning, instead of denying it")
	f.BoolVar(&o.gate.GateValuesChanges, "gate-values-changes", false, "also decide HelmRelease updates that change only spec.values or spec.valuesFrom (a value can switch a chart's CRDs on or off); the webhook configuration must send them too (chart value webhook.gateValuesChanges)")
}

func (o *controllerOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	o.setLogger(streams.ErrOut)
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return couldNot("cluster: %w (set --kubeconfig or --context; in a pod the service account is used)", err)
	}
	if p := o.manager.Snapshot.Push; p != "" && !snapshot.IsOCI(p) {
		return couldNot("--snapshot-push %q: want oci://REGISTRY/REPOSITORY:TAG", p)
	}
	if err := controller.Preflight(cfg); err != nil {
		return couldNot("%w", err)
	}
	mgr, err := controller.NewManager(cfg, o.manager)
	if err != nil {
		return couldNot("%w", err)
	}
	b := CurrentBuild()
	metrics.SetBuildInfo(b.Version, b.Commit, b.GoVersion)
	if o.manager.EnableWebhook {
		if err := webhook.Setup(mgr, o.gate); err != nil {
			return couldNot("webhook: %w", err)
		}
	}
	if err := mgr.Start(ctx); err != nil {
		return couldNot("controller stopped: %w", err)
	}
	return nil
}

// setLogger sends controller-runtime's and client-go's logs to w, as text or JSON.
func (o *controllerOptions) setLogger(w io.Writer) {
	logger := newLogger(w, o.debug, o.jsonLogs)
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
}

// newLogger logs at slog's Info level, or Debug with --debug: logr's V(4) at most.
// client-go dumps request and response bodies (a Secret's data among them) from V(8),
// so no flag may reach that far.
func newLogger(w io.Writer, debug, jsonLogs bool) logr.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if debug {
		opts.Level = slog.LevelDebug
	}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if jsonLogs {
		h = slog.NewJSONHandler(w, opts)
	}
	return logr.FromSlogHandler(h)
}

const controllerLong = `Run upgradeguard as a controller (normally in-cluster, installed by the chart in
charts/upgradeguard).

It runs StorageMigration resources with the same engine as 'upgradeguard migrate', saving
its place (the LIST continue token and the counts) in status so that a restarted or
newly elected controller resumes where the last one stopped. With a
StorageMigrationPolicy whose spec.proactive is true, it creates a StorageMigration for
every selected CRD whose status.storedVersions holds more than its storage version, so
stale storedVersions never accumulate. With --enable-webhook it serves the admission gate
for Flux HelmReleases.

Replicas: every replica serves the webhooks. The leader (--leader-elect, Lease
upgradeguard-controller) runs this cluster's StorageMigrations, proactive mode over its
CRDs and the policies' status. The target clusters of policies' spec.targets are shared
between all replicas: each target has a Lease (upgradeguard-target-<hash>, in the
leader-election namespace) held by the replica that runs it and its StorageMigrations,
and each replica a member Lease (upgradeguard-replica-<id>). A replica takes targets
until it holds ceil(targets / live replicas), keeps at most one more, and hands one to a
replica holding two fewer. When a replica stops, its targets are released and taken at
the others' next tick; when it dies, they are taken within --target-lease-duration plus
--target-renew-period of its last renewal, and a migration in flight resumes from its
saved place. One replica holds every target.

Metrics (on --metrics-bind-address, /metrics): upgradeguard_migrations_total{cluster,result},
upgradeguard_objects_rewritten_total{cluster,crd}, upgradeguard_migration_duration_seconds,
upgradeguard_pending_migrations, upgradeguard_fleet_targets{state} (this replica's targets),
upgradeguard_fleet_targets_owned{replica}, upgradeguard_gate_decisions_total{outcome},
upgradeguard_snapshot_pushes_total{result}, upgradeguard_snapshot_last_push_timestamp_seconds.

Snapshots: with --snapshot-push oci://REGISTRY/REPOSITORY:TAG, the leader pushes a
snapshot of this cluster (as the snapshot command takes it) at start and every
--snapshot-every, so that review --snapshot in CI needs registry read access only.
Health probes (on --health-probe-bind-address): /healthz and /readyz.`

const controllerExample = `  # Out of cluster, against the current kubeconfig context, without the webhook:
  upgradeguard controller --enable-webhook=false --leader-election-namespace upgradeguard-system

  # One of several replicas sharing a fleet (the chart passes the Pod's name):
  upgradeguard controller --replica-id "$POD_NAME" --target-lease-duration 30s --target-renew-period 10s`
