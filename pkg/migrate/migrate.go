// Package migrate owns storage-version migration of custom resources: re-persisting every
// object of a CRD at its current storage version with a merge patch that changes nothing,
// then pruning status.storedVersions to that version, and only then. It pages, bounds its
// work with a deadline, retries what can be retried, reports what cannot per object, holds
// a Lease so that two runs never overlap, and never prunes after a partial run.
//
// A patch that changes nothing re-encodes an object only when its stored bytes differ
// from the encoding at the storage version (the API server's GuaranteedUpdate skips
// identical writes), so "resourceVersion unchanged" proves an object was already current,
// and a re-run on a migrated cluster writes nothing. The patch carries the listed
// resourceVersion as a precondition, so that comparison is exact even when the listing
// is an older snapshot (a resumed continue token).
package migrate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// Defaults bound the load by concurrency, not by a client-side rate: at most
// DefaultConcurrency patches are in flight, and API Priority and Fairness (GA since
// Kubernetes 1.29) queues or rejects them with 429 and Retry-After when the API server is
// busy, which the client honours. A client-side rate limit (QPS, Burst) is an opt-in.
const (
	DefaultPageSize    = 500
	DefaultConcurrency = 8
	// DefaultQPS is no client-side rate limit: the API server's Priority and Fairness
	// sets the pace.
	DefaultQPS = 0
	// DefaultBurst applies only with a QPS: 0 means twice the QPS.
	DefaultBurst         = 0
	DefaultDeadline      = 10 * time.Minute
	DefaultLeaseDuration = 30 * time.Second
	// maxReportedFailures bounds the per-object failures kept in a Result.
	maxReportedFailures = 50
)

// Status of one CRD after a run.
type Status string

const (
	// Migrated means every object was re-persisted and storedVersions was pruned.
	Migrated Status = "migrated"
	// AlreadyMigrated means storedVersions already equalled [storageVersion]: nothing was done.
	AlreadyMigrated Status = "alreadyMigrated"
	// Incomplete means the run stopped or some objects failed: storedVersions is untouched.
	Incomplete Status = "incomplete"
	// WouldMigrate is the dry-run answer for a CRD that needs migrating.
	WouldMigrate Status = "wouldMigrate"
)

// Target is one CRD to migrate, optionally switching its storage version first (a
// reverse migration for a rollback, or the storage switch of a bridge).
type Target struct {
	Name           string `json:"name"`
	StorageVersion string `json:"storageVersion,omitempty"`
}

// Options tune a run.
type Options struct {
	PageSize    int64
	Concurrency int
	Deadline    time.Duration
	// SkipManagedFields skips cleaning managedFields entries that name unserved versions.
	SkipManagedFields bool
	DryRun            bool
	// AllowStorageSwitch confirms that a Target with StorageVersion may change the live
	// CRD's storage version.
	AllowStorageSwitch bool
	// AllowFieldLoss lets a migration go ahead when re-writing the objects stored at
	// another version would drop fields the storage version's schema does not declare
	// (Result.FieldLoss says which). Without it (or the CRD's
	// predict.AllowFieldLossAnnotation) such a run writes nothing and is refused
	// (Result.FieldLossRefused): the loss would be permanent.
	AllowFieldLoss bool
	// BackupFields, with AllowFieldLoss, saves the values of the fields a run drops before
	// it writes anything: DIR/<crd>/ per CRD (see crdschema.Backup), 0600 files.
	BackupFields string
	// LeaseNamespace holds the per-CRD Leases; Holder names this run in them.
	LeaseNamespace string
	Holder         string
	LeaseDuration  time.Duration
	// Wait waits for a Lease another run holds instead of failing.
	Wait bool
	// QPS is used for the dry-run estimate (the client's own limiter does the limiting;
	// see RateLimit). 0: no client-side limit, and no estimate.
	QPS float64
	// Progress, when set, is called after every page.
	Progress func(Progress)
	// Restarting, when set, is called by Run before it starts a CRD over (attempt counts
	// from 1), with the result that asked for the restart.
	Restarting func(res *Result, attempt int)
	// Continue resumes an earlier run from the LIST continue token it reported in
	// Progress.Continue. The caller vouches that every object before the token was
	// migrated without failures at the same storage version (the run prunes
	// storedVersions when the rest completes). An expired token continues from the next
	// key, as a fresh run's expired token does.
	Continue string
	// NoResume starts from the first object even when the last run of this CRD stopped
	// cleanly part-way and left its place in the migration Lease.
	NoResume bool
	// Engine chooses who re-persists the objects (EngineAuto when empty): this process
	// (EngineClient) or the built-in migrator in kube-controller-manager (EngineBuiltin).
	Engine Engine
	// BuiltinStartTimeout is how long the builtin engine waits for the built-in migrator
	// to act on its StorageVersionMigration before it stops and says that nobody runs it
	// (default DefaultBuiltinStartTimeout).
	BuiltinStartTimeout time.Duration
}

// Progress is a snapshot of one CRD's run.
type Progress struct {
	CRD     string
	Done    int64
	Total   int64 // best estimate; 0 when unknown
	Elapsed time.Duration
	// Continue is the token to resume after this page (Options.Continue); empty after
	// the last page.
	Continue string
	// The counts so far (Done is their sum).
	Rewritten, AlreadyCurrent, Deleted, Failed int64
	// ConversionRetries counts the requests retried so far because the conversion webhook
	// did not answer (Result.ConversionRetries).
	ConversionRetries int64
}

// ObjectError is one object that could not be migrated.
type ObjectError struct {
	Object string `json:"object"`
	Error  string `json:"error"`
}

// ResultKey is the ConfigMap key a migration run in a Job writes its results under (the
// JSON of `upgradeguard migrate -o json`, with --result-configmap), and the controller
// that started the Job reads them from.
const ResultKey = "result.json"

// Result is the outcome for one CRD.
type Result struct {
	Name                 string        `json:"name"`
	Status               Status        `json:"status"`
	StorageVersion       string        `json:"storageVersion"`
	StorageSwitchedFrom  string        `json:"storageSwitchedFrom,omitempty"`
	StoredVersionsBefore []string      `json:"storedVersionsBefore"`
	StoredVersionsAfter  []string      `json:"storedVersionsAfter"`
	Objects              int64         `json:"objects"`
	Rewritten            int64         `json:"rewritten"`
	AlreadyCurrent       int64         `json:"alreadyCurrent"`
	Deleted              int64         `json:"deleted"`
	Failed               []ObjectError `json:"failed"`
	FailedCount          int64         `json:"failedCount"`
	ManagedFieldsCleaned int64         `json:"managedFieldsCleaned"`
	DurationSeconds      float64       `json:"durationSeconds"`
	// EstimatedSeconds is the dry-run estimate at the configured QPS (0 when unlimited).
	EstimatedSeconds float64 `json:"estimatedSeconds,omitempty"`
	// Resumed says the run started where an earlier, interrupted one stopped (the counts
	// cover only the rest).
	Resumed bool `json:"resumed,omitempty"`
	// Interrupted says an incomplete run was cut short (deadline, cancellation, a lost
	// Lease), so running again carries on; otherwise an error stopped it.
	Interrupted bool `json:"interrupted,omitempty"`
	// Restart says an incomplete run found the CRD changed under it (a chart upgrade
	// applied meanwhile: new generation or storage version, or a stored version gained),
	// or the API server had not yet switched its encoding: storedVersions is untouched,
	// and a run from the first object is expected to finish.
	Restart bool `json:"restart,omitempty"`
	// Forbidden says RBAC denied patching the custom resources (PatchForbiddenError):
	// the caller must be granted the patch verb before a run can finish.
	Forbidden bool `json:"forbidden,omitempty"`
	// Engine is the engine that ran (or would run, in a dry run), and EngineReason why.
	Engine       Engine `json:"engine,omitempty"`
	EngineReason string `json:"engineReason,omitempty"`
	// StorageVersionMigration is the one the builtin engine created and followed.
	StorageVersionMigration string `json:"storageVersionMigration,omitempty"`
	// BuiltinFailure is the built-in migrator's Failed condition (reason and message)
	// when it failed: storedVersions is untouched.
	BuiltinFailure string `json:"builtinFailure,omitempty"`
	// PrunedBy says who pruned storedVersions after a builtin migration: the server
	// (Kubernetes 1.37 does) or upgradeguard, under the same guards as the client engine.
	PrunedBy string `json:"prunedBy,omitempty"`
	// BuiltinReruns are the StorageVersionMigrations of this run that succeeded while the
	// built-in migrator skipped pruning storedVersions, because the CRD's generation
	// changed while they ran: the engine re-ran the migration under a new name each time.
	BuiltinReruns []BuiltinRerun `json:"builtinReruns,omitempty"`
	// FieldLoss is what re-writing the objects stored at other versions drops at the
	// storage version: field paths, object counts and a few object names, never values.
	// Nil when nothing is dropped (or nothing needed reading). Set whether the run was
	// refused for it or went ahead under Options.AllowFieldLoss.
	FieldLoss *crdschema.Report `json:"fieldLoss,omitempty"`
	// FieldLossRefused says the run stopped before writing anything because of FieldLoss
	// (Status is Incomplete, Message says how to go on): a finding, not a failure to run.
	FieldLossRefused bool `json:"fieldLossRefused,omitempty"`
	// FieldBackup is the directory the dropped fields' values were saved to
	// (Options.BackupFields).
	FieldBackup string `json:"fieldBackup,omitempty"`
	// ConversionRetries counts the requests (a page's LIST, an object's write) the run
	// repeated because the API server could not convert objects through the CRD's
	// conversion webhook (kubeclient.IsConversionFailure): while a webhook was repointed
	// or restarted, say. Each request is repeated at most MaxConversionRetries times;
	// what still failed is in Failed.
	ConversionRetries int64 `json:"conversionRetries,omitempty"`
	// ConversionChanges counts the changes of the CRD's spec.conversion the run saw while
	// it wrote; after each it waited until the API server converted through the webhook
	// the CRD names before writing on.
	ConversionChanges int    `json:"conversionChanges,omitempty"`
	Message           string `json:"message,omitempty"`
}

// Migrator runs migrations with one set of clients.
type Migrator struct {
	crds      apiextclient.Interface
	metadata  metadata.Interface
	leases    coordclient.CoordinationV1Interface
	discovery clientdiscovery.DiscoveryInterface
	// kube asks SelfSubjectAccessReviews; dynamic handles StorageVersionMigrations
	// (v1 or v1beta1, whichever the server serves).
	kube    kubernetes.Interface
	dynamic dynamic.Interface
}

// RateLimit sets an opt-in client-side rate limit on cfg: qps 0 means none (the default:
// API Priority and Fairness protects the API server), burst 0 twice the qps.
func RateLimit(cfg *rest.Config, qps float32, burst int) *rest.Config {
	if qps <= 0 {
		return kubeclient.NoRateLimit(cfg)
	}
	c := rest.CopyConfig(cfg)
	if burst <= 0 {
		burst = int(2 * qps)
	}
	c.QPS, c.Burst = qps, max(burst, 1)
	c.RateLimiter = nil
	return c
}

// New builds a Migrator from a REST config. A config that sets no rate limit (QPS 0 and
// no RateLimiter, where client-go would fall back to 5 requests per second) gets none:
// concurrency bounds the run and the API server's Priority and Fairness paces it. Use
// RateLimit for a client-side limit. client-go retries a 429 or 5xx that carries
// Retry-After after the delay the server asks for, up to 10 times, before the run's own
// backoff takes over.
func New(cfg *rest.Config) (*Migrator, error) {
	c, err := kubeclient.New(kubeclient.DefaultRateLimit(cfg))
	if err != nil {
		return nil, err
	}
	// The field-loss read lists objects at old versions on purpose: the API server's
	// deprecation warnings for it would only be noise.
	quiet := rest.CopyConfig(cfg)
	quiet.WarningHandler = rest.NoWarnings{}
	quiet.Wrap(kubeclient.FailFastOnConversion)
	dyn, err := dynamic.NewForConfig(quiet)
	if err != nil {
		return nil, err
	}
	return &Migrator{crds: c.CRDs, metadata: c.Metadata, leases: c.Leases, discovery: c.Discovery, kube: c.Kube, dynamic: dyn}, nil
}

func (o *Options) defaults() {
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Deadline <= 0 {
		o.Deadline = DefaultDeadline
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = "kube-system"
	}
	if o.Holder == "" {
		o.Holder = "upgradeguard"
	}
}

// Migrate migrates one CRD. A returned error means the run could not start or the CRD
// could not be read (for example RBAC, a missing CRD or a held Lease); everything that
// happened to objects is in the Result.
func (m *Migrator) Migrate(ctx context.Context, t Target, o Options) (*Result, error) {
	o.defaults()
	start := time.Now()
	ctx, cancelDeadline := context.WithTimeout(ctx, o.Deadline)
	defer cancelDeadline()

	crd, err := m.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, t.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &CRDNotFoundError{Name: t.Name}
		}
		return nil, fmt.Errorf("read CRD %s: %w", t.Name, err)
	}
	res := &Result{Name: t.Name, StorageVersion: crdversions.StorageVersion(crd),
		StoredVersionsBefore: slices.Clone(crd.Status.StoredVersions), Failed: []ObjectError{}}
	res.StoredVersionsAfter = res.StoredVersionsBefore
	defer func() { res.DurationSeconds = time.Since(start).Seconds() }()

	switchTo, err := storageSwitch(crd, t, o, res.StorageVersion)
	if err != nil {
		return nil, err
	}
	if switchTo == "" && !NeedsMigration(crd) {
		res.Status = AlreadyMigrated
		res.Message = "storedVersions already equals [" + res.StorageVersion + "]"
		return res, nil
	}
	// Before any engine writes (or a dry run reports): the objects the migration would
	// strip of fields, refused unless allowed.
	refused, err := m.judgeFieldLoss(ctx, crd, cmp.Or(switchTo, res.StorageVersion), o, res)
	if err != nil {
		return nil, err
	}
	if refused {
		return res, nil
	}
	if err := m.chooseEngine(ctx, crd, o, res); err != nil {
		return nil, err
	}
	if o.DryRun {
		return m.dryRun(ctx, crd, switchTo, o, res)
	}
	return m.locked(ctx, t, o, res, switchTo, start, crd.Generation)
}

// storageSwitch is the storage version a target switches to first ("" for none), if the
// live CRD serves it and the options allow it.
func storageSwitch(crd *apiextv1.CustomResourceDefinition, t Target, o Options, current string) (string, error) {
	if t.StorageVersion == "" || t.StorageVersion == current {
		return "", nil
	}
	if !crdversions.Serves(crd, t.StorageVersion) {
		return "", fmt.Errorf("cannot switch the storage version of %s to %s: the live CRD does not serve it", t.Name, t.StorageVersion)
	}
	if !o.AllowStorageSwitch && !o.DryRun {
		return "", &StorageSwitchError{CRD: t.Name, From: current, To: t.StorageVersion}
	}
	return t.StorageVersion, nil
}

// locked runs the migration under the CRD's Lease, recording where it stopped in the
// Lease when it stops cleanly part-way. judged is the CRD generation whose schemas the
// field loss was judged against.
func (m *Migrator) locked(ctx context.Context, t Target, o Options, res *Result, switchTo string, start time.Time, judged int64) (*Result, error) {
	l := &lease{client: m.leases.Leases(o.LeaseNamespace), name: leaseName(t.Name), holder: o.Holder,
		duration: o.LeaseDuration, crd: t.Name, ns: o.LeaseNamespace}
	saved, err := l.acquire(ctx, o.Wait)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go l.keepRenewed(runCtx, cancel)
	var stoppedAt *resumePoint // where this run leaves off, for the next one
	defer func() { _ = l.release(context.WithoutCancel(ctx), stoppedAt) }()
	if err := m.awaitOthers(runCtx, t.Name, o.Wait); err != nil {
		return nil, err
	}

	// Another run may have finished while this one waited for the Lease: decide again
	// from the CRD as it is now.
	crd, err := m.crds.ApiextensionsV1().CustomResourceDefinitions().Get(runCtx, t.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read CRD %s: %w", t.Name, err)
	}
	if switchTo == "" && !NeedsMigration(crd) {
		res.Status, res.StoredVersionsAfter = AlreadyMigrated, slices.Clone(crd.Status.StoredVersions)
		res.Message = "migrated by another run while this one waited"
		return res, nil
	}
	if switchTo == crdversions.StorageVersion(crd) {
		switchTo = ""
	}
	if crd.Generation != judged {
		// The schemas changed while this run waited for the Lease: judge them again.
		res.FieldLoss = nil
		refused, err := m.judgeFieldLoss(runCtx, crd, cmp.Or(switchTo, crdversions.StorageVersion(crd)), o, res)
		if err != nil {
			return nil, err
		}
		if refused {
			return res, nil
		}
	}
	if crd = m.ready(runCtx, crd, res, switchTo); crd == nil {
		return res, nil // the reason is in the Result: an incomplete run, not a failure to start
	}
	if res.Engine == EngineBuiltin {
		if err := m.builtin(runCtx, crd, o, res, start); err != nil {
			return nil, err
		}
		return res, nil
	}
	if o.Continue == "" && !o.NoResume && saved != nil && switchTo == "" &&
		saved.StorageVersion == crdversions.StorageVersion(crd) && saved.CRDUID == string(crd.UID) {
		// The last run stopped cleanly at this storage version: every object before its
		// token is migrated, and objects written since are stored at the storage version.
		o.Continue = saved.Continue
		res.Resumed = true
	}
	// This engine writes through the CRD's conversion webhook itself: not before the API
	// server converts through the one the CRD names.
	if err := m.waitConversion(runCtx, crd); err != nil {
		res.Status, res.Message, res.Interrupted = Incomplete, err.Error(), runCtx.Err() != nil
		if res.Resumed {
			stoppedAt = saved // nothing written: the place stays where it was
		}
		return res, nil
	}
	stoppedAt = m.pass(runCtx, crd, o, res, start)
	return res, nil
}

// ready switches the storage version when asked and waits until the API server encodes
// at the storage version. It returns the CRD as it is then, or nil after recording in
// res why the run is incomplete.
func (m *Migrator) ready(ctx context.Context, crd *apiextv1.CustomResourceDefinition, res *Result, switchTo string) *apiextv1.CustomResourceDefinition {
	if switchTo != "" {
		switched, err := m.switchStorage(ctx, crd, switchTo)
		if err != nil {
			res.Status, res.Message = Incomplete, err.Error()
			return nil
		}
		crd = switched
		res.StorageSwitchedFrom, res.StorageVersion = res.StorageVersion, switchTo
	}
	if err := m.waitServedStorage(ctx, crd); err != nil {
		res.Status, res.Message, res.Restart = Incomplete, err.Error(), ctx.Err() == nil
		return nil
	}
	return crd
}

// pass re-persists every object and prunes storedVersions when all succeeded; it returns
// where a clean, interrupted pass stopped (nil otherwise).
func (m *Migrator) pass(ctx context.Context, crd *apiextv1.CustomResourceDefinition, o Options, res *Result, start time.Time) *resumePoint {
	w := &worker{m: m, crd: crd, o: o, res: res, start: start, conversion: crd.Spec.Conversion,
		gvr: schema.GroupVersionResource{Group: crd.Spec.Group, Version: crdversions.ServedVersion(crd), Resource: crd.Spec.Names.Plural}}
	complete := w.run(ctx)
	res.FailedCount = w.failedCount.Load()
	res.ConversionRetries = w.conversionRetries.Load()
	var stoppedAt *resumePoint
	if !complete && res.FailedCount == 0 && w.cleanContinue != "" {
		stoppedAt = &resumePoint{Continue: w.cleanContinue, StorageVersion: crdversions.StorageVersion(crd), CRDUID: string(crd.UID)}
	}
	switch {
	case !complete:
		res.Status = Incomplete
		// Cut short by the deadline, a cancellation or a lost Lease, rather than by an
		// error that another attempt would meet again (RBAC, a LIST that keeps failing).
		res.Interrupted = ctx.Err() != nil
		res.Forbidden = errors.As(w.stopErr, new(*PatchForbiddenError))
		if res.Message == "" {
			res.Message = stopReason(ctx, w.stopErr)
		}
	case res.FailedCount > 0:
		res.Status = Incomplete
		res.Message = fmt.Sprintf("%d objects could not be migrated: storedVersions untouched; fix them and run again", res.FailedCount)
	default:
		if err := m.prune(ctx, crd, res); err != nil {
			var changed *crdChangedError
			res.Status, res.Message, res.Restart = Incomplete, err.Error(), errors.As(err, &changed)
			return stoppedAt
		}
		res.Status = Migrated
	}
	return stoppedAt
}

func stopReason(ctx context.Context, stopErr error) string {
	const untouched = "storedVersions untouched; run again to finish (objects already migrated are skipped)"
	switch {
	case context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.Canceled) && !errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return fmt.Sprintf("stopped: %v: %s", context.Cause(ctx), untouched)
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && stopErr != nil:
		return fmt.Sprintf("deadline passed; last error: %v: %s", stopErr, untouched)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "deadline passed: " + untouched
	case stopErr != nil:
		return fmt.Sprintf("stopped: %v: %s", stopErr, untouched)
	case ctx.Err() != nil:
		return "interrupted: " + untouched
	}
	return untouched
}

// FieldManager is the field manager upgradeguard writes as.
const FieldManager = "upgradeguard"

// switchStorage marks version as the storage version of the live CRD. The update makes
// upgradeguard a co-owner of spec.versions, which would make the next Helm 4 server-side
// apply of the chart fail on a field conflict; so the ownership entry is removed again
// right after, leaving spec.versions owned by whoever applied it (Helm, Flux).
func (m *Migrator) switchStorage(ctx context.Context, crd *apiextv1.CustomResourceDefinition, version string) (*apiextv1.CustomResourceDefinition, error) {
	api := m.crds.ApiextensionsV1().CustomResourceDefinitions()
	c := crd.DeepCopy()
	for i := range c.Spec.Versions {
		c.Spec.Versions[i].Storage = c.Spec.Versions[i].Name == version
	}
	updated, err := api.Update(ctx, c, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, fmt.Errorf("switch storage version of %s to %s: %w", crd.Name, version, err)
	}
	keep := make([]metav1.ManagedFieldsEntry, 0, len(updated.ManagedFields))
	for _, e := range updated.ManagedFields {
		if e.Manager != FieldManager || e.Subresource != "" {
			keep = append(keep, e)
		}
	}
	if len(keep) == len(updated.ManagedFields) || len(keep) == 0 {
		return updated, nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"managedFields": keep, "resourceVersion": updated.ResourceVersion}})
	if err != nil {
		return nil, err
	}
	if updated, err = api.Patch(ctx, crd.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("hand spec.versions of %s back to its owner (managedFields): %w", crd.Name, err)
	}
	return updated, nil
}

// waitServedStorage waits until the API server encodes new writes at the CRD's storage
// version, read from discovery's storage version hash; a CRD update takes effect
// asynchronously, and a migration that starts too early would re-persist at the old one.
func (m *Migrator) waitServedStorage(ctx context.Context, crd *apiextv1.CustomResourceDefinition) error {
	storage := crdversions.StorageVersion(crd)
	want := storageVersionHash(crd.Spec.Group, storage, crd.Spec.Names.Kind)
	gv := schema.GroupVersion{Group: crd.Spec.Group, Version: crdversions.ServedVersion(crd)}.String()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		list, err := m.discovery.ServerResourcesForGroupVersion(gv)
		if err != nil {
			return false, nil //nolint:nilerr // discovery lags a CRD update; poll again
		}
		for _, r := range list.APIResources {
			if r.Name == crd.Spec.Names.Plural {
				return r.StorageVersionHash == want || r.StorageVersionHash == "", nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not yet store %s at %s (discovery storage version hash): %w", crd.Name, storage, err)
	}
	return nil
}

// prune sets storedVersions to [storage], only if the storage version and generation are
// what they were when the run started. The first attempt carries the resourceVersion read
// at the start as a precondition; after a conflict it re-reads and re-checks.
func (m *Migrator) prune(ctx context.Context, started *apiextv1.CustomResourceDefinition, res *Result) error {
	api := m.crds.ApiextensionsV1().CustomResourceDefinitions()
	storage := crdversions.StorageVersion(started)
	cur := started.DeepCopy()
	for attempt := 0; attempt < 5; attempt++ {
		if got := crdversions.StorageVersion(cur); got != storage || (cur.Generation != started.Generation && !onlyWebhookMoved(started, cur)) {
			return &crdChangedError{fmt.Sprintf("%s changed during the run (storage version %s -> %s, generation %d -> %d): not pruning storedVersions; run again",
				started.Name, storage, got, started.Generation, cur.Generation)}
		}
		for _, v := range cur.Status.StoredVersions {
			if !slices.Contains(started.Status.StoredVersions, v) && v != storage {
				return &crdChangedError{fmt.Sprintf("%s gained stored version %s during the run: not pruning; run again", started.Name, v)}
			}
		}
		cur.Status.StoredVersions = []string{storage}
		updated, err := api.UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			res.StoredVersionsAfter = slices.Clone(updated.Status.StoredVersions)
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("prune storedVersions of %s: %w", started.Name, err)
		}
		if cur, err = api.Get(ctx, started.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("re-read %s before pruning: %w", started.Name, err)
		}
	}
	return &crdChangedError{fmt.Sprintf("prune storedVersions of %s: the CRD kept changing; run again", started.Name)}
}

func (m *Migrator) dryRun(ctx context.Context, crd *apiextv1.CustomResourceDefinition, switchTo string, o Options, res *Result) (*Result, error) {
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: crdversions.ServedVersion(crd), Resource: crd.Spec.Names.Plural}
	list, err := m.metadata.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("count objects of %s: %w", crd.Name, err)
	}
	res.Objects = int64(len(list.Items))
	if list.RemainingItemCount != nil {
		res.Objects += *list.RemainingItemCount
	}
	res.Status = WouldMigrate
	if switchTo != "" {
		res.StorageSwitchedFrom, res.StorageVersion = res.StorageVersion, switchTo
	}
	res.StoredVersionsAfter = []string{res.StorageVersion}
	if o.QPS > 0 {
		res.EstimatedSeconds = float64(res.Objects+res.Objects/o.PageSize+2) / o.QPS
	}
	res.Message = "dry run: nothing was written"
	return res, nil
}

// worker migrates the objects of one CRD.
type worker struct {
	m     *Migrator
	crd   *apiextv1.CustomResourceDefinition
	gvr   schema.GroupVersionResource
	o     Options
	res   *Result
	start time.Time

	rewritten, current, deleted, failedCount, cleaned atomic.Int64
	// conversionRetries counts retries of conversion failures (Result.ConversionRetries).
	conversionRetries atomic.Int64
	// conversion is the CRD's spec.conversion the API server was last seen converting
	// through (waitConversion); only a webhook's is followed between pages.
	conversion *apiextv1.CustomResourceConversion
	mu         sync.Mutex
	stopErr    error
	// cleanContinue is the continue token after the last page done while no object had
	// failed: where a later run may resume.
	cleanContinue string
}

// run pages through the objects and rewrites them; it reports whether every page was
// processed.
func (w *worker) run(ctx context.Context) bool {
	defer w.collect()
	var total int64
	served := map[string]bool{}
	for _, v := range w.crd.Spec.Versions {
		served[schema.GroupVersion{Group: w.crd.Spec.Group, Version: v.Name}.String()] = v.Served
	}
	opts := metav1.ListOptions{Limit: w.o.PageSize, Continue: w.o.Continue}
	for list, err := range kubeclient.Pages(ctx, w.list, opts) {
		if err != nil {
			w.stop(fmt.Errorf("list %s: %w", w.gvr.GroupResource(), err))
			return false
		}
		if err := w.conversionSettled(ctx); err != nil {
			w.stop(err)
			return false
		}
		if total == 0 {
			total = int64(len(list.Items))
			if list.RemainingItemCount != nil {
				total += *list.RemainingItemCount
			}
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(w.o.Concurrency)
		for i := range list.Items {
			item := &list.Items[i]
			g.Go(func() error { return w.rewrite(gctx, item, served) })
		}
		if err := g.Wait(); err != nil {
			w.stop(err)
			return false
		}
		if ctx.Err() != nil {
			return false
		}
		if w.failedCount.Load() == 0 {
			w.cleanContinue = list.Continue
		}
		if w.o.Progress != nil {
			w.o.Progress(Progress{CRD: w.crd.Name, Done: w.done(), Total: max(total, w.done()), Elapsed: time.Since(w.start),
				Continue: list.Continue, Rewritten: w.rewritten.Load(), AlreadyCurrent: w.current.Load(),
				Deleted: w.deleted.Load(), Failed: w.failedCount.Load(), ConversionRetries: w.conversionRetries.Load()})
		}
	}
	return true
}

// list reads one page of the objects' metadata, retrying what is worth retrying. When the
// continue token has expired, the server hands out one that continues from the next key
// without a consistent snapshot, which is all a migration needs; without one, it starts
// over.
func (w *worker) list(ctx context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
	for {
		var list *metav1.PartialObjectMetadataList
		err := retryCounting(ctx, &w.conversionRetries, func() error {
			var err error
			list, err = w.m.metadata.Resource(w.gvr).List(ctx, opts)
			return err
		})
		if !apierrors.IsResourceExpired(err) {
			return list, err
		}
		opts.Continue = continueFrom(err)
	}
}

// conversionSettled is called before each page is written. When the run started with a
// conversion webhook, the CRD is read again, and after a change of its spec.conversion
// (a repointed webhook) the run waits until the API server converts through the new one
// (waitConversion): the API server takes the change up asynchronously, and writes in the
// meantime would meet the old webhook.
func (w *worker) conversionSettled(ctx context.Context) error {
	if !webhookConversion(w.crd) {
		return nil
	}
	cur, changed, err := w.m.conversionChanged(ctx, w.crd.Name, w.conversion)
	if err != nil || !changed {
		return err
	}
	w.mu.Lock()
	w.res.ConversionChanges++
	w.mu.Unlock()
	if err := w.m.waitConversion(ctx, cur); err != nil {
		return err
	}
	w.conversion = cur.Spec.Conversion
	return nil
}

func (w *worker) done() int64 {
	return w.rewritten.Load() + w.current.Load() + w.deleted.Load() + w.failedCount.Load()
}

func (w *worker) stop(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopErr == nil {
		w.stopErr = err
	}
}

func (w *worker) collect() {
	w.res.Rewritten, w.res.AlreadyCurrent, w.res.Deleted = w.rewritten.Load(), w.current.Load(), w.deleted.Load()
	w.res.ManagedFieldsCleaned = w.cleaned.Load()
	w.res.Objects = w.done()
}

// rewrite re-persists one object. It returns an error only to stop the whole run (RBAC
// forbids patching at all); per-object problems are recorded and the run goes on.
func (w *worker) rewrite(ctx context.Context, item *metav1.PartialObjectMetadata, served map[string]bool) error {
	ri := w.m.metadata.Resource(w.gvr).Namespace(item.Namespace)
	// The listed resourceVersion as a precondition: a patch that changes nothing else
	// re-persists the object at the storage version, and the response's resourceVersion
	// then tells a rewrite from an object already stored there. A conflict means the
	// object was written after the listing's snapshot, which was taken once the storage
	// version was in effect (a resumed token's too), so it is stored there already.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": item.ResourceVersion}})
	if err != nil {
		return err
	}
	var out *metav1.PartialObjectMetadata
	err = retryCounting(ctx, &w.conversionRetries, func() error {
		var err error
		out, err = ri.Patch(ctx, item.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	switch {
	case err == nil:
	case apierrors.IsConflict(err):
		w.current.Add(1)
		return nil
	case apierrors.IsNotFound(err):
		w.deleted.Add(1)
		return nil
	case ctx.Err() != nil:
		return nil // stopping: not this object's fault
	case isRBACForbidden(err):
		return &PatchForbiddenError{CRD: w.crd.Name, Resource: w.gvr.GroupResource().String(), Err: err}
	case kubeclient.IsConversionFailure(err):
		// The webhook did not answer for MaxConversionRetries retries: every other object
		// stored at another version would meet the same, so the run stops.
		w.fail(item, err)
		return &ConversionError{CRD: w.crd.Name, After: fmt.Sprintf("after %d retries of %s", MaxConversionRetries, objectName(item)), Err: err}
	default:
		w.fail(item, err)
		return nil
	}
	if out.ResourceVersion != item.ResourceVersion {
		w.rewritten.Add(1)
	} else {
		w.current.Add(1)
	}
	if !w.o.SkipManagedFields {
		w.cleanManagedFields(ctx, ri, out, served)
	}
	return nil
}

func (w *worker) fail(item *metav1.PartialObjectMetadata, err error) {
	w.failedCount.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.res.Failed) < maxReportedFailures {
		w.res.Failed = append(w.res.Failed, ObjectError{Object: objectName(item), Error: describe(err)})
	}
}

func objectName(item *metav1.PartialObjectMetadata) string {
	if item.Namespace == "" {
		return item.Name
	}
	return item.Namespace + "/" + item.Name
}

// NeedsMigration reports whether a CRD's storedVersions is anything other than exactly
// its storage version.
func NeedsMigration(crd *apiextv1.CustomResourceDefinition) bool {
	return !slices.Equal(crd.Status.StoredVersions, []string{crdversions.StorageVersion(crd)})
}
