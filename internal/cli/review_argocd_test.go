package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/review"
)

// lwsApplication is an Argo CD Application of the lws chart at version, with
// helm.skipCrds and automated prune.
func lwsApplication(name, repoURL, version string) string {
	return `apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: ` + name + `
  namespace: argocd
spec:
  project: default
  destination:
    server: https://kubernetes.default.svc
    namespace: lws-system
  source:
    repoURL: ` + repoURL + `
    chart: lws
    targetRevision: ` + version + `
    helm:
      releaseName: lws
      skipCrds: true
  syncPolicy:
    automated:
      prune: true
`
}

// TestReviewArgoCDStatus: what the live Application's status says Argo CD deployed and
// manages decides the verdict of its targetRevision bump. The real lws chart moved its CRD
// from templates/ to crds/ in 0.8.0; an Application with helm.skipCrds renders no crds/,
// so on 0.8.0 the CRD leaves it. The live Application says lws 0.7.0 is deployed and its
// resource tree (status.resources) holds the CRD, which carries the Application's
// instance label; under label tracking (argocd-cm) its automated prune deletes the CRD and
// its 3 LeaderWorkerSets: the bump is blocked. An Application of the same chart that is
// not on the cluster yet is judged as a fresh install: nothing leaves it, and it passes.
// Under annotation tracking (Argo CD's default) the CRD is not tracked, and the bump
// passes. Each verdict is the same from a snapshot, read from a file and from a
// registry on loopback.
//
// No Argo CD runs here: review reads only the Application's status, which the test
// writes as Argo CD's application controller writes it (the Application CRD of
// internal/testenv/argocd, like Argo CD's without a status subresource). The real Argo CD
// is built and run only by make test-argocd, apart from the default suite this test runs
// in, and syncing it through both versions would need its repo-server, controller and
// Redis for one verdict that reads three status fields.
func TestReviewArgoCDStatus(t *testing.T) {
	needCluster(t)
	own := testenv.ForTest(t)
	ctx := t.Context()
	// lws 0.7.0 as deployed, with 3 LeaderWorkerSets, and its CRD labelled with the
	// Application's instance (as a chart that sets app.kubernetes.io/instance does).
	repo := lwsDeployed(t, own)
	ext := apiextclient.NewForConfigOrDie(own.Config)
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, testenv.LWSCRD, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+predict.ArgoDefaultInstanceLabel+`":"lws"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// Argo CD's Application CRD, its settings, and the live Application lws: 0.7.0
	// deployed, the CRD in its resource tree.
	if err := argocd.InstallApplicationCRD(ctx, ext); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(own.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "argocd"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "argocd-cm", Namespace: "argocd"},
		Data: map[string]string{"application.resourceTrackingMethod": "label"}}
	settings, err := cs.CoreV1().ConfigMaps("argocd").Create(ctx, settings, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(lwsApplication("lws", repo.URL, "0.7.0")), &live.Object); err != nil {
		t.Fatal(err)
	}
	live.Object["status"] = map[string]any{
		"sync":    map[string]any{"status": "Synced", "revision": "0.7.0"},
		"history": []any{map[string]any{"id": int64(0), "revision": "0.7.0"}},
		"resources": []any{
			map[string]any{"group": "apiextensions.k8s.io", "version": "v1", "kind": "CustomResourceDefinition", "name": testenv.LWSCRD, "status": "Synced"},
			map[string]any{"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "lws-system", "name": "lws-controller-manager", "status": "Synced"},
		},
	}
	if _, err := dynamic.NewForConfigOrDie(own.Config).Resource(argocd.ApplicationGVR).Namespace("argocd").Create(ctx, live, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	g := servers.NewGitRepo(t)
	base := g.Commit("lws 0.7.0", map[string]string{"clusters/prod/lws.yaml": lwsApplication("lws", repo.URL, "0.7.0")})
	bump := g.Commit("Update lws to 0.8.0", map[string]string{"clusters/prod/lws.yaml": lwsApplication("lws", repo.URL, "0.8.0")})
	fresh := g.Commit("lws-fresh at 0.8.0", map[string]string{"clusters/prod/lws-fresh.yaml": lwsApplication("lws-fresh", repo.URL, "0.8.0")})
	args := func(base, head string) []string {
		return []string{"--kubeconfig", own.Kubeconfig, "review", "--repo", g.Dir, "--base", base, "--head", head}
	}
	deletes := func(row review.Row) bool {
		for _, c := range row.Report.Findings() {
			if c.Verdict == predict.Delete && c.Name == testenv.LWSCRD {
				return true
			}
		}
		return false
	}
	// one reviews base..head live, wants one row of the Application and the exit code,
	// and returns the row.
	one := func(name, base, head, subject string, code int) review.Row {
		t.Helper()
		r := run(t, append(args(base, head), "-o", "json")...)
		rows := reviewRows(t, r)
		if r.code != code || len(rows) != 1 || rows[0].Subject != subject || rows[0].Report == nil {
			t.Fatalf("%s: exit %d with rows %+v, want %d with one judged row of %s\n%s%s", name, r.code, rows, code, subject, r.stdout, r.stderr)
		}
		return rows[0]
	}
	snapshots := func() [][]string {
		cps := map[string]*testenv.ControlPlane{contextOf(t, own): own}
		return [][]string{takeSnapshots(t, cps, ""), takeSnapshots(t, cps, ociRegistry(t))}
	}

	// The live status says 0.7.0 is deployed and the CRD is the Application's: the bump
	// deletes it with its objects.
	row := one("bump", base.String(), bump.String(), "Application/argocd/lws", cli.ExitFindings)
	if !deletes(row) || row.From != "0.7.0" || row.To != "0.8.0" {
		t.Errorf("bump 0.7.0 -> 0.8.0: %s -> %s, findings %+v; want the deletion of %s", row.From, row.To, row.Report.Findings(), testenv.LWSCRD)
	}
	if text := run(t, args(base.String(), bump.String())...); !strings.Contains(text.stdout, "3 LeaderWorkerSet objects") || !strings.Contains(text.stdout, "helm.skipCrds") {
		t.Errorf("bump: the text says neither the 3 LeaderWorkerSet objects nor helm.skipCrds:\n%s", text.stdout)
	}
	// Not on the cluster yet: a fresh install, from which nothing leaves.
	if row := one("fresh", bump.String(), fresh.String(), "Application/argocd/lws-fresh", cli.ExitSafe); !row.Report.Safe || deletes(row) || row.What != "new" {
		t.Errorf("an Application not on the cluster: %+v, want a safe fresh install", row)
	}
	for _, snaps := range snapshots() {
		sameFromSnapshots(t, args(base.String(), bump.String()), snaps)
		sameFromSnapshots(t, args(bump.String(), fresh.String()), snaps)
	}

	// Under annotation tracking the CRD, which carries no tracking-id annotation, is not
	// the Application's once the target stops rendering it: the bump passes, live and
	// from a new snapshot.
	settings.Data["application.resourceTrackingMethod"] = "annotation"
	if _, err := cs.CoreV1().ConfigMaps("argocd").Update(ctx, settings, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if row := one("annotation tracking", base.String(), bump.String(), "Application/argocd/lws", cli.ExitSafe); deletes(row) {
		t.Errorf("under annotation tracking: %+v, want the CRD untracked", row.Report.Findings())
	}
	for _, snaps := range snapshots() {
		sameFromSnapshots(t, args(base.String(), bump.String()), snaps)
	}

	// A snapshot taken before snapshots recorded Argo CD (no argoCD) judges no
	// Application, and says to take a new one.
	snaps := takeSnapshots(t, map[string]*testenv.ControlPlane{"prod": own}, "")
	file := strings.TrimPrefix(snaps[1], "prod=")
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(old, &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc, "argoCD")
	if old, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, old, 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, append(args(base.String(), bump.String()), "--kubeconfig", filepath.Join(t.TempDir(), "none"), "--snapshot", snaps[1], "-o", "json")...)
	rows := reviewRows(t, r)
	if len(rows) != 1 || rows[0].Report != nil || !strings.Contains(rows[0].NotJudged, "taken before snapshots recorded Argo CD") ||
		!strings.Contains(rows[0].NotJudged, "upgradeguard snapshot") {
		t.Errorf("an old snapshot: exit %d, rows %+v; want the Application not judged, saying to take a new snapshot\n%s", r.code, rows, r.stderr)
	}
}
