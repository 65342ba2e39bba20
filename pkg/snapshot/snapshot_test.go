package snapshot_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

const crdName = "gadgets.gadgets.example.com"

// gadgetCRD is a CRD whose objects hold a string, a map (whose keys are data) and a list
// of objects; without token and items[].name when narrowed.
func gadgetCRD(narrowed bool) string {
	token, item := "\n                token: {type: string}", "\n                      name: {type: string}"
	if narrowed {
		token, item = "", ""
	}
	return `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ` + crdName + `
  annotations:
    helm.sh/resource-policy: keep
spec:
  group: gadgets.example.com
  names: {plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList}
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
              properties:` + token + `
                labels:
                  type: object
                  additionalProperties: {type: string}
                items:
                  type: array
                  items:
                    type: object
                    properties:
                      weight: {type: integer}` + item + `
`
}

// TestSnapshotHoldsNoData: objects, a Secret, a release's values, Argo CD's settings and
// an Application's values, credentials and status messages with distinctive names and
// values; the snapshot holds the CRD, its object count and field paths (the map's path,
// not its keys), the release and its CRD's keep annotation, the Application's source,
// deployed revision and managed CRD, Argo CD's tracking settings, and none of them.
// It reads back the same from a file and from an OCI registry on loopback, and a
// schema change judged from it prunes what the live objects lose.
func TestSnapshotHoldsNoData(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	dir := t.TempDir()
	chartDir, err := testenv.WriteChart(dir, "gadgets", "1.2.3", map[string]string{
		"templates/crd.yaml": gadgetCRD(false),
		"templates/cm.yaml":  "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gadgets-note\ndata:\n  note: {{ .Values.note | quote }}\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := scenario.Helm(cp, "install", "gadgets", chartDir, "-n", "default", "--set", "note=SENTINEL-RELEASE-VALUE"); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(cp.Config), crdName); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	gvr := schema.GroupVersionResource{Group: "gadgets.example.com", Version: "v1", Resource: "gadgets"}
	for i, name := range []string{"sentinel-object-alpha", "sentinel-object-beta"} {
		spec := map[string]any{"labels": map[string]any{"SENTINEL-MAP-KEY": "SENTINEL-MAP-VALUE"}, "items": []any{map[string]any{"name": "SENTINEL-ITEM", "weight": int64(3)}}}
		if i == 0 {
			spec["token"] = "SENTINEL-FIELD-VALUE"
		}
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gadgets.example.com/v1", "kind": "Gadget",
			"metadata": map[string]any{"name": name, "namespace": "default", "labels": map[string]any{"sentinel-label": "sentinel-label-value"}}, "spec": spec}}
		if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sentinel-secret-name"},
		StringData: map[string]string{"SENTINEL-SECRET-KEY": "SENTINEL-SECRET-DATA"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Argo CD: its settings with label tracking beside entries that can hold data, and an
	// Application of the gadgets chart whose spec and status hold values, credentials,
	// messages and object names; its resource tree holds the gadgets CRD.
	if err := argocd.InstallApplicationCRD(ctx, apiextclient.NewForConfigOrDie(cp.Config)); err != nil {
		t.Fatal(err)
	}
	// Argo CD runs in a namespace of its own choosing: the snapshot reads its settings there.
	const argoNS = "gitops"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: argoNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(argoNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: argoapp.SettingsConfigMap},
		Data: map[string]string{"application.resourceTrackingMethod": "label", "installationID": "prod-eu", "dex.config": "clientSecret: SENTINEL-ARGOCD-SETTING",
			"url": "https://sentinel-argocd.example.com"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	app := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"name": "gadgets", "namespace": argoNS, "annotations": map[string]any{"note": "SENTINEL-APP-ANNOTATION"}},
		"spec": map[string]any{"project": "default", "destination": map[string]any{"server": "https://kubernetes.default.svc", "namespace": "default"},
			"source": map[string]any{"repoURL": "https://sentinel-user:sentinel-password@charts.example.com/stable?token=sentinel-token", "chart": "gadgets",
				"targetRevision": "1.2.3", "helm": map[string]any{"values": "note: SENTINEL-APP-VALUE", "valuesObject": map[string]any{"SENTINEL-VALUES-KEY": "x"},
					"parameters": []any{map[string]any{"name": "note", "value": "SENTINEL-APP-PARAMETER"}}}}},
		"status": map[string]any{
			"sync": map[string]any{"status": "Synced", "revision": "1.2.3", "comparedTo": map[string]any{"source": map[string]any{"helm": map[string]any{"values": "SENTINEL-COMPARED"}}}},
			"history": []any{map[string]any{"revision": "1.2.2", "source": map[string]any{"helm": map[string]any{"values": "SENTINEL-HISTORY-OLD"}}},
				map[string]any{"revision": "1.2.3", "source": map[string]any{"helm": map[string]any{"values": "SENTINEL-HISTORY"}}}},
			"resources": []any{
				map[string]any{"group": "apiextensions.k8s.io", "version": "v1", "kind": "CustomResourceDefinition", "name": crdName, "status": "Synced"},
				map[string]any{"version": "v1", "kind": "ConfigMap", "namespace": "default", "name": "sentinel-configmap", "status": "Synced"}},
			"conditions":     []any{map[string]any{"type": "SyncError", "message": "SENTINEL-CONDITION"}},
			"operationState": map[string]any{"message": "SENTINEL-OPERATION"}}}}
	if _, err := dyn.Resource(argoapp.GVR).Namespace(argoNS).Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	s, err := snapshot.Take(ctx, cp.Config, snapshot.Options{ArgoCDNamespace: argoNS})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := s.Write(&b); err != nil {
		t.Fatal(err)
	}
	if i := strings.Index(strings.ToLower(b.String()), "sentinel"); i >= 0 {
		t.Errorf("the snapshot holds an object name, a value, Secret data or a release value: ...%s...", b.String()[max(0, i-200):min(b.Len(), i+100)])
	}

	var gadgets *snapshot.CRD
	for i := range s.CRDs {
		if s.CRDs[i].Name == crdName {
			gadgets = &s.CRDs[i]
		}
	}
	if gadgets == nil {
		t.Fatalf("no %s in the snapshot", crdName)
	}
	var paths []string
	for _, p := range gadgets.Fields["v1"] {
		paths = append(paths, p.String()+" "+p.Leaf+" "+string(rune('0'+p.Objects)))
	}
	want := []string{"spec.items[*].name string 2", "spec.items[*].weight integer 2", "spec.labels map 2", "spec.token string 1"}
	if gadgets.Objects != 2 || !slices.Equal(paths, want) || !slices.Equal(gadgets.StoredVersions, []string{"v1"}) {
		t.Errorf("%s: %d objects, paths %q, stored %v; want 2, %q, [v1]", crdName, gadgets.Objects, paths, gadgets.StoredVersions, want)
	}
	if s.Server.Minor != cp.Minor || s.SchemaVersion != snapshot.SchemaVersion || time.Since(s.TakenAt) > time.Hour {
		t.Errorf("server %+v, schemaVersion %d, taken %s; want minor %d", s.Server, s.SchemaVersion, s.TakenAt, cp.Minor)
	}
	i := slices.IndexFunc(s.Releases, func(r snapshot.Release) bool { return r.Name == "gadgets" && r.Namespace == "default" })
	if i < 0 {
		t.Fatalf("release default/gadgets not in the snapshot: %+v", s.Releases)
	}
	rel := s.Releases[i]
	if len(rel.Revisions) != 1 || rel.Revisions[0] != (snapshot.Revision{Revision: 1, Chart: "gadgets", Version: "1.2.3", Status: "deployed"}) ||
		len(rel.CRDs) != 1 || rel.CRDs[0].Name != crdName || rel.CRDs[0].Source != string(predict.Templates) || rel.CRDs[0].Annotations[predict.KeepAnnotation] != predict.KeepValue {
		t.Errorf("release %+v, want revision 1 of gadgets 1.2.3 deployed, carrying %s from templates/ with keep", rel, crdName)
	}

	// What a prediction of the Application reads: its source without credentials, what
	// it deployed, the CRD it manages, and Argo CD's tracking settings.
	wantApp := snapshot.Application{Namespace: argoNS, Name: "gadgets", RepoURL: "https://charts.example.com/stable", Chart: "gadgets",
		TargetRevision: "1.2.3", Destination: "default", Sync: "Synced"}
	wantApp.Status.Sync.Status, wantApp.Status.Sync.Revision = "Synced", "1.2.3"
	wantApp.Status.History = []argoapp.HistoryEntry{{Revision: "1.2.3"}}
	wantApp.Status.Resources = []argoapp.ResourceStatus{{Group: argoapp.CRDGroup, Version: "v1", Kind: argoapp.CRDKind, Name: crdName, Status: "Synced"}}
	if diff := cmp.Diff([]snapshot.Application{wantApp}, s.Applications); diff != "" {
		t.Errorf("Applications (-want +got):\n%s", diff)
	}
	if want := (&snapshot.ArgoCD{Namespace: argoNS, Settings: &argoapp.Settings{TrackingMethod: "label", InstallationID: "prod-eu"}}); !cmp.Equal(want, s.ArgoCD) {
		t.Errorf("Argo CD: %+v, want %+v", s.ArgoCD, want)
	}

	// The same snapshot from a file and from a registry.
	file := dir + "/snapshot.json"
	if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := snapshot.Read(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	host, stop := servers.ServeOCI()
	t.Cleanup(stop)
	reg := snapshot.Registry{PlainHTTP: true}
	ref := "oci://" + host + "/fleet/snapshots:envtest"
	if _, err := reg.Push(ctx, s, ref); err != nil {
		t.Fatal(err)
	}
	fromRegistry, err := reg.Pull(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]*snapshot.Snapshot{"file": fromFile, "registry": fromRegistry} {
		var g bytes.Buffer
		if err := got.Write(&g); err != nil {
			t.Fatal(err)
		}
		if g.String() != b.String() {
			t.Errorf("the snapshot read from the %s differs from the one taken", name)
		}
	}

	// A narrowed schema judged from the snapshot prunes what it prunes live: the same
	// verdict, paths and counts, with no object named.
	next, err := chartcrds.FromManifest("---\n# Source: gadgets/templates/crd.yaml\n" + gadgetCRD(true))
	if err != nil {
		t.Fatal(err)
	}
	req := check.Request{Operation: predict.Upgrade, Incoming: next, Release: "gadgets", Namespace: "default", NoAdmission: true}
	live, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	judge := func(c check.Cluster) string {
		rep, err := check.Run(ctx, c, req)
		if err != nil {
			t.Fatal(err)
		}
		c0 := rep.CRDs[0]
		var pruned []string
		if c0.Schema != nil {
			for _, p := range c0.Schema.Pruned {
				pruned = append(pruned, p.Path+" "+p.Version+" "+string(rune('0'+p.Objects)))
			}
		}
		return strings.Join(append([]string{string(c0.Verdict), c0.Reason}, pruned...), "\n")
	}
	fromLive, fromSnapshot := judge(live), judge(fromFile.Cluster())
	if fromSnapshot != fromLive || !strings.Contains(fromLive, "spec.token v1 1") || !strings.Contains(fromLive, "spec.items[*].name v1 2") {
		t.Errorf("narrowed schema from the snapshot:\n%s\nlive:\n%s\nwant the same, pruning spec.token (1 object) and spec.items[*].name (2)", fromSnapshot, fromLive)
	}
}

// TestReadVersions: a snapshot of another format version, or no snapshot at all, is a
// clear error.
func TestReadVersions(t *testing.T) {
	for in, want := range map[string]string{
		`{"schemaVersion": 2, "crds": []}`: "newer than this upgradeguard reads (1): upgrade upgradeguard",
		`{"schemaVersion": 0}`:             "not one this upgradeguard reads (1): take the snapshot again",
		`{"crds": []}`:                     "not a snapshot: it has no schemaVersion",
		`not json`:                         "not a snapshot (JSON)",
	} {
		_, err := snapshot.Read(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Read(%s): %v, want %q", in, err, want)
		}
	}
	s := &snapshot.Snapshot{SchemaVersion: snapshot.SchemaVersion, TakenAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Took: snapshot.Duration(1500 * time.Millisecond)}
	var b bytes.Buffer
	if err := s.Write(&b); err != nil {
		t.Fatal(err)
	}
	written := slices.Clone(b.Bytes())
	got, err := snapshot.Read(&b)
	if err != nil || !got.TakenAt.Equal(s.TakenAt) || got.Took != s.Took || got.Age(s.TakenAt.Add(time.Hour)) != time.Hour {
		t.Errorf("round trip: %+v %v", got, err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(written, &raw); err != nil || raw["took"] != "1.5s" {
		t.Errorf("took written as %v, want 1.5s", raw["took"])
	}
}
