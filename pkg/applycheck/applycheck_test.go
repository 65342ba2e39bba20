package applycheck_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	release "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/redact"
)

const sentinel = "pw-sentinel-7f3a9c"

// Templates of the app chart. Helm applies them in install order: Secret, ConfigMaps,
// Service, Deployment, StatefulSet, CronJobs; the Deployment sits in the middle.
func appTemplates(settings, image, mysqlMemory, reportSchedule string) map[string]string {
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n" + data
	}
	cron := func(name, schedule string) string {
		return "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: " + name + "\nspec:\n  schedule: \"" + schedule + "\"\n" +
			"  jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n" +
			"          containers:\n          - name: run\n            image: busybox:1.36\n"
	}
	return map[string]string{
		"values.yaml":               "password: unset\n",
		"templates/secret.yaml":     "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ntype: Opaque\nstringData:\n  password: {{ .Values.password | quote }}\n",
		"templates/settings.yaml":   cm("settings", "  mode: "+settings+"\n"),
		"templates/service.yaml":    "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector:\n    app: web\n  ports:\n  - port: 80\n",
		"templates/deployment.yaml": workload("Deployment", "jobs-manager", "api", image, "cpu: 1000m", "memory: 256Mi"),
		"templates/mysql.yaml":      workload("StatefulSet", "mysql", "mysql", "mysql:8.4", "memory: "+mysqlMemory),
		"templates/report.yaml":     cron("report", reportSchedule),
		"templates/cleanup.yaml":    cron("cleanup", "30 * * * *"),
		"templates/pre-check.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: pre-check\n  annotations:\n    helm.sh/hook: pre-upgrade\n" +
			"data:\n  step: pre\n",
		"templates/post-note.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: post-note\n  annotations:\n    helm.sh/hook: post-upgrade\n" +
			"data:\n  step: post\n",
	}
}

func workload(kind, name, container, image string, limits ...string) string {
	extra := ""
	if kind == "StatefulSet" {
		extra = "  serviceName: web\n"
	}
	return "apiVersion: apps/v1\nkind: " + kind + "\nmetadata:\n  name: " + name + "\nspec:\n" + extra +
		"  selector:\n    matchLabels:\n      app: " + name + "\n  template:\n    metadata:\n      labels:\n        app: " + name + "\n" +
		"    spec:\n      containers:\n      - name: " + container + "\n        image: " + image + "\n" +
		"        resources:\n          limits:\n            " + strings.Join(limits, "\n            ") + "\n"
}

type cluster struct {
	cp     *testenv.ControlPlane
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	cs     kubernetes.Interface
}

// predict renders chart like helm upgrade does (the release's stored values) and runs the
// prediction from the release's stored history.
func (c cluster) predict(t *testing.T, chart, rel, ns string, o applycheck.Options) *applycheck.Report {
	t.Helper()
	ctx := t.Context()
	reader, err := helmrelease.NewReader(c.cs, ns, "secret")
	if err != nil {
		t.Fatal(err)
	}
	hist, err := reader.History(ctx, rel)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := reader.Current(ctx, rel)
	if err != nil {
		t.Fatal(err)
	}
	last := hist[len(hist)-1]
	ch, err := chartsource.Load(ctx, chartsource.Options{Ref: chart, ReleaseName: rel, Namespace: ns, IsUpgrade: true, BaseValues: cur.Config})
	if err != nil {
		t.Fatal(err)
	}
	u := applycheck.Upgrade{Release: rel, Namespace: ns, CurrentManifest: cur.Manifest, Current: cur.Version, CurrentStatus: cur.Info.Status.String(),
		LastRevision: last.Version, LastStatus: last.Info.Status.String(), TargetManifest: ch.Manifest}
	for _, h := range ch.Hooks {
		for _, e := range h.Events {
			switch e {
			case release.HookPreUpgrade:
				u.PreUpgradeHooks = append(u.PreUpgradeHooks, h.Kind+"/"+h.Name)
			case release.HookPostUpgrade:
				u.PostUpgradeHooks = append(u.PostUpgradeHooks, h.Kind+"/"+h.Name)
			}
		}
	}
	rep, err := applycheck.Run(ctx, c.dyn, c.mapper, u, o)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// snapshot reads every object a report names back from the API server, without the
// bookkeeping every write rewrites. Absent objects map to nil.
func (c cluster) snapshot(t *testing.T, rep *applycheck.Report) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range rep.Objects {
		kind, rest, _ := strings.Cut(o.Object, "/")
		ns, name, _ := strings.Cut(rest, "/")
		gk := map[string]string{"ConfigMap": "", "Secret": "", "Service": "", "Deployment": "apps", "StatefulSet": "apps", "CronJob": "batch"}
		mapping, err := c.mapper.RESTMapping(schema.GroupKind{Group: gk[kind], Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		obj, err := c.dyn.Resource(mapping.Resource).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			out[o.Object] = nil
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		unstructured.RemoveNestedField(obj.Object, "metadata", "managedFields")
		unstructured.RemoveNestedField(obj.Object, "metadata", "resourceVersion")
		out[o.Object] = obj.Object
	}
	return out
}

// changedBetween lists the objects that differ between two snapshots.
func changedBetween(before, after map[string]map[string]any) []string {
	out := []string{}
	for k := range after {
		if !cmp.Equal(before[k], after[k]) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func outcomes(rep *applycheck.Report) map[string]applycheck.Outcome {
	out := map[string]applycheck.Outcome{}
	for _, o := range rep.Objects {
		out[o.Object] = o.Outcome
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func newCluster(t *testing.T) cluster {
	cp := testenv.ForTest(t)
	return cluster{cp: cp, dyn: dynamic.NewForConfigOrDie(cp.Config), cs: kubernetes.NewForConfigOrDie(cp.Config),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))}
}

func (c cluster) helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := c.cp.Helm(args...).CombinedOutput()
	return string(out), err
}

// TestConflictInTheMiddleMatchesHelm is the seed's incident on the real API server with
// the real Helm 4.3.1 CLI: `kubectl patch` took a Deployment's resources.limits.cpu, and
// the chart upgrade renders it. The Deployment sits in the middle of Helm's apply order,
// with changed, unchanged and new objects after it and one object the new chart drops.
// The prediction must name the field and manager Helm reports, print Helm's own error,
// and say exactly which objects land (read back from the API server) and what release
// record Helm writes. A second upgrade whose new object fails to create then shows that
// Helm stops at a failed create.
func TestConflictInTheMiddleMatchesHelm(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	ctx := t.Context()
	const ns, rel = "seed", "client"

	v1files := appTemplates("a", "busybox:1.36", "512Mi", "0 * * * *")
	v1files["templates/legacy.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: legacy\ndata:\n  old: \"yes\"\n"
	v1, err := testenv.WriteChart(t.TempDir(), "client", "1.0.0", v1files)
	if err != nil {
		t.Fatal(err)
	}
	v2files := appTemplates("b", "busybox:1.37", "1Gi", "15 * * * *")
	v2files["templates/extra.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\ndata:\n  new: \"yes\"\n"
	v2files["templates/backup.yaml"] = strings.ReplaceAll(v2files["templates/cleanup.yaml"], "name: cleanup", "name: backup")
	v2, err := testenv.WriteChart(t.TempDir(), "client", "1.1.0", v2files)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.helm(t, "install", rel, v1, "-n", ns, "--create-namespace", "--set", "password="+sentinel); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	// The real kubectl patch, as an operator resizing by hand does.
	kubectl := exec.CommandContext(ctx, filepath.Join(c.cp.KubeBin, "kubectl"), "--kubeconfig", c.cp.Kubeconfig, "-n", ns, "patch", "deployment", "jobs-manager",
		"-p", `{"spec":{"template":{"spec":{"containers":[{"name":"api","resources":{"limits":{"cpu":"1500m"}}}]}}}}`)
	if out, err := kubectl.CombinedOutput(); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}

	rep := c.predict(t, v2, rel, ns, applycheck.Options{FieldManager: "helm", Redact: redact.New(sentinel)})
	wantOrder := []applycheck.Object{
		{Object: "Secret/seed/creds", Step: applycheck.Apply, Outcome: applycheck.Unchanged},
		{Object: "ConfigMap/seed/extra", Step: applycheck.Create, Outcome: applycheck.Created},
		{Object: "ConfigMap/seed/settings", Step: applycheck.Apply, Outcome: applycheck.Updated},
		{Object: "Service/seed/web", Step: applycheck.Apply, Outcome: applycheck.Unchanged},
		{Object: "Deployment/seed/jobs-manager", Step: applycheck.Apply, Outcome: applycheck.Conflict,
			Conflicts: []applycheck.FieldConflict{{Field: `.spec.template.spec.containers[name="api"].resources.limits.cpu`, Manager: "kubectl-patch"}}},
		{Object: "StatefulSet/seed/mysql", Step: applycheck.Apply, Outcome: applycheck.Updated},
		{Object: "CronJob/seed/backup", Step: applycheck.Create, Outcome: applycheck.Created},
		{Object: "CronJob/seed/cleanup", Step: applycheck.Apply, Outcome: applycheck.Unchanged},
		{Object: "CronJob/seed/report", Step: applycheck.Apply, Outcome: applycheck.Updated},
		{Object: "ConfigMap/seed/legacy", Step: applycheck.Delete, Outcome: applycheck.NotDeleted},
	}
	if diff := cmp.Diff(wantOrder, rep.Objects, cmpIgnoreText()); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
	if rep.Safe || rep.Result != applycheck.Fails || !cmp.Equal(rep.Failing, []string{"Deployment/seed/jobs-manager"}) {
		t.Errorf("verdict: safe=%v result=%s failing=%v", rep.Safe, rep.Result, rep.Failing)
	}
	wantRecord := applycheck.Record{Revision: 2, Status: "failed", Description: `Upgrade "client" failed: ` + rep.Error, Previous: 1, PreviousStatus: "deployed"}
	if diff := cmp.Diff(wantRecord, rep.Record); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	if !cmp.Equal(rep.PreUpgradeHooks, []string{"ConfigMap/pre-check"}) || !cmp.Equal(rep.PostUpgradeHooks, []string{"ConfigMap/post-note"}) {
		t.Errorf("hooks: pre %v post %v", rep.PreUpgradeHooks, rep.PostUpgradeHooks)
	}

	// The real upgrade: Helm's error is the predicted one, and what changed on the
	// cluster is exactly what the prediction says landed.
	before := c.snapshot(t, rep)
	out, err := c.helm(t, "upgrade", rel, v2, "-n", ns)
	if err == nil {
		t.Fatalf("helm upgrade succeeded, want the conflict:\n%s", out)
	}
	if !strings.Contains(out, "Error: UPGRADE FAILED: "+rep.Error+"\n") {
		t.Errorf("helm's error is not the predicted one\nhelm:      %s\npredicted: %s", out, rep.Error)
	}
	if strings.Contains(out, sentinel) || strings.Contains(rep.Error, sentinel) {
		t.Error("a release value leaked into an error")
	}
	after := c.snapshot(t, rep)
	if diff := cmp.Diff(sorted(rep.Landed), changedBetween(before, after)); diff != "" {
		t.Errorf("landed: predicted (-) vs changed on the cluster (+):\n%s", diff)
	}
	for _, s := range rep.NotLanded {
		if !cmp.Equal(before[s], after[s]) || after[s] == nil {
			t.Errorf("%s was predicted not to land, but it changed or is gone", s)
		}
	}
	if !cmp.Equal(sorted(rep.NotLanded), []string{"ConfigMap/seed/legacy", "Deployment/seed/jobs-manager"}) {
		t.Errorf("not landed: %v", rep.NotLanded)
	}
	dep := after["Deployment/seed/jobs-manager"]
	ctr, _, _ := unstructured.NestedSlice(dep, "spec", "template", "spec", "containers")
	if got := ctr[0].(map[string]any); got["image"] != "busybox:1.36" {
		t.Errorf("the conflicting Deployment got part of its change: image %v", got["image"])
	}
	c.checkRecord(t, rel, ns, map[int]string{1: "deployed", 2: "failed"}, rep.Record.Description)
	if _, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, "pre-check", metav1.GetOptions{}); err != nil {
		t.Errorf("the pre-upgrade hook did not run: %v", err)
	}
	if _, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, "post-note", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the post-upgrade hook ran after a failed upgrade: %v", err)
	}

	// Next attempt, from the failed state: the chart adds a ConfigMap the API server
	// rejects. It sorts first among the ConfigMaps: Helm stops there, and reports only
	// that error, although the Deployment still conflicts.
	v3files := maps(v2files)
	v3files["templates/bad.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\ndata:\n  \"not valid!\": x\n"
	v3files["templates/settings.yaml"] = strings.ReplaceAll(v3files["templates/settings.yaml"], "mode: b", "mode: c")
	v3, err := testenv.WriteChart(t.TempDir(), "client", "1.2.0", v3files)
	if err != nil {
		t.Fatal(err)
	}
	rep = c.predict(t, v3, rel, ns, applycheck.Options{FieldManager: "helm", Redact: redact.New(sentinel)})
	want := map[string]applycheck.Outcome{
		"Secret/seed/creds": applycheck.Unchanged, "ConfigMap/seed/bad": applycheck.Failed, "ConfigMap/seed/extra": applycheck.NotReached,
		"ConfigMap/seed/settings": applycheck.NotReached, "Service/seed/web": applycheck.NotReached, "Deployment/seed/jobs-manager": applycheck.NotReached,
		"StatefulSet/seed/mysql": applycheck.NotReached, "CronJob/seed/backup": applycheck.NotReached, "CronJob/seed/cleanup": applycheck.NotReached,
		"CronJob/seed/report": applycheck.NotReached, "ConfigMap/seed/legacy": applycheck.NotDeleted,
	}
	if diff := cmp.Diff(want, outcomes(rep)); diff != "" {
		t.Errorf("outcomes after a failed create (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(rep.Error, "failed to create resource: server-side apply failed for object seed/bad /v1, Kind=ConfigMap: ") ||
		rep.Record.Revision != 3 || rep.Record.Previous != 1 {
		t.Errorf("error %q record %+v", rep.Error, rep.Record)
	}
	if !cmp.Equal(sorted(rep.NotLanded), []string{"ConfigMap/seed/bad", "ConfigMap/seed/legacy", "ConfigMap/seed/settings", "Deployment/seed/jobs-manager"}) {
		t.Errorf("not landed: %v", rep.NotLanded)
	}
	before = c.snapshot(t, rep)
	out, err = c.helm(t, "upgrade", rel, v3, "-n", ns)
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+rep.Error+"\n") {
		t.Errorf("helm's error is not the predicted one\nhelm:      %s\npredicted: %s", out, rep.Error)
	}
	if diff := cmp.Diff(sorted(rep.Landed), changedBetween(before, c.snapshot(t, rep))); diff != "" {
		t.Errorf("landed: predicted (-) vs changed on the cluster (+):\n%s", diff)
	}
	c.checkRecord(t, rel, ns, map[int]string{1: "deployed", 2: "failed", 3: "failed"}, rep.Record.Description)

	// Forcing conflicts (helm --force-conflicts, Flux's helm-controller) the v2 upgrade
	// applies, and would delete the dropped object.
	rep = c.predict(t, v2, rel, ns, applycheck.Options{FieldManager: "helm", Force: true})
	if !rep.Safe || rep.Result != applycheck.Succeeds || outcomes(rep)["ConfigMap/seed/legacy"] != applycheck.Deleted || rep.Record.Revision != 4 {
		t.Errorf("forced: %+v", rep)
	}
	before = c.snapshot(t, rep)
	if out, err := c.helm(t, "upgrade", rel, v2, "-n", ns, "--force-conflicts"); err != nil {
		t.Fatalf("forced helm upgrade: %v\n%s", err, out)
	}
	after = c.snapshot(t, rep)
	if after["ConfigMap/seed/legacy"] != nil || after["ConfigMap/seed/bad"] != nil {
		t.Error("the forced upgrade left a dropped object")
	}
	for _, o := range rep.Objects {
		if changed := !cmp.Equal(before[o.Object], after[o.Object]); changed != (o.Outcome != applycheck.Unchanged) {
			t.Errorf("%s predicted %s, changed on the cluster: %v", o.Object, o.Outcome, changed)
		}
	}
	c.checkRecord(t, rel, ns, map[int]string{1: "superseded", 2: "failed", 3: "failed", 4: "deployed"}, "Upgrade complete")
}

// TestRefusedNewObjectNotOwned: a new object of the chart that exists without this
// release's ownership makes Helm refuse the upgrade before it applies anything or records
// a revision.
func TestRefusedNewObjectNotOwned(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	ctx := t.Context()
	const ns, rel = "refuse", "app"
	cm := func(name, v string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n  v: \"" + v + "\"\n"
	}
	v1, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", map[string]string{"templates/a.yaml": cm("a", "1")})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "app", "1.1.0", map[string]string{"templates/a.yaml": cm("a", "2"), "templates/b.yaml": cm("b", "2")})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.helm(t, "install", rel, v1, "-n", ns, "--create-namespace"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	if _, err := c.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Data: map[string]string{"v": "mine"}},
		metav1.CreateOptions{FieldManager: "kubectl-create"}); err != nil {
		t.Fatal(err)
	}
	rep := c.predict(t, v2, rel, ns, applycheck.Options{FieldManager: "helm"})
	if rep.Result != applycheck.Refused || rep.Record.Revision != 0 || !cmp.Equal(rep.Failing, []string{"ConfigMap/refuse/b"}) {
		t.Fatalf("report %+v", rep)
	}
	before := c.snapshot(t, rep)
	out, err := c.helm(t, "upgrade", rel, v2, "-n", ns)
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+rep.Error+"\n") {
		t.Errorf("helm's error is not the predicted one\nhelm:      %s\npredicted: %s", out, rep.Error)
	}
	if diff := changedBetween(before, c.snapshot(t, rep)); len(diff) != 0 {
		t.Errorf("a refused upgrade changed %v", diff)
	}
	c.checkRecord(t, rel, ns, map[int]string{1: "deployed"}, "")

	// helm upgrade --take-ownership adopts it instead of refusing: the upgrade gets as far
	// as the apply, where kubectl-create still owns the field the chart changes.
	rep = c.predict(t, v2, rel, ns, applycheck.Options{FieldManager: "helm", TakeOwnership: true})
	if rep.Result != applycheck.Fails || outcomes(rep)["ConfigMap/refuse/b"] != applycheck.Conflict || rep.Record.Revision != 2 {
		t.Fatalf("take ownership: %s %+v", rep.Result, rep.Objects)
	}
	before = c.snapshot(t, rep)
	out, err = c.helm(t, "upgrade", rel, v2, "-n", ns, "--take-ownership")
	if err == nil || !strings.Contains(out, rep.HelmPrints()+"\n") {
		t.Errorf("helm upgrade --take-ownership: %v\n%s\npredicted: %s", err, out, rep.HelmPrints())
	}
	if diff := cmp.Diff(sorted(rep.Landed), changedBetween(before, c.snapshot(t, rep))); diff != "" {
		t.Errorf("landed: predicted (-) vs changed on the cluster (+):\n%s", diff)
	}
	c.checkRecord(t, rel, ns, map[int]string{1: "deployed", 2: "failed"}, rep.Record.Description)
}

// checkRecord reads the release history and compares statuses; the last revision's
// description when desc is set.
func (c cluster) checkRecord(t *testing.T, rel, ns string, want map[int]string, desc string) {
	t.Helper()
	reader, err := helmrelease.NewReader(c.cs, ns, "secret")
	if err != nil {
		t.Fatal(err)
	}
	hist, err := reader.History(context.WithoutCancel(t.Context()), rel)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]string{}
	for _, r := range hist {
		got[r.Version] = r.Info.Status.String()
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("release history (-want +got):\n%s", diff)
	}
	if last := hist[len(hist)-1]; desc != "" && last.Info.Description != desc {
		t.Errorf("revision %d description:\n got  %s\n want %s", last.Version, last.Info.Description, desc)
	}
}

func cmpIgnoreText() cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool {
		s := p.String()
		return s == "Error" || s == "Note" || s == "DryRun"
	}, cmp.Ignore())
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
