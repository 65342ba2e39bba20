package check_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// TestBundledStorageVersionMigrations renders a chart of the test's own with the Helm SDK:
// three real Flux CRDs, each moved to a group of this test's own and each at the version
// its case needs, and a StorageVersionMigration template for each case, plus one for a
// resource no CRD serves. check judges every one against the real API server:
//   - will run: a new name, and the incoming CRD (source-controller 1.6.0) keeps serving
//     the version the live one (1.2.0) stores;
//   - will not run: a StorageVersionMigration of that name already exists and succeeded;
//   - too late: it arrives with the CRD (1.8.0) that drops stored v1beta2;
//   - no CRD: spec.resource names nothing in the chart or on the cluster.
//
// None changes the CRDs' verdicts or Safe. Where StorageVersionMigrations are not served
// (1.32), the existing name cannot be known: the report says so.
func TestBundledStorageVersionMigrations(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	const hr = "source.toolkit.fluxcd.io_helmrepositories.yaml"
	group := func(c string) string { return c + ".bundled.upgradeguard.test" }
	crdName := func(c string) string { return "helmrepositories." + group(c) }
	regroup := func(version, c string) string {
		fx, err := testenv.Fixtures()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(fx, "crds/flux-source-controller", version, hr))
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(data), "source.toolkit.fluxcd.io", group(c))
	}
	// The live CRDs, as earlier releases left them.
	live := map[string]struct {
		version string
		stored  []string
	}{
		"run":   {"v1.2.0", []string{"v1beta2"}},
		"again": {"v1.6.0", []string{"v1beta2", "v1"}},
		"late":  {"v1.7.0", []string{"v1beta2", "v1"}},
	}
	for c, l := range live {
		crds, err := crdversions.FromManifest(c, []byte(regroup(l.version, c)))
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.ApplyCRD(ctx, cs, crds[0]); err != nil {
			t.Fatal(err)
		}
		if err := testenv.SetStoredVersions(ctx, cs, crds[0].Name, l.stored...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.WithoutCancel(ctx), crds[0].Name, metav1.DeleteOptions{})
		})
	}

	// A StorageVersionMigration named as the chart's "again" one ran before and succeeded.
	disco := discovery.NewDiscoveryClientForConfigOrDie(cp.Config)
	gvr, err := svm.Resource(disco)
	if err != nil {
		t.Fatal(err)
	}
	served := !gvr.Empty()
	if cp.Minor >= 37 && !served {
		t.Fatalf("1.%d serves no StorageVersionMigrations; want storagemigration.k8s.io/v1 served by default", cp.Minor)
	}
	const usedName = "bundled-again-migration"
	if served {
		dyn := dynamic.NewForConfigOrDie(cp.Config)
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": gvr.GroupVersion().String(), "kind": "StorageVersionMigration",
			"metadata": map[string]any{"name": usedName},
			"spec":     map[string]any{"resource": map[string]any{"group": group("again"), "resource": "helmrepositories"}},
		}}
		created, err := dyn.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dyn.Resource(gvr).Delete(context.WithoutCancel(ctx), usedName, metav1.DeleteOptions{}) })
		if err := unstructured.SetNestedSlice(created.Object, []any{map[string]any{
			"type": string(svmv1.MigrationSucceeded), "status": "True", "reason": "StorageVersionMigrationSucceeded",
			"message": "The migration has succeeded", "lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z"),
		}}, "status", "conditions"); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(gvr).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	svmTemplate := func(name, apiVersion, g string) string {
		return fmt.Sprintf("apiVersion: %s\nkind: StorageVersionMigration\nmetadata:\n  name: %s\nspec:\n  resource:\n    group: %s\n    resource: helmrepositories\n",
			apiVersion, name, g)
	}
	dir, err := testenv.WriteChart(t.TempDir(), "bundled", "2.0.0", map[string]string{
		"templates/crd-run.yaml":   regroup("v1.6.0", "run"),
		"templates/crd-again.yaml": regroup("v1.7.0", "again"),
		"templates/crd-late.yaml":  regroup("v1.8.0", "late"),
		"templates/svm-run.yaml":   svmTemplate("bundled-run-{{ .Chart.Version }}", "storagemigration.k8s.io/v1", group("run")),
		"templates/svm-again.yaml": svmTemplate(usedName, "storagemigration.k8s.io/v1", group("again")),
		"templates/svm-late.yaml":  svmTemplate("bundled-late-{{ .Chart.Version }}", "storagemigration.k8s.io/v1beta1", group("late")),
		"templates/svm-nocrd.yaml": svmTemplate("bundled-nocrd", "storagemigration.k8s.io/v1", group("nothing")),
		"templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bundled\ndata:\n  kind: StorageVersionMigration\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := check.Predict(ctx, check.Sources{Cluster: cluster, Chart: chartsource.CheckChart(chartsource.Helm{}, chartsource.Options{Ref: dir})})
	if err != nil {
		t.Fatal(err)
	}
	rep := p.Report

	verdicts := map[string]predict.Verdict{}
	bundled := map[string]predict.BundledMigration{}
	for _, c := range rep.CRDs {
		verdicts[c.Name] = c.Verdict
		for _, b := range c.BundledMigrations {
			if b.CRD != c.Name {
				t.Errorf("%s lists StorageVersionMigration %s, which covers %s", c.Name, b.Name, b.CRD)
			}
			bundled[b.Name] = b
		}
	}
	for _, b := range rep.BundledMigrations {
		bundled[b.Name] = b
	}
	// The CRDs' verdicts are what they are without the bundled migrations.
	wantVerdicts := map[string]predict.Verdict{crdName("run"): predict.OK, crdName("again"): predict.OK, crdName("late"): predict.Migrate}
	for n, v := range wantVerdicts {
		if verdicts[n] != v {
			t.Errorf("%s: verdict %q, want %q", n, verdicts[n], v)
		}
	}
	if rep.Safe {
		t.Errorf("safe, want unsafe: %s drops stored v1beta2", crdName("late"))
	}
	if len(bundled) != 4 {
		t.Fatalf("bundled migrations %+v, want the chart's four (the ConfigMap is none)", bundled)
	}

	againVerdict := predict.BundledWillNotRun
	if !served {
		againVerdict = predict.BundledWillRun
		if !rep.BundledMigrationsUnknown {
			t.Errorf("1.%d serves no StorageVersionMigrations: want BundledMigrationsUnknown", cp.Minor)
		}
	} else if rep.BundledMigrationsUnknown {
		t.Errorf("BundledMigrationsUnknown on 1.%d, which serves %s", cp.Minor, gvr.GroupVersion())
	}
	for _, c := range []struct {
		name    string
		crd     string
		verdict predict.BundledVerdict
		reason  []string
		action  []string
	}{
		{"bundled-run-2.0.0", crdName("run"), predict.BundledWillRun,
			[]string{"re-writes the objects stored at v1beta2 to v1", "nothing waits for it"},
			[]string{cmdline.Migrate{CRDs: []string{crdName("run")}, Wait: true}.String()}},
		{usedName, crdName("again"), againVerdict,
			map[bool][]string{true: {"already exists (succeeded", "migrates nothing"}, false: {"nothing waits for it"}}[served],
			map[bool][]string{true: {"stored v1beta2 remain", cmdline.Migrate{CRDs: []string{crdName("again")}}.String()},
				false: {"--wait"}}[served]},
		{"bundled-late-2.0.0", crdName("late"), predict.BundledTooLate,
			[]string{"drops stored v1beta2", "rejects that CRD write", "the upgrade fails"},
			[]string{"before the upgrade", cmdline.Migrate{CRDs: []string{crdName("late")}}.String()}},
		{"bundled-nocrd", "helmrepositories." + group("nothing"), predict.BundledNoCRD,
			[]string{"names no CRD in the chart or on the cluster"}, []string{"spec.resource"}},
	} {
		b, ok := bundled[c.name]
		if !ok {
			t.Errorf("%s: not reported", c.name)
			continue
		}
		if b.CRD != c.crd || b.Verdict != c.verdict {
			t.Errorf("%s: covers %s, verdict %s; want %s, %s (%s)", c.name, b.CRD, b.Verdict, c.crd, c.verdict, b.Reason)
		}
		for _, s := range c.reason {
			if !strings.Contains(b.Reason, s) {
				t.Errorf("%s: reason %q, want it to say %q", c.name, b.Reason, s)
			}
		}
		for _, s := range c.action {
			if !strings.Contains(b.Action, s) {
				t.Errorf("%s: action %q, want it to say %q", c.name, b.Action, s)
			}
		}
		if !strings.HasPrefix(b.File, "bundled/templates/svm-") {
			t.Errorf("%s: file %q, want its template", c.name, b.File)
		}
	}
	if b := bundled["bundled-nocrd"]; len(rep.BundledMigrations) != 1 || rep.BundledMigrations[0].Name != b.Name {
		t.Errorf("report-level bundled migrations %+v, want only the one with no CRD", rep.BundledMigrations)
	}
}

// TestBundledMigrationTooLateWithHelm: what "too late" rests on, with the real Helm 4 and
// Helm 3 CLIs. A chart version that drops stored v1beta2 and bundles a
// StorageVersionMigration for that CRD fails `helm upgrade` on the CRD
// (status.storedVersions) whatever the migration would do; check, on the same chart,
// calls the migration too-late beside the CRD's migrate verdict. Both Helms still create
// the new StorageVersionMigration beside the failed CRD: the reason says so, and this test
// keeps it true.
func TestBundledMigrationTooLateWithHelm(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp.NeedHelm3(t)
	for _, h := range []struct {
		name string
		cli  func(args ...string) *exec.Cmd
	}{{"helm4", cp.Helm}, {"helm3", cp.Helm3}} {
		t.Run(h.name, func(t *testing.T) { tooLateWithHelm(t, h.name, h.cli) })
	}
}

func tooLateWithHelm(t *testing.T, name string, helm func(args ...string) *exec.Cmd) {
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	g := name + "late.bundled.upgradeguard.test"
	crd := "helmrepositories." + g
	regroup := func(version string) string {
		fx, err := testenv.Fixtures()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(fx, "crds/flux-source-controller", version, "source.toolkit.fluxcd.io_helmrepositories.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(data), "source.toolkit.fluxcd.io", g)
	}
	gvr, err := svm.Resource(discovery.NewDiscoveryClientForConfigOrDie(cp.Config))
	if err != nil {
		t.Fatal(err)
	}
	if cp.Minor >= 37 && gvr.Empty() {
		t.Fatalf("1.%d serves no StorageVersionMigrations", cp.Minor)
	}
	ns := "bundled-" + name
	dir := t.TempDir()
	v1, err := testenv.WriteChart(filepath.Join(dir, "1"), "late", "1.0.0", map[string]string{"templates/crd.yaml": regroup("v1.7.0")})
	if err != nil {
		t.Fatal(err)
	}
	v2files := map[string]string{"templates/crd.yaml": regroup("v1.8.0")}
	svmName := name + "-late-migration"
	if !gvr.Empty() {
		// Only where the kind is served: elsewhere Helm would fail on the unknown kind instead.
		v2files["templates/svm.yaml"] = fmt.Sprintf("apiVersion: %s\nkind: StorageVersionMigration\nmetadata:\n  name: %s\nspec:\n  resource:\n    group: %s\n    resource: helmrepositories\n",
			gvr.GroupVersion(), svmName, g)
	}
	v2, err := testenv.WriteChart(filepath.Join(dir, "2"), "late", "2.0.0", v2files)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := helm("install", "late", v1, "-n", ns, "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("%s install: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		_ = helm("uninstall", "late", "-n", ns).Run()
		_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.WithoutCancel(ctx), crd, metav1.DeleteOptions{})
	})
	// Objects were stored at v1beta2 before v1 became the storage version.
	if err := testenv.SetStoredVersions(ctx, cs, crd, "v1beta2", "v1"); err != nil {
		t.Fatal(err)
	}

	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := check.Predict(ctx, check.Sources{Cluster: cluster, Chart: chartsource.CheckChart(chartsource.Helm{}, chartsource.Options{Ref: v2})})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Report.CRDs) != 1 || p.Report.CRDs[0].Verdict != predict.Migrate {
		t.Fatalf("report %+v, want %s: migrate", p.Report.CRDs, crd)
	}
	if !gvr.Empty() {
		b := p.Report.CRDs[0].BundledMigrations
		if len(b) != 1 || b[0].Name != svmName || b[0].Verdict != predict.BundledTooLate {
			t.Errorf("bundled %+v, want %s too-late", b, svmName)
		}
	}

	out, err := helm("upgrade", "late", v2, "-n", ns).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "storedVersions") {
		t.Fatalf("%s upgrade: %v\n%s\nwant it refused on status.storedVersions", name, err, out)
	}
	if !gvr.Empty() {
		_, err := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Get(ctx, svmName, metav1.GetOptions{})
		if err != nil {
			t.Errorf("StorageVersionMigration %s after the failed upgrade: %v; want %s to have created it beside the failed CRD, as the too-late reason says", svmName, err, name)
		}
		t.Cleanup(func() {
			_ = dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Delete(context.WithoutCancel(ctx), svmName, metav1.DeleteOptions{})
		})
	}
}

// TestBundledMigrationRunsWithHelm: will-run and will-not-run rest on what the in-tree
// migrator does, not on a status the test writes. A release whose CRD is source-
// controller 1.2.0's (objects stored at v1beta2) is checked against chart 2.0.0 (the 1.6.0
// CRD, storing v1 and still serving v1beta2, and a StorageVersionMigration): it will run.
// The real `helm upgrade` creates it, and the real kube-controller-manager migrates the
// objects and prunes status.storedVersions to [v1]. The same chart checked again: it will
// not run (a StorageVersionMigration of that name exists and succeeded). Before 1.37 no
// StorageVersionMigration is served by default, so no chart can bundle one that runs.
func TestBundledMigrationRunsWithHelm(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	gvr, err := svm.Resource(discovery.NewDiscoveryClientForConfigOrDie(cp.Config))
	if err != nil {
		t.Fatal(err)
	}
	if cp.Minor < 37 {
		if !gvr.Empty() {
			t.Fatalf("1.%d serves %s by default; the verdicts assume only 1.37 on does", cp.Minor, gvr)
		}
		return
	}
	if gvr.Empty() {
		t.Fatalf("1.%d serves no StorageVersionMigrations", cp.Minor)
	}
	// The built-in migrator needs the garbage collector's informers.
	if err := cp.StartControllerManager("garbage-collector-controller", "storage-version-migrator-controller"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.StopControllerManager(); err != nil {
			t.Error(err)
		}
	})

	cs := apiextclient.NewForConfigOrDie(cp.Config)
	const g = "runs.bundled.upgradeguard.test"
	crd := "helmrepositories." + g
	regroup := func(version string) string {
		fx, err := testenv.Fixtures()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(fx, "crds/flux-source-controller", version, "source.toolkit.fluxcd.io_helmrepositories.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(data), "source.toolkit.fluxcd.io", g)
	}
	dir := t.TempDir()
	v1, err := testenv.WriteChart(filepath.Join(dir, "1"), "runs", "1.0.0", map[string]string{"templates/crd.yaml": regroup("v1.2.0")})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(filepath.Join(dir, "2"), "runs", "2.0.0", map[string]string{
		"templates/crd.yaml": regroup("v1.6.0"),
		"templates/svm.yaml": fmt.Sprintf("apiVersion: %s\nkind: StorageVersionMigration\nmetadata:\n  name: runs-{{ .Chart.Version }}\nspec:\n  resource:\n    group: %s\n    resource: helmrepositories\n",
			gvr.GroupVersion(), g),
	})
	if err != nil {
		t.Fatal(err)
	}
	const ns = "bundled-runs"
	if out, err := cp.Helm("install", "runs", v1, "-n", ns, "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_ = cp.Helm("uninstall", "runs", "-n", ns).Run()
		_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.WithoutCancel(ctx), crd, metav1.DeleteOptions{})
		_ = dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Delete(context.WithoutCancel(ctx), "runs-2.0.0", metav1.DeleteOptions{})
	})
	if err := testenv.WaitEstablished(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	objects := dyn.Resource(schema.GroupVersionResource{Group: g, Version: "v1beta2", Resource: "helmrepositories"}).Namespace(ns)
	for i := range 3 {
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": g + "/v1beta2", "kind": "HelmRepository",
			"metadata": map[string]any{"name": fmt.Sprintf("repo%d", i)}, "spec": map[string]any{"url": "https://charts.example.com", "interval": "5m"}}}
		if _, err := objects.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	bundledVerdict := func() predict.BundledMigration {
		t.Helper()
		cluster, err := livecluster.NewKubeCluster(cp.Config)
		if err != nil {
			t.Fatal(err)
		}
		p, err := check.Predict(ctx, check.Sources{Cluster: cluster, Chart: chartsource.CheckChart(chartsource.Helm{}, chartsource.Options{Ref: v2})})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Report.CRDs) != 1 || len(p.Report.CRDs[0].BundledMigrations) != 1 {
			t.Fatalf("report %+v, want %s with one bundled migration", p.Report.CRDs, crd)
		}
		return p.Report.CRDs[0].BundledMigrations[0]
	}
	if b := bundledVerdict(); b.Name != "runs-2.0.0" || b.Verdict != predict.BundledWillRun {
		t.Fatalf("before the upgrade: %s %s (%s), want runs-2.0.0 will-run", b.Name, b.Verdict, b.Reason)
	}

	if out, err := cp.Helm("upgrade", "runs", v2, "-n", ns).CombinedOutput(); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	// The in-tree migrator runs it: Succeeded, and storedVersions pruned by the server. It
	// starts once the garbage collector's monitors know the new resource, which can take
	// a minute or more on a loaded machine.
	svmDone := func() (bool, error) {
		m, err := dyn.Resource(gvr).Get(ctx, "runs-2.0.0", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(m.Object, "status", "conditions")
		succeeded := false
		for _, c := range conds {
			c, _ := c.(map[string]any)
			if c["type"] == string(svmv1.MigrationSucceeded) && c["status"] == "True" {
				succeeded = true
			}
		}
		live, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if !succeeded || strings.Join(live.Status.StoredVersions, ",") != "v1" {
			return false, fmt.Errorf("not yet: conditions %v, storedVersions %v", conds, live.Status.StoredVersions)
		}
		return true, nil
	}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 4*time.Minute, true, func(context.Context) (bool, error) {
		ok, err := svmDone()
		last = err
		return ok, nil
	}); err != nil {
		t.Fatalf("the bundled StorageVersionMigration did not succeed with storedVersions [v1]: %v", last)
	}

	if b := bundledVerdict(); b.Verdict != predict.BundledWillNotRun || !strings.Contains(b.Reason, "already exists (succeeded") {
		t.Fatalf("after the migrator ran it: %s %s (%s), want will-not-run: it exists and succeeded", b.Name, b.Verdict, b.Reason)
	}
}
