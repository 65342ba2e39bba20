package webhook_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

const gadgetGroup = "records.upgradeguard.io"

// gadgetCRD is the Gadget CRD serving versions, the last one the storage version.
func gadgetCRD(plural string, versions ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %s.%s
spec:
  group: %s
  names: {kind: %s, listKind: %sList, plural: %s, singular: %s}
  scope: Namespaced
  versions:
`, plural, gadgetGroup, gadgetGroup, kindOf(plural), kindOf(plural), plural, strings.TrimSuffix(plural, "s"))
	for i, v := range versions {
		fmt.Fprintf(&b, `  - name: %s
    served: true
    storage: %t
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, v, i == len(versions)-1)
	}
	return b.String()
}

func kindOf(plural string) string {
	s := strings.TrimSuffix(plural, "s")
	return strings.ToUpper(s[:1]) + s[1:]
}

// gadgetChart writes the chart "gadgets" at version, whose templates/ render the CRD
// of plural with versions and a ConfigMap named after the chart version (to see
// whether anything of a revision was applied).
func gadgetChart(t *testing.T, plural, version string, versions ...string) string {
	t.Helper()
	cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gadgets-%s\ndata:\n  version: %q\n", strings.ReplaceAll(version, ".", "-"), version)
	dir, err := testenv.WriteChart(filepath.Join(t.TempDir(), version), "gadgets", version,
		map[string]string{"templates/crd.yaml": gadgetCRD(plural, versions...), "templates/configmap.yaml": cm})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// helmCLI runs the real helm CLI against the suite's API server.
func helmCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := s.cp.Helm(args...).CombinedOutput()
	return string(out), err
}

func mustHelm(t *testing.T, args ...string) {
	t.Helper()
	if out, err := helmCLI(t, args...); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// revisions are the stored revisions of the release "gadgets" and their status labels,
// as Helm's Secret driver keeps them.
func revisions(t *testing.T, ns string) []string {
	t.Helper()
	var list corev1.SecretList
	if err := s.c.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{"owner": "helm", "name": "gadgets"}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sec := range list.Items {
		out = append(out, sec.Labels["version"]+":"+sec.Labels["status"])
	}
	slices.Sort(out)
	return out
}

func liveCRD(t *testing.T, name string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd
}

func servedVersions(crd *apiextv1.CustomResourceDefinition) []string {
	var out []string
	for _, v := range crd.Spec.Versions {
		out = append(out, v.Name)
	}
	return out
}

// createObjects creates n objects of plural at version and returns a func that lists
// them at another version (every object must be readable).
func createObjects(t *testing.T, ns, plural, version string, n int) func(version string) int {
	t.Helper()
	for i := range n {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(gadgetGroup + "/" + version)
		u.SetKind(kindOf(plural))
		u.SetNamespace(ns)
		u.SetName(fmt.Sprintf("%s-%d", plural, i))
		u.Object["spec"] = map[string]any{"size": int64(i)}
		// The kind is served a moment after helm applied the CRD.
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return s.c.Create(ctx, u.DeepCopy()) == nil, nil
		})
		if err != nil {
			t.Fatalf("create %s %s: %v", plural, u.GetName(), err)
		}
	}
	return func(version string) int {
		t.Helper()
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: gadgetGroup, Version: version, Kind: kindOf(plural) + "List"})
		if err := s.c.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			t.Fatalf("list %s at %s: %v", plural, version, err)
		}
		return len(list.Items)
	}
}

// gadgetPolicy lets the gate migrate the test's CRDs (gate only: proactive mode would
// migrate them before the upgrade).
func gadgetPolicy(t *testing.T) {
	t.Helper()
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gadgets"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{gadgetGroup}, Proactive: ptr.To(false)}}
	if err := s.c.Create(t.Context(), policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.c.Delete(context.Background(), policy) })
}

func mustContain(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
}

// TestReleaseRecordHelmCLI: the real helm CLI upgrades a release across a storage
// boundary (the incoming chart's CRD drops v1alpha1, still in storedVersions). The
// release-record gate denies the pending-upgrade record before anything is applied (the
// history, the CRD and the chart's other objects stay as they were), starts the
// StorageMigration, and the same helm upgrade run again succeeds with every object
// readable and storedVersions pruned. A rollback to the revision that only served
// v1alpha1, which needs a reverse migration, is then denied with the reason, and nothing
// is applied.
func TestReleaseRecordHelmCLI(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "records"
	namespace(t, s.c, ns)
	gadgetPolicy(t)
	crdName := "gadgets." + gadgetGroup
	v1 := gadgetChart(t, "gadgets", "1.0.0", "v1alpha1")
	v11 := gadgetChart(t, "gadgets", "1.1.0", "v1alpha1", "v1")
	v2 := gadgetChart(t, "gadgets", "2.0.0", "v1")

	mustHelm(t, "install", "gadgets", v1, "-n", ns)
	readable := createObjects(t, ns, "gadgets", "v1alpha1", 3)
	mustHelm(t, "upgrade", "gadgets", v11, "-n", ns)
	if got := liveCRD(t, crdName).Status.StoredVersions; !slices.Equal(got, []string{"v1alpha1", "v1"}) {
		t.Fatalf("storedVersions after 1.1.0 = %v, want [v1alpha1 v1]", got)
	}
	before := revisions(t, ns)

	// A rollback to revision 1 (v1alpha1 only) now drops the live storage version v1:
	// it needs a reverse migration first, which the gate names; nothing is applied.
	out, err := helmCLI(t, "rollback", "gadgets", "1", "-n", ns)
	if err == nil {
		t.Fatalf("helm rollback to 1 succeeded; want it denied:\n%s", out)
	}
	mustContain(t, out, `admission webhook "release.upgradeguard.io" denied the request`,
		"upgradeguard denied the rollback of release records/gadgets to revision 1 (chart gadgets@1.0.0, as revision 3) from chart version 1.1.0 before anything was applied",
		"the API server would reject it, and no automatic migration fixes it",
		"upgradeguard migrate --rollback --release gadgets -n records --to-revision 1 --allow-storage-switch", "then run the helm command again")
	if diff := cmp.Diff(before, revisions(t, ns)); diff != "" {
		t.Errorf("release history changed by the denied rollback (-before +after):\n%s", diff)
	}

	out, err = helmCLI(t, "upgrade", "gadgets", v2, "-n", ns)
	if err == nil {
		t.Fatalf("helm upgrade to 2.0.0 succeeded; want it denied at the release record:\n%s", out)
	}
	sm := "release-records-gadgets"
	mustContain(t, out, `admission webhook "release.upgradeguard.io" denied the request`,
		"upgradeguard is holding the upgrade of release records/gadgets to revision 3 (chart gadgets@2.0.0) from chart version 1.1.0 before anything was applied",
		"stored versions of "+crdName+" are dropped by the incoming chart and must be migrated first",
		"StorageMigration "+sm, "run the same helm command again")
	// Nothing of revision 3 was applied.
	if diff := cmp.Diff(before, revisions(t, ns)); diff != "" {
		t.Errorf("release history changed (-before +after):\n%s", diff)
	}
	if got := servedVersions(liveCRD(t, crdName)); !slices.Equal(got, []string{"v1alpha1", "v1"}) {
		t.Errorf("the CRD changed: spec.versions = %v, want [v1alpha1 v1]", got)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gadgets-2-0-0"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap gadgets-2-0-0 of the denied revision: %v, want NotFound", err)
	}

	done := waitMigration(t, sm)
	if diff := cmp.Diff([]string{crdName}, done.Spec.Resources); diff != "" {
		t.Errorf("StorageMigration resources (-want +got):\n%s", diff)
	}
	mustContain(t, done.Annotations[webhook.AnnotationHolds], "holds the upgrade of release records/gadgets", "run the same helm command again")
	if done.Labels[webhook.LabelReleaseName] != "gadgets" || done.Labels[webhook.LabelReleaseNamespace] != ns {
		t.Errorf("StorageMigration labels = %v", done.Labels)
	}
	if got := liveCRD(t, crdName).Status.StoredVersions; !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("storedVersions after the migration = %v, want [v1]", got)
	}

	mustHelm(t, "upgrade", "gadgets", v2, "-n", ns)
	if diff := cmp.Diff([]string{"1:superseded", "2:superseded", "3:deployed"}, revisions(t, ns)); diff != "" {
		t.Errorf("history after the retried upgrade (-want +got):\n%s", diff)
	}
	if n := readable("v1"); n != 3 {
		t.Errorf("%d gadgets readable at v1, want 3", n)
	}
	if got := servedVersions(liveCRD(t, crdName)); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("spec.versions after the upgrade = %v, want [v1]", got)
	}

	// From 2.0.0 (v1 only), revision 1 (v1alpha1 only) shares no version with the live
	// CRD: no migration path at all, and the denial says so.
	before = revisions(t, ns)
	out, err = helmCLI(t, "rollback", "gadgets", "1", "-n", ns)
	if err == nil {
		t.Fatalf("helm rollback to 1 succeeded; want it denied:\n%s", out)
	}
	mustContain(t, out, `admission webhook "release.upgradeguard.io" denied the request`,
		"upgradeguard denied the rollback of release records/gadgets to revision 1 (chart gadgets@1.0.0, as revision 4) from chart version 2.0.0 before anything was applied",
		"the API server would reject it, and no automatic migration fixes it",
		"live storage version v1 is dropped by the incoming CRD ([v1alpha1])", "then run the helm command again")
	if diff := cmp.Diff(before, revisions(t, ns)); diff != "" {
		t.Errorf("release history changed by the denied rollback (-before +after):\n%s", diff)
	}
	if got := servedVersions(liveCRD(t, crdName)); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("the CRD changed by the denied rollback: spec.versions = %v", got)
	}
	// A rollback to revision 2 (v1alpha1 served, v1 storage) is safe and goes through.
	mustHelm(t, "rollback", "gadgets", "2", "-n", ns)
	if n := readable("v1"); n != 3 {
		t.Errorf("%d gadgets readable at v1 after the rollback to 2, want 3", n)
	}
}

// TestCRDGateStoredVersions: a CRD update that drops a version still in
// status.storedVersions (what helm-controller's upgrade.crds CreateReplace applies from
// crds/, before any release record) reaches the mutating CRD gate, which denies it with
// the reason and starts the migration; the same update retried afterwards succeeds.
func TestCRDGateStoredVersions(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "crdgate"
	namespace(t, s.c, ns)
	gadgetPolicy(t)
	crdName := "widgetboxes." + gadgetGroup
	apply := func(versions ...string) error {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(gadgetCRD("widgetboxes", versions...)), &crd); err != nil {
			t.Fatal(err)
		}
		// The labels helm-controller puts on the CRDs it applies.
		crd.Labels = map[string]string{webhook.LabelFluxName: "boxes", webhook.LabelFluxNamespace: ns}
		return testenv.ApplyCRDServerSide(ctx, s.cp.Config, &crd, "helm-controller")
	}
	if err := apply("v1alpha1"); err != nil {
		t.Fatal(err)
	}
	readable := createObjects(t, ns, "widgetboxes", "v1alpha1", 2)
	if err := apply("v1alpha1", "v1"); err != nil {
		t.Fatal(err)
	}
	sm := webhook.MigrationName(ns, "boxes")
	// A server-side dry run (Argo CD's server-side diff) is denied too, creates nothing,
	// and says so: nothing migrates unless someone starts it.
	dry := func() error {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(gadgetCRD("widgetboxes", "v1")), &crd); err != nil {
			t.Fatal(err)
		}
		crd.Labels = map[string]string{webhook.LabelFluxName: "boxes", webhook.LabelFluxNamespace: ns}
		return testenv.DryRunApplyCRDServerSide(ctx, s.cp.Config, &crd, "helm-controller")
	}
	if err := dry(); err == nil {
		t.Fatal("the dry-run CRD update dropping v1alpha1 was accepted; want it denied")
	} else {
		mustContain(t, err.Error(), `admission webhook "crd.upgradeguard.io" denied the request`, "upgradeguard would hold the update of CustomResourceDefinition "+crdName,
			"This was a dry run, so no StorageMigration was created", "Next steps: upgradeguard migrate --crd "+crdName)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Name: sm}, &v1alpha1.StorageMigration{}); !apierrors.IsNotFound(err) {
		t.Errorf("StorageMigration %s after a dry run: %v, want none", sm, err)
	}
	err := apply("v1")
	if err == nil {
		t.Fatal("the CRD update dropping v1alpha1 was accepted; want it denied")
	}
	mustContain(t, err.Error(), `admission webhook "crd.upgradeguard.io" denied the request`,
		"upgradeguard is holding the update of CustomResourceDefinition "+crdName+", which drops v1alpha1 from spec.versions while status.storedVersions still lists it",
		"applied for HelmRelease crdgate/boxes", "StorageMigration "+sm, "reconcile.fluxcd.io/resetAt")
	// Only the CRD write is refused: the client may have applied other objects already.
	if strings.Contains(err.Error(), "before anything was applied") {
		t.Errorf("the CRD gate claims nothing was applied: %v", err)
	}
	done := waitMigration(t, sm)
	if done.Labels[webhook.LabelHelmReleaseName] != "boxes" {
		t.Errorf("StorageMigration labels = %v", done.Labels)
	}
	if err := apply("v1"); err != nil {
		t.Fatalf("the retried CRD update: %v", err)
	}
	if got := liveCRD(t, crdName).Status.StoredVersions; !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions = %v, want [v1]", got)
	}
	if n := readable("v1"); n != 2 {
		t.Errorf("%d objects readable at v1, want 2", n)
	}
}

// TestReleaseRecordRollbackWouldDeleteCRD: a helm rollback to a revision that did not
// render a CRD would make Helm delete the CRD and every object of its type. The
// release-record gate denies the pending-rollback record with that reason; the CRD and its
// objects stay.
func TestReleaseRecordRollbackWouldDeleteCRD(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "records-delete"
	namespace(t, s.c, ns)
	crdName := "gizmos." + gadgetGroup
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gizmos-config\n"
	v1, err := testenv.WriteChart(filepath.Join(t.TempDir(), "1"), "gadgets", "1.0.0", map[string]string{"templates/cm.yaml": cm})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(filepath.Join(t.TempDir(), "2"), "gadgets", "2.0.0",
		map[string]string{"templates/cm.yaml": cm, "templates/crd.yaml": gadgetCRD("gizmos", "v1")})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, "install", "gadgets", v1, "-n", ns)
	mustHelm(t, "upgrade", "gadgets", v2, "-n", ns)
	readable := createObjects(t, ns, "gizmos", "v1", 2)
	before := revisions(t, ns)

	out, err := helmCLI(t, "rollback", "gadgets", "1", "-n", ns)
	if err == nil {
		t.Fatalf("helm rollback to 1 succeeded; want it denied:\n%s", out)
	}
	mustContain(t, out, `admission webhook "release.upgradeguard.io" denied the request`,
		"upgradeguard denied the rollback of release records-delete/gadgets to revision 1",
		"Helm would delete CRDs and every object of their types", crdName)
	if diff := cmp.Diff(before, revisions(t, ns)); diff != "" {
		t.Errorf("release history changed by the denied rollback (-before +after):\n%s", diff)
	}
	_ = liveCRD(t, crdName)
	if n := readable("v1"); n != 2 {
		t.Errorf("%d gizmos after the denied rollback, want 2", n)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gizmos-config"}, &corev1.ConfigMap{}); err != nil {
		t.Errorf("the release's ConfigMap: %v", err)
	}
}
