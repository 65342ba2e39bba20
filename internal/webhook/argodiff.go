package webhook

import (
	"context"
	"fmt"
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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

// heldDiff finds the CRDs in a CRD gate's answer to a dry run it would hold, as Argo CD
// quotes it in a condition: "upgradeguard would hold the update of CustomResourceDefinition
// NAME, ..." (see crdGate.decide and door.answer).
var heldDiff = regexp.MustCompile(`upgradeguard would hold the update of CustomResourceDefinition ([a-z0-9][a-z0-9.-]*[a-z0-9])`)

// heldCRDs are the CRDs the gate's dry-run answers quoted in app's conditions hold, in order.
func heldCRDs(app *argoapp.Application) []string {
	var out []string
	for _, c := range app.Status.Conditions {
		for _, m := range heldDiff.FindAllStringSubmatch(c.Message, -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
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
	return ctrl.NewControllerManagedBy(mgr).Named("argocd-diff").For(app).
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
	storage := crdversions.StorageVersion(&crd)
	if !slices.ContainsFunc(crd.Status.StoredVersions, func(v string) bool { return v != storage }) {
		return nil // migrated already: Argo CD's next comparison passes
	}
	m := crdOwner(&crd).migrations(r.g, false)
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

// ReasonArgoDiffMigrationStarted is the event on an Argo CD Application whose
// server-side diff the CRD gate held, when upgradeguard started the migration it waits for.
const ReasonArgoDiffMigrationStarted = "StorageMigrationStarted"
