package fluxtest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
)

// The remediation-rollback scenarios below use small charts of their own (the kyverno
// charts never need a rollback that deletes or reverse-migrates a CRD).

// RollbackGroup is the API group of their CRDs.
const RollbackGroup = "rollback.upgradeguard.io"

// CRDDoc is a namespaced CRD of RollbackGroup named after kind, serving versions (the
// last is the storage version) with an open schema.
func CRDDoc(kind string, versions ...string) string {
	lower := strings.ToLower(kind)
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: %ss.%s\nspec:\n  group: %s\n  names: {kind: %s, listKind: %sList, plural: %ss, singular: %s}\n  scope: Namespaced\n  versions:\n",
		lower, RollbackGroup, RollbackGroup, kind, kind, lower, lower)
	for i, v := range versions {
		fmt.Fprintf(&b, "  - name: %s\n    served: true\n    storage: %t\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n", v, i == len(versions)-1)
	}
	return b.String()
}

// BrokenService is a Service the API server rejects (port 0): an upgrade that renders it
// fails after the CRDs are applied (Helm applies CRDs before Services, and stops at the
// first failure).
const BrokenService = "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\nspec:\n  ports:\n  - port: 0\n"

// NeverReady is a Deployment that never becomes ready (there is no kubelet): an upgrade
// that renders it fails when helm-controller's wait times out, after everything is applied.
const NeverReady = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: never-ready\nspec:\n  selector: {matchLabels: {app: never-ready}}\n  template:\n    metadata: {labels: {app: never-ready}}\n    spec: {containers: [{name: c, image: registry.invalid/never:1}]}\n"

// TemplatesChart writes the chart name at version with templates/ files (file name ->
// content) and returns its directory.
func TemplatesChart(t testing.TB, name, version string, templates map[string]string) string {
	t.Helper()
	files := map[string]string{}
	for f, doc := range templates {
		files["templates/"+f] = doc
	}
	dir, err := testenv.WriteChart(filepath.Join(t.TempDir(), version), name, version, files)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// RemediatedRelease serves charts from a loopback chart repository and installs the
// HelmRelease name in ns at chart version from, with `upgrade.remediation.strategy:
// rollback` and `retries: 1` (after a failed upgrade helm-controller rolls back by
// itself) and the given timeout (0: helm-controller's default), then waits until it is
// Ready. Cleanup deletes the HelmRelease and the CRDs named.
func RemediatedRelease(t testing.TB, env Env, ns, name, from string, timeout time.Duration, charts []string, crds ...string) *helmv2.HelmRelease {
	t.Helper()
	ctx := t.Context()
	if err := env.Flux.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	repo, err := servers.NewChartRepo(filepath.Join(t.TempDir(), "repo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	for _, dir := range charts {
		if err := repo.Add(dir); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Flux.Client.Create(ctx, flux.HelmRepository(ns, "charts", repo.URL)); err != nil {
		t.Fatal(err)
	}
	hr := flux.HelmReleaseFromRepository(ns, name, "charts", name, from)
	strategy := helmv2.RollbackRemediationStrategy
	hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: 1, Strategy: &strategy}}
	if timeout > 0 {
		hr.Spec.Timeout = &metav1.Duration{Duration: timeout}
	}
	if err := env.Flux.Client.Create(ctx, hr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = env.Flux.Client.Delete(ctx, hr)
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return apierrors.IsNotFound(env.Flux.Client.Get(ctx, client.ObjectKeyFromObject(hr), &helmv2.HelmRelease{})), nil
		})
		for _, crd := range crds {
			_ = env.Flux.Client.Delete(ctx, &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: crd}})
		}
	})
	if _, err := env.Flux.WaitHelmRelease(ctx, ns, name, 3*time.Minute, flux.ReadyAtGeneration(metav1.ConditionTrue)); err != nil {
		t.Fatalf("%v\n%s", err, env.Flux.LogTail(20))
	}
	return hr
}

// GearsCRD is the CRD that gears 2.0.0 adds.
const GearsCRD = "gears." + RollbackGroup

// GearsInUse sets up the release "gears" in ns whose failed upgrade added a CRD that is
// already in use: 1.0.0 renders a ConfigMap; 2.0.0 adds the Gear CRD to templates/ and a
// Deployment that never becomes ready. It bumps the HelmRelease to 2.0.0, and while
// helm-controller waits for the Deployment (timeout 30s) it creates two Gears. When the
// wait times out, helm-controller's remediation rolls back to 1.0.0, which no longer
// renders the CRD: Helm deletes it and every Gear with it. It returns the HelmRelease
// and the Gears' client.
func GearsInUse(t testing.TB, env Env, ns string) (*helmv2.HelmRelease, dynamic.ResourceInterface) {
	t.Helper()
	ctx := t.Context()
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gears-config\n"
	hr := RemediatedRelease(t, env, ns, "gears", "1.0.0", 30*time.Second, []string{
		TemplatesChart(t, "gears", "1.0.0", map[string]string{"cm.yaml": cm}),
		TemplatesChart(t, "gears", "2.0.0", map[string]string{"cm.yaml": cm, "crd.yaml": CRDDoc("Gear", "v1"), "deploy.yaml": NeverReady}),
	}, GearsCRD)
	if err := env.Flux.Update(ctx, hr, func() { hr.Spec.Chart.Spec.Version = "2.0.0" }); err != nil {
		t.Fatalf("the version bump to 2.0.0 (adds a CRD): %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var crd apiextv1.CustomResourceDefinition
		err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: GearsCRD}, &crd)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && apihelpers.IsCRDConditionTrue(&crd, apiextv1.Established), err
	})
	if err != nil {
		t.Fatalf("the upgrade to 2.0.0 did not establish %s: %v\n%s", GearsCRD, err, env.Flux.LogTail(20))
	}
	gears := dynamic.NewForConfigOrDie(env.CP.Config).Resource(schema.GroupVersionResource{Group: RollbackGroup, Version: "v1", Resource: "gears"}).Namespace(ns)
	for i := range 2 {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": RollbackGroup + "/v1", "kind": "Gear",
			"metadata": map[string]any{"name": fmt.Sprintf("g-%d", i)}, "spec": map[string]any{"teeth": int64(30)}}}
		if _, err := gears.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The premise: the Gears exist before the upgrade fails (revision 2 still pending).
	if h := History(t, env, ns, "gears"); len(h) != 2 || h[1].Status != "pending-upgrade" {
		t.Fatalf("history %+v when the Gears exist, want revision 2 pending-upgrade (the upgrade ended before the test could use its CRD; raise the HelmRelease timeout)", h)
	}
	return hr, gears
}
