package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
)

// stsChart writes a database chart whose data lives in a StatefulSet's
// volumeClaimTemplates: name is the StatefulSet's name suffix, template the claim
// template's name, policy the podManagementPolicy, other one more template.
func stsChart(t *testing.T, chart, version, name, template, policy, other string) string {
	t.Helper()
	dir, err := testenv.WriteChart(t.TempDir(), chart, version, map[string]string{
		"templates/sts.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ .Release.Name }}-%[1]s
spec:
  replicas: 2
  podManagementPolicy: %[3]s
  serviceName: {{ .Release.Name }}-%[1]s
  selector:
    matchLabels: {app: {{ .Release.Name }}-%[1]s}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}-%[1]s}
    spec:
      containers:
      - name: db
        image: postgres:17
        volumeMounts: [{name: %[2]s, mountPath: /var/lib/postgresql/data}]
  volumeClaimTemplates:
  - metadata:
      name: %[2]s
    spec:
      storageClassName: manual
      accessModes: [ReadWriteOnce]
      resources:
        requests: {storage: 1Gi}
`, name, template, policy),
		"templates/other.yaml": other,
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReleaseMigrateStatefulSet moves a release whose data sits in StatefulSet claims
// (volumeClaimTemplates, 2 replicas, on pre-provisioned PVs) to a chart with a
// differently named StatefulSet and claim template, on the real API server with the
// real kube-controller-manager: its StatefulSet controller makes the old claims (the
// setup checks it) and its binder binds them. helm uninstall leaves these claims; the
// plan lists them, pairs them by ordinal with the claims the new StatefulSet will use,
// and --execute deletes exactly those (by uid) and pre-creates the new ones on the same
// PVs. A leftover claim of a higher ordinal is reported (statefulset-claim-beyond-replicas)
// but neither moved nor deleted: it survives.
func TestReleaseMigrateStatefulSet(t *testing.T) {
	needCluster(t)
	cp.ControllerManagerForTest(t)
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	const ns = "migsts"
	identity := "sts-" + rand.String(10)
	pvs := map[string]*corev1.PersistentVolume{}
	for i := range 2 {
		name := fmt.Sprintf("sts-pv-%d", i)
		// Pre-provisioned for the ordinal's claim, as an operator does it.
		pv := manualPV(name, "/srv/"+identity+"/"+name, corev1.PersistentVolumeReclaimDelete,
			&corev1.ObjectReference{Namespace: ns, Name: fmt.Sprintf("data-olddb-db-%d", i)})
		pv.Labels = map[string]string{"upgradeguard.dev/data-id": identity}
		pv, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pvs[name] = pv
	}
	oldChart := stsChart(t, "sdb", "1.0.0", "db", "data", "Parallel", `apiVersion: v1
kind: Secret
metadata:
  name: {{ .Release.Name }}-db-credentials
stringData:
  password: {{ randAlphaNum 24 | quote }}
`)
	mustHelm(t, nil, "install", "olddb", oldChart, "-n", ns, "--create-namespace")
	// The StatefulSet controller makes the claims (with the pods; no kubelet runs them).
	oldClaims := map[string]*corev1.PersistentVolumeClaim{}
	for i := range 2 {
		c := waitBound(t, cs, ns, fmt.Sprintf("data-olddb-db-%d", i))
		if c.Spec.VolumeName != fmt.Sprintf("sts-pv-%d", i) {
			t.Fatalf("%s is bound to %s, want sts-pv-%d", c.Name, c.Spec.VolumeName, i)
		}
		oldClaims[c.Name] = c
	}
	for i := range 2 {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, fmt.Sprintf("olddb-db-%d", i), metav1.GetOptions{})
		if err != nil || !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == fmt.Sprintf("data-olddb-db-%d", i)
		}) {
			t.Fatalf("the StatefulSet controller made no pod olddb-db-%d on its claim: %v", i, err)
		}
	}
	if m, err := helm(t, nil, "get", "manifest", "olddb", "-n", ns); err != nil || strings.Contains(m, "PersistentVolumeClaim") {
		t.Fatalf("the stored manifest lists claims (or: %v); this test is about claims it does not list", err)
	}
	// A claim of an ordinal the StatefulSet no longer runs (left by a scale-down: the plan
	// reports it, but neither moves nor deletes it), and a bystander: both stay.
	for _, c := range []string{"data-olddb-db-2", "scratch"} {
		if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: c},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("none"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bystander"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The new chart: another StatefulSet name and claim template, ordered pod management
	// (its controller would make only ordinal 0's claim until that pod is ready: the
	// migration pre-creates both).
	newChart := stsChart(t, "newsdb", "2.0.0", "mysql", "storage", "OrderedReady", `{{- $name := printf "%s-auth" .Release.Name }}
{{- $old := lookup "v1" "Secret" .Release.Namespace $name }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $name }}
data:
  password: {{ if $old }}{{ index $old.data "password" }}{{ else }}{{ randAlphaNum 24 | b64enc }}{{ end }}
`)
	before := append(namespaceObjects(t, cs, ns), statefulSets(t, cs, ns)...)

	// The plan.
	base := []string{"release", "migrate", "olddb", "-n", ns, "--to-chart", newChart, "--new-release", "newdb"}
	plan := safePlan(t, base...)
	var out migrateOutput
	type pairing struct{ Old, New, PV, UID, OldSTS, NewSTS string }
	var got []pairing
	for _, v := range plan.Volumes {
		p := pairing{Old: v.OldPVC, New: v.NewPVC, PV: v.PV, UID: v.PVUID}
		if v.OldStatefulSet != nil {
			p.OldSTS = v.OldStatefulSet.String()
		}
		if v.NewStatefulSet != nil {
			p.NewSTS = v.NewStatefulSet.String()
		}
		if !v.DeleteOld || v.OldPVCUID != string(oldClaims[v.OldPVC].UID) {
			t.Errorf("%s: deleteOld=%v with uid %q, want true with %s", v.OldPVC, v.DeleteOld, v.OldPVCUID, oldClaims[v.OldPVC].UID)
		}
		got = append(got, p)
	}
	want := []pairing{
		{"data-olddb-db-0", "storage-newdb-mysql-0", "sts-pv-0", string(pvs["sts-pv-0"].UID), "StatefulSet olddb-db template data ordinal 0", "StatefulSet newdb-mysql template storage ordinal 0"},
		{"data-olddb-db-1", "storage-newdb-mysql-1", "sts-pv-1", string(pvs["sts-pv-1"].UID), "StatefulSet olddb-db template data ordinal 1", "StatefulSet newdb-mysql template storage ordinal 1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan volumes (-want +got):\n%s", diff)
	}
	var beyond []string
	for _, f := range plan.Findings {
		if f.Check == chartmigrate.CheckSTSClaimBeyond {
			beyond = append(beyond, f.Subject)
		}
	}
	if diff := cmp.Diff([]string{"PersistentVolumeClaim/migsts/data-olddb-db-2"}, beyond); diff != "" {
		t.Errorf("claims reported beyond the StatefulSet's replicas (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"PersistentVolumeClaim/migsts/data-olddb-db-0", "PersistentVolumeClaim/migsts/data-olddb-db-1"}, plan.ClaimDeletes); diff != "" {
		t.Errorf("plan claim deletes (-want +got):\n%s", diff)
	}
	for _, d := range plan.Deletes {
		if strings.HasPrefix(d, "PersistentVolumeClaim/") {
			t.Errorf("the plan says the uninstall deletes %s: helm uninstall does not delete StatefulSet claims", d)
		}
	}
	text := ug(t, append(base, "--plan")...)
	for _, want := range []string{
		"  data-olddb-db-0 -> storage-newdb-mysql-0  on PV sts-pv-0 (uid " + string(pvs["sts-pv-0"].UID) + ", hostPath:/srv/" + identity + "/sts-pv-0, Delete, 1Gi, class \"manual\")\n" +
			"      StatefulSet olddb-db template data ordinal 0 -> StatefulSet newdb-mysql template storage ordinal 0\n",
		"  data-olddb-db-1 -> storage-newdb-mysql-1  on PV sts-pv-1 (uid " + string(pvs["sts-pv-1"].UID) + ", hostPath:/srv/" + identity + "/sts-pv-1, Delete, 1Gi, class \"manual\")\n" +
			"      StatefulSet olddb-db template data ordinal 1 -> StatefulSet newdb-mysql template storage ordinal 1\n",
		"The uninstall leaves 2 StatefulSet claim(s) behind; the migration deletes them itself, by uid, after their PVs are Retain:\n" +
			"  PersistentVolumeClaim/migsts/data-olddb-db-0\n  PersistentVolumeClaim/migsts/data-olddb-db-1\n",
		"note     statefulset-claims-left  StatefulSet/migsts/olddb-db: helm uninstall does not delete the claims",
		"statefulset-claim-beyond-replicas  PersistentVolumeClaim/migsts/data-olddb-db-2: a claim of StatefulSet olddb-db's template data at ordinal 2, which it does not run",
		"then, once the old StatefulSets are gone, delete the StatefulSet claims it leaves behind, each by its uid: PersistentVolumeClaim/migsts/data-olddb-db-0, PersistentVolumeClaim/migsts/data-olddb-db-1",
		"data-olddb-db-0 -> storage-newdb-mysql-0 on sts-pv-0 (hostPath:/srv/" + identity + "/sts-pv-0; for StatefulSet newdb-mysql template storage ordinal 0, not owned by Helm)",
	} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("plan text lacks %q:\n%s", want, text.stdout)
		}
	}

	// Execute.
	dir := filepath.Join(t.TempDir(), "backup")
	r := ug(t, append(base, "--execute", "--backup-dir", dir, "--yes", "-o", "json")...)
	if r.code != cli.ExitSafe {
		t.Fatalf("execute: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Result == nil || !out.Result.Done {
		t.Fatalf("result: %v\n%s", err, r.stdout)
	}
	for _, vc := range out.Result.Volumes {
		if !vc.Bound || !vc.SameUID || !vc.SameData || vc.StatefulSet != "newdb-mysql" || !vc.StatefulSetUses {
			t.Errorf("verify: %+v", vc)
		}
	}
	if !strings.Contains(r.stderr, "3/8 uninstall: done (release olddb uninstalled (2 object(s) deleted); StatefulSet claims deleted: data-olddb-db-0, data-olddb-db-1)") {
		t.Errorf("progress does not show the StatefulSet claims deleted:\n%s", r.stderr)
	}
	if len(out.Result.Volumes) != 2 {
		t.Errorf("verify checked %d claims, want 2", len(out.Result.Volumes))
	}

	// The proof, read from the API server: both new claims Bound to the same PVs (uid).
	for i := range 2 {
		pvName := fmt.Sprintf("sts-pv-%d", i)
		claim := waitBound(t, cs, ns, fmt.Sprintf("storage-newdb-mysql-%d", i))
		live, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Spec.VolumeName != pvName || live.UID != pvs[pvName].UID || live.Spec.HostPath.Path != "/srv/"+identity+"/"+pvName ||
			live.Spec.ClaimRef == nil || live.Spec.ClaimRef.UID != claim.UID || live.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
			t.Errorf("%s is not on %s: volume %q, PV uid %s (was %s), claimRef %+v, policy %s", claim.Name, pvName, claim.Spec.VolumeName, live.UID, pvs[pvName].UID, live.Spec.ClaimRef, live.Spec.PersistentVolumeReclaimPolicy)
		}
		if claim.Labels["app"] != "newdb-mysql" || claim.Labels["app.kubernetes.io/managed-by"] != "" {
			t.Errorf("%s labels %v: want the StatefulSet's selector labels and no Helm ownership", claim.Name, claim.Labels)
		}
	}
	// The new StatefulSet's controller takes the pre-created claim: its first pod mounts it.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, "newdb-mysql-0", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "storage-newdb-mysql-0"
		}), nil
	})
	if err != nil {
		t.Errorf("pod newdb-mysql-0 does not mount storage-newdb-mysql-0: %v", err)
	}
	if out, err := helm(t, nil, "status", "newdb", "-n", ns); err != nil || !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status newdb: %v\n%s", err, out)
	}

	// The old claims are gone only because the plan listed them; nothing else went.
	after := append(namespaceObjects(t, cs, ns), statefulSets(t, cs, ns)...)
	for _, o := range before {
		if !slices.Contains(after, o) && !slices.Contains(plan.Deletes, o) && !slices.Contains(plan.ClaimDeletes, o) {
			t.Errorf("%s was deleted but the plan did not list it", o)
		}
	}
	for _, o := range append(slices.Clone(plan.ClaimDeletes), "StatefulSet/migsts/olddb-db") {
		if slices.Contains(after, o) {
			t.Errorf("%s is still there", o)
		}
	}
	for _, o := range []string{"PersistentVolumeClaim/migsts/data-olddb-db-2", "PersistentVolumeClaim/migsts/scratch", "ConfigMap/migsts/bystander"} {
		if !slices.Contains(after, o) {
			t.Errorf("%s is gone, yet the plan did not list it", o)
		}
	}
	// The backup holds the StatefulSet claims and their PVs, which the uninstall
	// backup does not (they are not in the manifest).
	files, err := filepath.Glob(filepath.Join(dir, chartmigrate.STSBackupDir, "*.yaml"))
	if err != nil || len(files) != 4 {
		t.Errorf("StatefulSet claim backup: %v %v, want 2 claims and 2 PVs", files, err)
	}
}

func statefulSets(t *testing.T, cs kubernetes.Interface, ns string) []string {
	t.Helper()
	l, err := cs.AppsV1().StatefulSets(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		out = append(out, "StatefulSet/"+ns+"/"+s.Name)
	}
	return out
}

// TestReleaseMigrateStatefulSetSameName moves a StatefulSet release to a chart whose
// StatefulSet and template make the same claim names (same release name): helm
// uninstall leaves the claims, so the plan keeps them as they are (nothing to delete)
// and the new StatefulSet takes them; afterwards they are the very same claims (uid) on
// the same PVs.
func TestReleaseMigrateStatefulSetSameName(t *testing.T) {
	needCluster(t)
	cp.ControllerManagerForTest(t)
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	const ns = "migsame"
	for i := range 2 {
		pv := manualPV(fmt.Sprintf("same-pv-%d", i), fmt.Sprintf("/srv/same-%d", i), corev1.PersistentVolumeReclaimRetain,
			&corev1.ObjectReference{Namespace: ns, Name: fmt.Sprintf("data-db-db-%d", i)})
		if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	settings := `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-{{ .Chart.Name }}-settings
`
	mustHelm(t, nil, "install", "db", stsChart(t, "sdb", "1.0.0", "db", "data", "Parallel", settings), "-n", ns, "--create-namespace")
	uids := map[string]string{}
	for i := range 2 {
		c := waitBound(t, cs, ns, fmt.Sprintf("data-db-db-%d", i))
		uids[c.Name] = string(c.UID)
	}
	newChart := stsChart(t, "otherdb", "2.0.0", "db", "data", "OrderedReady", settings)
	base := []string{"release", "migrate", "db", "-n", ns, "--to-chart", newChart}
	r := ug(t, append(base, "--plan")...)
	if r.code != cli.ExitSafe {
		t.Fatalf("plan: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"leave the claim data-db-db-0 as it is, for StatefulSet db-db template data ordinal 0 (bound to same-pv-0)",
		"leave the claim data-db-db-1 as it is, for StatefulSet db-db template data ordinal 1 (bound to same-pv-1)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("plan text lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "StatefulSet claim(s) behind") {
		t.Errorf("the plan deletes claims it keeps:\n%s", r.stdout)
	}
	r = ug(t, append(base, "--execute", "--backup-dir", filepath.Join(t.TempDir(), "b"), "--yes")...)
	if r.code != cli.ExitSafe {
		t.Fatalf("execute: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for i := range 2 {
		c := waitBound(t, cs, ns, fmt.Sprintf("data-db-db-%d", i))
		if string(c.UID) != uids[c.Name] || c.Spec.VolumeName != fmt.Sprintf("same-pv-%d", i) {
			t.Errorf("%s: uid %s (was %s), volume %s: not the same claim on the same volume", c.Name, c.UID, uids[c.Name], c.Spec.VolumeName)
		}
	}
	if out, err := helm(t, nil, "status", "db", "-n", ns); err != nil || !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status db: %v\n%s", err, out)
	}
}
