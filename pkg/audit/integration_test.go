package audit_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordv1 "k8s.io/api/coordination/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/config"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
}

// sources reads the cluster cfg points at.
func sources(t *testing.T, cfg *rest.Config) audit.Sources {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cfg)
	return audit.Sources{
		Dynamic:  dynamic.NewForConfigOrDie(cfg),
		Metadata: metadata.NewForConfigOrDie(cfg),
		Leases:   cs.CoordinationV1(),
		Releases: audit.HelmStorage{Clientset: cs},
		Objects:  objects(t, cfg),
		Webhooks: cs.AdmissionregistrationV1(),
	}
}

// run audits the package's control plane.
func run(t *testing.T, ns string) *audit.Report {
	t.Helper()
	rep, err := audit.Run(t.Context(), sources(t, cp.Config), audit.Options{Namespace: ns})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	return rep
}

var (
	scenarioOnce sync.Once
	scenarioErr  error
)

func installScenario(t *testing.T) {
	t.Helper()
	needCluster(t)
	scenarioOnce.Do(func() {
		dir, err := os.MkdirTemp("", "audit-charts-")
		if err != nil {
			scenarioErr = err
			return
		}
		defer func() { _ = os.RemoveAll(dir) }()
		scenarioErr = scenario.Audit(context.WithoutCancel(t.Context()), cp, dir)
	})
	if scenarioErr != nil {
		t.Fatal(scenarioErr)
	}
}

// TestAuditWithoutFlux runs on a cluster without the HelmRelease CRD (nor Argo CD's
// Application CRD): no Flux is not an error. The package's control plane gets Flux's CRDs from whichever test installs the
// scenario first, so this test starts a control plane of its own.
func TestAuditWithoutFlux(t *testing.T) {
	needCluster(t)
	own := testenv.ForTest(t)
	cs := apiextclient.NewForConfigOrDie(own.Config)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), "helmreleases.helm.toolkit.fluxcd.io", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a new control plane serves the HelmRelease CRD (%v)", err)
	}
	rep, err := audit.Run(t.Context(), sources(t, own.Config), audit.Options{})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	if len(rep.Releases) != 0 || rep.Summary.Coverage != "0/0" || rep.Unprotected() || rep.Controller.Running || rep.Applications != nil || rep.CRDGate != nil {
		t.Errorf("empty cluster: %+v", rep)
	}
	// Nor Argo CD: the audit said nothing of it, and reading one Application names the
	// missing CRD (what check --argocd-app reports), not a missing Application.
	_, err = argoapp.Get(t.Context(), dynamic.NewForConfigOrDie(own.Config), "argocd", "flux")
	var nf *argoapp.NotFoundError
	if !errors.As(err, &nf) || !nf.NoCRD || !strings.Contains(err.Error(), "Argo CD's Application CRD is not installed") {
		t.Errorf("Get on a cluster without Argo CD: %v", err)
	}
}

func bySubject(rep *audit.Report) map[string]audit.Release {
	return indexed(rep.Releases, func(r audit.Release) string { return r.Subject })
}

// indexed maps items by key.
func indexed[T any](items []T, key func(T) string) map[string]T {
	out := make(map[string]T, len(items))
	for _, it := range items {
		out[key(it)] = it
	}
	return out
}

func codes(r audit.Release) []string { return findingChecks(r.Findings) }

// findingChecks are the findings' codes, sorted.
func findingChecks(findings []audit.Finding) []string {
	var out []string
	for _, f := range findings {
		out = append(out, f.Check)
	}
	slices.Sort(out)
	return out
}

func TestAuditUpstreamHooks(t *testing.T) {
	installScenario(t)
	rep := run(t, "")
	got := bySubject(rep)
	type want struct {
		chart              string
		crds               int
		upgrade, rollback  []string
		codes              []string
		mechanismOn        map[string]bool
		hookRenderedByHelm map[string]bool
	}
	hook := func(m string) []string { return []string{"upstream hook " + m} }
	cases := map[string]want{
		"Release/flux-a/flux2-default": {chart: "flux2", crds: 14, codes: []string{audit.CodeMechanismOff},
			mechanismOn: map[string]bool{"flux-migrate": false}, hookRenderedByHelm: map[string]bool{"flux-migrate": false}},
		"Release/flux-b/flux2-migrate": {chart: "flux2", crds: 14, upgrade: hook("flux-migrate"),
			mechanismOn: map[string]bool{"flux-migrate": true}, hookRenderedByHelm: map[string]bool{"flux-migrate": true}},
		"HelmRelease/flux-c/flux2-hooks-off": {chart: "flux2", crds: 14, codes: []string{audit.CodeRollbackHooksDisabled, audit.CodeUpgradeHooksDisabled},
			mechanismOn: map[string]bool{"flux-migrate": true}},
		"Release/kyverno/kyverno": {chart: "kyverno", crds: 4, codes: []string{audit.CodePostUpgradeHook},
			mechanismOn: map[string]bool{"kyverno-migrate": true}, hookRenderedByHelm: map[string]bool{"kyverno-migrate": true}},
		"Release/velero/velero": {chart: "velero", crds: 2, codes: []string{audit.CodeAppliesCRDsOnly, audit.CodeDestructive},
			mechanismOn: map[string]bool{"upgrade-crds": true, "cleanup-crds": true}},
		"HelmRelease/kro/kro": {chart: "kro", crds: 2, codes: []string{audit.CodeCRDsSkip, audit.CodeNoProtection}},
		"Release/apps/plain":  {chart: "plain", crds: 0},
	}
	if len(got) != len(cases) {
		t.Errorf("%d releases, want %d: %v", len(got), len(cases), slices.Sorted(func(yield func(string) bool) {
			for k := range got {
				if !yield(k) {
					return
				}
			}
		}))
	}
	for subject, w := range cases {
		r, ok := got[subject]
		if !ok {
			t.Errorf("%s not reported", subject)
			continue
		}
		if r.Chart != w.chart || len(r.CRDs) != w.crds {
			t.Errorf("%s: chart %s with %d CRDs, want %s with %d", subject, r.Chart, len(r.CRDs), w.chart, w.crds)
		}
		if diff := cmp.Diff(w.upgrade, r.Upgrade.By); diff != "" {
			t.Errorf("%s: upgrade protected by (-want +got):\n%s", subject, diff)
		}
		if diff := cmp.Diff(w.rollback, r.Rollback.By); diff != "" {
			t.Errorf("%s: rollback protected by (-want +got):\n%s", subject, diff)
		}
		if diff := cmp.Diff(w.codes, codes(r)); diff != "" {
			t.Errorf("%s: findings (-want +got):\n%s\n%+v", subject, diff, r.Findings)
		}
		if r.Protected {
			t.Errorf("%s: protected without upgradeguard; only flux2-migrate's upgrade is", subject)
		}
		for _, m := range r.Mechanisms {
			if on, ok := w.mechanismOn[m.Name]; ok && m.On != on {
				t.Errorf("%s: mechanism %s on=%v, want %v", subject, m.Name, m.On, on)
			}
			if rendered, ok := w.hookRenderedByHelm[m.Name]; ok && (m.Rendered == nil || *m.Rendered != rendered) {
				t.Errorf("%s: hook %s in the stored release = %v, want %v", subject, m.Name, m.Rendered, rendered)
			}
		}
	}
	// The exact words the issue asks for, and where each value came from.
	for _, f := range got["Release/kyverno/kyverno"].Findings {
		if f.Check == audit.CodePostUpgradeHook && f.Message[:len("post-upgrade: too late when a minor release is skipped")] != "post-upgrade: too late when a minor release is skipped" {
			t.Errorf("kyverno finding: %q", f.Message)
		}
	}
	velero := got["Release/velero/velero"]
	if diff := cmp.Diff([]audit.Value{{Key: "cleanUpCRDs", Value: true, Source: "values"}}, velero.Mechanisms[1].Keys); diff != "" {
		t.Errorf("velero cleanUpCRDs (-want +got):\n%s", diff)
	}
	flux := got["Release/flux-a/flux2-default"]
	if diff := cmp.Diff([]audit.Value{{Key: "crds.migration.enabled", Value: false, Source: "chart default"}}, flux.Mechanisms[0].Keys); diff != "" {
		t.Errorf("flux2 default (-want +got):\n%s", diff)
	}
	if got["HelmRelease/flux-c/flux2-hooks-off"].HelmRelease != "flux-c/flux2-hooks-off" {
		t.Errorf("HelmRelease not paired with its Helm release: %+v", got["HelmRelease/flux-c/flux2-hooks-off"])
	}
	if s := rep.Summary; s != (audit.Summary{Releases: 7, ShipCRDs: 6, Protected: 0, UpgradeProtected: 1, RollbackProtected: 0, Coverage: "0/6"}) {
		t.Errorf("summary %+v", s)
	}
	if !rep.Unprotected() {
		t.Error("Unprotected() = false with 0/6 covered")
	}

	// -n: only that namespace.
	nsRep := run(t, "flux-c")
	if len(nsRep.Releases) != 1 || nsRep.Releases[0].Subject != "HelmRelease/flux-c/flux2-hooks-off" || nsRep.Releases[0].Revision != 1 {
		t.Errorf("-n flux-c: %+v", nsRep.Releases)
	}
}

// installAPI installs upgradeguard's own CRDs (StorageMigrationPolicy, StorageMigration).
func installAPI(t *testing.T) {
	t.Helper()
	for _, f := range []string{"crd/upgradeguard.io_storagemigrationpolicies.yaml", "crd/upgradeguard.io_storagemigrations.yaml"} {
		data, err := config.CRDs.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crds, err := crdversions.FromManifest(f, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.ApplyCRD(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), crds[0]); err != nil {
			t.Fatal(err)
		}
	}
}

func createPolicy(t *testing.T, name string, spec map[string]any) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	gvr := v1alpha1.GroupVersion.WithResource("storagemigrationpolicies")
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "StorageMigrationPolicy",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
	if _, err := dyn.Resource(gvr).Create(t.Context(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(gvr).Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{})
	})
}

// startController runs the real upgradeguard controller (internal/controller, as
// `upgradeguard controller` does, without the webhook) and waits until its leader
// election holds the Lease. The returned function stops it; it releases the Lease on the
// way out.
func startController(t *testing.T, ns string) (stop func()) {
	t.Helper()
	mgr, err := controller.NewManager(cp.Config, controller.Options{
		LeaderElect: true, LeaderElectionNamespace: ns, MetricsAddr: "0", ProbeAddr: "0", SkipNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	select {
	case <-mgr.Elected():
	case err := <-done:
		cancel()
		t.Fatalf("manager stopped before it was elected: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatal("not elected within a minute")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestAuditCountsUpgradeguard(t *testing.T) {
	installScenario(t)
	installAPI(t)
	ctx := t.Context()

	// A proactive policy for everything, but no controller: nothing changes.
	createPolicy(t, "all", map[string]any{})
	rep := run(t, "")
	if rep.Controller.Running || rep.Summary.Protected != 0 || !slices.Equal(rep.Policies, []string{"all"}) {
		t.Fatalf("policy without a controller: controller %+v, summary %+v, policies %v", rep.Controller, rep.Summary, rep.Policies)
	}

	// The real controller holds its Lease: every release that ships CRDs is
	// protected by upgradeguard, on upgrade and on rollback.
	stop := startController(t, "kube-system")
	rep = run(t, "")
	if !rep.Controller.Running || rep.Controller.Lease != "kube-system/upgradeguard-controller" {
		t.Fatalf("controller: %+v", rep.Controller)
	}
	for _, r := range rep.Releases {
		if !r.ShipsCRDs {
			continue
		}
		if !r.Protected || !slices.Contains(r.Upgrade.By, audit.ByUpgradeguard) || !slices.Contains(r.Rollback.By, audit.ByUpgradeguard) {
			t.Errorf("%s: not protected by upgradeguard: upgrade %+v rollback %+v", r.Subject, r.Upgrade, r.Rollback)
		}
	}
	if s := rep.Summary; s.Coverage != "6/6" || rep.Unprotected() {
		t.Errorf("summary %+v", s)
	}
	flux := bySubject(rep)["Release/flux-b/flux2-migrate"]
	if diff := cmp.Diff([]string{"upstream hook flux-migrate", audit.ByUpgradeguard}, flux.Upgrade.By); diff != "" {
		t.Errorf("flux2-migrate upgrade (-want +got):\n%s", diff)
	}

	// A proactive policy must select every CRD the release ships: with only the Flux
	// groups selected (and the catch-all made non-proactive), kyverno, velero and kro
	// fall back to unprotected.
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	gvr := v1alpha1.GroupVersion.WithResource("storagemigrationpolicies")
	patch := []byte(`{"spec":{"proactive":false}}`)
	if _, err := dyn.Resource(gvr).Patch(ctx, "all", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	createPolicy(t, "flux", map[string]any{"groups": []any{"source.toolkit.fluxcd.io", "kustomize.toolkit.fluxcd.io", "helm.toolkit.fluxcd.io",
		"notification.toolkit.fluxcd.io", "image.toolkit.fluxcd.io", "source.extensions.fluxcd.io"}})
	// A policy selecting most of kyverno's CRDs by label still leaves it unprotected.
	createPolicy(t, "kyverno-some", map[string]any{"groups": []any{"kyverno.io"}, "selector": map[string]any{"matchLabels": map[string]any{"no-such": "label"}}})
	rep = run(t, "")
	got := bySubject(rep)
	for subject, want := range map[string]bool{
		"Release/flux-a/flux2-default": true, "Release/flux-b/flux2-migrate": true, "HelmRelease/flux-c/flux2-hooks-off": true,
		"Release/kyverno/kyverno": false, "Release/velero/velero": false, "HelmRelease/kro/kro": false,
	} {
		if r := got[subject]; r.Protected != want {
			t.Errorf("%s: protected=%v with the flux policy, want %v (%v)", subject, r.Protected, want, r.Upgrade.By)
		}
	}
	if !slices.Equal(rep.Policies, []string{"flux", "kyverno-some"}) {
		t.Errorf("proactive policies %v", rep.Policies)
	}

	// The controller stops and releases its Lease: not running, nothing protected by it.
	stop()
	rep = run(t, "")
	if rep.Controller.Running || rep.Summary.Protected != 0 {
		t.Errorf("after the controller stopped: %+v, %+v", rep.Controller, rep.Summary)
	}

	// A Lease with a holder that stopped renewing long ago is expired.
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	old := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	lease := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "upgradeguard-controller"},
		Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("gone"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &old}}
	if _, err := cs.CoordinationV1().Leases("default").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoordinationV1().Leases("default").Delete(context.WithoutCancel(ctx), lease.Name, metav1.DeleteOptions{})
	})
	rep = run(t, "")
	if rep.Controller.Running || rep.Summary.Protected != 0 {
		t.Errorf("expired Lease counted: %+v", rep.Controller)
	}
	// Renewed now, it counts again (any namespace).
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoordinationV1().Leases("default").Get(ctx, lease.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		_, err = cs.CoordinationV1().Leases("default").Update(ctx, l, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rep = run(t, "")
	if !rep.Controller.Running || rep.Controller.Lease != "default/upgradeguard-controller" || rep.Summary.Protected != 3 {
		t.Errorf("renewed Lease: %+v, summary %+v", rep.Controller, rep.Summary)
	}
}

// The audit looks for the Lease the controller's leader election takes.
func TestLeaseNameIsTheControllers(t *testing.T) {
	if audit.ControllerLeaseName != controller.LeaderElectionID {
		t.Errorf("audit looks for Lease %q, the controller takes %q", audit.ControllerLeaseName, controller.LeaderElectionID)
	}
}
