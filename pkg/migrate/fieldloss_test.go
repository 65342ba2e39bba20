package migrate_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

const helmreleases = "helmreleases.helm.toolkit.fluxcd.io"

// hrV2beta2 is where helm-controller v0.37.4 stored HelmReleases, and where the v1.0.0
// CRD still serves them.
var hrV2beta2 = schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2beta2", Resource: "helmreleases"}

// valuesFile is the v2beta2 field the v2 schema no longer declares.
var valuesFile = []string{"spec", "chart", "spec", "valuesFile"}

// helmControllerUpgrade reproduces the helm-controller v0.37.4 -> v1.0.0 CRD upgrade (storage
// v2beta2 -> v2, conversion None, v2beta2 still served) with withFile HelmReleases created
// at v2beta2 with spec.chart.spec.valuesFile and without others that do not set it.
func helmControllerUpgrade(t *testing.T, withFile, without int) env {
	t.Helper()
	e := emptyCluster(t)
	applySet(t, e, "flux-helm-controller/v0.37.4")
	create := func(name string, file bool) {
		chart := map[string]any{"chart": "podinfo", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"}}
		if file {
			chart["valuesFile"] = "values-" + name + ".yaml"
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "helm.toolkit.fluxcd.io/v2beta2", "kind": "HelmRelease",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"spec":     map[string]any{"interval": "5m", "chart": map[string]any{"spec": chart}}}}
		if _, err := e.dyn.Resource(hrV2beta2).Namespace("default").Create(e.ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range withFile {
		create(fmt.Sprintf("with-file-%d", i), true)
	}
	for i := range without {
		create(fmt.Sprintf("plain-%d", i), false)
	}
	applySet(t, e, "flux-helm-controller/v1.0.0")
	if got := storedVersions(t, e, helmreleases); !slices.Equal(got, []string{"v2beta2", "v2"}) {
		t.Fatalf("storedVersions after the v1.0.0 CRD: %v, want [v2beta2 v2]", got)
	}
	return e
}

func applySet(t *testing.T, e env, set string) {
	t.Helper()
	files, err := testenv.FixtureSet(set)
	if err != nil {
		t.Fatal(err)
	}
	apply(t, e, files...)
	if err := testenv.WaitEstablished(e.ctx, e.crds, helmreleases); err != nil {
		t.Fatal(err)
	}
}

// writes are the requests of user that change something.
func writes(t *testing.T, user string) []string {
	t.Helper()
	events, err := cp.AuditEvents(user)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range events {
		if slices.Contains([]string{"create", "update", "patch", "delete", "deletecollection"}, ev.Verb) {
			out = append(out, ev.Verb+" "+ev.RequestURI)
		}
	}
	return out
}

// TestFieldLossRefused: after the helm-controller v1.0.0 CRD upgrade, HelmReleases stored
// at v2beta2 still hold spec.chart.spec.valuesFile, which v2 does not declare. A migration
// to v2 would delete it from etcd: both engines, and a dry run, refuse before writing
// anything (no request that writes, no StorageVersionMigration, every resourceVersion and
// storedVersions as they were) and name the path with its exact count. With
// AllowFieldLoss the migration runs, reports the same loss, and the field is gone from
// etcd (read back at v2beta2), while everything else is intact.
func TestFieldLossRefused(t *testing.T) {
	e := helmControllerUpgrade(t, 4, 3)
	before, rvs := snapshot(t, e, hrV2beta2)
	for name, o := range before {
		spec, _ := o.(map[string]any)["spec"].(map[string]any)
		_, found, _ := unstructured.NestedString(spec, valuesFile[1:]...)
		if found != strings.Contains(name, "with-file") {
			t.Fatalf("%s before the migration: valuesFile found=%v (the API server must still serve it at v2beta2)", name, found)
		}
	}
	wantLoss := []crdschema.PathCount{{Path: "spec.chart.spec.valuesFile", Version: "v2", Objects: 4,
		Examples: []string{"default/with-file-0", "default/with-file-1", "default/with-file-2"}}}

	for _, engine := range []migrate.Engine{migrate.EngineClient, migrate.EngineBuiltin} {
		for _, dryRun := range []bool{false, true} {
			user := fmt.Sprintf("fieldloss-%s-%v", engine, dryRun)
			cfg, err := cp.AddUser(user, "system:masters")
			if err != nil {
				t.Fatal(err)
			}
			o := opts()
			o.Engine, o.DryRun = engine, dryRun
			res, err := newMigrator(t, cfg).Migrate(e.ctx, migrate.Target{Name: helmreleases}, o)
			if err != nil {
				t.Fatalf("%s (dry run %v): %v, want a refusal in the result", engine, dryRun, err)
			}
			if res.Status != migrate.Incomplete || !res.FieldLossRefused || res.FieldLoss == nil {
				t.Fatalf("%s (dry run %v): status %s, refused %v, message %q; want incomplete and refused for field loss",
					engine, dryRun, res.Status, res.FieldLossRefused, res.Message)
			}
			if diff := cmp.Diff(wantLoss, res.FieldLoss.Pruned); diff != "" {
				t.Errorf("%s (dry run %v): pruned fields (-want +got):\n%s", engine, dryRun, diff)
			}
			for _, s := range []string{"spec.chart.spec.valuesFile (4 objects", "stored at v2beta2", "allowing the loss", "allow-field-loss=true", "Nothing was written", migrate.FieldLossRunbook} {
				if !strings.Contains(res.Message, s) {
					t.Errorf("%s (dry run %v): message %q does not say %q", engine, dryRun, res.Message, s)
				}
			}
			// The library names no front end's flag or field: the CLI and the controller add theirs.
			if strings.Contains(res.Message, "--allow-field-loss") || strings.Contains(res.Message, "spec.allowFieldLoss") {
				t.Errorf("%s (dry run %v): message %q names a flag or field of one front end", engine, dryRun, res.Message)
			}
			if w := writes(t, user); len(w) > 0 {
				t.Errorf("%s (dry run %v): a refused run wrote: %v", engine, dryRun, w)
			}
		}
	}
	if svmServed() {
		list, err := kubernetes.NewForConfigOrDie(cp.Config).StoragemigrationV1().StorageVersionMigrations().List(e.ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 0 {
			t.Errorf("StorageVersionMigrations after the refusals: %d (%v), want none", len(list.Items), err)
		}
	}
	if _, after := snapshot(t, e, hrV2beta2); !cmp.Equal(rvs, after) {
		t.Errorf("resourceVersions changed by refused runs (-before +after):\n%s", cmp.Diff(rvs, after))
	}
	if got := storedVersions(t, e, helmreleases); !slices.Equal(got, []string{"v2beta2", "v2"}) {
		t.Errorf("storedVersions after refused runs: %v, want [v2beta2 v2]", got)
	}

	// The live CRD's annotation accepts the loss as AllowFieldLoss does (a dry run: the
	// same decision, nothing written).
	annotate := func(value any) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, predict.AllowFieldLossAnnotation, value)
		if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Patch(e.ctx, helmreleases, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate(`"true"`)
	dry := opts()
	dry.DryRun = true
	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmreleases}, dry)
	if err != nil || res.Status != migrate.WouldMigrate || res.FieldLossRefused || res.FieldLoss == nil {
		t.Fatalf("dry run with %s=true: %+v, %v; want wouldMigrate, reporting the loss without refusing", predict.AllowFieldLossAnnotation, res, err)
	}
	annotate("null")

	o := opts()
	o.Engine, o.AllowFieldLoss = migrate.EngineClient, true
	res, err = newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmreleases}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != migrate.Migrated || res.FieldLossRefused || res.FieldLoss == nil || res.Rewritten != 7 {
		t.Fatalf("allowed: status %s, refused %v, rewritten %d, message %q; want 7 objects migrated", res.Status, res.FieldLossRefused, res.Rewritten, res.Message)
	}
	if diff := cmp.Diff(wantLoss, res.FieldLoss.Pruned); diff != "" {
		t.Errorf("allowed: reported loss (-want +got):\n%s", diff)
	}
	if got := storedVersions(t, e, helmreleases); !slices.Equal(got, []string{"v2"}) {
		t.Errorf("allowed: storedVersions %v, want [v2]", got)
	}
	// Read at v2beta2, whose schema declares valuesFile: had it stayed in etcd it would
	// show. Everything else reads as before.
	after, _ := snapshot(t, e, hrV2beta2)
	for name, o := range before {
		spec := o.(map[string]any)["spec"].(map[string]any)
		unstructured.RemoveNestedField(spec, valuesFile[1:]...)
		if diff := cmp.Diff(o, after[name]); diff != "" {
			t.Errorf("%s read at v2beta2 after the migration, compared with before without valuesFile (-want +got):\n%s", name, diff)
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d objects after the migration, want %d", len(after), len(before))
	}
}
