package releasediff_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	release "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/releasediff"
)

// seedCharts returns the files of two chart versions for the seed's incident: v2 changes
// a ConfigMap, the Deployment's CPU limit (which another manager will own), a ConfigMap
// whose field another manager pins to the v1 value, and a CronJob; it adds a CronJob and
// drops a ConfigMap. v2 also spells the memory limit differently (0.5Gi for 512Mi): the
// same quantity.
func seedCharts(v2 bool) map[string]string {
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n  " + data + "\n"
	}
	cron := func(name, schedule string) string {
		return "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: " + name + "\nspec:\n  schedule: \"" + schedule + "\"\n" +
			"  jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          containers:\n          - name: run\n            image: busybox:1.36\n"
	}
	deploy := func(cpu, memory string) string {
		return `apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
spec:
  replicas: 1
  selector:
    matchLabels: {app: api}
  template:
    metadata:
      labels: {app: api}
    spec:
      containers:
      - name: api
        image: busybox:1.36
        resources:
          limits: {cpu: "` + cpu + `", memory: "` + memory + `"}
`
	}
	files := map[string]string{"templates/same.yaml": cm("same", "k: v")}
	if !v2 {
		files["templates/pinned.yaml"] = cm("pinned", "mode: a")
		files["templates/cfg.yaml"] = cm("cfg", `x: "1"`)
		files["templates/old.yaml"] = cm("old", `y: "1"`)
		files["templates/deploy.yaml"] = deploy("500m", "512Mi")
		files["templates/nightly.yaml"] = cron("nightly", "0 1 * * *")
		return files
	}
	files["templates/pinned.yaml"] = cm("pinned", "mode: b")
	files["templates/cfg.yaml"] = cm("cfg", `x: "2"`)
	files["templates/deploy.yaml"] = deploy("1", "0.5Gi")
	files["templates/nightly.yaml"] = cron("nightly", "0 2 * * *")
	files["templates/weekly.yaml"] = cron("weekly", "0 3 * * 0")
	return files
}

// TestFailedUpgradeVerdicts: a real Helm 4.3.1 upgrade fails on fields that
// kubectl-patch owns. Helm 4.3.1 goes on past an update that fails (it collects the
// errors), creates the new objects, and then skips the deletions: the release is mixed.
// Each object's verdict agrees with what the test reads back from the API server.
func TestFailedUpgradeVerdicts(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := testenv.ForTest(t)
	ctx := t.Context()
	v1, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", seedCharts(false))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "app", "1.1.0", seedCharts(true))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Helm("install", "app", v1, "-n", "apps", "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	patch := `{"spec":{"template":{"spec":{"containers":[{"name":"api","resources":{"limits":{"cpu":"750m"}}}]}}}}`
	if _, err := cs.AppsV1().Deployments("apps").Patch(ctx, "api", types.StrategicMergePatchType, []byte(patch),
		metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}
	// kubectl-patch takes pinned's mode and leaves it at the v1 value.
	for _, mode := range []string{"z", "a"} {
		if _, err := cs.CoreV1().ConfigMaps("apps").Patch(ctx, "pinned", types.MergePatchType, []byte(`{"data":{"mode":"`+mode+`"}}`),
			metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := cp.Helm("upgrade", "app", v2, "-n", "apps").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "conflict") {
		t.Fatalf("helm upgrade should fail on the conflict: %v\n%s", err, out)
	}

	// What actually landed, read straight from the API server.
	cfg, _ := cs.CoreV1().ConfigMaps("apps").Get(ctx, "cfg", metav1.GetOptions{})
	pinned, _ := cs.CoreV1().ConfigMaps("apps").Get(ctx, "pinned", metav1.GetOptions{})
	dep, _ := cs.AppsV1().Deployments("apps").Get(ctx, "api", metav1.GetOptions{})
	nightly, _ := cs.BatchV1().CronJobs("apps").Get(ctx, "nightly", metav1.GetOptions{})
	_, weeklyErr := cs.BatchV1().CronJobs("apps").Get(ctx, "weekly", metav1.GetOptions{})
	_, oldErr := cs.CoreV1().ConfigMaps("apps").Get(ctx, "old", metav1.GetOptions{})
	if cfg.Data["x"] != "2" || pinned.Data["mode"] != "a" || dep.Spec.Template.Spec.Containers[0].Resources.Limits.Cpu().String() != "750m" ||
		nightly.Spec.Schedule != "0 2 * * *" || weeklyErr != nil || oldErr != nil {
		t.Fatalf("the failed upgrade left an unexpected state: cfg x=%s pinned mode=%s cpu=%s nightly=%q weekly err=%v old err=%v",
			cfg.Data["x"], pinned.Data["mode"], dep.Spec.Template.Spec.Containers[0].Resources.Limits.Cpu(), nightly.Spec.Schedule, weeklyErr, oldErr)
	}

	reader, err := helmrelease.NewReader(cs, "apps", "")
	if err != nil {
		t.Fatal(err)
	}
	h, err := reader.History(ctx, "app")
	if err != nil || len(h) != 2 {
		t.Fatalf("history: %v (%d revisions)", err, len(h))
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	rep, err := releasediff.Run(ctx, dyn, mapper, h[1], h[0], releasediff.Options{Namespace: "apps"})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Object  string
		Change  releasediff.Change
		Verdict releasediff.Verdict
		Differs []string
	}
	var got []row
	for _, o := range rep.Objects {
		got = append(got, row{o.Object, o.Change, o.Verdict, o.Differs})
	}
	want := []row{
		{"ConfigMap/apps/cfg", releasediff.Changed, releasediff.Failed, nil},
		{"ConfigMap/apps/pinned", releasediff.Changed, releasediff.Previous, []string{".data.mode"}},
		{"ConfigMap/apps/same", releasediff.Same, releasediff.Unchanged, nil},
		// The conflicting object holds the other manager's value: neither revision. The
		// memory limit, spelled 0.5Gi in v2, is the same quantity and is not reported.
		{"Deployment/apps/api", releasediff.Changed, releasediff.Neither, []string{`.spec.template.spec.containers[name="api"].resources.limits.cpu`}},
		{"CronJob/apps/nightly", releasediff.Changed, releasediff.Failed, nil},
		{"CronJob/apps/weekly", releasediff.Added, releasediff.Failed, nil},
		{"ConfigMap/apps/old", releasediff.Dropped, releasediff.Previous, nil},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	if !rep.Mixed || rep.Clean() || rep.FailedStatus != "failed" || rep.FailedRevision != 2 || rep.PreviousRevision != 1 {
		t.Errorf("report: mixed=%v failed=%d(%s) previous=%d", rep.Mixed, rep.FailedRevision, rep.FailedStatus, rep.PreviousRevision)
	}
	if diff := cmp.Diff([]string{"Deployment/apps/api"}, rep.Drifted); diff != "" {
		t.Errorf("drifted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"ConfigMap/apps/pinned", "ConfigMap/apps/old"}, rep.NotLanded); diff != "" {
		t.Errorf("not landed (-want +got):\n%s", diff)
	}

	// Forcing the upgrade through lands everything: against revision 1 nothing is
	// mixed any more.
	if out, err := cp.Helm("upgrade", "app", v2, "-n", "apps", "--server-side=true", "--force-conflicts").CombinedOutput(); err != nil {
		t.Fatalf("forced upgrade: %v\n%s", err, out)
	}
	if h, err = reader.History(ctx, "app"); err != nil || len(h) != 3 {
		t.Fatalf("history: %v", err)
	}
	rep, err = releasediff.Run(ctx, dyn, mapper, h[2], h[0], releasediff.Options{Namespace: "apps"})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Clean() || len(rep.NotLanded) != 0 || len(rep.Landed) != 6 {
		t.Errorf("after the forced upgrade: clean=%v landed=%v notLanded=%v drifted=%v", rep.Clean(), rep.Landed, rep.NotLanded, rep.Drifted)
	}
}

func TestDiffMatchesListsByName(t *testing.T) {
	a := map[string]any{"spec": map[string]any{"containers": []any{
		map[string]any{"name": "a", "image": "x"}, map[string]any{"name": "b", "image": "y"}}, "args": []any{"1", "2"}}}
	b := map[string]any{"spec": map[string]any{"containers": []any{
		map[string]any{"name": "b", "image": "y"}, map[string]any{"name": "a", "image": "z"}}, "args": []any{"1", "3"}, "extra": true}}
	want := []string{`.spec.args[1]`, `.spec.containers[name="a"].image`, `.spec.extra`}
	if diff := cmp.Diff(want, releasediff.Diff(a, b)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestAPIServerErrorsAreRedacted: the API server echoes the values it rejects. A failed
// revision whose labels carry a release value and a Secret's data gets a 422 from the
// dry run; the report keeps the error and neither value.
func TestAPIServerErrorsAreRedacted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := testenv.ForTest(t)
	ctx := t.Context()
	const ns, valueSentinel, secretSentinel = "redact", "value sentinel 7f3a!!", "secret sentinel 9c2e!!"
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	manifest := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  labels:\n    app: \"" + valueSentinel + "\"\n---\n" +
		"apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  labels:\n    app: \"" + secretSentinel + "\"\nstringData:\n  token: \"" + secretSentinel + "\"\n"
	failed := &release.Release{Name: "leaky", Namespace: ns, Version: 2, Manifest: manifest, Config: map[string]any{"label": valueSentinel}}

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	rep, err := releasediff.Run(ctx, dyn, mapper, failed, nil, releasediff.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Objects) != 2 {
		t.Fatalf("objects %+v, want the ConfigMap and the Secret", rep.Objects)
	}
	for _, o := range rep.Objects {
		if o.Verdict != releasediff.Unknown || !strings.Contains(o.Error, "Invalid value") || !strings.Contains(o.Error, "[redacted]") {
			t.Errorf("%s: verdict %s error %q, want the API server's rejection with the value redacted", o.Object, o.Verdict, o.Error)
		}
	}
	for _, s := range []string{valueSentinel, secretSentinel} {
		if strings.Contains(string(data), s) {
			t.Errorf("the report shows %q:\n%s", s, data)
		}
	}
}
