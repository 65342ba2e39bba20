// Package controller holds upgradeguard's reconcilers: StorageMigration runs migrations
// with pkg/migrate and saves its place so a restarted controller resumes, and the
// proactive policy reconciler creates StorageMigrations for CRDs whose storedVersions hold
// more than their storage version.
package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/transport"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// +kubebuilder:rbac:groups=upgradeguard.io,resources=storagemigrations,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=upgradeguard.io,resources=storagemigrations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Event reasons on a StorageMigration.
const (
	EventStarted   = "MigrationStarted"
	EventMigrated  = "Migrated"
	EventPartial   = "MigrationPaused"
	EventFailed    = "MigrationFailed"
	EventResumed   = "MigrationResumed"
	EventRestarted = "MigrationRestarted"
	// EventRerun: the built-in migrator succeeded but skipped pruning storedVersions
	// because the CRD's generation changed while it ran; the builtin engine ran a new
	// StorageVersionMigration (migrate.Result.BuiltinReruns).
	EventRerun     = "BuiltinMigrationRerun"
	EventSucceeded = "Succeeded"
	// EventFieldLossRefused: the migration would drop fields objects hold, and the spec
	// does not allow it (spec.allowFieldLoss). Nothing was written.
	EventFieldLossRefused = "FieldLossRefused"
	// EventConversionRetried: an attempt repeated requests because the API server could
	// not convert objects through the CRD's conversion webhook, or waited for a changed
	// spec.conversion (migrate.Result.ConversionRetries, ConversionChanges).
	EventConversionRetried = "ConversionRetried"
)

// StorageMigrationReconciler runs StorageMigrations.
type StorageMigrationReconciler struct {
	Client client.Client
	// Reader reads StorageMigrations uncached, so a reconcile never starts from a stale
	// copy of the status it saved last.
	Reader   client.Reader
	Config   *rest.Config // the local cluster
	Recorder events.EventRecorder
	// LeaseNamespace holds the per-CRD migration Leases; Holder names this process in them.
	LeaseNamespace string
	Holder         string
	// LeaseDuration of the migration Leases. A restarted controller waits at most this
	// long for the Lease of a run that died.
	LeaseDuration time.Duration
	// SaveEvery bounds how often progress is written to status while a CRD migrates
	// (every page at most).
	SaveEvery time.Duration
	// JobImage is the image of Job-mode migrations (it runs `upgradeguard migrate`).
	JobImage string
	// JobNamespace is where Job-mode migrations run on their target cluster.
	JobNamespace string
	// Replica names this replica in status.replica.
	Replica string
	// WrapTarget, when set, wraps the transport of the clients to target clusters.
	WrapTarget transport.WrapperFunc

	// progressHook is called after each page whose place was saved (tests).
	progressHook func(ctx context.Context, sm *v1alpha1.StorageMigration)
}

// Reconcile runs (or resumes) one StorageMigration to the end, one CRD after another.
func (r *StorageMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if err != nil && ctx.Err() != nil {
		// The attempt was cut short because its context ended: the controller is stopping,
		// or a fleet target's Lease moved to another replica. That is no failure: the place
		// was saved (every SaveEvery, and on the way out where the API server still
		// answered), and the next owner resumes from it. Look again soon all the same, as
		// the error's retry did: a replica that holds the target by then resumes it.
		log.FromContext(ctx).V(1).Info("attempt stopped with its context", "cause", context.Cause(ctx).Error(), "error", err.Error())
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return res, err
}

func (r *StorageMigrationReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	defer r.updatePending(ctx)
	sm := &v1alpha1.StorageMigration{}
	if err := r.Reader.Get(ctx, req.NamespacedName, sm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	st := &sm.Status
	if terminal(st.Phase) && st.ObservedGeneration == sm.Generation {
		return ctrl.Result{}, nil
	}
	if st.ObservedGeneration != sm.Generation {
		// A new or changed spec: start over.
		sm.Status = v1alpha1.StorageMigrationStatus{ObservedGeneration: sm.Generation}
	}
	r.syncResources(sm)
	resumed, before := st.Phase == v1alpha1.PhaseRunning, st.Replica
	if st.StartTime == nil {
		st.StartTime = ptrTime(metav1.Now())
	}
	st.Phase, st.Replica = v1alpha1.PhaseRunning, r.Replica
	setConditions(sm, metav1.ConditionTrue, v1alpha1.ReasonMigrating, "migrating "+fmt.Sprint(sm.Spec.Resources))
	if err := r.saveStatus(ctx, sm); err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case resumed && before != "" && before != r.Replica:
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventResumed, "Migrate", "replica %s resuming where replica %s stopped", r.Replica, before)
	case resumed:
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventResumed, "Migrate", "resuming where the last run stopped")
	default:
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventStarted, "Migrate", "migrating %v", sm.Spec.Resources)
	}

	cfg, err := r.target(ctx, sm)
	if err != nil {
		return r.fail(ctx, sm, "", err.Error())
	}
	if sm.Spec.Mode == v1alpha1.ModeJob {
		return r.runJob(ctx, sm, cfg)
	}
	m, err := migrate.New(rateLimit(cfg, sm.Spec.Rate))
	if err != nil {
		return r.fail(ctx, sm, "", err.Error())
	}
	crds, err := kubeclient.New(cfg)
	if err != nil {
		return r.fail(ctx, sm, "", err.Error())
	}
	for i := range st.Resources {
		rp := &st.Resources[i]
		if terminal(rp.Phase) {
			continue
		}
		res, requeue, err := r.migrateOne(ctx, sm, rp, m, crds)
		if err != nil {
			return ctrl.Result{}, err
		}
		if requeue > 0 {
			return ctrl.Result{RequeueAfter: requeue}, nil
		}
		if res == nil {
			continue
		}
		if rp.Phase == v1alpha1.PhaseFailed && res.FieldLossRefused {
			return r.refuse(ctx, sm, rp.Name, rp.Message)
		}
		if rp.Phase == v1alpha1.PhaseFailed {
			return r.fail(ctx, sm, rp.Name, rp.Message)
		}
		if rp.Phase == v1alpha1.PhaseRunning {
			// The attempt's deadline passed: the place is saved; carry on at once.
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		}
	}
	return r.succeed(ctx, sm, "every CRD is migrated", "every CRD is migrated and its storedVersions pruned", "migrated %v")
}

// succeed marks sm Succeeded with its conditions and event: running says why it stopped,
// done what succeeded, and event (with the resources as its one verb) the event's note.
func (r *StorageMigrationReconciler) succeed(ctx context.Context, sm *v1alpha1.StorageMigration, running, done, event string) (ctrl.Result, error) {
	now := metav1.Now()
	st := &sm.Status
	st.Phase, st.CompletionTime = v1alpha1.PhaseSucceeded, &now
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionRunning, metav1.ConditionFalse, v1alpha1.ReasonCompleted, running, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionSucceeded, metav1.ConditionTrue, v1alpha1.ReasonMigrated, done, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionFailed, metav1.ConditionFalse, v1alpha1.ReasonMigrated, "", sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationRequired, metav1.ConditionFalse, v1alpha1.ReasonMigrated, "storedVersions hold only the storage version", sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationInProgress, metav1.ConditionFalse, v1alpha1.ReasonMigrated, "", sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationFailed, metav1.ConditionFalse, v1alpha1.ReasonMigrated, "", sm))
	r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventSucceeded, "Migrate", event, sm.Spec.Resources)
	if err := r.saveStatus(ctx, sm); err != nil {
		return ctrl.Result{}, err
	}
	r.retryHelmRelease(ctx, sm)
	return ctrl.Result{}, nil
}

// Flux's annotations: a new requestedAt makes helm-controller reconcile at once, and a
// resetAt equal to it resets the failure counters of a release whose upgrade failed and
// exhausted its retries (helm-controller v1.x, internal/action/reset.go
// MustResetFailures; `flux reconcile helmrelease --reset` sets the same pair).
const (
	annotationFluxRequestedAt = "reconcile.fluxcd.io/requestedAt"
	annotationFluxResetAt     = "reconcile.fluxcd.io/resetAt"
)

// EventRetryRequested is the event on a StorageMigration after which helm-controller
// was asked to retry the HelmRelease it held.
const EventRetryRequested = "HelmReleaseRetryRequested"

// retryHelmRelease asks helm-controller to retry, at once and with its failure counters
// reset, the HelmRelease whose upgrade an admission gate held until this migration
// succeeded (the labels name it; the HelmRelease is on this cluster whatever the
// migration's target). helm-controller's upgrade was denied before it applied anything,
// and without this it would wait for its next interval, or forever once its retries are
// exhausted. A missing HelmRelease, or no Flux at all, is not an error.
func (r *StorageMigrationReconciler) retryHelmRelease(ctx context.Context, sm *v1alpha1.StorageMigration) {
	ns, name := sm.Labels[v1alpha1.LabelHelmReleaseNamespace], sm.Labels[v1alpha1.LabelHelmReleaseName]
	if ns == "" || name == "" {
		return
	}
	token := time.Now().UTC().Format(time.RFC3339Nano)
	hr := &unstructured.Unstructured{}
	hr.SetAPIVersion("helm.toolkit.fluxcd.io/v2")
	hr.SetKind("HelmRelease")
	hr.SetNamespace(ns)
	hr.SetName(name)
	body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, annotationFluxRequestedAt, token, annotationFluxResetAt, token)
	err := r.Client.Patch(ctx, hr, client.RawPatch(types.MergePatchType, []byte(body)))
	switch {
	case err == nil:
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventRetryRequested, "Migrate",
			"asked helm-controller to retry HelmRelease %s/%s now (reconcile.fluxcd.io/requestedAt and resetAt %s)", ns, name, token)
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
	default:
		log.FromContext(ctx).Error(err, "ask helm-controller to retry the HelmRelease", "helmRelease", ns+"/"+name)
	}
}

// startAttempt marks rp running for a new attempt at the live CRD and returns the run's
// options, resuming from rp's saved place when the storage version is unchanged, with the
// counts the attempt starts from.
func (r *StorageMigrationReconciler) startAttempt(ctx context.Context, sm *v1alpha1.StorageMigration, rp *v1alpha1.ResourceProgress,
	live *apiextv1.CustomResourceDefinition) (migrate.Options, v1alpha1.ResourceProgress) {
	storage := crdversions.StorageVersion(live)
	base := *rp
	o := migrate.Options{
		PageSize: sm.Spec.Rate.PageSize, Concurrency: int(sm.Spec.Rate.Concurrency),
		LeaseNamespace: r.LeaseNamespace, Holder: r.Holder, LeaseDuration: r.LeaseDuration, Wait: true,
		Engine: migrate.Engine(sm.Spec.Engine), AllowFieldLoss: sm.Spec.AllowFieldLoss,
	}
	if sm.Spec.Deadline != nil {
		o.Deadline = sm.Spec.Deadline.Duration
	}
	if rp.Continue != "" && rp.StorageVersion == storage {
		o.Continue = rp.Continue
		log.FromContext(ctx).Info("resuming from the saved continue token", "crd", rp.Name, "done", rp.Objects)
	} else if rp.Continue != "" {
		// The storage version changed since the place was saved: objects before it may be
		// stored at the old one, so start over.
		base = v1alpha1.ResourceProgress{Name: rp.Name, Attempts: rp.Attempts}
		rp.Continue = ""
	}
	if rp.StoredVersionsBefore == nil {
		rp.StoredVersionsBefore = slices.Clone(live.Status.StoredVersions)
	}
	rp.StorageVersion, rp.Phase = storage, v1alpha1.PhaseRunning
	rp.Attempts++
	return o, base
}

// migrateOne runs one attempt at one CRD and records it in rp. It returns a requeue delay
// when the attempt could not start yet (a Lease held by another run).
func (r *StorageMigrationReconciler) migrateOne(ctx context.Context, sm *v1alpha1.StorageMigration, rp *v1alpha1.ResourceProgress,
	m *migrate.Migrator, c *kubeclient.Clients) (*migrate.Result, time.Duration, error) {
	live, err := c.CRDs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, rp.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		rp.Phase, rp.Message = v1alpha1.PhaseFailed, fmt.Sprintf("CRD %s not found on the target cluster: fix spec.resources", rp.Name)
		return &migrate.Result{}, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("read CRD %s: %w", rp.Name, err)
	}
	a := &attempt{r: r, sm: sm, rp: rp, storage: crdversions.StorageVersion(live),
		cluster: metrics.ClusterLabel(ClusterOf(sm)), logger: log.FromContext(ctx).WithValues("crd", rp.Name)}
	o, base := r.startAttempt(ctx, sm, rp, live)
	a.base, a.lastSave = base, time.Now()
	o.Progress = func(p migrate.Progress) { a.progress(ctx, p) }
	started := time.Now()
	res, err := m.Migrate(ctx, migrate.Target{Name: rp.Name}, o)
	metrics.MigrationDuration.Observe(time.Since(started).Seconds())
	if err != nil {
		return a.failed(ctx, err)
	}
	return a.finish(ctx, c, res)
}

// attempt is one run at one CRD as it is recorded in its ResourceProgress.
type attempt struct {
	r       *StorageMigrationReconciler
	sm      *v1alpha1.StorageMigration
	rp      *v1alpha1.ResourceProgress
	storage string // the live CRD's storage version when the attempt started
	cluster string // the metrics' cluster label
	logger  logr.Logger
	// base are the counts the attempt starts from (startAttempt).
	base     v1alpha1.ResourceProgress
	lastSave time.Time
	// atToken are this attempt's counts at the last page boundary, where rp.Continue
	// points: an attempt that stops part-way saves these, so that the objects after the
	// token, which the next attempt lists again, are not counted twice.
	atToken migrate.Progress
}

// count sets rp's counts to the attempt's base plus p.
func (a *attempt) count(p migrate.Progress) {
	rp, base := a.rp, a.base
	rp.Objects, rp.Rewritten = base.Objects+p.Done, base.Rewritten+p.Rewritten
	rp.AlreadyCurrent, rp.Deleted, rp.FailedCount = base.AlreadyCurrent+p.AlreadyCurrent, base.Deleted+p.Deleted, base.FailedCount+p.Failed
}

// progress records a page done, keeps the place to resume from while no object has
// failed, and saves the status at most every SaveEvery.
func (a *attempt) progress(ctx context.Context, p migrate.Progress) {
	a.count(p)
	if p.Failed == 0 && a.base.FailedCount == 0 {
		// Only a clean prefix may be skipped on resume.
		a.rp.Continue, a.atToken = p.Continue, p
	}
	if time.Since(a.lastSave) < a.r.SaveEvery {
		return
	}
	a.lastSave = time.Now()
	if err := a.r.saveStatus(ctx, a.sm); err != nil {
		if ctx.Err() == nil { // else the attempt is ending: its last place is saved on the way out
			a.logger.Error(err, "saving progress")
		}
	} else if a.r.progressHook != nil {
		a.r.progressHook(ctx, a.sm)
	}
}

// failed records an attempt that did not run to a result: another run holds the Lease,
// the controller is stopping, the target went away, or the run failed.
func (a *attempt) failed(ctx context.Context, err error) (*migrate.Result, time.Duration, error) {
	r, sm, rp := a.r, a.sm, a.rp
	switch {
	case migrate.IsMigratingElsewhere(err):
		rp.Message = err.Error()
		return nil, r.LeaseDuration, r.saveStatus(ctx, sm)
	case ctx.Err() != nil:
		return nil, 0, r.saveStatus(context.WithoutCancel(ctx), sm)
	case Unreachable(err):
		// The target went away mid-run (down, restarting, a network cut): keep the place
		// and try again with this StorageMigration's own backoff; other targets go on.
		rp.Phase, rp.Message = v1alpha1.PhaseRunning, "target cluster unreachable, retrying: "+err.Error()
		if serr := r.saveStatus(ctx, sm); serr != nil {
			a.logger.Error(serr, "saving progress")
		}
		return nil, 0, fmt.Errorf("migrate %s: %w", rp.Name, err)
	default:
		rp.Phase, rp.Message = v1alpha1.PhaseFailed, err.Error()
		metrics.Migrations.WithLabelValues(a.cluster, metrics.ResultFailed).Inc()
		return &migrate.Result{}, 0, nil
	}
}

// finish records the result of an attempt that ran, and its outcome: restarted, refused,
// migrated, failed, or paused to resume.
func (a *attempt) finish(ctx context.Context, c *kubeclient.Clients, res *migrate.Result) (*migrate.Result, time.Duration, error) {
	r, sm, rp, cluster := a.r, a.sm, a.rp, a.cluster
	a.count(migrate.Progress{Done: res.Objects, Rewritten: res.Rewritten, AlreadyCurrent: res.AlreadyCurrent, Deleted: res.Deleted, Failed: res.FailedCount})
	rp.StoredVersionsAfter = res.StoredVersionsAfter
	rp.Message, rp.FieldLoss = res.Message, DroppedFields(res.FieldLoss)
	rp.Engine, rp.EngineReason = v1alpha1.MigrationEngine(res.Engine), res.EngineReason
	partial := res.Status == migrate.Incomplete && res.Interrupted && rp.FailedCount == 0
	if partial {
		a.count(a.atToken)
	}
	metrics.ObjectsRewritten.WithLabelValues(cluster, rp.Name).Add(float64(max(rp.Rewritten-a.base.Rewritten, 0)))
	metrics.ConversionRetries.WithLabelValues(cluster, rp.Name).Add(float64(res.ConversionRetries))
	if res.ConversionRetries > 0 || res.ConversionChanges > 0 {
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventConversionRetried, action(rp.Name),
			"%s: %d requests retried because the conversion webhook did not answer, %d changes of spec.conversion waited for", rp.Name, res.ConversionRetries, res.ConversionChanges)
	}
	r.reruns(sm, res)
	switch {
	case res.Restart && ctx.Err() == nil:
		// A chart upgrade changed the CRD during the attempt: the next one starts over.
		*rp = v1alpha1.ResourceProgress{Name: rp.Name, Phase: v1alpha1.PhaseRunning, Attempts: rp.Attempts,
			StoredVersionsBefore: rp.StoredVersionsBefore, Message: res.Message}
		metrics.Migrations.WithLabelValues(cluster, metrics.ResultRestarted).Inc()
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventRestarted, action(rp.Name), "%s: %s; starting over", rp.Name, res.Message)
	case res.FieldLossRefused:
		// A finding, not a fault: another attempt meets it again, so the CRD waits for an
		// operator (a schema that keeps the fields, or spec.allowFieldLoss).
		rp.Phase = v1alpha1.PhaseFailed
		metrics.Migrations.WithLabelValues(cluster, metrics.ResultRefused).Inc()
	case res.Status == migrate.Migrated || res.Status == migrate.AlreadyMigrated:
		rp.Phase, rp.Continue, rp.CompletionTime = v1alpha1.PhaseSucceeded, "", ptrTime(metav1.Now())
		metrics.Migrations.WithLabelValues(cluster, metrics.ResultSucceeded).Inc()
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventMigrated, action(rp.Name),
			"%s: %d objects, %d rewritten at %s; storedVersions %v -> %v", rp.Name, rp.Objects, rp.Rewritten, a.storage, rp.StoredVersionsBefore, rp.StoredVersionsAfter)
	case !partial && unreachableNow(ctx, c, rp.Name):
		// The target stopped answering during the attempt: what failed is the cluster,
		// not the objects. Keep the clean place and retry with backoff.
		a.count(a.atToken)
		rp.Message = "target cluster unreachable, retrying: " + res.Message
		if serr := r.saveStatus(ctx, sm); serr != nil {
			a.logger.Error(serr, "saving progress")
		}
		return nil, 0, fmt.Errorf("migrate %s: the target cluster stopped answering: %s", rp.Name, res.Message)
	case !partial:
		rp.Phase = v1alpha1.PhaseFailed
		metrics.Migrations.WithLabelValues(cluster, metrics.ResultFailed).Inc()
	case ctx.Err() != nil:
		// The controller is stopping: the place is saved, the next leader resumes.
		return nil, 0, r.saveStatus(context.WithoutCancel(ctx), sm)
	default:
		// The deadline ended the attempt with every object so far migrated: resume.
		metrics.Migrations.WithLabelValues(cluster, metrics.ResultPartial).Inc()
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventPartial, action(rp.Name),
			"%s: %d objects so far; %s", rp.Name, rp.Objects, res.Message)
	}
	return res, 0, r.saveStatus(ctx, sm)
}

func (r *StorageMigrationReconciler) fail(ctx context.Context, sm *v1alpha1.StorageMigration, crd, msg string) (ctrl.Result, error) {
	return r.stop(ctx, sm, crd, v1alpha1.ReasonMigrationFailed, EventFailed, msg)
}

// refuse fails sm because migrating crd would drop fields its objects hold and the spec
// does not allow that: the message names the paths and counts, and nothing was written.
// The phase is terminal, so the migration is not retried until its spec changes.
func (r *StorageMigrationReconciler) refuse(ctx context.Context, sm *v1alpha1.StorageMigration, crd, msg string) (ctrl.Result, error) {
	msg = strings.TrimRight(msg, ". ") + ". Here the loss is allowed by spec.allowFieldLoss: true on a new StorageMigration (a policy's allowFieldLoss for the ones it creates)."
	return r.stop(ctx, sm, crd, ReasonFieldLossRefused, EventFieldLossRefused, msg)
}

// ReasonFieldLossRefused is the reason of the Failed conditions of a migration refused for
// the fields it would drop.
const ReasonFieldLossRefused = v1alpha1.ReasonFieldLossRefused

// stop marks sm Failed, with reason on its failure conditions and a warning event.
func (r *StorageMigrationReconciler) stop(ctx context.Context, sm *v1alpha1.StorageMigration, crd, reason, event, msg string) (ctrl.Result, error) {
	st := &sm.Status
	now := metav1.Now()
	st.Phase, st.CompletionTime = v1alpha1.PhaseFailed, &now
	if crd != "" {
		msg = crd + ": " + msg
	}
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionRunning, metav1.ConditionFalse, v1alpha1.ReasonFailed, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionSucceeded, metav1.ConditionFalse, v1alpha1.ReasonFailed, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionFailed, metav1.ConditionTrue, reason, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationInProgress, metav1.ConditionFalse, reason, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationFailed, metav1.ConditionTrue, reason, msg, sm))
	r.Recorder.Eventf(sm, nil, corev1.EventTypeWarning, event, "Migrate", "%s", msg)
	return ctrl.Result{}, r.saveStatus(ctx, sm)
}

// DroppedFields are a field-loss report's paths for a StorageMigration's status: paths,
// counts and object names, never values.
func DroppedFields(rep *crdschema.Report) []v1alpha1.DroppedField {
	if rep == nil {
		return nil
	}
	out := make([]v1alpha1.DroppedField, 0, len(rep.Pruned))
	for _, p := range rep.Pruned {
		out = append(out, v1alpha1.DroppedField{Path: p.Path, Version: p.Version, Objects: p.Objects, Examples: slices.Clone(p.Examples)})
	}
	return out
}

// target is the cluster to migrate: the local one, or the kubeconfig in spec.kubeConfig.
func (r *StorageMigrationReconciler) target(ctx context.Context, sm *v1alpha1.StorageMigration) (*rest.Config, error) {
	if sm.Spec.KubeConfig == nil {
		return rest.CopyConfig(r.Config), nil
	}
	ref := sm.Spec.KubeConfig.SecretRef
	// Uncached: the Secret as it is now.
	cfg, _, err := kubeclient.ConfigFromSecretRef(ctx, r.Reader, ref.Namespace, ref.Name, ref.Key)
	if err == nil && r.WrapTarget != nil {
		cfg.Wrap(r.WrapTarget)
	}
	return cfg, err
}

// unreachableNow asks the target for the CRD once more, to tell an attempt cut short by
// the cluster going away from one its objects failed.
func unreachableNow(ctx context.Context, c *kubeclient.Clients, crd string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.CRDs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd, metav1.GetOptions{})
	return Unreachable(err)
}

// ClusterOf names the target cluster of a StorageMigration for metrics and logs: its
// upgradeguard.io/cluster label (set on the migrations of a policy's targets), else the
// kubeConfig Secret's name, else metrics.LocalCluster.
func ClusterOf(sm *v1alpha1.StorageMigration) string {
	if c := sm.Labels[LabelCluster]; c != "" {
		return c
	}
	if sm.Spec.KubeConfig != nil {
		return sm.Spec.KubeConfig.SecretRef.Name
	}
	return metrics.LocalCluster
}

// Unreachable reports whether err says the API server could not be reached or did not
// answer (as opposed to an answer refusing the request).
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsServiceUnavailable(err)
	}
	var netErr net.Error
	return errors.As(err, &netErr) || utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded)
}

// syncResources makes status.resources follow spec.resources, keeping saved progress.
func (r *StorageMigrationReconciler) syncResources(sm *v1alpha1.StorageMigration) {
	prev := map[string]v1alpha1.ResourceProgress{}
	for _, p := range sm.Status.Resources {
		prev[p.Name] = p
	}
	out := make([]v1alpha1.ResourceProgress, 0, len(sm.Spec.Resources))
	for _, name := range sm.Spec.Resources {
		p, ok := prev[name]
		if !ok {
			p = v1alpha1.ResourceProgress{Name: name, Phase: v1alpha1.PhasePending}
		}
		out = append(out, p)
	}
	sm.Status.Resources = out
}

func (r *StorageMigrationReconciler) saveStatus(ctx context.Context, sm *v1alpha1.StorageMigration) error {
	sm.Status.ObservedGeneration = sm.Generation
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Update a copy: decoding the answer into sm would replace the slices that the
	// running migration's progress pointer points into.
	out := sm.DeepCopy()
	if err := r.Client.Status().Update(ctx, out); err != nil {
		return fmt.Errorf("save the status of StorageMigration %s: %w", sm.Name, err)
	}
	sm.ResourceVersion = out.ResourceVersion
	return nil
}

// updatePending sets the pending-migrations gauge from the cache.
func (r *StorageMigrationReconciler) updatePending(ctx context.Context) {
	// Read from the cache without a copy: it runs after every reconcile, and copying
	// every StorageMigration each time costs a replica with hundreds of fleet migrations
	// gigabytes of garbage. The items are only read.
	var list v1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	n := 0
	for _, sm := range list.Items {
		if !terminal(sm.Status.Phase) || sm.Status.ObservedGeneration != sm.Generation {
			n++
		}
	}
	metrics.PendingMigrations.Set(float64(n))
}

func setConditions(sm *v1alpha1.StorageMigration, running metav1.ConditionStatus, reason, msg string) {
	st := &sm.Status
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionRunning, running, reason, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionSucceeded, metav1.ConditionFalse, reason, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionFailed, metav1.ConditionFalse, reason, "", sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationRequired, metav1.ConditionTrue, v1alpha1.ReasonMigrationRequired,
		"storedVersions hold versions other than the storage version", sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationInProgress, running, reason, msg, sm))
	meta.SetStatusCondition(&st.Conditions, cond(v1alpha1.ConditionStorageMigrationFailed, metav1.ConditionFalse, reason, "", sm))
}

func cond(t string, s metav1.ConditionStatus, reason, msg string, sm *v1alpha1.StorageMigration) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: sm.Generation}
}

func terminal(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseSucceeded || p == v1alpha1.PhaseFailed
}

// rateLimit applies spec.rate: QPS 0 means no client-side limit (the API server's
// Priority and Fairness paces the run), Burst 0 twice the QPS.
func rateLimit(cfg *rest.Config, r v1alpha1.RateSettings) *rest.Config {
	return migrate.RateLimit(cfg, float32(r.QPS), int(r.Burst))
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

// action names a per-CRD event's action. The events API folds events with the same
// object, reason and action into one series that keeps the first note, so the CRD goes
// into the action (at most 128 characters).
func action(crd string) string {
	a := "Migrate " + crd
	if len(a) > 128 {
		a = a[:128]
	}
	return a
}

// reruns reports each StorageVersionMigration of res whose prune the built-in migrator
// skipped for a generation change, and that the builtin engine re-ran, as an event.
func (r *StorageMigrationReconciler) reruns(sm *v1alpha1.StorageMigration, res *migrate.Result) {
	for _, re := range res.BuiltinReruns {
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, EventRerun, action(res.Name),
			"%s: StorageVersionMigration %s succeeded, but the built-in migrator skipped pruning storedVersions (generation %d -> %d during it); re-ran it as a new StorageVersionMigration",
			res.Name, re.StorageVersionMigration, re.GenerationBefore, re.GenerationAfter)
	}
}
