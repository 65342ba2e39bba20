package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

func TestMigrateFlagErrors(t *testing.T) {
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"migrate"}, "exactly one of --crd"},
		{[]string{"migrate", "--crd", "a", "--all"}, "exactly one of --crd"},
		{[]string{"migrate", "--crd", "a", "--crd", "b", "--storage-version", "v1"}, "exactly one --crd"},
		{[]string{"migrate", "--all", "--concurrency", "0"}, "--concurrency"},
		{[]string{"rbac"}, "exactly one of --crd"},
		{[]string{"migrate", "--all", "--engine", "svm"}, `unknown migration engine "svm": use auto, client or builtin`},
		{[]string{"rbac", "--crd", "a", "--engine", "auto"}, `migration engine "auto" has no role of its own: use client or builtin`},
	}
	for _, tc := range cases {
		r := run(t, tc.args...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
			t.Errorf("%v: exit %d stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.mention)
		}
	}
}

// TestMigrateByChart: ESO 0.15.1 with v1alpha1 stored, then migrate the CRDs check says
// 0.16.2 needs, then the real helm upgrade succeeds; a re-run has nothing to do.
func TestMigrateByChart(t *testing.T) {
	needCluster(t)
	const es = "externalsecrets.external-secrets.io"
	old := fixtureChart(t, "eso", "0.15.1", "crds/external-secrets/v0.15.1/external-secrets.io_externalsecrets.yaml")
	target := fixtureChart(t, "eso", "0.16.2", "crds/external-secrets/v0.16.2/external-secrets.io_externalsecrets.yaml")
	mustHelm(t, nil, "install", "eso", old, "-n", "eso", "--create-namespace")
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	if err := testenv.WaitEstablished(t.Context(), cs, es); err != nil {
		t.Fatal(err)
	}
	if err := testenv.SetStoredVersions(t.Context(), cs, es, "v1alpha1", "v1beta1"); err != nil {
		t.Fatal(err)
	}

	r := ug(t, "migrate", "--chart", target, "--release", "eso", "-n", "eso", "--dry-run", "-o", "json")
	if r.code != cli.ExitSafe {
		t.Fatalf("dry run exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	var out struct{ CRDs []migrate.Result }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.CRDs) != 1 || out.CRDs[0].Status != migrate.WouldMigrate {
		t.Fatalf("dry run output %s (%v)", r.stdout, err)
	}
	if out, err := helm(t, nil, "upgrade", "eso", target, "-n", "eso"); err == nil {
		t.Fatalf("upgrade succeeded before the migration: %s", out)
	}

	r = ug(t, "migrate", "--chart", target, "--release", "eso", "-n", "eso", "--lease-namespace", "eso", "-o", "json")
	if r.code != cli.ExitSafe {
		t.Fatalf("migrate exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.CRDs[0].Status != migrate.Migrated || strings.Join(out.CRDs[0].StoredVersionsAfter, ",") != "v1beta1" {
		t.Fatalf("migrate output %s (%v)", r.stdout, err)
	}
	mustHelm(t, nil, "upgrade", "eso", target, "-n", "eso")

	// The upgrade moved storage to v1 (storedVersions [v1beta1 v1]): one more migration,
	// then a re-run has nothing to do.
	for _, want := range []string{"migrated", "alreadyMigrated"} {
		r = ug(t, "migrate", "--crd", es, "--lease-namespace", "eso")
		if r.code != cli.ExitSafe || !strings.Contains(r.stdout, " "+want+" ") {
			t.Errorf("want %s: exit %d: %s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	r = ug(t, "migrate", "--crd", "nope.example.com")
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "kubectl get crd") {
		t.Errorf("unknown CRD: exit %d stderr %q", r.code, r.stderr)
	}
	r = ug(t, "rbac", "--crd", es, "--lease-namespace", "eso")
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "kind: ClusterRole") || !strings.Contains(r.stdout, "externalsecrets") || !strings.Contains(r.stdout, "upgradeguard-migrate-"+es) {
		t.Errorf("rbac: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestMigrateStartsOverWhenCRDChanges: a chart upgrade changes the CRD while migrate runs.
// The run does not prune on the first pass; it says why, starts over and finishes.
func TestMigrateStartsOverWhenCRDChanges(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD("restart.example.com", "gadgets", "Gadget")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.WithoutCancel(ctx), crd.Name, metav1.DeleteOptions{})
	})
	const n = 60
	gvr := schema.GroupVersionResource{Group: "restart.example.com", Version: "v1alpha1", Resource: "gadgets"}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: gvr, Kind: "Gadget", Namespaces: []string{"gadgets"}, PerNS: n,
		Spec: map[string]any{"size": int64(1)}}); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Namespace("gadgets")
	list, err := ri.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, o := range list.Items {
		listed[o.GetName()] = o.GetResourceVersion()
	}

	done := make(chan result, 1)
	go func() {
		done <- ug(t, "migrate", "--crd", crd.Name, "--lease-namespace", "default", "--qps", "10", "--burst", "1",
			"--page-size", "10", "--concurrency", "1", "-o", "json")
	}()
	// Once the run has rewritten a few objects, the upgrade changes the CRD (a new
	// generation, the same storage version).
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := ri.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		changed := 0
		for _, o := range list.Items {
			if listed[o.GetName()] != o.GetResourceVersion() {
				changed++
			}
		}
		if changed >= n {
			return false, fmt.Errorf("the first pass finished before the CRD could change")
		}
		return changed >= 5, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Deprecated, crd.Spec.Versions[0].DeprecationWarning = true, ptr.To("v1alpha1 is going away")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}

	r := <-done
	if r.code != cli.ExitSafe || !strings.Contains(r.stderr, "changed during the run") || !strings.Contains(r.stderr, "starting over") {
		t.Fatalf("exit %d, want 0 after starting over\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	var out struct{ CRDs []migrate.Result }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.CRDs) != 1 {
		t.Fatalf("output %s (%v)", r.stdout, err)
	}
	if res := out.CRDs[0]; res.Status != migrate.Migrated || res.Restart || res.Objects != n || strings.Join(res.StoredVersionsAfter, ",") != "v1" {
		t.Errorf("result %+v, want the second pass to migrate all %d objects and prune to [v1]", res, n)
	}
}

// TestMigrateRefusesFieldLoss: after the helm-controller v0.37.4 -> v1.0.0 CRD upgrade,
// HelmReleases stored at v2beta2 hold spec.chart.spec.valuesFile, which v2 drops. migrate
// exits 1 (a finding), names the field, its count and the way on, writes nothing, and
// never prints the field's value; with --allow-field-loss it migrates (exit 0) and still
// reports the field it dropped.
func TestMigrateRefusesFieldLoss(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "helm.toolkit.fluxcd.io")
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	const hr = "helmreleases.helm.toolkit.fluxcd.io"
	applySet := func(set string) {
		files, err := testenv.FixtureSet(set)
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.ApplyFixtureCRDs(ctx, cs, files...); err != nil {
			t.Fatal(err)
		}
	}
	applySet("flux-helm-controller/v0.37.4")
	gvr := schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2beta2", Resource: "helmreleases"}
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Namespace("default")
	for i := range 3 {
		chart := map[string]any{"chart": "podinfo", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"}}
		if i < 2 {
			chart["valuesFile"] = fmt.Sprintf("secret-values-%d.yaml", i)
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": gvr.GroupVersion().String(), "kind": "HelmRelease",
			"metadata": map[string]any{"name": fmt.Sprintf("app-%d", i)}, "spec": map[string]any{"interval": "5m", "chart": map[string]any{"spec": chart}}}}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	applySet("flux-helm-controller/v1.0.0")
	stored := func() string {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, hr, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(crd.Status.StoredVersions, ",")
	}
	if got := stored(); got != "v2beta2,v2" {
		t.Fatalf("storedVersions %s, want v2beta2,v2", got)
	}

	r := ug(t, "migrate", "--crd", hr, "--lease-namespace", "default")
	for _, want := range []string{"refused: migrating to v2 would permanently drop", "spec.chart.spec.valuesFile  2", "default/app-0, default/app-1",
		"--allow-field-loss", "migration-refused-field-loss.md"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("refused output does not say %q:\n%s", want, r.stdout)
		}
	}
	if r.code != cli.ExitFindings || strings.Contains(r.stdout+r.stderr, "secret-values") {
		t.Errorf("refused: exit %d (want %d, a finding), output:\n%s%s\nwithout any value", r.code, cli.ExitFindings, r.stdout, r.stderr)
	}
	if got := stored(); got != "v2beta2,v2" {
		t.Errorf("storedVersions after the refusal %s, want v2beta2,v2", got)
	}

	if r := ug(t, "migrate", "--crd", hr, "--backup-fields", t.TempDir()); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "pass both") {
		t.Errorf("--backup-fields without --allow-field-loss: exit %d, %s", r.code, r.stderr)
	}
	backup := filepath.Join(t.TempDir(), "fields")
	r = ug(t, "migrate", "--crd", hr, "--lease-namespace", "default", "--allow-field-loss", "--backup-fields", backup, "-o", "json")
	var out struct{ CRDs []migrate.Result }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitSafe || len(out.CRDs) != 1 {
		t.Fatalf("allowed: exit %d, output %s%s (%v)", r.code, r.stdout, r.stderr, err)
	}
	if res := out.CRDs[0]; res.Status != migrate.Migrated || res.FieldLossRefused || res.FieldLoss == nil ||
		len(res.FieldLoss.Pruned) != 1 || res.FieldLoss.Pruned[0].Path != "spec.chart.spec.valuesFile" || res.FieldLoss.Pruned[0].Objects != 2 {
		t.Errorf("allowed: %+v; want migrated, reporting spec.chart.spec.valuesFile dropped from 2 objects", res)
	}
	if got := stored(); got != "v2" {
		t.Errorf("storedVersions after the allowed migration %s, want v2", got)
	}
	// The values were saved before the write: one file per object that lost the field.
	if res := out.CRDs[0]; res.FieldBackup != filepath.Join(backup, hr) {
		t.Fatalf("field backup at %q, want %q", res.FieldBackup, filepath.Join(backup, hr))
	}
	files, err := filepath.Glob(filepath.Join(backup, hr, "objects", "*.yaml"))
	if err != nil || len(files) != 2 {
		t.Fatalf("backup files %v (%v), want 2", files, err)
	}
	saved, err := os.ReadFile(files[0])
	if err != nil || !strings.Contains(string(saved), "valuesFile:") {
		t.Errorf("backup %s lacks valuesFile:\n%s (%v)", files[0], saved, err)
	}
}
