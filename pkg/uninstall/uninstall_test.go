package uninstall_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// liveGet reads an object of the report by its API version and kind.
func liveGet(ctx context.Context, c *uninstall.Clients, o uninstall.Object) error {
	gv, err := schema.ParseGroupVersion(o.APIVersion)
	if err != nil {
		return err
	}
	m, err := c.Mapper.RESTMapping(schema.GroupKind{Group: gv.Group, Kind: o.Kind}, gv.Version)
	if err != nil {
		return err
	}
	if o.Namespace == "" {
		_, err = c.Metadata.Resource(m.Resource).Get(ctx, o.Name, metav1.GetOptions{})
	} else {
		_, err = c.Metadata.Resource(m.Resource).Namespace(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
	}
	return err
}

// uninstallAgrees runs the real `helm uninstall` (Helm 4.3.1) and checks that exactly
// the live objects predicted Delete are gone and every other live object is still there.
func uninstallAgrees(t *testing.T, rep *uninstall.Report, env ...string) {
	t.Helper()
	c := clients(t)
	ctx := t.Context()
	var deleted, stays []string
	for _, o := range rep.Objects {
		if !o.Live {
			continue
		}
		if o.Action == uninstall.Delete {
			deleted = append(deleted, o.Subject)
		} else {
			stays = append(stays, o.Subject)
		}
	}
	out := mustHelm(t, env, "uninstall", rep.Release, "-n", rep.Namespace)
	for _, o := range rep.Objects {
		if !o.Live {
			continue
		}
		if o.Action == uninstall.Delete {
			waitGone(t, o.Subject+" (predicted deleted)", func(ctx context.Context) error { return liveGet(ctx, c, o) })
			continue
		}
		if err := liveGet(ctx, c, o); err != nil {
			t.Errorf("%s was predicted %s but the real uninstall removed it (%v)\nhelm: %s", o.Subject, o.Action, err, out)
		}
	}
	t.Logf("helm uninstall deleted %v and left %v, as predicted", deleted, stays)
}

// TestLiveOnlyKeep is the 2026-04-22 incident: keep added with kubectl annotate on the
// live objects only. The check says they are deleted, and the real uninstall deletes them;
// keep in the stored manifest protects.
func TestLiveOnlyKeep(t *testing.T) {
	needCluster(t)
	ns := "live-keep"
	ch := dbChart(t, "1.0.0", nil)
	mustHelm(t, nil, "install", "db", ch, "-n", ns, "--create-namespace",
		"--set-json", `configMaps={"cfg":null,"stored-keep":{"helm.sh/resource-policy":"keep"},"other-policy":{"helm.sh/resource-policy":"whatever"}}`)
	ctx := t.Context()
	annotate := []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`)
	if _, err := kube(t).CoreV1().ConfigMaps(ns).Patch(ctx, "cfg", types.MergePatchType, annotate, metav1.PatchOptions{FieldManager: "kubectl-annotate"}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube(t).CoreV1().Secrets(ns).Patch(ctx, "creds", types.MergePatchType, annotate, metav1.PatchOptions{FieldManager: "kubectl-annotate"}); err != nil {
		t.Fatal(err)
	}
	rep := check(t, uninstall.Options{Release: "db", Namespace: ns})
	want := map[string]uninstall.Action{"ConfigMap/cfg": uninstall.Delete, "ConfigMap/stored-keep": uninstall.Keep,
		"ConfigMap/other-policy": uninstall.Untouched, "Secret/creds": uninstall.Delete, "PersistentVolumeClaim/data": uninstall.Delete}
	got := map[string]uninstall.Action{}
	for _, o := range rep.Objects {
		got[o.Kind+"/"+o.Name] = o.Action
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	var live []string
	for _, f := range findings(rep, uninstall.CheckLiveOnlyKeep) {
		live = append(live, f.Subject)
		if !strings.Contains(f.Remediation, "Option A") {
			t.Errorf("finding %s lacks the Option A remediation: %q", f.Subject, f.Remediation)
		}
	}
	slices.Sort(live)
	if diff := cmp.Diff([]string{"ConfigMap/live-keep/cfg", "Secret/live-keep/creds"}, live); diff != "" {
		t.Errorf("live-only-keep findings (-want +got):\n%s", diff)
	}
	if rep.Safe || rep.HelmVersion != uninstall.DefaultHelmVersion || !rep.VerifiesOwnership {
		t.Errorf("safe=%v helmVersion=%q verifies=%v; want unsafe, default 4.3, verifies", rep.Safe, rep.HelmVersion, rep.VerifiesOwnership)
	}
	uninstallAgrees(t, rep)
}

// TestOwnershipStripped is the 2026-04-27 incident: the Helm ownership label and
// annotations were stripped from the live objects. With Helm 4.2 that protects nothing;
// with 4.3 it does. The real Helm 4.3.1 uninstall agrees with the 4.3 verdict.
func TestOwnershipStripped(t *testing.T) {
	needCluster(t)
	ns := "stripped"
	ch := dbChart(t, "1.0.0", nil)
	mustHelm(t, nil, "install", "db", ch, "-n", ns, "--create-namespace", "--set-json", `configMaps={"cfg":null,"storage-like":null}`)
	strip := []byte(`{"metadata":{"labels":{"app.kubernetes.io/managed-by":null},"annotations":{"meta.helm.sh/release-name":null,"meta.helm.sh/release-namespace":null}}}`)
	if _, err := kube(t).CoreV1().ConfigMaps(ns).Patch(t.Context(), "storage-like", types.MergePatchType, strip, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another release's name is not this release either.
	other := []byte(`{"metadata":{"annotations":{"meta.helm.sh/release-name":"someone-else"}}}`)
	if _, err := kube(t).CoreV1().Secrets(ns).Patch(t.Context(), "creds", types.MergePatchType, other, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	old := check(t, uninstall.Options{Release: "db", Namespace: ns, HelmVersion: "4.2"})
	cur := check(t, uninstall.Options{Release: "db", Namespace: ns, HelmVersion: "4.3"})
	if old.VerifiesOwnership || !cur.VerifiesOwnership || old.HelmVersion != "4.2" || cur.HelmVersion != "4.3" {
		t.Fatalf("versions: 4.2 verifies=%v %q, 4.3 verifies=%v %q", old.VerifiesOwnership, old.HelmVersion, cur.VerifiesOwnership, cur.HelmVersion)
	}
	for _, name := range []string{"ConfigMap/storage-like", "Secret/creds"} {
		kind, n, _ := strings.Cut(name, "/")
		if a := objectByKind(old, kind, n).Action; a != uninstall.Delete {
			t.Errorf("Helm 4.2: %s action %s, want delete", name, a)
		}
		if a := objectByKind(cur, kind, n).Action; a != uninstall.SkipNotOwned {
			t.Errorf("Helm 4.3: %s action %s, want skip-not-owned", name, a)
		}
	}
	if got := len(findings(old, uninstall.CheckOwnershipStripped)); got != 2 {
		t.Errorf("Helm 4.2: %d ownership-stripped findings, want 2: %+v", got, old.Findings)
	}
	if got := len(findings(cur, uninstall.CheckOwnershipStripped)); got != 0 {
		t.Errorf("Helm 4.3: %d ownership-stripped findings, want 0", got)
	}
	if a := objectByKind(cur, "ConfigMap", "cfg").Action; a != uninstall.Delete {
		t.Errorf("Helm 4.3: ConfigMap/cfg (still owned) action %s, want delete", a)
	}
	// The built Helm CLI is 4.3.1: it must do exactly what the 4.3 verdict says.
	if out := mustHelm(t, nil, "version", "--short"); !strings.HasPrefix(out, "v4.3.") {
		t.Fatalf("test Helm is %s, want v4.3.x", out)
	}
	uninstallAgrees(t, cur)
}

// TestPVReclaimDeleteAndForeignPod: a PVC bound (by the real PV binder) to a Delete
// volume is flagged as data loss, and a pod and a Job outside the release that mount it
// are flagged; the real uninstall then leaves the claim Terminating while the pod exists.
func TestPVReclaimDeleteAndForeignPod(t *testing.T) {
	needCluster(t)
	ns := "pv-delete"
	createPV(t, "pv-delete-data", "sc-pv-delete", corev1.PersistentVolumeReclaimDelete)
	ch := dbChart(t, "1.0.0", map[string]string{"templates/deploy.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: db
spec:
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: mysql:8}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
`})
	mustHelm(t, nil, "install", "db", ch, "-n", ns, "--create-namespace", "--set", "storageClass=sc-pv-delete")
	pvc := waitBound(t, ns, "data")
	ctx := t.Context()
	cs := kube(t)
	vol := []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
	// A training pod scheduled to a node: it holds the claim as a running pod does.
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "training-1", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "t", Image: "busybox"}}, Volumes: vol}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "training-job", Namespace: ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "t", Image: "busybox"}}, Volumes: vol}}}}
	if _, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The release's own pods (Deployment -> ReplicaSet -> Pod, made by the real
	// controllers) mount the claim too, and are not foreign.
	var podsErr error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=db"})
		podsErr = err
		return err == nil && len(pods.Items) == 1, nil
	}); err != nil {
		t.Fatalf("the Deployment's pod did not appear: %v %v", err, podsErr)
	}

	rep := check(t, uninstall.Options{Release: "db", Namespace: ns})
	o := objectByKind(rep, "PersistentVolumeClaim", "data")
	if o.Action != uninstall.Delete || o.PVC == nil || o.PVC.Volume != pvc.Spec.VolumeName || o.PVC.ReclaimPolicy != "Delete" || o.PVC.StorageClass != "sc-pv-delete" {
		t.Fatalf("PVC: action %s, info %+v", o.Action, o.PVC)
	}
	if diff := cmp.Diff([]string{"Job/pv-delete/training-job", "Pod/pv-delete/training-1"}, o.PVC.UsedBy); diff != "" {
		t.Errorf("UsedBy (-want +got):\n%s", diff)
	}
	backup := "`upgradeguard release uninstall-check db -n " + ns + " --backup DIR`"
	if f := findings(rep, uninstall.CheckPVDelete); len(f) != 1 || !strings.Contains(f[0].Message, "DATA LOSS") || !strings.Contains(f[0].Remediation, "persistentVolumeReclaimPolicy") ||
		!strings.Contains(f[0].Remediation, backup) {
		t.Errorf("pv-reclaim-delete findings: %+v", f)
	}
	if f := findings(rep, uninstall.CheckPVCInUse); len(f) != 1 || !strings.Contains(f[0].Message, "Pod/pv-delete/training-1") {
		t.Errorf("pvc-in-use findings: %+v", f)
	}

	// The real uninstall: the claim is marked for deletion but the foreign pod holds it.
	mustHelm(t, nil, "uninstall", "db", "-n", ns)
	held := func() *corev1.PersistentVolumeClaim {
		p, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		return p
	}
	if p := held(); p.DeletionTimestamp == nil || !slices.Contains(p.Finalizers, "kubernetes.io/pvc-protection") {
		t.Fatalf("claim after uninstall: deletionTimestamp %v finalizers %v; want Terminating with pvc-protection", p.DeletionTimestamp, p.Finalizers)
	}
	// Once the foreign users are gone, the protection controller lets it go.
	zero := int64(0)
	bg := metav1.DeletePropagationBackground
	_ = cs.BatchV1().Jobs(ns).Delete(ctx, "training-job", metav1.DeleteOptions{PropagationPolicy: &bg})
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		_ = cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	waitGone(t, "claim data", func(ctx context.Context) error {
		// Pods the Job controller was still creating are removed too.
		pods, _ := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			_ = cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		return err
	})
}

// TestFailedLastRevision: a real failed upgrade (the API server rejects one object) makes
// revision 2 failed; its manifest is the delete list, and what only revision 1 had is
// left behind — which the real uninstall confirms.
func TestFailedLastRevision(t *testing.T) {
	needCluster(t)
	ns := "failed-rev"
	cm := func(name, key string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n  " + key + ": \"1\"\n"
	}
	v1 := dbChart(t, "1.0.0", map[string]string{"templates/a.yaml": cm("a-both", "x"), "templates/b.yaml": cm("b-only-v1", "x")})
	v2 := dbChart(t, "2.0.0", map[string]string{"templates/a.yaml": cm("a-both", "x"), "templates/c.yaml": cm("c-only-v2", "x"),
		"templates/d.yaml": cm("d-rejected", "bad key!")})
	mustHelm(t, nil, "install", "db", v1, "-n", ns, "--create-namespace")
	if out, err := helm(t, nil, "upgrade", "db", v2, "-n", ns); err == nil {
		t.Fatalf("upgrade succeeded, want the API server to reject d-rejected:\n%s", out)
	}
	rep := check(t, uninstall.Options{Release: "db", Namespace: ns})
	if rep.Revision != 2 || rep.Status != "failed" || !rep.NotDeployed || rep.LastDeployedRevision != 1 {
		t.Fatalf("revision %d status %q notDeployed %v lastDeployed %d; want 2 failed true 1", rep.Revision, rep.Status, rep.NotDeployed, rep.LastDeployedRevision)
	}
	if diff := cmp.Diff([]string{"ConfigMap/failed-rev/b-only-v1"}, rep.LeftBehind); diff != "" {
		t.Errorf("left behind (-want +got):\n%s", diff)
	}
	if objectByKind(rep, "ConfigMap", "b-only-v1") != nil || objectByKind(rep, "ConfigMap", "d-rejected") == nil {
		t.Errorf("the delete list is not revision 2's manifest: %+v", rep.Objects)
	}
	if d := objectByKind(rep, "ConfigMap", "d-rejected"); d.Action != uninstall.Absent {
		t.Errorf("d-rejected was never created: action %s, want absent", d.Action)
	}
	if f := findings(rep, uninstall.CheckNotDeployed); len(f) != 1 || !strings.Contains(f[0].Message, "revision 2 is failed") {
		t.Errorf("findings: %+v", rep.Findings)
	}
	uninstallAgrees(t, rep)
	if _, err := kube(t).CoreV1().ConfigMaps(ns).Get(t.Context(), "b-only-v1", metav1.GetOptions{}); err != nil {
		t.Errorf("b-only-v1 (only in the deployed revision) should be left behind by the real uninstall: %v", err)
	}
}

// TestConfigMapDriver reads a release stored with HELM_DRIVER=configmap.
func TestConfigMapDriver(t *testing.T) {
	needCluster(t)
	ns := "cm-driver"
	env := []string{"HELM_DRIVER=configmap"}
	mustHelm(t, env, "install", "db", dbChart(t, "1.0.0", nil), "-n", ns, "--create-namespace")
	rep := check(t, uninstall.Options{Release: "db", Namespace: ns, Driver: helmrelease.DriverConfigMap})
	if rep.Driver != "configmap" || rep.Revision != 1 || objectByKind(rep, "Secret", "creds") == nil {
		t.Fatalf("driver %q revision %d objects %+v", rep.Driver, rep.Revision, rep.Objects)
	}
	_, err := uninstall.Check(t.Context(), clients(t), uninstall.Options{Release: "db", Namespace: ns})
	var nf *helmrelease.NotFoundError
	if !errors.As(err, &nf) || !strings.Contains(err.Error(), "configmap") {
		t.Errorf("secret driver: err %v, want NotFoundError suggesting configmap", err)
	}
	uninstallAgrees(t, rep, env...)
}

// TestNamespaceAndCRDCascade: a release that renders a Namespace and a CRD (from
// templates/) deletes what lives in them; the counts match what the real uninstall and
// the namespace controller then remove.
func TestNamespaceAndCRDCascade(t *testing.T) {
	needCluster(t)
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`
	nsTemplate := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-x\n"
	ch := dbChart(t, "1.0.0", map[string]string{"templates/crd.yaml": crd, "templates/ns.yaml": nsTemplate})
	mustHelm(t, nil, "install", "platform", ch, "-n", "platform", "--create-namespace")
	ctx := t.Context()
	for _, n := range []string{"one", "two", "three"} {
		if _, err := kube(t).CoreV1().ConfigMaps("team-x").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c := clients(t)
	widgets := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.Metadata.Resource(widgets).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("widgets not served: %v", err)
	}
	dyn := dynamicClient(t)
	for _, ns := range []string{"team-x", "platform"} {
		w := map[string]any{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": map[string]any{"name": "w"}}
		if err := createUnstructured(ctx, dyn, widgets, ns, w); err != nil {
			t.Fatal(err)
		}
	}
	// The PVC of the chart stays Pending here (no volume): no PVC finding.
	rep := check(t, uninstall.Options{Release: "platform", Namespace: "platform"})
	nso := objectByKind(rep, "Namespace", "team-x")
	if nso == nil || nso.Cascade == nil {
		t.Fatalf("namespace object: %+v", nso)
	}
	// 3 ConfigMaps and a Widget we made; the namespace controllers add a
	// ServiceAccount (default) and, on some versions, a root CA ConfigMap.
	if nso.Cascade.Counts["configmaps"] < 3 || nso.Cascade.Counts["widgets.example.com"] != 1 {
		t.Errorf("namespace cascade counts %v", nso.Cascade.Counts)
	}
	crdo := objectByKind(rep, "CustomResourceDefinition", "widgets.example.com")
	if crdo == nil || crdo.Cascade == nil || crdo.Cascade.Total != 2 {
		t.Fatalf("CRD cascade: %+v", crdo)
	}
	if len(findings(rep, uninstall.CheckNamespaceCascade)) != 1 || len(findings(rep, uninstall.CheckCRDCascade)) != 1 {
		t.Errorf("findings: %+v", rep.Findings)
	}
	if len(findings(rep, uninstall.CheckPVCDeleted))+len(findings(rep, uninstall.CheckPVDelete)) != 0 {
		t.Errorf("a Pending claim holds no data, but got PVC findings: %+v", rep.Findings)
	}
	uninstallAgrees(t, rep)
	waitGone(t, "the Widget in namespace platform (CRD cascade)", func(ctx context.Context) error {
		_, err := c.Metadata.Resource(widgets).Namespace("platform").Get(ctx, "w", metav1.GetOptions{})
		return err
	})
}

func TestHelmVersionParsing(t *testing.T) {
	cases := []struct {
		in       string
		verifies bool
		err      bool
	}{
		{"", true, false}, {"4.3", true, false}, {"v4.3.1", true, false}, {"4.4.0", true, false},
		{"4.2.4", false, false}, {"4.2", false, false}, {"3.18.0", false, false}, {"2.17", false, true}, {"latest", false, true},
	}
	for _, tc := range cases {
		got, _, err := uninstall.VerifiesOwnership(tc.in)
		if (err != nil) != tc.err || got != tc.verifies {
			t.Errorf("%q: verifies %v err %v; want %v err %v", tc.in, got, err, tc.verifies, tc.err)
		}
	}
}

func TestChecksRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range uninstall.Checks {
		if c.ID == "" || c.Why == "" || seen[c.ID] {
			t.Errorf("bad or duplicate check %+v", c)
		}
		seen[c.ID] = true
	}
	b, err := json.Marshal(uninstall.Checks)
	if err != nil || len(b) == 0 {
		t.Fatal(err)
	}
}

// TestUnknownKind: the release lists a custom resource whose CRD was deleted behind its
// back. The check flags it; the real Helm 4.3.1 uninstall with fresh discovery fails and
// deletes nothing, and with discovery cached from before the CRD went away it goes ahead.
func TestUnknownKind(t *testing.T) {
	needCluster(t)
	ns := "unknown-kind"
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`
	ch := dbChart(t, "1.0.0", map[string]string{"crds/gadgets.yaml": crd,
		"templates/gadget.yaml": "apiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: g\n"})
	warm := []string{"KUBECACHEDIR=" + t.TempDir()}
	mustHelm(t, warm, "install", "db", ch, "-n", ns, "--create-namespace", "--set-json", `configMaps={"cfg":null}`)
	c := clients(t)
	if err := c.CRDs.ApiextensionsV1().CustomResourceDefinitions().Delete(t.Context(), "gadgets.example.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.CRDs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "gadgets.example.com", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rep := check(t, uninstall.Options{Release: "db", Namespace: ns})
	if f := findings(rep, uninstall.CheckUnknownKind); len(f) != 1 || f[0].Subject != "Gadget/g" {
		t.Fatalf("findings: %+v", rep.Findings)
	}
	if a := objectByKind(rep, "Gadget", "g").Action; a != uninstall.Absent {
		t.Errorf("Gadget/g: %s, want absent", a)
	}
	cold := []string{"KUBECACHEDIR=" + t.TempDir()}
	if out, err := helm(t, cold, "uninstall", "db", "-n", ns); err == nil {
		t.Fatalf("helm uninstall with fresh discovery succeeded:\n%s", out)
	}
	if _, err := kube(t).CoreV1().ConfigMaps(ns).Get(t.Context(), "cfg", metav1.GetOptions{}); err != nil {
		t.Errorf("the failed uninstall deleted ConfigMap cfg: %v", err)
	}
	mustHelm(t, warm, "uninstall", "db", "-n", ns)
	waitGoneConfigMap(t, ns, "cfg")
}
