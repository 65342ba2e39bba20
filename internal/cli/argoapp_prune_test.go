package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// serveChart packages the chart directory and serves it from a chart repository for the
// test's length.
func serveChart(t *testing.T, chartDir string) string {
	t.Helper()
	pkgs := t.TempDir()
	if _, err := testenv.Package(chartDir, pkgs); err != nil {
		t.Fatal(err)
	}
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url
}

// managesCRD writes the status of Application argocd/name as Argo CD leaves it after a
// sync: its resource tree holds the CRD.
func managesCRD(t *testing.T, name, crd string) {
	t.Helper()
	setApplicationStatus(t, name, map[string]any{"sync": map[string]any{"status": "Synced"}, "resources": []any{
		map[string]any{"group": "apiextensions.k8s.io", "version": "v1", "kind": "CustomResourceDefinition", "name": crd, "status": "Synced"},
		map[string]any{"version": "v1", "kind": "ConfigMap", "namespace": "x", "name": "settings", "status": "Synced"},
	}})
}

// tracksCRD makes Argo CD count the live crd as Application argocd/app's, as it does for
// a chart that labels its CRD app.kubernetes.io/instance: {{ .Release.Name }} under label
// tracking: argocd-cm sets application.resourceTrackingMethod: label (deleted when the
// test ends, for Argo CD's v3 default again) and the CRD carries the label with the
// Application's name.
func tracksCRD(t *testing.T, crd, app string) {
	t.Helper()
	ctx := t.Context()
	cms := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ConfigMaps(argocd.Namespace)
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: argoapp.SettingsConfigMap, Namespace: argocd.Namespace},
		Data: map[string]string{argocd.TrackingMethodKey: predict.ArgoTrackingLabel}}
	if _, err := cms.Create(ctx, settings, metav1.CreateOptions{}); err == nil {
		t.Cleanup(func() {
			if err := cms.Delete(context.WithoutCancel(t.Context()), argoapp.SettingsConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete argocd-cm: %v", err)
			}
		})
	} else if !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	kubectl(t, "label", "--overwrite", "crd", crd, predict.ArgoDefaultInstanceLabel+"="+app)
}

// rowOf is the report's row for crd, failing the test when there is none.
func rowOf(t *testing.T, rep *check.Report, crd string) check.CRDReport {
	t.Helper()
	for _, c := range rep.CRDs {
		if c.Name == crd {
			return c
		}
	}
	t.Fatalf("the report has no row for %s: %+v", crd, rep.CRDs)
	return check.CRDReport{}
}

// TestCheckArgoCDAppPrune: an Application of a chart whose CRD renders while
// crds.enabled is true, synced (its resource tree holds the CRD, with 12 objects live),
// whose values now turn the CRD off. Under Argo CD's default tracking (by annotation,
// which its repo-server never puts on a CRD) the CRD just leaves the Application: no
// sync prunes it, and check is safe, saying why (test/argocd shows the real Argo CD do
// so). When Argo CD tracks the CRD (label tracking, the CRD labelled with the
// Application's name), automated prune deletes the CRD and every object: check
// --argocd-app exits 1 and names both, and so does it with PrunePropagationPolicy=orphan;
// plan --argocd-app steps through the keep. Without automated prune nothing is deleted
// now: exit 0, with the prune verdict saying what a sync with prune would do. The next
// step check names, run as a user would paste it, merges Prune=false into the CRD's sync
// options; check is then safe.
func TestCheckArgoCDAppPrune(t *testing.T) {
	needCluster(t)
	const group, ns = "argo-prune.deletion.test", "argo-prune"
	crdName := "leaderworkersets." + group
	cleanCRDs(t, group)
	text, err := testenv.LWSCRDText(group)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.Unmarshal([]byte(text), &crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), &crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateLeaderWorkerSets(t.Context(), cp.Config, group, ns, lwsObjects); err != nil {
		t.Fatal(err)
	}
	toggle := testenv.CRDLeavingCases()[0]
	if toggle.Name != "values crds.enabled" {
		t.Fatalf("the first leaving case is %q, want the crds.enabled toggle", toggle.Name)
	}
	chartDir, err := toggle.From(t.TempDir(), text)
	if err != nil {
		t.Fatal(err)
	}
	url := serveChart(t, chartDir)
	source := map[string]any{"repoURL": url, "chart": "widgets", "targetRevision": "1.0.0",
		"helm": map[string]any{"parameters": []any{map[string]any{"name": "crds.enabled", "value": "false"}}}}
	app := func(name string, syncPolicy map[string]any) {
		t.Helper()
		spec := appSpec(source, ns)
		if syncPolicy != nil {
			spec["syncPolicy"] = syncPolicy
		}
		createApplication(t, name, spec)
		managesCRD(t, name, crdName)
	}
	app("widgets-auto", map[string]any{"automated": map[string]any{"prune": true, "selfHeal": true}})
	app("widgets-orphan", map[string]any{"automated": map[string]any{"prune": true}, "syncOptions": []any{"PrunePropagationPolicy=orphan"}})
	app("widgets-manual", map[string]any{"syncOptions": []any{"ServerSideApply=true"}})
	count := fmt.Sprintf("all %d LeaderWorkerSet objects", lwsObjects)

	// Argo CD's default tracking: the CRD is not the Application's once it is no longer
	// rendered, and nothing prunes it.
	r := ug(t, "check", "--argocd-app", "argocd/widgets-auto", "-o", "json")
	rep := report(t, r)
	row := rowOf(t, rep, crdName)
	if r.code != cli.ExitSafe || row.Verdict != predict.OK || rep.Deployer.Sync.Tracking.Method != "annotation" ||
		!strings.Contains(row.Reason, "Argo CD does not track the CRD as the Application's") ||
		!strings.Contains(row.Reason, "no "+predict.ArgoTrackingAnnotation+" annotation (application.resourceTrackingMethod: annotation) naming widgets-auto") {
		t.Errorf("default tracking: exit %d, %s %s (%s), tracking %+v; want exit 0, ok, saying Argo CD does not track the CRD\n%s%s",
			r.code, crdName, row.Verdict, row.Reason, rep.Deployer.Sync.Tracking, r.stdout, r.stderr)
	}

	// Automated prune of a tracked CRD: the sync deletes the CRD and its objects.
	tracksCRD(t, crdName, "widgets-auto")
	r = ug(t, "check", "--argocd-app", "argocd/widgets-auto", "-o", "json")
	rep = report(t, r)
	row = rowOf(t, rep, crdName)
	if r.code != cli.ExitFindings || row.Verdict != predict.Delete || row.Objects == nil || *row.Objects != lwsObjects || rep.Deployer.Kind != predict.KindArgoCD {
		t.Fatalf("automated prune: exit %d, %s %s with %v objects (deployer %q); want exit 1, a delete verdict with %d objects under Argo CD\n%s%s",
			r.code, crdName, row.Verdict, row.Objects, rep.Deployer.Kind, lwsObjects, r.stdout, r.stderr)
	}
	for _, want := range []string{"its automated sync prunes it: Argo CD deletes the CRD and " + count, "no longer renders it"} {
		if !strings.Contains(row.Reason, want) {
			t.Errorf("reason %q does not say %q", row.Reason, want)
		}
	}
	if want := "kubectl annotate crd " + crdName + " argocd.argoproj.io/sync-options=Prune=false"; !slices.Contains(rep.NextSteps, want) {
		t.Errorf("next steps %q lack %q", rep.NextSteps, want)
	}
	text2 := ug(t, "check", "--argocd-app", "argocd/widgets-auto")
	if !slices.ContainsFunc(strings.Split(text2.stdout, "\n"), func(l string) bool {
		f := strings.Fields(l)
		return len(f) >= 3 && f[0] == crdName && f[1] == string(predict.Delete) && f[2] == fmt.Sprint(lwsObjects)
	}) || !strings.Contains(text2.stdout, "Argo CD deletes it") {
		t.Errorf("check's text does not list %s as delete with %d objects, the way Argo CD deletes it:\n%s", crdName, lwsObjects, text2.stdout)
	}

	// PrunePropagationPolicy=orphan saves none of the objects.
	tracksCRD(t, crdName, "widgets-orphan")
	r = ug(t, "check", "--argocd-app", "argocd/widgets-orphan", "-o", "json")
	if row := rowOf(t, report(t, r), crdName); r.code != cli.ExitFindings || row.Verdict != predict.Delete ||
		!strings.Contains(row.Reason, "PrunePropagationPolicy=orphan does not save them") {
		t.Errorf("orphan: exit %d, %s %s (%s); want exit 1, delete, saying orphan saves nothing", r.code, crdName, row.Verdict, row.Reason)
	}

	// No automated prune: nothing is deleted by the sync, and the report says what a
	// sync with prune would do.
	tracksCRD(t, crdName, "widgets-manual")
	r = ug(t, "check", "--argocd-app", "argocd/widgets-manual", "-o", "json")
	rep = report(t, r)
	row = rowOf(t, rep, crdName)
	if r.code != cli.ExitSafe || !rep.Safe || row.Verdict != predict.Prune {
		t.Errorf("no automated prune: exit %d (safe %v), %s %s; want exit 0, a prune verdict\n%s%s", r.code, rep.Safe, crdName, row.Verdict, r.stdout, r.stderr)
	}
	for _, want := range []string{"automated.prune is not true", "argocd app sync --prune", "would delete the CRD and " + count} {
		if !strings.Contains(row.Reason, want) {
			t.Errorf("reason %q does not say %q", row.Reason, want)
		}
	}
	if text := ug(t, "check", "--argocd-app", "argocd/widgets-manual"); !strings.Contains(text.stdout, "SAFE: nothing is deleted or refused now") ||
		!strings.Contains(text.stdout, crdName) {
		t.Errorf("check's text does not list the CRD left for a prune:\n%s", text.stdout)
	}

	// plan names the keep step in Argo CD's terms.
	tracksCRD(t, crdName, "widgets-auto")
	out := ug(t, "plan", "--argocd-app", "argocd/widgets-auto", "-o", "json")
	var p plan.Plan
	if err := json.Unmarshal([]byte(out.stdout), &p); err != nil {
		t.Fatalf("plan JSON: %v\n%s%s", err, out.stdout, out.stderr)
	}
	var commands []string
	for _, s := range p.Steps {
		if s.Kind == plan.Keep {
			commands = append(commands, s.Commands...)
		}
	}
	if want := []string{"kubectl annotate crd " + crdName + " argocd.argoproj.io/sync-options=Prune=false"}; !slices.Equal(commands, want) {
		t.Errorf("plan's keep commands %q, want %q (exit %d)\n%s", commands, want, out.code, out.stderr)
	}

	// The CRD already lists a sync option: the keep merges Prune=false into it.
	kubectl(t, "annotate", "crd", crdName, "argocd.argoproj.io/sync-options=ServerSideApply=true")
	rep = report(t, ug(t, "check", "--argocd-app", "argocd/widgets-auto", "-o", "json"))
	if want := "kubectl annotate --overwrite crd " + crdName + " argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false"; !slices.Equal(rep.NextSteps, []string{want}) {
		t.Fatalf("next steps %q, want %q", rep.NextSteps, want)
	}
	runNextStep(t, rep)
	live, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), crdName, metav1.GetOptions{})
	if err != nil || live.Annotations[predict.ArgoSyncOptionsAnnotation] != "ServerSideApply=true,Prune=false" {
		t.Fatalf("live sync options after the next step: %v (%v)", live.Annotations, err)
	}
	r = ug(t, "check", "--argocd-app", "argocd/widgets-auto", "-o", "json")
	if row := rowOf(t, report(t, r), crdName); r.code != cli.ExitSafe || row.Verdict != predict.OK || !strings.Contains(row.Reason, "Prune=false") {
		t.Errorf("after the keep: exit %d, %s %s (%s); want exit 0, ok, saying Prune=false keeps it", r.code, crdName, row.Verdict, row.Reason)
	}
}

// TestCheckArgoCDAppCRDMovedToCRDsDir is kubernetes-sigs/lws#880 under Argo CD: the real
// lws 0.8.0 chart moves the LeaderWorkerSet CRD from templates/ to crds/. Helm's upgrade
// deletes it (TestCRDMovedToCRDsDir); Argo CD renders crds/ too, so the CRD stays in the
// Application, and check --argocd-app finds no deletion even with automated prune.
// helm.skipCrds leaves crds/ out: then the CRD leaves the Application, and its automated
// prune deletes it where Argo CD tracks the CRD.
func TestCheckArgoCDAppCRDMovedToCRDsDir(t *testing.T) {
	needCluster(t)
	const ns = "lws-argo"
	cleanCRDs(t, testenv.LWSGroup)
	applyFixtures(t, testenv.LWSCRDFile)
	if err := testenv.CreateLeaderWorkerSets(t.Context(), cp.Config, testenv.LWSGroup, ns, lwsObjects); err != nil {
		t.Fatal(err)
	}
	url := serveChart(t, filepath.Join(fixturesDir(t), "charts/lws-0.8.0"))
	auto := map[string]any{"automated": map[string]any{"prune": true}}
	spec := appSpec(map[string]any{"repoURL": url, "chart": "lws", "targetRevision": "0.1.0"}, ns)
	spec["syncPolicy"] = auto
	createApplication(t, "lws", spec)
	managesCRD(t, "lws", testenv.LWSCRD)

	r := ug(t, "check", "--argocd-app", "argocd/lws", "-o", "json")
	rep := report(t, r)
	if row := rowOf(t, rep, testenv.LWSCRD); r.code != cli.ExitSafe || row.Verdict != predict.OK || row.Source != predict.CRDsDir {
		t.Errorf("lws 0.8.0 under Argo CD: exit %d, %s %s from %q (%s); want exit 0, ok, applied from crds/\n%s", r.code, testenv.LWSCRD, row.Verdict, row.Source, row.Reason, r.stderr)
	}
	if got := verdicts(rep)[predict.Delete]; len(got) > 0 {
		t.Errorf("delete verdicts %v, want none: Argo CD renders crds/", got)
	}

	skip := appSpec(map[string]any{"repoURL": url, "chart": "lws", "targetRevision": "0.1.0", "helm": map[string]any{"skipCrds": true}}, ns)
	skip["syncPolicy"] = auto
	createApplication(t, "lws-skip-crds", skip)
	managesCRD(t, "lws-skip-crds", testenv.LWSCRD)
	tracksCRD(t, testenv.LWSCRD, "lws-skip-crds")
	r = ug(t, "check", "--argocd-app", "argocd/lws-skip-crds", "-o", "json")
	if row := rowOf(t, report(t, r), testenv.LWSCRD); r.code != cli.ExitFindings || row.Verdict != predict.Delete ||
		!strings.Contains(row.Reason, "helm.skipCrds") || !strings.Contains(row.Reason, fmt.Sprintf("all %d LeaderWorkerSet objects", lwsObjects)) {
		t.Errorf("lws 0.8.0 with helm.skipCrds: exit %d, %s %s (%s); want exit 1, delete, naming helm.skipCrds and the objects", r.code, testenv.LWSCRD, row.Verdict, row.Reason)
	}
}
