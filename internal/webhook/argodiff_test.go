package webhook_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// TestArgoServerSideDiffStartsMigration: Argo CD's server-side diff is a dry-run apply.
// The CRD gate denies a dry run of an update that drops a stored version and creates
// nothing (sideEffects: NoneOnDryRun), so Argo CD reports ComparisonError and would never
// sync. Once Argo CD quotes that denial in the Application's conditions, the controller
// starts the StorageMigration the real update would, under the policy with autoMigrate;
// when it has succeeded, the same dry run passes, and so does the update.
func TestArgoServerSideDiffStartsMigration(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns = "argodiff"
	namespace(t, s.c, ns)
	gadgetPolicy(t)
	crdName := "diffboxes." + gadgetGroup
	crd := func(versions ...string) *apiextv1.CustomResourceDefinition {
		var c apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(gadgetCRD("diffboxes", versions...)), &c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	if err := testenv.ApplyCRDServerSide(ctx, s.cp.Config, crd("v1alpha1"), "argocd-controller"); err != nil {
		t.Fatal(err)
	}
	readable := createObjects(t, ns, "diffboxes", "v1alpha1", 2)
	if err := testenv.ApplyCRDServerSide(ctx, s.cp.Config, crd("v1alpha1", "v1"), "argocd-controller"); err != nil {
		t.Fatal(err)
	}
	sm := "crd-" + crdName // the CRD gate's name for a CRD no Helm release or HelmRelease applies

	// Argo CD's comparison: a server-side dry run, denied, and nothing created.
	diff := func() error {
		return testenv.DryRunApplyCRDServerSide(ctx, s.cp.Config, crd("v1"), "argocd-controller")
	}
	denied := diff()
	if denied == nil || !strings.Contains(denied.Error(), webhook.MarkDryRunHeld(crdName)) {
		t.Fatalf("the server-side diff: %v; want the CRD gate's dry-run answer, marked", denied)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Name: sm}, &v1alpha1.StorageMigration{}); !apierrors.IsNotFound(err) {
		t.Fatalf("StorageMigration %s after a dry run: %v, want none", sm, err)
	}

	// Argo CD reports it as the Application's ComparisonError. The controller reads the
	// mark, not the sentence: here every word after the mark is reworded, and the fix
	// still starts.
	reworded := reword(denied.Error(), webhook.MarkDryRunHeld(crdName))
	dyn := dynamic.NewForConfigOrDie(s.cp.Config)
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"namespace": ns, "name": "boxes"},
		"spec":     map[string]any{"project": "default"},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "ComparisonError",
			"message": "Failed to compare desired state to live state: failed to calculate diff: error calculating server side diff: serverSideDiff error: error running server side apply in dryrun mode for resource CustomResourceDefinition/" + crdName + ": " + reworded}}},
	}}
	if _, err := dyn.Resource(argocd.ApplicationGVR).Namespace(ns).Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(argocd.ApplicationGVR).Namespace(ns).Delete(context.Background(), "boxes", metav1.DeleteOptions{})
	})
	// The controller starts it once it sees the condition.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := s.c.Get(ctx, client.ObjectKey{Name: sm}, &v1alpha1.StorageMigration{})
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("no StorageMigration %s after Argo CD reported the denial: %v", sm, err)
	}
	done := waitMigration(t, sm)
	if !strings.Contains(done.Annotations[webhook.AnnotationHolds], "Argo CD Application "+ns+"/boxes") {
		t.Errorf("StorageMigration %s says it holds %q, want the Application", sm, done.Annotations[webhook.AnnotationHolds])
	}
	waitEventOn(t, "Application", ns, "boxes", webhook.ReasonArgoDiffMigrationStarted, "StorageMigration "+sm)
	if l := done.Labels; l[webhook.LabelArgoApplicationNamespace] != ns || l[webhook.LabelArgoApplicationName] != "boxes" {
		t.Errorf("StorageMigration %s labels %v, want the Application's namespace and name", sm, l)
	}
	// Its success asks Argo CD to compare again, rather than wait for the next resync.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(argocd.ApplicationGVR).Namespace(ns).Get(ctx, "boxes", metav1.GetOptions{})
		return err == nil && u.GetAnnotations()["argocd.argoproj.io/refresh"] == "normal", err
	})
	if err != nil {
		t.Fatalf("Application %s/boxes was not asked to refresh after StorageMigration %s succeeded: %v", ns, sm, err)
	}

	// The next comparison passes, and so does the sync.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return diff() == nil, nil
	})
	if err != nil {
		t.Fatalf("the server-side diff after the migration: %v", diff())
	}
	if err := testenv.ApplyCRDServerSide(ctx, s.cp.Config, crd("v1"), "argocd-controller"); err != nil {
		t.Fatalf("the sync after the migration: %v", err)
	}
	if n := readable("v1"); n != 2 {
		t.Errorf("%d objects readable at v1, want 2", n)
	}
	// The condition Argo CD has not refreshed yet starts nothing more. Argo CD takes the
	// refresh annotation away once it has compared; the controller's reconcile of that
	// change asks again (the comparison it read is older than the migration), and leaves
	// the succeeded migration as it is.
	patch := []byte(`{"metadata":{"annotations":{"argocd.argoproj.io/refresh":null}}}`)
	if _, err := dyn.Resource(argocd.ApplicationGVR).Namespace(ns).Patch(ctx, "boxes", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(argocd.ApplicationGVR).Namespace(ns).Get(ctx, "boxes", metav1.GetOptions{})
		return err == nil && u.GetAnnotations()["argocd.argoproj.io/refresh"] == "normal", err
	})
	if err != nil {
		t.Fatalf("Application %s/boxes was not reconciled after Argo CD took its refresh annotation away: %v", ns, err)
	}
	var after v1alpha1.StorageMigration
	if err := s.c.Get(ctx, client.ObjectKey{Name: sm}, &after); err != nil || after.UID != done.UID {
		t.Errorf("StorageMigration %s after the Application changed: %v, UID %s; want the succeeded one (UID %s)", sm, err, after.UID, done.UID)
	}
}

// reword keeps mark and changes every letter of the rest of msg, as any rewording of
// the gate's sentences could.
func reword(msg, mark string) string {
	before, after, ok := strings.Cut(msg, mark)
	if !ok {
		return msg
	}
	swap := func(r rune) rune {
		if r >= 'a' && r <= 'z' {
			return 'a' + ('z' - r)
		}
		return r
	}
	return strings.Map(swap, before) + mark + strings.Map(swap, after)
}
