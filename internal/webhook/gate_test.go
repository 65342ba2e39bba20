package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	repo "helm.sh/helm/v4/pkg/repo/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

const (
	buckets   = "buckets.source.toolkit.fluxcd.io"
	gitrepos  = "gitrepositories.source.toolkit.fluxcd.io"
	helmchs   = "helmcharts.source.toolkit.fluxcd.io"
	helmrepos = "helmrepositories.source.toolkit.fluxcd.io"
	ocirepos  = "ocirepositories.source.toolkit.fluxcd.io"
	ks        = "kustomizations.kustomize.toolkit.fluxcd.io"
	hrs       = "helmreleases.helm.toolkit.fluxcd.io"
	envcfgs   = "environmentconfigs.apiextensions.crossplane.io"
	certs     = "certificates.cert-manager.io"
)

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
}

func namespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func helmRepo(t *testing.T, ns, name string, spec sourcev1.HelmRepositorySpec) {
	t.Helper()
	spec.Interval = metav1.Duration{Duration: 10 * time.Minute}
	if err := s.c.Create(t.Context(), &sourcev1.HelmRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
}

func helmRelease(t *testing.T, ns, name, chart, version, repo string, mutate ...func(*helmv2.HelmRelease)) {
	t.Helper()
	hr := &helmv2.HelmRelease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: helmv2.HelmReleaseSpec{
			Interval: metav1.Duration{Duration: 10 * time.Minute},
			Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
				Chart: chart, Version: version,
				SourceRef: helmv2.CrossNamespaceObjectReference{Kind: sourcev1.HelmRepositoryKind, Name: repo},
			}},
		},
	}
	for _, m := range mutate {
		m(hr)
	}
	if err := s.c.Create(t.Context(), hr); err != nil {
		t.Fatal(err)
	}
}

// setVersion is the GitOps apply of a chart version change (a patch, as kubectl and
// kustomize-controller send, with no resourceVersion precondition): it returns the API
// server's answer, through the real webhook.
func setVersion(ctx context.Context, c client.Client, ns, name, version string) error {
	var hr helmv2.HelmRelease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &hr); err != nil {
		return err
	}
	base := hr.DeepCopy()
	hr.Spec.Chart.Spec.Version = version
	return c.Patch(ctx, &hr, client.MergeFrom(base))
}

func mustDeny(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the update was admitted, want it denied (%s)", strings.Join(want, "; "))
	}
	if !apierrors.IsForbidden(err) {
		t.Fatalf("want a denial (403), got %v", err)
	}
	t.Logf("denied: %v", err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("denial does not say %q:\n%v", w, err)
		}
	}
}

// gateState polls the HelmRelease until its gate annotation satisfies ok.
func gateState(t *testing.T, ns, name string, ok func(webhook.State) bool) webhook.State {
	t.Helper()
	var st webhook.State
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var hr helmv2.HelmRelease
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &hr); err != nil {
			return false, err
		}
		st = webhook.ParseState(&hr)
		return ok(st), nil
	})
	if err != nil {
		t.Fatalf("gate annotation of %s/%s: %v (last: %+v)", ns, name, err, st)
	}
	return st
}

func condStatus(st webhook.State, typ string) metav1.ConditionStatus {
	if c := apimeta.FindStatusCondition(st.Conditions, typ); c != nil {
		return c.Status
	}
	return ""
}

// waitEvent waits for an event with the reason regarding a HelmRelease, whose note says
// note.
func waitEvent(t *testing.T, ns, name, reason, note string) {
	t.Helper()
	waitEventOn(t, helmv2.HelmReleaseKind, ns, name, reason, note)
}

// waitEventOn waits for an event with reason and note on the object of kind ns/name.
func waitEventOn(t *testing.T, kind, ns, name, reason, note string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := s.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason && strings.Contains(e.Note, note) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no event %s saying %q on %s %s/%s: %v", reason, note, kind, ns, name, err)
	}
}

func decisions(outcome string) float64 {
	return testutil.ToFloat64(metrics.GateDecisions.WithLabelValues(outcome))
}

// TestGateFluxBoundary is the production incident through the gate: flux2 2.17.2 ->
// 2.18.2 with the source, kustomize and helm CRDs still holding v1beta2/v2beta2 in
// storedVersions. The update is denied with the actionable message; with a policy, a
// StorageMigration is created and held on; once it has run, the same update is admitted.
func TestGateFluxBoundary(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string][]string{buckets: {"v1beta2", "v1"}, gitrepos: {"v1beta2", "v1"}, helmchs: {"v1beta2", "v1"},
		helmrepos: {"v1beta2", "v1"}, ocirepos: {"v1beta2", "v1"}, ks: {"v1beta2", "v1"}, hrs: {"v2beta2", "v2"}}
	for name, versions := range stored {
		if err := testenv.SetStoredVersions(ctx, cs, name, versions...); err != nil {
			t.Fatal(err)
		}
	}
	helmRepo(t, "flux-system", "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	helmRelease(t, "flux-system", "flux", "flux2", "2.17.2", "charts")

	// No policy yet: denied with the command to run.
	blocked := decisions(webhook.OutcomeBlocked)
	err = setVersion(ctx, s.c, "flux-system", "flux", "2.18.2")
	mustDeny(t, err, "upgradeguard denied the upgrade of release flux-system/flux from chart flux2 2.17.2 to 2.18.2 before anything was applied",
		"no StorageMigrationPolicy with autoMigrate selects", "upgradeguard migrate --crd "+buckets+" --crd "+gitrepos)
	// The API server may retry a webhook call after a network error, so a decision can
	// be counted more than once: assert that it was counted.
	if got := decisions(webhook.OutcomeBlocked); got <= blocked {
		t.Errorf("blocked decisions = %v, want more than %v", got, blocked)
	}
	st := gateState(t, "flux-system", "flux", func(st webhook.State) bool { return st.Decision == webhook.OutcomeBlocked })
	if condStatus(st, v1alpha1.ConditionStorageMigrationRequired) != metav1.ConditionTrue {
		t.Errorf("StorageMigrationRequired is not True: %+v", st.Conditions)
	}
	waitEvent(t, "flux-system", "flux", "ChartChangeBlocked", "no StorageMigrationPolicy with autoMigrate")

	// A policy that auto-migrates the Flux groups.
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "flux"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"source.toolkit.fluxcd.io", "kustomize.toolkit.fluxcd.io", "helm.toolkit.fluxcd.io"},
			Proactive: ptr.To(false)}} // gate only: proactive mode would migrate before the update

	if err := s.c.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.c.Delete(context.WithoutCancel(ctx), policy) })

	// An operator's `upgradeguard migrate` holds the migration Lease of the first CRD, so
	// the StorageMigration stays in progress until it is released.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "upgradeguard-migrate-" + buckets},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("operator-cli"), LeaseDurationSeconds: ptr.To(int32(3600)),
			RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))}}
	if err := s.c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}

	migrating := decisions(webhook.OutcomeMigrating)
	err = setVersion(ctx, s.c, "flux-system", "flux", "2.18.2")
	// The API server re-runs admission when the object changes during the call, so the
	// answer may come from a second call that finds the StorageMigration created.
	mustDeny(t, err, "StorageMigration hr-flux-system-flux", "held until StorageMigration hr-flux-system-flux completes",
		"Flux's retries of this change will then succeed", helmrepos)
	var sm v1alpha1.StorageMigration
	if err := s.c.Get(ctx, client.ObjectKey{Name: "hr-flux-system-flux"}, &sm); err != nil {
		t.Fatalf("the StorageMigration was not created: %v", err)
	}
	wantRes := []string{buckets, gitrepos, helmchs, helmrepos, ocirepos, hrs, ks}
	slices.Sort(wantRes)
	if diff := cmp.Diff(wantRes, sm.Spec.Resources); diff != "" {
		t.Errorf("StorageMigration resources (-want +got):\n%s", diff)
	}
	if sm.Labels[webhook.LabelHelmReleaseNamespace] != "flux-system" || sm.Labels[webhook.LabelHelmReleaseName] != "flux" || sm.Spec.KubeConfig != nil {
		t.Errorf("StorageMigration labels %v, kubeConfig %v", sm.Labels, sm.Spec.KubeConfig)
	}
	waitEvent(t, "flux-system", "flux", "StorageMigrationStarted", "StorageMigration hr-flux-system-flux was created")
	st = gateState(t, "flux-system", "flux", func(st webhook.State) bool { return st.Decision == webhook.OutcomeMigrating })
	if condStatus(st, v1alpha1.ConditionStorageMigrationInProgress) != metav1.ConditionTrue || st.StorageMigration != "hr-flux-system-flux" {
		t.Errorf("gate state while migrating: %+v", st)
	}

	// A retry while it runs: held, and no second StorageMigration.
	err = setVersion(ctx, s.c, "flux-system", "flux", "2.18.2")
	mustDeny(t, err, "StorageMigration hr-flux-system-flux is in progress")
	if got := decisions(webhook.OutcomeMigrating); got < migrating+2 {
		t.Errorf("migrating decisions = %v, want at least %v", got, migrating+2)
	}
	var all v1alpha1.StorageMigrationList
	if err := s.c.List(ctx, &all, client.MatchingLabels{webhook.LabelHelmReleaseName: "flux"}); err != nil || len(all.Items) != 1 {
		t.Errorf("StorageMigrations for the HelmRelease: %d (%v)", len(all.Items), err)
	}

	// The operator's run ends; the controller takes over and finishes.
	if err := s.c.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitMigration(t, "hr-flux-system-flux")
	var done v1alpha1.StorageMigration
	if err := s.c.Get(ctx, client.ObjectKey{Name: "hr-flux-system-flux"}, &done); err != nil {
		t.Fatal(err)
	}
	for _, r := range done.Status.Resources {
		if r.Phase != v1alpha1.PhaseSucceeded || len(r.StoredVersionsAfter) != 1 {
			t.Errorf("StorageMigration progress of %s: %+v", r.Name, r)
		}
	}

	// Flux's retry is admitted now.
	admitted := decisions(webhook.OutcomeAdmitted)
	if err := setVersion(ctx, s.c, "flux-system", "flux", "2.18.2"); err != nil {
		t.Fatalf("the update after the migration was denied: %v", err)
	}
	if got := decisions(webhook.OutcomeAdmitted); got <= admitted {
		t.Errorf("admitted decisions = %v, want more than %v", got, admitted)
	}
	st = gateState(t, "flux-system", "flux", func(st webhook.State) bool { return st.Decision == webhook.OutcomeAdmitted })
	c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStorageMigrationRequired)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Migrated" || condStatus(st, v1alpha1.ConditionStorageMigrationInProgress) != metav1.ConditionFalse {
		t.Errorf("gate state after the migration: %+v", st.Conditions)
	}
	for name := range stored {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(crd.Status.StoredVersions) != 1 {
			t.Errorf("%s storedVersions = %v after the migration", name, crd.Status.StoredVersions)
		}
	}
}

// warnings records the API server's warning headers (admission warnings among them).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// TestGateRollbackDenied walks crossplane 1.17.3 -> 1.18.0 -> 1.17.3 through a HelmRelease.
// The upgrade is admitted, with a warning that helm-controller's rollback remediation
// would be rejected after it (crossplane#6148). Once a real Helm upgrade has stored
// EnvironmentConfigs at v1beta1, which 1.17.3 lacks, moving the version back is denied as
// a rollback before anything is applied.
func TestGateRollbackDenied(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "crossplane-system"
	if out, err := s.cp.Helm("install", "crossplane", s.charts["crossplane-1.17.3"], "-n", ns, "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v: %s", err, out)
	}
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	helmRelease(t, ns, "crossplane", "crossplane", "1.17.3", "charts", func(hr *helmv2.HelmRelease) {
		hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: 3}}
	})
	w := &warnings{}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WarningHandler = w
	wc, err := client.New(cfg, client.Options{Scheme: s.scheme})
	if err != nil {
		t.Fatal(err)
	}
	// A chart that drops CRDs the release renders today: Helm would delete them and every
	// object of their types. The Functions CRD holds one, so the gate denies; the
	// FunctionRevisions CRD holds none, so its deletion loses nothing and is let go.
	if err := testenv.CreateObjects(ctx, s.cp.Config, testenv.Objects{
		GVR: schema.GroupVersionResource{Group: "pkg.crossplane.io", Version: "v1", Resource: "functions"}, Kind: "Function", PerNS: 1,
		Spec: map[string]any{"package": "xpkg.upbound.io/crossplane-contrib/function-patch-and-transform:v0.1.4"},
	}); err != nil {
		t.Fatal(err)
	}
	err = setVersion(ctx, s.c, ns, "crossplane", "1.18.1")
	mustDeny(t, err, "before anything was applied: Helm would delete CRDs and every object of their types, and no automatic migration fixes it",
		"functions.pkg.crossplane.io: the upgrade target no longer renders it, so Helm deletes the CRD and its one Function object",
		"kubectl annotate crd functions.pkg.crossplane.io helm.sh/resource-policy=keep")
	st := gateState(t, ns, "crossplane", func(st webhook.State) bool { return st.Decision == webhook.OutcomeBlocked })
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStorageMigrationRequired); c == nil || c.Reason != "CRDWouldBeDeleted" {
		t.Errorf("gate state: %+v", st)
	}

	if err := setVersion(ctx, wc, ns, "crossplane", "1.18.0"); err != nil {
		t.Fatalf("the upgrade to 1.18.0 was denied: %v", err)
	}
	w.mu.Lock()
	got := strings.Join(w.list, "\n")
	w.mu.Unlock()
	if !strings.Contains(got, "helm-controller's rollback remediation would be rejected on "+envcfgs) {
		t.Errorf("no remediation warning on the upgrade; warnings: %q", got)
	}
	if want := "a reverse migration (upgradeguard migrate --rollback --release crossplane -n " + ns + " --allow-storage-switch)"; !strings.Contains(got, want) {
		t.Errorf("the remediation warning does not name %q; warnings: %q", want, got)
	}

	// helm-controller's upgrade, done here by the real Helm CLI.
	if out, err := s.cp.Helm("upgrade", "crossplane", s.charts["crossplane-1.18.0"], "-n", ns).CombinedOutput(); err != nil {
		t.Fatalf("helm upgrade: %v: %s", err, out)
	}
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	before, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, envcfgs, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	err = setVersion(ctx, s.c, ns, "crossplane", "1.17.3")
	mustDeny(t, err, "rollback (a move back to an older chart version) of release crossplane-system/crossplane from chart crossplane 1.18.0 to 1.17.3",
		"before anything was applied", envcfgs+": live storage version v1beta1 is dropped by the incoming CRD",
		"upgradeguard migrate --rollback --release crossplane -n crossplane-system --to-revision 1 --allow-storage-switch")

	var hr helmv2.HelmRelease
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "crossplane"}, &hr); err != nil {
		t.Fatal(err)
	}
	if hr.Spec.Chart.Spec.Version != "1.18.0" {
		t.Errorf("the HelmRelease changed to %s", hr.Spec.Chart.Spec.Version)
	}
	after, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, envcfgs, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("%s was written (resourceVersion %s -> %s)", envcfgs, before.ResourceVersion, after.ResourceVersion)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Name: webhook.MigrationName(ns, "crossplane")}, &v1alpha1.StorageMigration{}); !apierrors.IsNotFound(err) {
		t.Errorf("a StorageMigration exists for an unfixable rollback: %v", err)
	}
	st = gateState(t, ns, "crossplane", func(st webhook.State) bool {
		return st.Decision == webhook.OutcomeBlocked && st.Operation == "rollback"
	})
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStorageMigrationRequired); c == nil || c.Reason != "BridgeRequired" {
		t.Errorf("gate state: %+v", st)
	}
}

// TestGateSafeUpdate admits kro 0.2.0 -> ~0.9 (the highest match, 0.9.3) from an OCI
// HelmRepository, then a switch to an OCIRepository chartRef; a values-only change never
// reaches the gate.
func TestGateSafeUpdate(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "kro"
	if out, err := s.cp.Helm("install", "kro", s.charts["kro-0.2.0"], "-n", ns, "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install kro: %v: %s", err, out)
	}
	// The release owns kro's CRD (Helm's ownership annotations name kro/kro): while it is
	// installed, another test's release of the kro chart is a move between releases,
	// which the gate refuses. The tests share one control plane, so it goes at the end.
	t.Cleanup(func() {
		if out, err := s.cp.Helm("uninstall", "kro", "-n", ns, "--wait").CombinedOutput(); err != nil {
			t.Errorf("helm uninstall kro: %v: %s", err, out)
		}
	})
	helmRepo(t, ns, "oci", sourcev1.HelmRepositorySpec{URL: "oci://" + s.ociHost + "/charts", Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true})
	helmRelease(t, ns, "kro", "kro", "0.2.0", "oci", func(hr *helmv2.HelmRelease) {
		strategy := helmv2.UninstallRemediationStrategy
		hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: 1, Strategy: &strategy}}
	})

	w := &warnings{}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WarningHandler = w
	wc, err := client.New(cfg, client.Options{Scheme: s.scheme})
	if err != nil {
		t.Fatal(err)
	}
	admitted := decisions(webhook.OutcomeAdmitted)
	if err := setVersion(ctx, wc, ns, "kro", "~0.9"); err != nil {
		t.Fatalf("safe update denied: %v", err)
	}
	// Safe, but helm-controller's uninstall remediation would delete the CRD (from
	// templates/) and every ResourceGraphDefinition if the upgrade failed.
	w.mu.Lock()
	got := strings.Join(w.list, "\n")
	w.mu.Unlock()
	if !strings.Contains(got, "helm-controller's uninstall remediation (spec.upgrade.remediation.strategy: uninstall) deletes resourcegraphdefinitions.kro.run") {
		t.Errorf("no uninstall-remediation warning; warnings: %q", got)
	}
	st := gateState(t, ns, "kro", func(st webhook.State) bool { return st.Decision == webhook.OutcomeAdmitted })
	if st.Chart != "kro@0.9.3" || condStatus(st, v1alpha1.ConditionStorageMigrationRequired) != metav1.ConditionFalse {
		t.Errorf("gate state: %+v", st)
	}

	oci := &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kro"}, Spec: sourcev1.OCIRepositorySpec{
		URL: "oci://" + s.ociHost + "/charts/kro", Insecure: true, Interval: metav1.Duration{Duration: time.Hour},
		Reference: &sourcev1.OCIRepositoryRef{SemVer: ">=0.9.0"},
	}}
	if err := s.c.Create(ctx, oci); err != nil {
		t.Fatal(err)
	}
	var hr helmv2.HelmRelease
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kro"}, &hr); err != nil {
		t.Fatal(err)
	}
	base := hr.DeepCopy()
	hr.Spec.Chart = nil
	hr.Spec.ChartRef = &helmv2.CrossNamespaceSourceReference{Kind: sourcev1.OCIRepositoryKind, Name: "kro"}
	if err := s.c.Patch(ctx, &hr, client.MergeFrom(base)); err != nil {
		t.Fatalf("chartRef switch denied: %v", err)
	}
	afterSwitch := decisions(webhook.OutcomeAdmitted)
	if afterSwitch < admitted+2 {
		t.Errorf("admitted decisions = %v, want at least %v", afterSwitch, admitted+2)
	}
	// A values change is not a chart change: the gate is not consulted.
	base = hr.DeepCopy()
	hr.Spec.Values = &apiextv1.JSON{Raw: []byte(`{"replicas":2}`)}
	if err := s.c.Patch(ctx, &hr, client.MergeFrom(base)); err != nil {
		t.Fatalf("values update denied: %v", err)
	}
	if got := decisions(webhook.OutcomeAdmitted); got != afterSwitch {
		t.Errorf("a values-only update reached the gate: admitted decisions = %v, want %v", got, afterSwitch)
	}
}

// TestGateKubeConfigTarget checks a HelmRelease whose spec.kubeConfig.secretRef targets
// another cluster (a second real control plane): cert-manager 1.6.3 -> 1.7.0 with
// certificates stored at v1alpha2 there. The local cluster has no cert-manager CRDs, so
// only the remote could produce this verdict; the StorageMigration carries the Secret.
func TestGateKubeConfigTarget(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	remote := testenv.ForTest(t)
	if out, err := remote.Helm("install", "cert-manager", s.charts["cert-manager-1.6.3"], "-n", "cert-manager", "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install cert-manager on the remote: %v: %s", err, out)
	}
	rcs, err := apiextclient.NewForConfig(remote.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.SetStoredVersions(ctx, rcs, certs, "v1alpha2", "v1"); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := os.ReadFile(remote.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := "remote"
	namespace(t, s.c, ns)
	// "value.yaml" is Flux's second key: the gate must fall back to it.
	if err := s.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shoot-kubeconfig"}, Data: map[string][]byte{"value.yaml": kubeconfig}}); err != nil {
		t.Fatal(err)
	}
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cert-manager"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"cert-manager.io"}, Proactive: ptr.To(false)}}
	if err := s.c.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.c.Delete(context.WithoutCancel(ctx), policy) })
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	helmRelease(t, ns, "cert-manager", "cert-manager", "1.6.3", "charts", func(hr *helmv2.HelmRelease) {
		hr.Spec.KubeConfig = &meta.KubeConfigReference{SecretRef: &meta.SecretKeyReference{Name: "shoot-kubeconfig"}}
		hr.Spec.TargetNamespace, hr.Spec.StorageNamespace, hr.Spec.ReleaseName = "cert-manager", "cert-manager", "cert-manager"
	})

	// A run on the remote holds the CRD's migration Lease there, so the migration stays
	// in progress until it is released (the API server may call the webhook again during
	// one request, and a finished migration would rightly admit that call).
	rc, err := client.New(remote.Config, client.Options{Scheme: s.scheme})
	if err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "upgradeguard-migrate-" + certs},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("operator-cli"), LeaseDurationSeconds: ptr.To(int32(3600)),
			RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))}}
	if err := rc.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}

	err = setVersion(ctx, s.c, ns, "cert-manager", "1.7.0")
	mustDeny(t, err, "release cert-manager/cert-manager from chart cert-manager 1.6.3 to 1.7.0", certs, "held until StorageMigration hr-remote-cert-manager completes")
	var sm v1alpha1.StorageMigration
	if err := s.c.Get(ctx, client.ObjectKey{Name: "hr-remote-cert-manager"}, &sm); err != nil {
		t.Fatal(err)
	}
	want := &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: ns, Name: "shoot-kubeconfig"}}
	if diff := cmp.Diff(want, sm.Spec.KubeConfig); diff != "" {
		t.Errorf("StorageMigration kubeConfig (-want +got):\n%s", diff)
	}
	if !slices.Contains(sm.Spec.Resources, certs) {
		t.Errorf("StorageMigration resources = %v", sm.Spec.Resources)
	}

	// The controller migrates the remote cluster through the copied reference, and the
	// retry is admitted.
	if err := rc.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitMigration(t, "hr-remote-cert-manager")
	crd, err := rcs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, certs, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"v1"}, crd.Status.StoredVersions); diff != "" {
		t.Errorf("remote storedVersions after the migration (-want +got):\n%s", diff)
	}
	if err := setVersion(ctx, s.c, ns, "cert-manager", "1.7.0"); err != nil {
		t.Fatalf("the update after the remote migration was denied: %v", err)
	}
}

// TestGateHelmRepositoryAuth resolves a chart from a HelmRepository that needs basic auth,
// with the credentials of its secretRef; without them the gate cannot check and denies,
// saying why.
func TestGateHelmRepositoryAuth(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	dir := t.TempDir()
	for _, v := range []string{"0.9.0", "0.9.3"} {
		data, err := os.ReadFile(s.charts["kro-"+v])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(s.charts["kro-"+v])), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var authorized, refused atomic.Int64
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "reader" || p != "s3cret" {
			refused.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		authorized.Add(1)
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	idx, err := repo.IndexDirectory(dir, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.WriteFile(filepath.Join(dir, "index.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}

	ns := "private"
	namespace(t, s.c, ns)
	if err := s.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repo-auth"},
		Data: map[string][]byte{"username": []byte("reader"), "password": []byte("s3cret")}}); err != nil {
		t.Fatal(err)
	}
	helmRepo(t, ns, "private", sourcev1.HelmRepositorySpec{URL: srv.URL, SecretRef: &meta.LocalObjectReference{Name: "repo-auth"}})
	helmRepo(t, ns, "private-no-auth", sourcev1.HelmRepositorySpec{URL: srv.URL})
	helmRelease(t, ns, "kro", "kro", "0.9.0", "private")
	helmRelease(t, ns, "kro-no-auth", "kro", "0.9.0", "private-no-auth")

	if err := setVersion(ctx, s.c, ns, "kro", "0.9.3"); err != nil {
		t.Fatalf("update from an authenticated repository denied: %v", err)
	}
	if authorized.Load() == 0 {
		t.Error("the gate never fetched from the repository with the secretRef's credentials")
	}
	err = setVersion(ctx, s.c, ns, "kro-no-auth", "0.9.3")
	mustDeny(t, err, "upgradeguard could not check the chart change of HelmRelease private/kro-no-auth", "401")
	if strings.Contains(err.Error(), "s3cret") {
		t.Error("the denial shows the repository password")
	}
	if refused.Load() == 0 {
		t.Error("the repository never refused the gate's request without credentials")
	}

	// A server-side dry run is answered without side effects (sideEffects: NoneOnDryRun):
	// once the denial above is recorded, a dry run changes nothing.
	gateState(t, ns, "kro-no-auth", func(st webhook.State) bool { return st.Decision == webhook.OutcomeError })
	var hr helmv2.HelmRelease
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kro-no-auth"}, &hr); err != nil {
		t.Fatal(err)
	}
	before := hr.Annotations[webhook.AnnotationGate]
	base := hr.DeepCopy()
	hr.Spec.Chart.Spec.Version = "0.9.0-rc.1"
	err = s.c.Patch(ctx, &hr, client.MergeFrom(base), client.DryRunAll)
	mustDeny(t, err, "upgradeguard could not check")
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kro-no-auth"}, &hr); err != nil {
		t.Fatal(err)
	}
	if got := hr.Annotations[webhook.AnnotationGate]; got != before {
		t.Errorf("a dry run changed the gate annotation:\n%s\n->\n%s", before, got)
	}
	// Events are written asynchronously: record a real decision after the dry run, wait
	// for its event, and check that none names the dry run's version.
	mustDeny(t, setVersion(ctx, s.c, ns, "kro-no-auth", "0.9.0-rc.2"), "upgradeguard could not check")
	waitEvent(t, ns, "kro-no-auth", "GateError", "kro@0.9.0-rc.2")
	var list eventsv1.EventList
	if err := s.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if strings.Contains(e.Note, "0.9.0-rc.1") {
			t.Errorf("a dry run emitted an event: %s", e.Note)
		}
	}
}
