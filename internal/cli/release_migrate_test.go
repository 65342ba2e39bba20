package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/output/citest"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
)

// dbChart is the old chart: a database Deployment on a claim, with a credentials Secret
// whose password the chart mints.
func dbChart(t *testing.T) string {
	t.Helper()
	dir, err := testenv.WriteChart(t.TempDir(), "db", "1.0.0", map[string]string{
		"templates/pvc.yaml": `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ .Release.Name }}-db-data
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 1Gi}
`,
		"templates/secret.yaml": `apiVersion: v1
kind: Secret
metadata:
  name: {{ .Release.Name }}-db-credentials
stringData:
  password: {{ randAlphaNum 24 | quote }}
`,
		"templates/deploy.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-db
spec:
  selector:
    matchLabels: {app: {{ .Release.Name }}-db}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}-db}
    spec:
      containers:
      - name: db
        image: mysql:8
        volumeMounts: [{name: data, mountPath: /var/lib/mysql}]
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: {{ .Release.Name }}-db-data}
`,
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// newDBChart is the chart migrated to: other names for the claim and the Secret; the
// Secret keeps an existing password (lookup) and mints one only on a fresh install.
func newDBChart(t *testing.T) string {
	t.Helper()
	dir, err := testenv.WriteChart(t.TempDir(), "newdb", "2.0.0", map[string]string{
		"templates/pvc.yaml": `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data-{{ .Release.Name }}
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 1Gi}
`,
		"templates/secret.yaml": `{{- $name := printf "%s-auth" .Release.Name }}
{{- $old := lookup "v1" "Secret" .Release.Namespace $name }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $name }}
data:
  password: {{ if $old }}{{ index $old.data "password" }}{{ else }}{{ randAlphaNum 24 | b64enc }}{{ end }}
`,
		"templates/settings.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
data:
  engine: innodb
`,
		"templates/sts.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
spec:
  selector:
    matchLabels: {app: {{ .Release.Name }}}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}}
    spec:
      containers:
      - name: db
        image: mysql:8
        envFrom: [{secretRef: {name: {{ .Release.Name }}-auth}}]
        volumeMounts: [{name: data, mountPath: /var/lib/mysql}]
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: data-{{ .Release.Name }}}
`,
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// namespaceObjects lists Kind/namespace/name of the ConfigMaps, Secrets, claims and
// Deployments in ns.
func namespaceObjects(t *testing.T, cs kubernetes.Interface, ns string) []string {
	t.Helper()
	ctx := t.Context()
	var out []string
	cms, err1 := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	secs, err2 := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	pvcs, err3 := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	deps, err4 := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range cms.Items {
		out = append(out, "ConfigMap/"+ns+"/"+o.Name)
	}
	for _, o := range secs.Items {
		if o.Type != "helm.sh/release.v1" {
			out = append(out, "Secret/"+ns+"/"+o.Name)
		}
	}
	for _, o := range pvcs.Items {
		out = append(out, "PersistentVolumeClaim/"+ns+"/"+o.Name)
	}
	for _, o := range deps.Items {
		out = append(out, "Deployment/"+ns+"/"+o.Name)
	}
	slices.Sort(out)
	return out
}

// migrateOutput is release migrate's JSON output.
type migrateOutput struct {
	Plan   chartmigrate.Plan    `json:"plan"`
	Result *chartmigrate.Result `json:"result"`
}

// safePlan runs release migrate with args, --plan and -o json, and returns the plan,
// failing the test unless it exits 0 with a safe plan.
func safePlan(t *testing.T, args ...string) chartmigrate.Plan {
	t.Helper()
	r := ug(t, append(args, "--plan", "-o", "json")...)
	var out migrateOutput
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("plan JSON: %v\n%s\n%s", err, r.stdout, r.stderr)
	}
	if r.code != cli.ExitSafe || !out.Plan.Safe {
		t.Fatalf("plan: exit %d, findings %+v\n%s", r.code, out.Plan.Findings, r.stderr)
	}
	return out.Plan
}

// manualPV is a pre-provisioned 1Gi ReadWriteOnce hostPath volume of storage class
// "manual", optionally reserved for a claim.
func manualPV(name, path string, reclaim corev1.PersistentVolumeReclaimPolicy, claimRef *corev1.ObjectReference) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              "manual",
			ClaimRef:                      claimRef,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
		},
	}
}

// TestReleaseMigrate moves a release with a PVC-backed database to a chart with other
// claim and Secret names, on the real API server with the real kube-controller-manager
// binding claims to volumes. The install fails once (an object in the way), and the
// re-run resumes there without repeating the backup or the uninstall. At the end the
// new release is deployed, its claim is Bound to the same PV (name, uid, hostPath, the
// test's identity label), the Secret holds the same bytes, and nothing the plan did not
// list was deleted.
func TestReleaseMigrate(t *testing.T) {
	needCluster(t)
	cp.ControllerManagerForTest(t)
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	const ns = "mig"
	identity := "data-" + rand.String(10)
	pv := manualPV("db-pv", "/srv/"+identity, corev1.PersistentVolumeReclaimDelete, nil)
	pv.Labels = map[string]string{"upgradeguard.dev/data-id": identity}
	pv, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "olddb", dbChart(t), "-n", ns, "--create-namespace")
	waitBound(t, cs, ns, "olddb-db-data")
	creds, err := cs.CoreV1().Secrets(ns).Get(ctx, "olddb-db-credentials", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	password := string(creds.Data["password"])
	// Objects outside the release, which must survive.
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bystander"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bystander"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newChart := newDBChart(t)
	before := namespaceObjects(t, cs, ns)

	// The plan.
	plan := safePlan(t, "release", "migrate", "olddb", "-n", ns, "--to-chart", newChart, "--new-release", "newdb")
	var out migrateOutput
	if len(plan.Volumes) != 1 || plan.Volumes[0].OldPVC != "olddb-db-data" || plan.Volumes[0].NewPVC != "data-newdb" ||
		plan.Volumes[0].PV != "db-pv" || plan.Volumes[0].PVUID != string(pv.UID) || plan.Volumes[0].ReclaimPolicy != "Delete" {
		t.Errorf("plan volumes: %+v", plan.Volumes)
	}
	if diff := cmp.Diff([]chartmigrate.Secret{{Old: "olddb-db-credentials", New: "newdb-auth", Type: "Opaque", Keys: []string{"password"}}}, plan.Secrets); diff != "" {
		t.Errorf("plan secrets (-want +got):\n%s", diff)
	}
	text := ug(t, "release", "migrate", "olddb", "-n", ns, "--to-chart", newChart, "--new-release", "newdb", "--plan")
	for _, want := range []string{"olddb-db-data -> data-newdb  on PV db-pv", "olddb-db-credentials -> newdb-auth", "pv-not-retain", "3. uninstall: helm uninstall olddb"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("plan text lacks %q:\n%s", want, text.stdout)
		}
	}

	// A plan that blocks (the new name is another release's): execute refuses it before
	// the first step, prints the plan, and exits 1 with what to do.
	taken, err := testenv.WriteChart(t.TempDir(), "taken", "1.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: taken\n"})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "taken", taken, "-n", ns)
	blocked := ug(t, "release", "migrate", "olddb", "-n", ns, "--to-chart", newChart, "--new-release", "taken", "--yes",
		"--execute", "--backup-dir", filepath.Join(t.TempDir(), "blocked"))
	if blocked.code != cli.ExitFindings || !strings.Contains(blocked.stdout, "BLOCKING new-release-exists") ||
		!strings.Contains(blocked.stderr, "Error: nothing was changed: the plan has blocking findings (") ||
		!strings.Contains(blocked.stderr, "): fix them, or pass --override-blocking") {
		t.Errorf("blocked plan: exit %d, want 1 with the plan and the refusal\n%s\n%s", blocked.code, blocked.stdout, blocked.stderr)
	}
	// CI reads the same plans: the blocked one fails on the taken name, the safe one's
	// notes (pv-not-retain: the migration retains the volume itself) fail nothing.
	for name, c := range map[string]struct {
		release string
		code    int
		want    string
	}{
		"blocked": {"taken", cli.ExitFindings, "release-migrate: Release/" + ns + "/olddb FAIL " + chartmigrate.CheckNewReleaseInUse + " out"},
		"safe":    {"newdb", cli.ExitSafe, "release-migrate: Release/" + ns + "/olddb out"},
	} {
		r := ug(t, "release", "migrate", "olddb", "-n", ns, "--to-chart", newChart, "--new-release", c.release, "--plan", "-o", "junit")
		if diff := cmp.Diff([]string{c.want}, citest.JUnit(t, r.stdout)); diff != "" || r.code != c.code || strings.Contains(r.stdout, password) {
			t.Errorf("%s plan, -o junit: exit %d (want %d, no Secret data), cases (-want +got):\n%s", name, r.code, c.code, diff)
		}
	}
	if strings.Contains(blocked.stderr, "1/8 backup") {
		t.Errorf("blocked plan: a step ran\n%s", blocked.stderr)
	}

	dir := filepath.Join(t.TempDir(), "backup")
	args := []string{"release", "migrate", "olddb", "-n", ns, "--to-chart", newChart, "--new-release", "newdb", "--execute", "--backup-dir", dir}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		// Nobody to ask and no --yes: the PV patch is refused after the backup, with
		// nothing changed on the cluster.
		r := ug(t, args...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "pass --yes") {
			t.Fatalf("without --yes: exit %d\n%s", r.code, r.stderr)
		}
		if live, _ := cs.CoreV1().PersistentVolumes().Get(ctx, "db-pv", metav1.GetOptions{}); live.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
			t.Fatalf("refused, yet the PV was patched")
		}
	}

	// An object in the new chart's way makes the install fail once.
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "newdb-settings"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := ug(t, append(args, "--yes")...)
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "step install failed") {
		t.Fatalf("first run: exit %d, want 2 at the install\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	st, err := chartmigrate.LoadState(dir)
	if err != nil || st == nil {
		t.Fatalf("record: %v", err)
	}
	for _, step := range chartmigrate.Steps[:6] {
		if !st.Done(step) {
			t.Errorf("step %s: %+v, want done", step, st.Steps[step])
		}
	}
	if st.Steps[chartmigrate.StepInstall].Status != chartmigrate.StatusFailed {
		t.Errorf("install step: %+v", st.Steps[chartmigrate.StepInstall])
	}
	uninstalledAt := st.Steps[chartmigrate.StepUninstall].At
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "newdb-settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The re-run resumes at the install.
	r = ug(t, append(args, "--yes", "-o", "json")...)
	if r.code != cli.ExitSafe {
		t.Fatalf("re-run: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"resuming the migration", "1/8 backup: done in an earlier run, skipped", "3/8 uninstall: done in an earlier run, skipped", "7/8 install: done"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, r.stderr)
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Result == nil || !out.Result.Done {
		t.Fatalf("result: %v\n%s", err, r.stdout)
	}
	if st, _ = chartmigrate.LoadState(dir); !st.Steps[chartmigrate.StepUninstall].At.Equal(uninstalledAt) || !st.Done(chartmigrate.StepVerify) {
		t.Errorf("the re-run repeated the uninstall or did not verify: %+v", st.Steps)
	}

	// The proof, read from the API server.
	if out, err := helm(t, nil, "status", "newdb", "-n", ns); err != nil || !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status newdb: %v\n%s", err, out)
	}
	if _, err := helm(t, nil, "status", "olddb", "-n", ns); err == nil {
		t.Error("the old release is still installed")
	}
	claim := waitBound(t, cs, ns, "data-newdb")
	live, err := cs.CoreV1().PersistentVolumes().Get(ctx, "db-pv", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Spec.VolumeName != "db-pv" || live.UID != pv.UID || live.Labels["upgradeguard.dev/data-id"] != identity ||
		live.Spec.HostPath == nil || live.Spec.HostPath.Path != "/srv/"+identity || live.Spec.ClaimRef == nil || live.Spec.ClaimRef.UID != claim.UID {
		t.Errorf("data-newdb is not on the same volume: claim volume %q, PV uid %s (was %s), claimRef %+v", claim.Spec.VolumeName, live.UID, pv.UID, live.Spec.ClaimRef)
	}
	if live.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("PV reclaim policy %s, want Retain", live.Spec.PersistentVolumeReclaimPolicy)
	}
	auth, err := cs.CoreV1().Secrets(ns).Get(ctx, "newdb-auth", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(auth.Data["password"], []byte(password)) || len(auth.Data) != 1 {
		t.Error("newdb-auth does not hold the old release's credentials")
	}
	if auth.Labels["app.kubernetes.io/managed-by"] != "Helm" || auth.Annotations["meta.helm.sh/release-name"] != "newdb" {
		t.Errorf("newdb-auth is not owned by the new release: %v %v", auth.Labels, auth.Annotations)
	}
	after := namespaceObjects(t, cs, ns)
	for _, o := range before {
		if !slices.Contains(after, o) && !slices.Contains(plan.Deletes, o) {
			t.Errorf("%s was deleted but the plan did not list it", o)
		}
	}
	for _, o := range []string{"ConfigMap/mig/bystander", "Secret/mig/bystander"} {
		if !slices.Contains(after, o) {
			t.Errorf("%s is gone", o)
		}
	}
	for _, o := range []string{text.stdout, text.stderr, r.stdout, r.stderr} {
		if strings.Contains(o, password) {
			t.Fatal("migrate printed the Secret's data")
		}
	}
	backup, err := os.ReadFile(filepath.Join(dir, chartmigrate.StateFile))
	if err != nil || bytes.Contains(backup, []byte(password)) {
		t.Errorf("the migration record holds Secret data (or is missing: %v)", err)
	}
}

func waitBound(t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	var got *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = c
		return c.Status.Phase == corev1.ClaimBound, nil
	})
	if err != nil {
		t.Fatalf("PersistentVolumeClaim %s/%s not Bound within a minute: %v", ns, name, err)
	}
	return got
}

// TestReleaseMigrateChartCredentials: release migrate takes the new chart from a private
// repository with the chart-source flags check takes. With --username and --password the
// plan reads the chart from the repository (on loopback, behind basic auth); without
// them the repository refuses and release migrate says so, exit 2, before it reads or
// changes anything.
func TestReleaseMigrateChartCredentials(t *testing.T) {
	needCluster(t)
	const ns = "mig-auth"
	old, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "app", old, "-n", ns, "--create-namespace")
	newChart, err := testenv.WriteChart(t.TempDir(), "private-app", "2.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	repoDir := t.TempDir()
	if _, err := testenv.Package(newChart, repoDir); err != nil {
		t.Fatal(err)
	}
	url, stop, err := servers.ServeRepoBasicAuth(repoDir, "reader", "s3cret-pass")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	args := []string{"release", "migrate", "app", "-n", ns, "--to-chart", "private-app", "--repo", url, "--version", "2.0.0"}

	plan := safePlan(t, append(args, "--username", "reader", "--password", "s3cret-pass")...)
	if plan.NewChart != "private-app" || plan.NewChartVersion != "2.0.0" || !slices.Contains(plan.Deletes, "ConfigMap/"+ns+"/app-settings") {
		t.Errorf("plan with credentials: new chart %s-%s, deletes %v", plan.NewChart, plan.NewChartVersion, plan.Deletes)
	}

	for name, creds := range map[string][]string{
		"no credentials":   nil,
		"a wrong password": {"--username", "reader", "--password", "guess"},
	} {
		r := ug(t, append(args, append(creds, "--plan")...)...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "401 Unauthorized") || !strings.Contains(r.stderr, "--username") ||
			strings.Contains(r.stderr, "s3cret-pass") || strings.Contains(r.stderr, "guess") {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 naming the 401 and --username/--password", name, r.code, r.stderr)
		}
	}
}
