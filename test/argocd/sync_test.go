//go:build argocd

package argocd_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// TestSyncDroppingStoredVersionFails is garage-operator#156 with the real Argo CD: the
// Application moves to the commit whose chart drops v2alpha1; automated sync applies the
// CRDs (client-side apply, Argo CD's default), the API server refuses each on
// status.storedVersions, Argo CD retries five times and fails the operation with the API
// server's text, then reports a SyncError. The CRDs and the objects stay as they were;
// the ConfigMap of the same wave is applied at To.
//
// It runs for a chart in a git repository and for a chart of a Helm repository.
func TestSyncDroppingStoredVersionFails(t *testing.T) {
	needCluster(t)
	for _, kind := range []sourceKind{fromGit, fromHelmRepo} {
		t.Run(string(kind), func(t *testing.T) { syncFails(t, kind) })
	}
}

func syncFails(t *testing.T, kind sourceKind) {
	cp := testenv.ForTest(t)
	argo := argocd.Start(t, cp)
	s := newScenario(t, cp, argo, "no-gate", kind, argocd.SyncRetry{Limit: 5, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second})

	app := s.bumpFails(t, fluxtest.To)
	wording := crdversions.WordingFor(cp.Minor)
	op := app.Status.OperationState
	if op.RetryCount != 5 || !strings.HasPrefix(op.Message, "one or more synchronization tasks completed unsuccessfully") ||
		!strings.HasSuffix(op.Message, "(retried 5 times).") {
		t.Errorf("operation: retry count %d, message %q; want 5 retries and Argo CD's failed-tasks message", op.RetryCount, op.Message)
	}
	if got, want := rejectedCRDs(op.Message, wording), []string{"cleanuppolicies.kyverno.io@v2alpha1", "policyexceptions.kyverno.io@v2alpha1"}; !slices.Equal(got, want) {
		t.Errorf("operation message %q: storedVersions rejections (%q wording) %v, want %v", op.Message, wording, got, want)
	}
	results := resourceResults(op)
	for _, n := range fluxtest.BreakingCRDs {
		if r := results[n]; !strings.HasPrefix(r, "SyncFailed: ") || !slices.Equal(rejectedCRDs(r, wording), []string{n + "@v2alpha1"}) {
			t.Errorf("sync result of %s = %q, want SyncFailed with the API server's rejection of v2alpha1", n, r)
		}
	}
	if msg, _ := app.Status.Condition("SyncError"); len(rejectedCRDs(msg, wording)) == 0 {
		t.Errorf("SyncError condition %q carries no storedVersions rejection", msg)
	}
	if app.Status.Sync.Status != "OutOfSync" {
		t.Errorf("sync status %s, want OutOfSync", app.Status.Sync.Status)
	}
	// The CRDs stay at From, but the rest of the wave was applied: Argo CD applies a
	// wave's tasks together, so the failed sync leaves the release half at To.
	s.expectLeft(t, "after the failed sync", crdState{Storage: "v2beta1", Versions: []string{"v2", "v2alpha1", "v2beta1"},
		StoredVersions: []string{"v2alpha1", "v2beta1"}}, fluxtest.To)
}

// TestCRDGateHoldsArgoCDSyncUntilMigrated: the same sync with upgradeguard running (the
// controller's manager and the CRD gate registered on the API server, a
// StorageMigrationPolicy with autoMigrate for kyverno.io), in each way an Application
// compares and syncs (compareModes). It ends with the sync of To succeeded,
// storedVersions pruned and the objects readable.
func TestCRDGateHoldsArgoCDSyncUntilMigrated(t *testing.T) {
	needCluster(t)
	for _, m := range compareModes {
		t.Run(m.name, func(t *testing.T) {
			cp, ug := startGated(t)
			argo := argocd.Start(t, cp, argocd.Options{Resync: m.resync})
			var opts []func(*unstructured.Unstructured)
			if m.serverSide {
				opts = append(opts, argocd.ServerSideApplyAndDiff)
			}
			s := newScenario(t, cp, argo, "gated", fromGit, argocd.SyncRetry{Limit: 10, Backoff: time.Second, Factor: 2, MaxBackoff: 8 * time.Second}, opts...)
			if m.serverSide {
				gatedDiff(t, s, ug, m)
			} else {
				gatedApply(t, s, ug)
			}
			// 1.13's CRDs store v2: the apply added it to storedVersions after the
			// migration pruned v2alpha1.
			s.expectLeft(t, "after the sync", at13, fluxtest.To)
		})
	}
}

// compareMode is how an Application compares and syncs, and how Argo CD comes to compare
// it again.
type compareMode struct {
	name string
	// serverSide: syncOptions ServerSideApply=true and the compare option
	// ServerSideDiff=true (argocd.ServerSideApplyAndDiff); else Argo CD's defaults,
	// client-side apply and its own diff.
	serverSide bool
	// resync is the controller's resync period (timeout.reconciliation). 0: an hour, so
	// within the test Argo CD compares the Application again only when asked to: the
	// test never asks, so with server-side diff only upgradeguard's own refresh
	// (argocd.argoproj.io/refresh, once the migration a ComparisonError waits for has
	// succeeded) unblocks the sync.
	resync time.Duration
}

var compareModes = []compareMode{
	{name: "client-side-apply"},
	{name: "server-side-diff-controller-refresh", serverSide: true},
	{name: "server-side-diff-resync", serverSide: true, resync: 20 * time.Second},
}

// gatedApply: with client-side apply and Argo CD's diff, the Application compares
// OutOfSync and automated sync applies the CRDs. The gate denies the apply of each
// breaking CRD with its reason, which Argo CD shows in its operation, and starts a
// StorageMigration per CRD; once they succeeded, Argo CD's own retry applies the CRDs and
// the sync succeeds.
func gatedApply(t *testing.T, s *scenario, ug client.Client) {
	s.bump(t, fluxtest.To)
	var seen []string // every message of the operation and of the CRDs' sync results
	app, err := s.argo.WaitApplication(t.Context(), s.name, 4*time.Minute, func(app *argocd.Application) bool {
		op := app.Status.OperationState
		if op == nil || op.Operation.Sync.Revision != s.commits[fluxtest.To] {
			return false
		}
		for _, m := range append([]string{op.Message}, sortedValues(resourceResults(op))...) {
			if m != "" && !slices.Contains(seen, m) {
				seen = append(seen, m)
			}
		}
		// Done when synced, or when the operation ended otherwise (its retries spent).
		return s.synced(fluxtest.To)(app) || op.Phase == "Failed" || op.Phase == "Error"
	})
	if err == nil && !s.synced(fluxtest.To)(app) {
		err = fmt.Errorf("operation %s: %s", app.Status.OperationState.Phase, app.Status.OperationState.Message)
	}
	if err != nil {
		t.Fatalf("the sync of %s did not succeed: %v\nmessages seen:\n%s\n%s", fluxtest.To, err, strings.Join(seen, "\n"), s.argo.LogTail(30))
	}
	t.Logf("%s", app)
	all := strings.Join(seen, "\n")
	t.Logf("messages of the operation on the way:\n%s", all)
	for _, n := range fluxtest.BreakingCRDs {
		if !strings.Contains(all, `admission webhook "crd.upgradeguard.io" denied the request: upgradeguard is holding the update of CustomResourceDefinition `+n) {
			t.Errorf("Argo CD never showed the gate's denial of %s; messages seen:\n%s", n, all)
		}
	}
	if got := crdversions.StoredVersionRejections(all); len(got) > 0 {
		t.Errorf("the API server's own rejection reached Argo CD (%v): the gate should answer every attempt first", got)
	}
	if op := app.Status.OperationState; op.RetryCount < 1 {
		t.Errorf("operation succeeded with retry count %d: the first attempt should have been held", op.RetryCount)
	}
	for _, n := range fluxtest.BreakingCRDs {
		sm := migrationOf(t, ug, n)
		if !strings.Contains(sm.Annotations[webhook.AnnotationHolds], "update of CustomResourceDefinition "+n) {
			t.Errorf("StorageMigration %s holds %q", sm.Name, sm.Annotations[webhook.AnnotationHolds])
		}
	}
}

// gatedDiff: with ServerSideApply=true and ServerSideDiff=true, Argo CD compares by a
// server-side dry-run apply. The gate denies the dry run of a breaking CRD and creates
// nothing, so Argo CD reports a ComparisonError that quotes the denial (of the first CRD
// it dry-runs: one per comparison) and starts no sync. upgradeguard's controller reads
// the denial in the Application's conditions and starts the StorageMigration the real
// update would (crd-NAME), with a StorageMigrationStarted event on the Application.
//
// With m.resync 0 (an hour) nothing but upgradeguard's controller asks Argo CD to
// compare again: it sets argocd.argoproj.io/refresh on the Application once the
// migration a ComparisonError waits for has succeeded (the test watches the Application
// for it and never sets it). A refresh dry-runs every object again, so each breaking CRD
// is quoted in turn, and the sync starts only once the comparison passes, its first
// attempt succeeding. With a short resync, Argo CD's periodic comparison may come first;
// it reuses its cached server-side diffs of the objects that did not change: a CRD not
// yet quoted may not be dry-run again, the comparison passes, automated sync starts, and
// the gate holds the real apply of that CRD (as with client-side apply) until Argo CD's
// retry. Either way the sync of To succeeds.
func gatedDiff(t *testing.T, s *scenario, ug client.Client, m compareMode) {
	ctx := t.Context()
	to := s.commits[fluxtest.To]
	start := time.Now()
	var seen, opSeen, steps []string // the ComparisonError messages; the operation's; what happened when
	step := func(format string, args ...any) {
		steps = append(steps, fmt.Sprintf("%5.1fs ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
	}
	started := map[string]bool{}   // the StorageMigrations seen
	succeeded := map[string]bool{} // and seen succeeded
	var app *argocd.Application
	asked := watchRefreshes(t, s)
	s.bump(t, fluxtest.To)
	timeout := 4 * time.Minute
	if m.resync > 0 {
		timeout = 4*time.Minute + 4*m.resync
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		got, err := s.argo.Get(ctx, s.name)
		if err != nil {
			return false, err
		}
		app = got // the last state read stays for the failure message
		msg, comparisonError := app.Status.Condition("ComparisonError")
		if comparisonError && !slices.Contains(seen, msg) {
			seen = append(seen, msg)
			step("ComparisonError quoting the gate's dry-run denial of %v", heldIn(msg))
		}
		var list v1alpha1.StorageMigrationList
		if err := ug.List(ctx, &list); err != nil {
			return false, err
		}
		for _, sm := range list.Items {
			if !started[sm.Name] {
				started[sm.Name] = true
				step("StorageMigration %s created", sm.Name)
			}
			if sm.Status.Phase == v1alpha1.PhaseSucceeded && !succeeded[sm.Name] {
				succeeded[sm.Name] = true
				step("StorageMigration %s succeeded", sm.Name)
			}
		}
		if op := app.Status.OperationState; op != nil && op.Operation.Sync.Revision == to {
			for _, m := range append([]string{op.Message}, sortedValues(resourceResults(op))...) {
				if m != "" && !slices.Contains(opSeen, m) {
					opSeen = append(opSeen, m)
					step("sync operation (retry %d): %s", op.RetryCount, truncated(m, 160))
				}
			}
			if s.synced(fluxtest.To)(app) {
				step("synced: %s", app)
				return true, nil
			}
			if op.Phase == "Failed" || op.Phase == "Error" {
				return false, fmt.Errorf("operation %s: %s", op.Phase, op.Message)
			}
		}
		return false, nil
	})
	refreshes := asked()
	t.Logf("%s mode, after the bump to %s:\n%s\nupgradeguard asked Argo CD to compare again %d times", m.name, fluxtest.To, strings.Join(steps, "\n"), refreshes)
	if err != nil {
		t.Fatalf("the sync of %s did not succeed: %v\nlast: %s\nComparisonErrors seen:\n%s\n%s", fluxtest.To, err, app, strings.Join(seen, "\n"), s.argo.LogTail(30))
	}
	all := strings.Join(seen, "\n")
	t.Logf("ComparisonErrors on the way:\n%s", all)
	var quoted []string // the CRDs a ComparisonError quoted the gate's dry-run denial of
	for _, n := range fluxtest.BreakingCRDs {
		if strings.Contains(all, `admission webhook "crd.upgradeguard.io" denied the request: `+webhook.MarkDryRunHeld(n)) {
			quoted = append(quoted, n)
		}
	}
	if len(quoted) == 0 || (m.resync == 0 && len(quoted) != len(fluxtest.BreakingCRDs)) {
		t.Errorf("Argo CD's ComparisonErrors quoted the gate's dry-run denial of %v (want every breaking CRD after refreshes, at least one else); seen:\n%s", quoted, all)
	}
	if got := crdversions.StoredVersionRejections(all + "\n" + strings.Join(opSeen, "\n")); len(got) > 0 {
		t.Errorf("the API server's own rejection reached Argo CD (%v): the gate should answer every dry run and apply first", got)
	}
	// The comparison at To passed: no ComparisonError is left. (The Application's own sync
	// status is not asked for: Argo CD v3.6.1 at times reports a kyverno CRD OutOfSync after its
	// successful server-side apply, without upgradeguard too; see scenario.synced.)
	if msg, ok := app.Status.Condition("ComparisonError"); ok || app.Status.Sync.Revision != to {
		t.Errorf("after the sync: compared at %s (want %s), ComparisonError %q", app.Status.Sync.Revision, to, msg)
	}
	op := app.Status.OperationState
	if len(quoted) == len(fluxtest.BreakingCRDs) && op.RetryCount != 0 {
		t.Errorf("operation at %s retried %d times, though every breaking CRD was migrated before the comparison passed", fluxtest.To, op.RetryCount)
	}
	for _, n := range fluxtest.BreakingCRDs {
		sm := migrationOf(t, ug, n)
		if sm.Name != "crd-"+n {
			t.Errorf("StorageMigration %s migrated %s, want crd-%s", sm.Name, n, n)
		}
		if !slices.Contains(quoted, n) {
			// Held at the real apply instead: the gate's own denial, and Argo CD's retry.
			if op.RetryCount < 1 || !strings.Contains(strings.Join(opSeen, "\n"), "upgradeguard is holding the update of CustomResourceDefinition "+n) {
				t.Errorf("%s: neither quoted in a ComparisonError nor held at the sync (retry %d); operation messages:\n%s", n, op.RetryCount, strings.Join(opSeen, "\n"))
			}
			continue
		}
		if !strings.Contains(sm.Annotations[webhook.AnnotationHolds], "Argo CD Application "+argocd.Namespace+"/"+s.name) {
			t.Errorf("StorageMigration %s holds %q; want Argo CD Application %s/%s", sm.Name, sm.Annotations[webhook.AnnotationHolds], argocd.Namespace, s.name)
		}
		waitApplicationEvent(t, s, webhook.ReasonArgoDiffMigrationStarted, "started StorageMigration crd-"+n+" for CustomResourceDefinition "+n)
	}
	if m.resync == 0 && refreshes == 0 {
		t.Errorf("the sync of %s went on with an hour's resync, and upgradeguard never set %s on the Application: what compared it again?", fluxtest.To, argocd.RefreshAnnotation)
	}
}

// watchRefreshes watches the scenario's Application from now on and counts each time
// the refresh annotation is set on it (Argo CD removes it once it has compared again).
// The test sets it nowhere, so each is upgradeguard's controller asking. The returned
// function stops the watch and returns the count.
func watchRefreshes(t *testing.T, s *scenario) func() int {
	t.Helper()
	ri := s.argo.Dynamic.Resource(argocd.ApplicationGVR).Namespace(argocd.Namespace)
	list, err := ri.List(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + s.name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	w, err := ri.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + s.name, ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	count, done := 0, make(chan struct{})
	go func() {
		defer close(done)
		set := false
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			_, now := u.GetAnnotations()[argocd.RefreshAnnotation]
			if now && !set {
				count++
			}
			set = now
		}
	}()
	return func() int {
		cancel()
		w.Stop()
		<-done
		return count
	}
}

func truncated(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// heldIn are the breaking CRDs whose update msg marks as held by a dry run.
func heldIn(msg string) []string {
	var out []string
	for _, n := range fluxtest.BreakingCRDs {
		if strings.Contains(msg, webhook.MarkDryRunHeld(n)) {
			out = append(out, n)
		}
	}
	return out
}

// waitApplicationEvent waits for an event (events.k8s.io) on the scenario's Application
// with reason whose note contains note.
func waitApplicationEvent(t *testing.T, s *scenario, reason, note string) {
	t.Helper()
	events := kubernetes.NewForConfigOrDie(s.cp.Config).EventsV1().Events(argocd.Namespace)
	var last []string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := events.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		last = last[:0]
		for _, e := range list.Items {
			if e.Regarding.Kind != "Application" || e.Regarding.Name != s.name {
				continue
			}
			last = append(last, e.Reason+": "+e.Note)
			if e.Reason == reason && strings.Contains(e.Note, note) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no %s event saying %q on Application %s/%s: %v; its events: %q", reason, note, argocd.Namespace, s.name, err, last)
	}
}

// at13 is what kyverno 1.13's CRDs leave once v2alpha1 was migrated away: storage v2,
// v2 added to storedVersions by the apply.
var at13 = crdState{Storage: "v2", Versions: []string{"v2", "v2beta1"}, StoredVersions: []string{"v2", "v2beta1"}}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// migrationOf returns the StorageMigration that migrated crd, once it succeeded.
func migrationOf(t *testing.T, ug client.Client, crd string) *v1alpha1.StorageMigration {
	t.Helper()
	var found *v1alpha1.StorageMigration
	var last []string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var list v1alpha1.StorageMigrationList
		if err := ug.List(ctx, &list); err != nil {
			return false, err
		}
		last = last[:0]
		for i := range list.Items {
			sm := &list.Items[i]
			last = append(last, sm.Name+" "+string(sm.Status.Phase)+" "+strings.Join(sm.Spec.Resources, ","))
			if slices.Contains(sm.Spec.Resources, crd) && sm.Status.Phase == v1alpha1.PhaseSucceeded {
				found = sm
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no succeeded StorageMigration of %s: %v (StorageMigrations: %v)", crd, err, last)
	}
	return found
}

// startGated starts a control plane with upgradeguard running the way a cluster runs it:
// Argo CD's CRDs installed first, the canonical webhook configuration (config/webhook)
// installed, the controller's
// manager with the gates on a real webhook server, and a StorageMigrationPolicy with
// autoMigrate for kyverno.io (proactive off: only the gate migrates). It returns the
// control plane and a client for upgradeguard's objects.
func startGated(t *testing.T) (*testenv.ControlPlane, client.Client) {
	t.Helper()
	ctrllog.SetLogger(logr.Discard()) // the tests read the API, not the manager's logs
	ctx := t.Context()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp := testenv.ForTest(t, testenv.Options{Webhooks: &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook")}}})
	if err := testenv.ApplyUpgradeguardCRDs(ctx, cp.Config); err != nil {
		t.Fatal(err)
	}
	// The HelmRelease gate's informers need Flux's kinds served, though no Flux runs.
	if err := flux.ApplyCRDs(ctx, cp); err != nil {
		t.Fatal(err)
	}
	// Argo CD's kinds are served before the manager starts, as in a cluster where Argo CD
	// was installed first: upgradeguard then watches Applications for the CRD gate's
	// dry-run denials in their server-side diffs (webhook.Setup looks once, at start).
	if err := argocd.ApplyCRDs(ctx, cp); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ug, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	wh := cp.Webhooks
	mgr, err := controller.NewManager(cp.Config, controller.Options{
		LeaderElectionNamespace: "default", MetricsAddr: "0", ProbeAddr: "0", SkipNameValidation: true, // one manager per test
		EnableWebhook: true, WebhookPort: wh.LocalServingPort, WebhookCertDir: wh.LocalServingCertDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.Setup(mgr, webhook.Options{Timeout: 20 * time.Second, HelmCacheDir: filepath.Join(t.TempDir(), "helm")}); err != nil {
		t.Fatal(err)
	}
	testenv.RunManager(t, mgr)
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "kyverno"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"kyverno.io"}, Proactive: ptr.To(false), AutoMigrate: ptr.To(true)}}
	if err := ug.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a readiness probe of our own loopback server
		if err != nil {
			return false, nil
		}
		return true, conn.Close()
	})
	if err != nil {
		t.Fatalf("the webhook server at %s is not serving: %v", addr, err)
	}
	return cp, ug
}
