package webhook

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
)

// argoDiffs starts the migrations that Argo CD's server-side diffs wait for.
//
// With ServerSideDiff=true (and ServerSideApply=true, whose users set it), Argo CD compares
// an Application by a server-side dry-run apply. The CRD gate answers a dry run without
// side effects (sideEffects: NoneOnDryRun): a CRD update it would hold is denied, and no
// StorageMigration is created. Admitting the dry run instead would not help, as the API
// server's own validation then refuses an update that drops a stored version. So Argo CD
// reports ComparisonError, never syncs, and the migration the real update would start is
// never started.
//
// argoDiffs reads that denial where Argo CD reports it, the Application's
// status.conditions, and starts the StorageMigration the CRD gate would start for the
// real update: the same name and labels (crdOwner), under the StorageMigrationPolicy with
// autoMigrate that selects the CRD, refused for field loss as the gate refuses it, and
// nothing without such a policy. It acts only while the live CRD still lists a stored
// version other than its storage version. Argo CD's next comparisons are denied while the
// migration runs and pass once it has pruned storedVersions; the sync then goes ahead.
type argoDiffs struct {
	g      *Gate
	client client.Client
}

// heldCRDs are the CRDs that the CRD gate's dry-run answers quoted in app's conditions
// would hold, in order: Argo CD quotes the answer whole, and the answer carries
// MarkDryRunHeld, which the gate writes for programs to read, whatever the sentence says.
func heldCRDs(app *argoapp.Application) []string {
	var out []string
	for _, c := range app.Status.Conditions {
		for _, name := range dryRunHeldCRDs(c.Message) {
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// setupArgoDiffs registers argoDiffs when the API server serves Argo CD's Applications
// (checked once, at start: a cluster that gains Argo CD later needs a restart of the
// controller for it).
func setupArgoDiffs(mgr manager.Manager, g *Gate) error {
	gvk := schema.GroupVersionKind{Group: argoapp.GVR.Group, Version: argoapp.GVR.Version, Kind: "Application"}
	if _, err := mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
		if meta.IsNoMatchError(err) {
			mgr.GetLogger().Info("Argo CD's Application CRD is not installed: Argo CD's server-side diffs that the CRD gate holds start no migration (restart the controller once Argo CD is installed)")
			return nil
		}
		return fmt.Errorf("argo CD Applications: %w", err)
	}
	app := &unstructured.Unstructured{}
	app.SetGroupVersionKind(gvk)
	// A StorageMigration started for an Application's diff brings it back when it changes
	// (its success is when Argo CD is asked to compare again).
	byLabels := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		ns, name := o.GetLabels()[LabelArgoApplicationNamespace], o.GetLabels()[LabelArgoApplicationName]
		if ns == "" || name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
	})
	return ctrl.NewControllerManagedBy(mgr).Named("argocd-diff").For(app).
		Watches(&v1alpha1.StorageMigration{}, byLabels).
		Complete(&argoDiffs{g: g, client: mgr.GetClient()})
}

func (r *argoDiffs) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: argoapp.GVR.Group, Version: argoapp.GVR.Version, Kind: "Application"})
	if err := r.client.Get(ctx, req.NamespacedName, u); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	app, err := argoapp.FromUnstructured(u)
	if err != nil {
		return reconcile.Result{}, err
	}
	for _, name := range heldCRDs(app) {
		if err := r.start(ctx, u, name); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// start starts the StorageMigration the CRD gate would start for a real update of CRD
// name, when the live CRD still lists a stored version other than its storage version.
func (r *argoDiffs) start(ctx context.Context, app *unstructured.Unstructured, name string) error {
	logger := log.FromContext(ctx).WithValues("crd", name)
	var crd apiextv1.CustomResourceDefinition
	if err := r.g.reader.Get(readFresh(ctx), types.NamespacedName{Name: name}, &crd); err != nil {
		return client.IgnoreNotFound(err)
	}
	m := crdOwner(&crd).migrations(r.g, false)
	storage := crdversions.StorageVersion(&crd)
	if !slices.ContainsFunc(crd.Status.StoredVersions, func(v string) bool { return v != storage }) {
		// Migrated already: Argo CD's next comparison passes.
		return r.refresh(ctx, app, m.name)
	}
	m.labels = map[string]string{LabelArgoApplicationNamespace: app.GetNamespace(), LabelArgoApplicationName: labelValue(app.GetName())}
	m.readBefore(ctx)
	m.live = map[string]*apiextv1.CustomResourceDefinition{name: &crd}
	m.holds = fmt.Sprintf("holds the sync of Argo CD Application %s/%s, whose server-side diff the CRD gate denied: the update of CustomResourceDefinition %s waits until the stored versions are migrated; Argo CD's next comparison passes once this has succeeded",
		app.GetNamespace(), app.GetName(), name)
	p, err := m.Migrate(ctx, []string{name})
	if err != nil {
		return err
	}
	logger.Info("Argo CD's server-side diff is held by the CRD gate", "application", app.GetNamespace()+"/"+app.GetName(),
		"storageMigration", p.Name, "state", p.State, "message", p.Message)
	if p.State == gate.MigrationRunning && p.Created {
		r.g.recorder.Eventf(app, nil, corev1.EventTypeNormal, ReasonArgoDiffMigrationStarted, "Migrate",
			"upgradeguard started StorageMigration %s for CustomResourceDefinition %s, whose update this Application's server-side diff needs: %s", p.Name, name, truncate(p.Message, 800))
	}
	return nil
}

// refresh asks Argo CD to compare the Application again (the annotation
// argocd.argoproj.io/refresh: normal, as `argocd app get --refresh` sets it) once the
// StorageMigration name that its quoted denial waits for has succeeded after Argo CD's
// last comparison. Without it the next comparison comes with Argo CD's resync (3 minutes
// by default). Argo CD removes the annotation when it has refreshed, and its comparison
// then is newer than the migration, so it is asked once.
func (r *argoDiffs) refresh(ctx context.Context, app *unstructured.Unstructured, name string) error {
	sm, err := storagemigration.Get(ctx, r.g.reader, name)
	if err != nil || !refreshDue(app, sm) {
		return err
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+argoRefreshAnnotation+`":"normal"}}}`))
	if err := r.client.Patch(ctx, app.DeepCopy(), patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("asked Argo CD to compare the Application again: the migration its server-side diff waited for has succeeded",
		"application", app.GetNamespace()+"/"+app.GetName(), "storageMigration", name)
	return nil
}

// refreshDue: sm has succeeded after Argo CD last compared app (status.reconciledAt), or
// in the same second, and no refresh is asked for yet. Both times are whole seconds, so
// a migration created for a comparison's denial and finished within that second has the
// comparison's time: it is due, or nothing would compare again before Argo CD's resync.
// A comparison that came after it within the second is asked for again, at most until
// the second has passed.
func refreshDue(app *unstructured.Unstructured, sm *v1alpha1.StorageMigration) bool {
	if sm == nil || !storagemigration.Succeeded(sm) || sm.Status.CompletionTime == nil {
		return false
	}
	if _, asked := app.GetAnnotations()[argoRefreshAnnotation]; asked {
		return false
	}
	at, _, _ := unstructured.NestedString(app.Object, "status", "reconciledAt")
	compared, err := time.Parse(time.RFC3339, at)
	return err != nil || !compared.After(sm.Status.CompletionTime.Time)
}

// argoRefreshAnnotation asks Argo CD to compare an Application again.
const argoRefreshAnnotation = "argocd.argoproj.io/refresh"

// Labels on a StorageMigration started for an Argo CD Application's server-side diff:
// its success brings the Application back to argoDiffs, which asks for a refresh.
const (
	LabelArgoApplicationNamespace = "upgradeguard.io/argocd-application-namespace"
	LabelArgoApplicationName      = "upgradeguard.io/argocd-application-name"
)

// ReasonArgoDiffMigrationStarted is the event on an Argo CD Application whose
// server-side diff the CRD gate held, when upgradeguard started the migration it waits for.
const ReasonArgoDiffMigrationStarted = "StorageMigrationStarted"
