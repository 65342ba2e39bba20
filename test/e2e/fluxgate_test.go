//go:build e2e

package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// TestHelmControllerHeldThroughService runs test/fluxgate's scenarios with upgradeguard
// as users install it: the real source-controller and helm-controller (on the host, as in
// test/fluxgate), the chart's Pod on the node, and the API server reaching the three gates
// through the chart's Service with the chart-generated certificate. The chart is
// installed with its policy narrowed to kyverno.io and proactive mode off, so that only
// the gates migrate. Each gate holds a real kyverno 1.12 -> 1.13 upgrade, the controller
// in the Pod migrates, and helm-controller upgrades with nothing failed on the way:
//   - the HelmRelease gate (failurePolicy Fail): a pinned version bump, whose chart it
//     fetches from the scenario's repository (served on the host's address, which the Pod
//     reaches);
//   - the release-record gate: a semver range the repository satisfies anew;
//   - the CRD gate: crds/ applied by `upgrade.crds: Create`.
//
// The release-record and CRD gates fail open (Ignore): had the API server not reached
// them, helm-controller would report the API server's storedVersions rejection instead of
// the gate's denial, and the scenario would fail.
//
// Then `helm uninstall`: a chart change of a HelmRelease that the gate denied is admitted,
// and the StorageMigrations the gates created are kept with the CRDs.
func TestHelmControllerHeldThroughService(t *testing.T) {
	ctx := t.Context()
	// Flux's CRDs and kyverno's, and the StorageMigrations the gates created, go when the
	// test ends (after Flux stops: clean-ups run last-in first-out), so that the next test
	// starts from a cluster without them.
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		if err := ugClient(t).DeleteAllOf(ctx, &v1alpha1.StorageMigration{}); err != nil && !meta.IsNoMatchError(err) {
			t.Errorf("cleanup: delete StorageMigrations: %v", err)
		}
		keep := func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group == v1alpha1.GroupVersion.Group }
		if err := cp.DeleteCRDs(ctx, keep); err != nil {
			t.Errorf("cleanup: delete the Flux and kyverno CRDs: %v", err)
		}
	})
	fx, err := flux.StartControllers(ctx, cp)
	must(t, err, "start source-controller and helm-controller")
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(fx.LogTail(60))
		}
		if err := fx.Stop(); err != nil {
			t.Errorf("stop Flux: %v", err)
		}
	})
	rel := installChart(t, "ug-gates", "--set", "policy.groups={kyverno.io}", "--set", "policy.proactive=false")
	c := ugClient(t)
	env := fluxtest.Env{CP: cp, Flux: fx, UG: c, RepoHost: rel.node.IP}

	t.Run("HelmRelease gate", func(t *testing.T) {
		s := fluxtest.VersionBump(t, env, "version-bump", fluxtest.Options{})
		before := s.ReleaseRevision
		s.BumpThroughHelmReleaseGate(t)
		s.WaitUpgraded(t)
		s.AssertUpgraded(t, before)
	})
	t.Run("release-record gate", func(t *testing.T) {
		fluxtest.SemverRange(t, env, "semver-range", fluxtest.Options{}).RecordHeld(t)
	})
	t.Run("CRD gate", func(t *testing.T) {
		fluxtest.CRDsPolicy(t, env, "crds-create", helmv2.Create, fluxtest.Options{}).HeldByCRDGate(t)
	})
	if t.Failed() {
		return
	}

	// A chart change the HelmRelease gate answers before the uninstall (its source does
	// not exist, so the gate denies it as unchecked) and nobody after it.
	dyn, hr := gatedHelmRelease(t, "uninstall-apps")
	if err := chartChange(ctx, dyn, hr); classify(err) != answerDenied {
		t.Fatalf("a chart change with upgradeguard installed: %v; want the HelmRelease gate's denial", err)
	}
	migrations := migrationNames(t, c)
	if len(migrations) != 3 {
		t.Errorf("StorageMigrations before the uninstall: %v, want one per scenario", migrations)
	}

	uninstalled(t, rel)
	if err := chartChange(ctx, dyn, hr); err != nil {
		t.Errorf("a chart change after helm uninstall: %v; want it admitted (no webhook left)", err)
	}
	if got := migrationNames(t, c); !slices.Equal(got, migrations) {
		t.Errorf("StorageMigrations after helm uninstall: %v, want %v kept (the chart README says so)", got, migrations)
	}
}

// gatedHelmRelease creates namespace ns and, in it, a suspended HelmRelease "podinfo" of
// a HelmRepository that does not exist: the HelmRelease gate answers each chart change
// of it (a denial, since it cannot check the chart), and helm-controller leaves it
// alone. The namespace is deleted when the test ends.
func gatedHelmRelease(t *testing.T, ns string) (dynamic.Interface, *unstructured.Unstructured) {
	t.Helper()
	kubectl(t, "create", "namespace", ns)
	dyn, err := dynamic.NewForConfig(cp.Config)
	must(t, err, "dynamic client")
	// Where helm-controller runs it puts its finalizer on the HelmRelease: delete it while
	// helm-controller still runs (clean-ups run last-in first-out), or its CRD never goes.
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		res := dyn.Resource(helmreleasesV2).Namespace(ns)
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := res.Delete(ctx, "podinfo", metav1.DeleteOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("cleanup: HelmRelease %s/podinfo is not gone: %v", ns, err)
		}
		_ = kubectlOut("delete", "namespace", ns, "--wait=false")
	})
	hr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
		"metadata": map[string]any{"name": "podinfo", "namespace": ns},
		"spec": map[string]any{"interval": "10m", "suspend": true, "chart": map[string]any{"spec": map[string]any{
			"chart": "podinfo", "version": "6.0.0", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"}}}},
	}}
	hr, err = dyn.Resource(helmreleasesV2).Namespace(ns).Create(t.Context(), hr, metav1.CreateOptions{})
	must(t, err, "create HelmRelease %s/podinfo", ns)
	return dyn, hr
}

// chartChange sends a chart version change of hr as a server-side dry run: a merge patch,
// which the API server admits as an UPDATE of the object as it is now (helm-controller
// may have written it since).
func chartChange(ctx context.Context, dyn dynamic.Interface, hr *unstructured.Unstructured) error {
	patch := []byte(`{"spec":{"chart":{"spec":{"version":"6.0.1"}}}}`)
	_, err := dyn.Resource(helmreleasesV2).Namespace(hr.GetNamespace()).Patch(ctx, hr.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// migrationNames lists the StorageMigrations' names, sorted.
func migrationNames(t *testing.T, c client.Client) []string {
	t.Helper()
	var list v1alpha1.StorageMigrationList
	must(t, c.List(t.Context(), &list), "list StorageMigrations")
	names := make([]string, 0, len(list.Items))
	for _, sm := range list.Items {
		names = append(names, sm.Name)
	}
	slices.Sort(names)
	return names
}
