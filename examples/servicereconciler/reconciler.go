package servicereconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
)

// ConditionReady says whether the service runs the chart version its spec asks for.
const ConditionReady = "Ready"

// Reasons of the Ready condition.
const (
	ReasonApplied          = "Applied"
	ReasonMigrationPending = "StorageMigrationInProgress"
	ReasonUpgradeBlocked   = "UpgradeBlocked"
	ReasonChartUnavailable = "ChartUnavailable"
	ReasonGateFailed       = "GateFailed"
	ReasonDeployFailed     = "DeployFailed"
)

// Charts gives the chart of one version of the service.
type Charts interface {
	Chart(ctx context.Context, version string) (*chart.Chart, error)
}

// RepoCharts fetches the versions of one chart from a chart repository or an OCI registry
// (Options.Ref and RepoURL, credentials), with Helm's cache.
type RepoCharts struct {
	Options chartsource.Options
}

// Chart fetches version.
func (r RepoCharts) Chart(_ context.Context, version string) (*chart.Chart, error) {
	o := r.Options
	o.Version = version
	return chartsource.Fetch(o)
}

// Reconciler deploys each DemoService's chart version to the target cluster as a Helm
// release named after it, and gates every version change with gate.DecideChart.
type Reconciler struct {
	// Client reads and writes DemoServices.
	Client client.Client
	// Target is the cluster the service runs on (the same cluster or a remote one). The
	// gate checks and migrates CRDs there, and Helm deploys there.
	Target *rest.Config
	// Charts gives the service's chart versions.
	Charts Charts
	// Gate tunes the gate: AutoMigrate, Budget, and the migration's Lease namespace and
	// holder. ObservedGeneration, Current and BeforeMigrate are set per call.
	Gate gate.Options
	// RequeueAfter is how soon to call the gate again while a migration runs (default 5s).
	RequeueAfter time.Duration
}

// SetupWithManager registers the reconciler. It reacts to spec changes only: its own
// status writes do not wake it, and a migration in progress is driven by requeues.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&DemoService{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// Reconcile brings one DemoService to its chart version: gate, then deploy.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var svc DemoService
	if err := r.Client.Get(ctx, req.NamespacedName, &svc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	want := svc.Spec.ChartVersion
	if svc.Status.AppliedVersion == want {
		return ctrl.Result{}, nil
	}
	base := svc.DeepCopy()

	incoming, err := r.Charts.Chart(ctx, want)
	if err != nil {
		return ctrl.Result{}, r.fail(ctx, &svc, base, ReasonChartUnavailable, fmt.Errorf("chart version %s: %w", want, err))
	}
	o := r.Gate
	o.ObservedGeneration = svc.Generation
	if svc.Status.AppliedVersion != "" {
		// The chart running today, so that the gate sees CRDs the new version drops.
		current, err := r.Charts.Chart(ctx, svc.Status.AppliedVersion)
		if err != nil {
			return ctrl.Result{}, r.fail(ctx, &svc, base, ReasonChartUnavailable, fmt.Errorf("running chart version %s: %w", svc.Status.AppliedVersion, err))
		}
		if o.Current, err = gate.ChartCRDs(ctx, r.Target, release(&svc, current)); err != nil {
			return ctrl.Result{}, r.fail(ctx, &svc, base, ReasonGateFailed, err)
		}
	}
	// Publish "migration in progress" before the gate spends its budget migrating.
	o.BeforeMigrate = func(ctx context.Context, conditions []metav1.Condition) error {
		r.setConditions(&svc, conditions, ReasonMigrationPending, "the upgrade to "+want+" is held until the storage migration completes")
		return r.Client.Status().Patch(ctx, &svc, client.MergeFrom(base))
	}

	d, err := gate.DecideChart(ctx, r.Target, release(&svc, incoming), o)
	if err != nil {
		// Could not decide (target unreachable, RBAC): never upgrade blind; retry.
		return ctrl.Result{}, r.fail(ctx, &svc, base, ReasonGateFailed, err)
	}
	switch d.Outcome {
	case gate.Migrating:
		r.setConditions(&svc, d.Conditions, ReasonMigrationPending, d.Message)
		log.Info("Upgrade held while CRD storage is migrated", "chartVersion", want)
		return ctrl.Result{RequeueAfter: r.requeueAfter()}, r.patch(ctx, &svc, base)
	case gate.Blocked:
		// Nothing this controller does will fix it: stop, and say why. A new spec (another
		// chart version) wakes the controller again.
		r.setConditions(&svc, d.Conditions, ReasonUpgradeBlocked, d.Message)
		svc.Status.ObservedGeneration = svc.Generation
		log.Info("Upgrade blocked", "chartVersion", want, "reason", d.Message)
		return ctrl.Result{}, r.patch(ctx, &svc, base)
	}

	if err := deploy(ctx, r.Target, &svc, incoming); err != nil {
		return ctrl.Result{}, r.fail(ctx, &svc, base, ReasonDeployFailed, err)
	}
	svc.Status.AppliedVersion = want
	svc.Status.ObservedGeneration = svc.Generation
	r.setConditions(&svc, d.Conditions, ReasonApplied, "chart version "+want+" is applied")
	log.Info("Chart version applied", "chartVersion", want)
	return ctrl.Result{}, r.patch(ctx, &svc, base)
}

// release is how the service's chart is installed; the gate renders it the same way.
func release(svc *DemoService, ch *chart.Chart) gate.Chart {
	return gate.Chart{Chart: ch, ReleaseName: svc.Name, Namespace: svc.Namespace}
}

func (r *Reconciler) setConditions(svc *DemoService, conditions []metav1.Condition, readyReason, msg string) {
	for _, c := range conditions {
		meta.SetStatusCondition(&svc.Status.Conditions, c)
	}
	status := metav1.ConditionFalse
	if readyReason == ReasonApplied {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{
		Type: ConditionReady, Status: status, Reason: readyReason, Message: msg, ObservedGeneration: svc.Generation,
	})
}

// fail records err on Ready and returns it, so that controller-runtime retries with backoff.
func (r *Reconciler) fail(ctx context.Context, svc *DemoService, base *DemoService, reason string, err error) error {
	r.setConditions(svc, nil, reason, err.Error())
	if perr := r.patch(ctx, svc, base); perr != nil {
		return errors.Join(err, fmt.Errorf("record it on the status: %w", perr))
	}
	return err
}

func (r *Reconciler) patch(ctx context.Context, svc, base *DemoService) error {
	return r.Client.Status().Patch(ctx, svc, client.MergeFrom(base))
}

func (r *Reconciler) requeueAfter() time.Duration {
	if r.RequeueAfter > 0 {
		return r.RequeueAfter
	}
	return 5 * time.Second
}
