//go:build argocd

package argocd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// The widgets chart: a ConfigMap, and the CRD widgets.example.com rendered from
// templates/ while the value crds.enabled is true. The CRD carries the chart's standard
// labels, app.kubernetes.io/instance among them, which Helm sets to the release name and
// Argo CD renders with the Application's name.
const (
	widgetsPath      = "widgets"
	widgetsCRD       = "widgets.example.com"
	widgetsConfigMap = "widgets-chart"
	widgetCount      = 3
)

var widgetGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// labelTracking is Argo CD tracking the objects of an Application by the
// app.kubernetes.io/instance label (the Argo CD 2 default, which many installations keep).
var labelTracking = argocd.Options{Settings: map[string]string{argocd.TrackingMethodKey: "label"}}

// widgetsChart is the chart's files in the git repository, with crds.enabled set to crds.
func widgetsChart(crds bool) map[string]string {
	return map[string]string{
		widgetsPath + "/Chart.yaml":  "apiVersion: v2\nname: widgets\nversion: 1.0.0\n",
		widgetsPath + "/values.yaml": fmt.Sprintf("crds:\n  enabled: %t\n", crds),
		widgetsPath + "/templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + widgetsConfigMap +
			"\ndata:\n  crds: {{ .Values.crds.enabled | quote }}\n",
		widgetsPath + "/templates/crd.yaml": `{{- if .Values.crds.enabled }}
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ` + widgetsCRD + `
  labels:
    app.kubernetes.io/name: widgets
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/managed-by: {{ .Release.Service }}
spec:
  group: example.com
  names:
    plural: widgets
    singular: widget
    kind: Widget
    listKind: WidgetList
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size:
                  type: integer
{{- end }}
`,
	}
}

// pruneScenario is an Application of the widgets chart from a git repository with
// automated sync and prune: true, synced at the commit that renders the CRD, with
// widgetCount Widgets in its destination namespace.
type pruneScenario struct {
	cp                 *testenv.ControlPlane
	argo               *argocd.ArgoCD
	name               string // the Application's name and its destination namespace
	withCRD, withoutIt string // the commits with crds.enabled true and false
}

func startPruneScenario(t *testing.T, cp *testenv.ControlPlane, argo *argocd.ArgoCD, name string, r argocd.SyncRetry) *pruneScenario {
	t.Helper()
	ctx := t.Context()
	repo := servers.NewGitRepo(t)
	s := &pruneScenario{cp: cp, argo: argo, name: name,
		withCRD:   repo.Commit("widgets chart with its CRD", widgetsChart(true)).String(),
		withoutIt: repo.Commit("widgets chart: crds.enabled false", widgetsChart(false)).String(),
	}
	app := argocd.AutomatedApplication(name, argocd.GitSource(repo.Dir, widgetsPath, s.withCRD), name, r)
	if err := unstructured.SetNestedField(app.Object, true, "spec", "syncPolicy", "automated", "prune"); err != nil {
		t.Fatal(err)
	}
	if err := argo.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	got, err := argo.WaitApplication(ctx, name, 3*time.Minute, func(app *argocd.Application) bool {
		return s.syncedAt(app, s.withCRD) && app.ResourceStatus("CustomResourceDefinition", widgetsCRD) == "Synced"
	})
	if err != nil {
		t.Fatalf("sync of the chart with its CRD: %v\n%s", err, argo.LogTail(30))
	}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: widgetGVR, Kind: "Widget", Namespaces: []string{name}, PerNS: widgetCount,
		Spec: map[string]any{"size": int64(1)}}); err != nil {
		t.Fatal(err)
	}
	if got := s.crdLabel(t); got != name {
		t.Fatalf("the live CRD's app.kubernetes.io/instance label is %q, want %q (the release name Argo CD renders with)", got, name)
	}
	t.Logf("at the commit with the CRD: %s", got)
	return s
}

// syncedAt says that Argo CD's last operation, a sync of commit, succeeded and that it
// compared the Application at commit since.
func (s *pruneScenario) syncedAt(app *argocd.Application, commit string) bool {
	op := app.Status.OperationState
	return op != nil && op.Phase == "Succeeded" && op.Operation.Sync.Revision == commit && app.Status.Sync.Revision == commit &&
		app.ResourceStatus("ConfigMap", widgetsConfigMap) == "Synced"
}

// crdLabel is the live CRD's app.kubernetes.io/instance label.
func (s *pruneScenario) crdLabel(t *testing.T) string {
	t.Helper()
	crd, err := apiextclient.NewForConfigOrDie(s.cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), widgetsCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd.Labels["app.kubernetes.io/instance"]
}

// expectIntact fails the test unless the CRD is there, not being deleted, and every
// Widget reads back.
func (s *pruneScenario) expectIntact(t *testing.T, when string) {
	t.Helper()
	ctx := t.Context()
	crd, err := apiextclient.NewForConfigOrDie(s.cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, widgetsCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CRD %s %s: %v", widgetsCRD, when, err)
	}
	if crd.DeletionTimestamp != nil {
		t.Fatalf("CRD %s %s is being deleted (since %s)", widgetsCRD, when, crd.DeletionTimestamp)
	}
	ri := dynamic.NewForConfigOrDie(s.cp.Config).Resource(widgetGVR).Namespace(s.name)
	for i := range widgetCount {
		if _, err := ri.Get(ctx, fmt.Sprintf("obj-%d", i), metav1.GetOptions{}); err != nil {
			t.Errorf("Widget %s/obj-%d %s: %v", s.name, i, when, err)
		}
	}
	if list, err := ri.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != widgetCount {
		t.Errorf("Widgets in %s %s: %v, want %d", s.name, when, err, widgetCount)
	}
}

// configMapCRDs is data.crds of the chart's ConfigMap: the value the last applied
// commit rendered it with.
func (s *pruneScenario) configMapCRDs(t *testing.T) string {
	t.Helper()
	cm, err := kubernetes.NewForConfigOrDie(s.cp.Config).CoreV1().ConfigMaps(s.name).Get(t.Context(), widgetsConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data["crds"]
}

// annotateCRD merges annotations into the live CRD (a nil value removes one).
func (s *pruneScenario) annotateCRD(t *testing.T, annotations map[string]any) {
	t.Helper()
	patch := map[string]any{"metadata": map[string]any{"annotations": annotations}}
	data, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apiextclient.NewForConfigOrDie(s.cp.Config).ApiextensionsV1().CustomResourceDefinitions().
		Patch(t.Context(), widgetsCRD, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// crdResult is the sync result of the CRD in op ("Status: message"), "" when it has none.
func crdResult(op *argocd.OperationState) string {
	if op == nil || op.SyncResult == nil {
		return ""
	}
	for _, r := range op.SyncResult.Resources {
		if r.Kind == "CustomResourceDefinition" && r.Name == widgetsCRD {
			return r.Status + ": " + r.Message
		}
	}
	return ""
}

// crdInTree returns the CRD's entry of the Application's resource tree.
func crdInTree(app *argocd.Application) (status string, requiresPruning, found bool) {
	for _, r := range app.Status.Resources {
		if r.Kind == "CustomResourceDefinition" && r.Name == widgetsCRD {
			return r.Status, r.RequiresPruning, true
		}
	}
	return "", false, false
}

// syncUntil syncs the Application with prune, as `argocd app sync NAME --prune` does,
// until the CRD's sync result in the finished operation is want, at most 5 times, and
// returns the Application then. Argo CD reads the live CRD from its watch cache, so a sync
// started right after the CRD was annotated may still act on the CRD as it was; stale
// lists the CRD results that such a sync gives, which another sync follows.
func (s *pruneScenario) syncUntil(t *testing.T, want string, stale ...string) *argocd.Application {
	t.Helper()
	for attempt := 1; ; attempt++ {
		if err := s.argo.Sync(t.Context(), s.name, true); err != nil {
			t.Fatal(err)
		}
		app, err := s.argo.WaitApplication(t.Context(), s.name, 3*time.Minute, func(app *argocd.Application) bool {
			return !app.Operating && operationEnded(s.withoutIt)(app)
		})
		if err != nil {
			t.Fatalf("the sync (attempt %d) did not end: %v\n%s", attempt, err, s.argo.LogTail(30))
		}
		got := crdResult(app.Status.OperationState)
		if got == want || attempt == 5 || !slices.ContainsFunc(stale, func(p string) bool { return strings.HasPrefix(got, p) }) {
			t.Logf("sync with prune, attempt %d: %s", attempt, app)
			return app
		}
		t.Logf("sync with prune, attempt %d, acted on the CRD before its annotation reached Argo CD's cache: %s", attempt, got)
	}
}

// runCheck runs upgradeguard check --argocd-app app -o json and returns its report and
// exit code.
func runCheck(t *testing.T, cp *testenv.ControlPlane, app string) (*check.Report, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Execute(t.Context(), []string{"--kubeconfig", cp.Kubeconfig, "check", "--argocd-app", app, "-o", "json"}, cli.Streams{Out: &out, ErrOut: &errOut})
	var rep check.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("check --argocd-app %s: exit %d, %v\n%s%s", app, code, err, out.String(), errOut.String())
	}
	t.Logf("check --argocd-app %s: exit %d\n%s", app, code, out.String())
	return &rep, code
}

// rowFor is the report's row for crd.
func rowFor(rep *check.Report, crd string) (check.CRDReport, bool) {
	for _, c := range rep.CRDs {
		if c.Name == crd {
			return c, true
		}
	}
	return check.CRDReport{}, false
}

// operationEnded says that the last operation is of commit and ended.
func operationEnded(commit string) func(*argocd.Application) bool {
	return func(app *argocd.Application) bool {
		op := app.Status.OperationState
		return op != nil && op.Operation.Sync.Revision == commit && (op.Phase == "Succeeded" || op.Phase == "Failed" || op.Phase == "Error")
	}
}

// TestPruneOfCRDWithObjectsRefused: the real Argo CD, tracking by label, syncs an
// Application with automated sync and prune: true to the commit whose chart no longer
// renders its CRD (crds.enabled: false). The CRD carries the chart's
// app.kubernetes.io/instance label, so Argo CD counts it as the Application's and prunes
// it; upgradeguard's CRD deletion guard refuses every DELETE, since the CRD holds
// widgetCount Widgets. Argo CD retries, fails the operation with the guard's text, and
// stops auto-syncing that commit (SyncError); the Application stays OutOfSync with the CRD
// requiring pruning; the CRD and the Widgets stay. The ways on: Prune=false on the live
// CRD (check's advice) makes the next sync with prune succeed and leave the CRD, still
// requiring pruning; upgradeguard.io/allow-delete=true makes it delete the CRD and its
// Widgets, and the Application ends Synced.
func TestPruneOfCRDWithObjectsRefused(t *testing.T) {
	needCluster(t)
	cp, _ := startGated(t)
	argo := argocd.Start(t, cp, labelTracking)
	ctx := t.Context()
	const name = "prune-guarded"
	s := startPruneScenario(t, cp, argo, name, argocd.SyncRetry{Limit: 2, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second})
	denied := testutil.ToFloat64(metrics.CRDDeletionsDenied.WithLabelValues(widgetsCRD))

	if err := argo.SetTargetRevision(ctx, name, s.withoutIt); err != nil {
		t.Fatal(err)
	}
	app, err := argo.WaitApplication(ctx, name, 3*time.Minute, operationEnded(s.withoutIt))
	if err != nil {
		t.Fatalf("the sync without the CRD did not end: %v\n%s", err, argo.LogTail(30))
	}
	t.Logf("the sync without the CRD ended: %s", app)
	op := app.Status.OperationState
	denial := `admission webhook "crd-delete.upgradeguard.io" denied the request: upgradeguard denied the deletion of CustomResourceDefinition ` + widgetsCRD +
		" by user admin (a CRD that Argo CD Application " + argocd.Namespace + "/" + name + " syncs): "
	if op.Phase != "Failed" || op.RetryCount != 2 ||
		!strings.HasPrefix(op.Message, "one or more objects failed to apply, reason: "+denial) ||
		!strings.HasSuffix(op.Message, "(retried 2 times).") {
		t.Errorf("operation: phase %s, retry count %d, message %q;\nwant Failed after 2 retries with Argo CD's failed-to-apply message carrying the guard's denial %q",
			op.Phase, op.RetryCount, op.Message, denial)
	}
	if r := crdResult(op); !strings.HasPrefix(r, "SyncFailed: "+denial) {
		t.Errorf("sync result of the CRD = %q, want SyncFailed with the guard's denial", r)
	}
	for _, want := range []string{widgetsCRD + ": the API server deletes all 3 Widget objects with it, for good (for example " + name + "/obj-0",
		"kubectl annotate crd " + widgetsCRD + " " + predict.AllowDeleteAnnotation + "=true",
		"then sync Application " + argocd.Namespace + "/" + name + " again",
		"To keep the CRD and its objects instead: kubectl annotate crd " + widgetsCRD + " " + predict.ArgoSyncOptionsAnnotation + "=" + predict.ArgoPruneFalse +
			", then sync Application " + argocd.Namespace + "/" + name + " again: Argo CD skips the CRD's prune"} {
		if !strings.Contains(op.Message, want) {
			t.Errorf("operation message lacks %q:\n%s", want, op.Message)
		}
	}
	// One refused DELETE per attempt: the first and the two retries.
	if got := testutil.ToFloat64(metrics.CRDDeletionsDenied.WithLabelValues(widgetsCRD)); got != denied+3 {
		t.Errorf("the guard refused %v deletions of %s, want 3 (the attempt and its 2 retries)", got-denied, widgetsCRD)
	}
	// Argo CD prunes a wave's objects before it applies the others: the refused prune
	// stopped the wave, and the ConfigMap is still the first commit's.
	if got := s.configMapCRDs(t); got != "true" || app.ResourceStatus("ConfigMap", widgetsConfigMap) != "OutOfSync" {
		t.Errorf("ConfigMap data.crds = %q (%s) after the failed sync, want \"true\", OutOfSync (the wave stops at the prune)",
			got, app.ResourceStatus("ConfigMap", widgetsConfigMap))
	}
	s.expectIntact(t, "after the refused prune")

	// Automated sync does not try the same commit again: it says so in a SyncError
	// condition, and the Application stays OutOfSync with the CRD requiring pruning.
	app, err = argo.WaitApplication(ctx, name, time.Minute, func(app *argocd.Application) bool {
		_, syncError := app.Status.Condition("SyncError")
		return syncError && app.Status.Sync.Revision == s.withoutIt
	})
	if err != nil {
		t.Fatalf("no SyncError condition after the failed sync: %v", err)
	}
	t.Logf("after the failed sync: %s", app)
	if msg, _ := app.Status.Condition("SyncError"); !strings.HasPrefix(msg, "Failed last sync attempt to ["+s.withoutIt+"]: one or more objects failed to apply, reason: "+denial) {
		t.Errorf("SyncError condition %q, want Argo CD's failed-last-attempt message with the guard's denial", msg)
	}
	if st, prune, found := crdInTree(app); app.Status.Sync.Status != "OutOfSync" || !found || st != "OutOfSync" || !prune {
		t.Errorf("sync status %s, CRD in the resource tree %t (%s, requires pruning %t); want OutOfSync, the CRD OutOfSync requiring pruning",
			app.Status.Sync.Status, found, st, prune)
	}
	if app.Status.Health.Status != "Healthy" {
		t.Errorf("health %s, want Healthy", app.Status.Health.Status)
	}

	// upgradeguard check --argocd-app, run now, reads the same: Argo CD tracks the CRD by
	// its label, and the next sync with automated prune deletes it and its 3 Widgets.
	rep, code := runCheck(t, cp, argocd.Namespace+"/"+name)
	row, found := rowFor(rep, widgetsCRD)
	if code != cli.ExitFindings || !found || row.Verdict != predict.Delete || row.Objects == nil || *row.Objects != widgetCount ||
		!strings.Contains(row.Reason, "its automated sync prunes it: Argo CD deletes the CRD and all 3 Widget objects") ||
		rep.Deployer.Sync.Tracking != (predict.ArgoTracking{Method: predict.ArgoTrackingLabel, Instance: name}) {
		t.Errorf("check --argocd-app: exit %d, %s found %t: %s (%v objects): %s; tracking %+v; want exit 1, delete with %d objects under label tracking",
			code, widgetsCRD, found, row.Verdict, row.Objects, row.Reason, rep.Deployer.Sync.Tracking, widgetCount)
	}

	// The way on that keeps the CRD, as the denial words it: Prune=false on the live CRD,
	// then a sync (with prune, argocd app sync --prune): Argo CD skips the CRD and the sync
	// succeeds.
	s.annotateCRD(t, map[string]any{predict.ArgoSyncOptionsAnnotation: predict.ArgoPruneFalse})
	app = s.syncUntil(t, "PruneSkipped: ignored (no prune)", "SyncFailed: "+denial)
	if op := app.Status.OperationState; op.Phase != "Succeeded" || crdResult(op) != "PruneSkipped: ignored (no prune)" {
		t.Errorf("sync with Prune=false: %s (%s), CRD %q; want Succeeded, the CRD PruneSkipped", op.Phase, op.Message, crdResult(op))
	}
	app, err = argo.WaitApplication(ctx, name, time.Minute, func(app *argocd.Application) bool {
		_, syncError := app.Status.Condition("SyncError")
		return !syncError && app.ResourceStatus("ConfigMap", widgetsConfigMap) == "Synced"
	})
	if err != nil {
		t.Fatalf("after the sync with Prune=false: %v", err)
	}
	t.Logf("after the sync with Prune=false: %s", app)
	if got := s.configMapCRDs(t); got != "false" {
		t.Errorf("ConfigMap data.crds = %q after the sync with Prune=false, want \"false\"", got)
	}
	if st, prune, found := crdInTree(app); app.Status.Sync.Status != "OutOfSync" || !found || st != "OutOfSync" || !prune {
		t.Errorf("sync status %s, CRD in the resource tree %t (%s, requires pruning %t); want OutOfSync, the CRD OutOfSync requiring pruning",
			app.Status.Sync.Status, found, st, prune)
	}
	s.expectIntact(t, "after the sync with Prune=false")

	// The way on that lets the CRD go: allow-delete instead of Prune=false, and a sync
	// with prune deletes the CRD and its Widgets.
	s.annotateCRD(t, map[string]any{predict.ArgoSyncOptionsAnnotation: nil, predict.AllowDeleteAnnotation: "true"})
	app = s.syncUntil(t, "Pruned: pruned", "PruneSkipped: ignored (no prune)")
	if op := app.Status.OperationState; op.Phase != "Succeeded" || crdResult(op) != "Pruned: pruned" {
		t.Errorf("sync with allow-delete: %s (%s), CRD %q; want Succeeded, the CRD Pruned", op.Phase, op.Message, crdResult(op))
	}
	cs := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.Get(ctx, widgetsCRD, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("CRD %s still there after the prune with allow-delete: %v", widgetsCRD, err)
	}
	app, err = argo.WaitApplication(ctx, name, time.Minute, func(app *argocd.Application) bool {
		_, _, found := crdInTree(app)
		return app.Status.Sync.Status == "Synced" && !found
	})
	if err != nil {
		t.Fatalf("the Application did not end Synced without the CRD: %v", err)
	}
	t.Logf("after the prune with allow-delete: %s", app)
}

// TestUntrackedCRDNotPruned: with Argo CD v3's default tracking (by annotation), the same
// change prunes nothing. Argo CD puts no tracking annotation on the CRDs it renders, so
// once the chart stops rendering the CRD it is no longer the Application's: the sync
// succeeds, the Application is Synced, the CRD leaves its resource tree, and the CRD and
// the Widgets stay, with no deletion guard running. Argo CD resyncs every crdResync: the
// untracked CRD's own changes bring no comparison.
func TestUntrackedCRDNotPruned(t *testing.T) {
	needCluster(t)
	cp := testenv.ForTest(t)
	argo := argocd.Start(t, cp, argocd.Options{Resync: crdResync})
	ctx := t.Context()
	const name = "prune-untracked"
	s := startPruneScenario(t, cp, argo, name, argocd.SyncRetry{Limit: 2, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second})
	// Argo CD tracked the ConfigMap it applied, and not the CRD.
	crd, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, widgetsCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ConfigMaps(name).Get(ctx, widgetsConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, cmGot := crd.Annotations[predict.ArgoTrackingAnnotation], cm.Annotations[predict.ArgoTrackingAnnotation]; got != "" || cmGot == "" {
		t.Fatalf("%s on the CRD %q, on the ConfigMap %q; want the ConfigMap's alone", predict.ArgoTrackingAnnotation, got, cmGot)
	}

	if err := argo.SetTargetRevision(ctx, name, s.withoutIt); err != nil {
		t.Fatal(err)
	}
	// Done once the sync ended and Argo CD compared the Application since (the
	// ConfigMap it applied reads Synced).
	app, err := argo.WaitApplication(ctx, name, 3*time.Minute, func(app *argocd.Application) bool {
		return operationEnded(s.withoutIt)(app) && app.Status.Sync.Revision == s.withoutIt && app.ResourceStatus("ConfigMap", widgetsConfigMap) == "Synced"
	})
	if err != nil {
		t.Fatalf("the sync without the CRD did not end: %v\n%s", err, argo.LogTail(30))
	}
	t.Logf("the sync without the CRD ended: %s", app)
	op := app.Status.OperationState
	if op.Phase != "Succeeded" || crdResult(op) != "" {
		t.Errorf("operation %s (%s), CRD result %q; want Succeeded with no task for the CRD", op.Phase, op.Message, crdResult(op))
	}
	if _, _, found := crdInTree(app); app.Status.Sync.Status != "Synced" || found {
		t.Errorf("sync status %s, CRD in the resource tree %t; want Synced, the CRD gone from the tree", app.Status.Sync.Status, found)
	}
	if got := s.configMapCRDs(t); got != "false" {
		t.Errorf("ConfigMap data.crds = %q, want \"false\"", got)
	}
	s.expectIntact(t, "after the sync without the CRD")
}
