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

	"github.com/google/go-cmp/cmp"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp, testenv.Options{Audit: true})) }

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Execute(t.Context(), args, cli.Streams{Out: &out, ErrOut: &errOut})
	return result{code, out.String(), errOut.String()}
}

// ug runs upgradeguard against the test control plane as the admin user.
func ug(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
}

func report(t *testing.T, r result) *check.Report {
	t.Helper()
	var rep check.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("JSON output: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
	return &rep
}

func verdicts(rep *check.Report) map[predict.Verdict][]string {
	out := map[predict.Verdict][]string{}
	for _, c := range rep.CRDs {
		out[c.Verdict] = append(out[c.Verdict], c.Name)
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out
}

func helm(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := cp.Helm(args...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustHelm(t *testing.T, env []string, args ...string) {
	t.Helper()
	if out, err := helm(t, env, args...); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// uninstallOnCleanup uninstalls the release when the test ends (with env, as installed),
// failing the test if Helm cannot: a release left behind changes what later tests see.
func uninstallOnCleanup(t *testing.T, env []string, release, ns string) {
	t.Helper()
	t.Cleanup(func() {
		if out, err := helm(t, env, "uninstall", release, "-n", ns); err != nil {
			t.Errorf("helm uninstall %s -n %s: %v\n%s", release, ns, err, out)
		}
	})
}

func fixtureChart(t *testing.T, name, version string, files ...string) string {
	t.Helper()
	p, err := testenv.FixtureChart(t.TempDir(), name, version, files...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func fixturesDir(t *testing.T) string {
	t.Helper()
	d, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
}

func TestFlagErrorsExit2(t *testing.T) {
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"check"}, "--chart"},
		{[]string{"check", "--rollback"}, "--release"},
		{[]string{"check", "--rollback", "--release", "x", "--chart", "y"}, "do not go together"},
		{[]string{"check", "--chart", "x", "--to-revision", "2"}, "--rollback"},
		{[]string{"check", "--chart", "x", "-o", "yaml"}, "-o json"},
		{[]string{"check", "--chart", "x", "--crd-policy", "always"}, "create-replace"},
		{[]string{"plan", "--release", "x", "--chart", "y", "--crd-policy", "always"}, `invalid argument "always" for "--crd-policy" flag`},
		{[]string{"release", "rollback-check", "x", "--crd-policy", "always"}, `invalid argument "always" for "--crd-policy" flag`},
		{[]string{"check", "--chart", "x", "--helm-driver", "sql"}, `"--helm-driver" flag: unknown Helm storage driver "sql": use secret or configmap`},
		{[]string{"audit", "--helm-driver", "sql"}, "use secret or configmap"},
		{[]string{"release", "migrate", "x", "--to-chart", "y", "--plan", "--helm-driver", "sql"}, "use secret or configmap"},
		{[]string{"release", "uninstall-check", "x", "--helm-driver", "sql"}, "use secret or configmap"},
		{[]string{"release", "diff-failed", "x", "--helm-driver", "sql"}, "use secret or configmap"},
		{[]string{"release", "rollback-check", "x", "--helm-driver", "sql"}, "use secret or configmap"},
		{[]string{"check", "--no-such-flag"}, "unknown flag"},
	}
	for _, tc := range cases {
		r := run(t, tc.args...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.mention)
		}
	}
}

func TestUnreachableClusterExit2(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "--kubeconfig", kc, "check", "--chart", "whatever")
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "cannot reach the Kubernetes API server") {
		t.Errorf("exit %d stderr %q", r.code, r.stderr)
	}
}

// TestFluxIncident reproduces the production upgrade and rollback incidents with real
// Helm, and checks that the real helm upgrade and helm rollback fail exactly where check
// predicts.
func TestFluxIncident(t *testing.T) {
	needCluster(t)
	fx := fixturesDir(t)
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	rev1 := fixtureChart(t, "flux2", "1.0.0", src("buckets"), src("helmcharts"), src("helmrepositories"))
	rev2 := fixtureChart(t, "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	target := filepath.Join(fx, "charts/flux2-2.18.2")

	mustHelm(t, nil, "install", "flux", rev1, "-n", "flux-system", "--create-namespace")
	if err := scenario.HelmRepositoriesAtV1beta2(t.Context(), cp); err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "upgrade", "flux", rev2, "-n", "flux-system")

	// Upgrade prediction.
	r := ug(t, "check", "--chart", target, "--release", "flux", "-n", "flux-system", "-o", "json")
	if r.code != cli.ExitFindings {
		t.Fatalf("check exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	rep := report(t, r)
	migrate := []string{buckets, charts, helmrepos}
	if got := verdicts(rep)[predict.Migrate]; !slices.Equal(got, migrate) || len(verdicts(rep)[predict.OK]) != 11 {
		t.Fatalf("verdicts %v, want migrate %v and 11 ok", verdicts(rep), migrate)
	}
	for _, c := range rep.CRDs {
		if c.Name == helmrepos && (c.Objects == nil || *c.Objects != 2) {
			t.Errorf("helmrepositories objects = %v, want 2", c.Objects)
		}
	}
	text := ug(t, "check", "--chart", target, "--release", "flux", "-n", "flux-system")
	for _, want := range []string{"BLOCKED: 3 of 14", "upgradeguard migrate --crd " + buckets, "--crd " + helmrepos} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
	// The same verdicts as CI reads them: a JUnit case per CRD, the three to migrate
	// failing, and an error annotation for each of them.
	junit := ug(t, "check", "--chart", target, "--release", "flux", "-n", "flux-system", "-o", "junit")
	if junit.code != cli.ExitFindings || !strings.Contains(junit.stdout, `<testsuites name="upgradeguard check" tests="14" failures="3">`) {
		t.Errorf("-o junit: exit %d, want 1 and 3 of 14 cases failing\n%s%s", junit.code, junit.stdout, junit.stderr)
	}
	gh := ug(t, "check", "--chart", target, "--release", "flux", "-n", "flux-system", "-o", "github")
	for _, crd := range migrate {
		if want := "::error title=migrate%3A " + crd + "::"; !strings.Contains(gh.stdout, want) {
			t.Errorf("-o github lacks %q:\n%s", want, gh.stdout)
		}
	}
	if n := strings.Count(gh.stdout, "\n"); gh.code != cli.ExitFindings || n != len(migrate) {
		t.Errorf("-o github: exit %d and %d annotations, want 1 and %d\n%s", gh.code, n, len(migrate), gh.stdout)
	}

	// The real upgrade fails on those CRDs and no other.
	out, err := helm(t, nil, "upgrade", "flux", target, "-n", "flux-system")
	if err == nil {
		t.Fatalf("helm upgrade succeeded, but check predicted a failure:\n%s", out)
	}
	assertRejected(t, out, migrate, rep)

	// Rollback prediction to revision 1, then the real rollback.
	r = ug(t, "check", "--rollback", "--release", "flux", "-n", "flux-system", "--to-revision", "1", "-o", "json")
	if r.code != cli.ExitFindings {
		t.Fatalf("check --rollback exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	rep = report(t, r)
	if got := verdicts(rep)[predict.Bridge]; !slices.Equal(got, migrate) {
		t.Errorf("bridge verdicts %v, want %v", got, migrate)
	}
	// The 11 CRDs revision 1 does not render hold no objects: their deletion loses
	// nothing, so it is no finding, and each row says it.
	retired := 0
	for _, c := range rep.CRDs {
		if c.Verdict == predict.OK && strings.Contains(c.Reason, "deletes the CRD; it holds no") {
			retired++
		}
	}
	if got := len(verdicts(rep)[predict.Delete]); got != 0 || retired != 11 {
		t.Errorf("%d delete verdicts and %d empty CRDs deleted, want 0 and 11 (the CRDs revision 1 does not render)", got, retired)
	}
	for _, c := range rep.CRDs {
		if c.Verdict == predict.Bridge && (c.StorageSwitchTo != "v1beta2" || !strings.Contains(c.Action, "--rollback --release flux -n flux-system --to-revision 1")) {
			t.Errorf("%s: switch %q action %q", c.Name, c.StorageSwitchTo, c.Action)
		}
	}
	out, err = helm(t, nil, "rollback", "flux", "1", "-n", "flux-system")
	if err == nil {
		t.Fatalf("helm rollback succeeded, but check predicted a failure:\n%s", out)
	}
	assertStoredVersionsRejected(t, out, "v1")
	before := readObjects(t, "v1")

	// The fix for the rollback: a reverse migration, then the real helm rollback succeeds.
	r = ug(t, "migrate", "--rollback", "--release", "flux", "-n", "flux-system", "--to-revision", "1", "--allow-storage-switch", "--lease-namespace", "flux-system")
	if r.code != cli.ExitSafe {
		t.Fatalf("reverse migration: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustHelm(t, nil, "rollback", "flux", "1", "-n", "flux-system")
	if diff := cmp.Diff(before, readObjects(t, "v1beta2")); diff != "" {
		t.Errorf("objects changed by the reverse migration and rollback (-before +after):\n%s", diff)
	}

	// The fix for the upgrade: through 2.17.2 (2.18.2 drops the live storage version
	// itself), migrate, then the real helm upgrade to 2.18.2 succeeds.
	mustHelm(t, nil, "upgrade", "flux", rev2, "-n", "flux-system")
	r = ug(t, "migrate", "--chart", target, "--release", "flux", "-n", "flux-system", "--lease-namespace", "flux-system")
	if r.code != cli.ExitSafe {
		t.Fatalf("migrate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustHelm(t, nil, "upgrade", "flux", target, "-n", "flux-system")
	// v1beta2 is gone from the CRD now: every object still reads back, unchanged.
	if diff := cmp.Diff(before, readObjects(t, "v1")); diff != "" {
		t.Errorf("objects changed by the migration and upgrade (-before +after):\n%s", diff)
	}
}

// readObjects reads every HelmRepository's spec and status at a version, by name.
func readObjects(t *testing.T, version string) map[string]any {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: version, Resource: "helmrepositories"}
	list, err := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("read HelmRepositories at %s: %v", version, err)
	}
	out := map[string]any{}
	for _, o := range list.Items {
		spec, _, _ := unstructured.NestedMap(o.Object, "spec")
		out[o.GetNamespace()+"/"+o.GetName()] = map[string]any{"spec": spec, "status": o.Object["status"]}
	}
	if len(out) == 0 {
		t.Fatal("no HelmRepositories read back")
	}
	return out
}

// assertRejected checks that Helm's error names storedVersions rejections only for CRDs
// check predicted, and names at least one of them.
func assertRejected(t *testing.T, helmOut string, predicted []string, rep *check.Report) {
	t.Helper()
	if len(storedVersionsRejected(t, helmOut)) == 0 {
		t.Fatalf("helm failed for another reason:\n%s", helmOut)
	}
	named := 0
	for _, c := range rep.CRDs {
		if strings.Contains(helmOut, c.Name) {
			if !slices.Contains(predicted, c.Name) {
				t.Errorf("helm rejected %s, which check called %s", c.Name, c.Verdict)
			}
			named++
		}
	}
	if named == 0 {
		t.Errorf("helm's error names none of the CRDs:\n%s", helmOut)
	}
}

// storedVersionsRejected returns the storedVersions rejections in a command's output,
// and fails the test when one is not in the wording of the Kubernetes minor that runs:
// "must appear in spec.versions" up to 1.32, "missing from spec.versions; ... must remain
// in spec.versions" from 1.33 (kubernetes#128746).
func storedVersionsRejected(t *testing.T, out string) []crdversions.StoredVersionRejection {
	t.Helper()
	rs := crdversions.StoredVersionRejections(out)
	for _, r := range rs {
		if want := crdversions.WordingFor(cp.Minor); r.Wording != want {
			t.Errorf("Kubernetes 1.%d rejected %s %s worded %q, want %q", cp.Minor, r.CRD, r.Version, r.Wording, want)
		}
	}
	return rs
}

// assertStoredVersionsRejected fails the test unless out holds a storedVersions
// rejection of version, in the wording of the minor that runs.
func assertStoredVersionsRejected(t *testing.T, out, version string) {
	t.Helper()
	for _, r := range storedVersionsRejected(t, out) {
		if r.Version == version {
			return
		}
	}
	t.Errorf("no storedVersions rejection of %s:\n%s", version, out)
}

const (
	buckets   = "buckets.source.toolkit.fluxcd.io"
	charts    = "helmcharts.source.toolkit.fluxcd.io"
	helmrepos = "helmrepositories.source.toolkit.fluxcd.io"
	envcfg    = "environmentconfigs.apiextensions.crossplane.io"
)

// TestCrossplaneRollbacks: the real helm rollback succeeds when check --rollback says
// safe (1.18.2 kept v1alpha1 storage) and fails when it says bridge (1.18.0).
func TestCrossplaneRollbacks(t *testing.T) {
	needCluster(t)
	c1173 := fixtureChart(t, "crossplane", "1.17.3", "crds/crossplane/v1.17.3/apiextensions.crossplane.io_environmentconfigs.yaml")
	c1182 := fixtureChart(t, "crossplane", "1.18.2", "crds/crossplane/v1.18.2/apiextensions.crossplane.io_environmentconfigs.yaml")
	c1180 := fixtureChart(t, "crossplane", "1.18.0", "crds/crossplane/v1.18.0/apiextensions.crossplane.io_environmentconfigs.yaml")
	ns := []string{"-n", "crossplane-system"}

	mustHelm(t, nil, append([]string{"install", "xp", c1173, "--create-namespace"}, ns...)...)
	mustHelm(t, nil, append([]string{"upgrade", "xp", c1182}, ns...)...)
	r := ug(t, append([]string{"check", "--rollback", "--release", "xp"}, ns...)...)
	if r.code != cli.ExitSafe {
		t.Fatalf("check --rollback after 1.18.2: exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustHelm(t, nil, append([]string{"rollback", "xp"}, ns...)...)

	mustHelm(t, nil, append([]string{"upgrade", "xp", c1180}, ns...)...)
	r = ug(t, append([]string{"check", "--rollback", "--release", "xp", "-o", "json"}, ns...)...)
	if r.code != cli.ExitFindings {
		t.Fatalf("check --rollback after 1.18.0: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	rep := report(t, r)
	if got := verdicts(rep)[predict.Bridge]; !slices.Equal(got, []string{envcfg}) || rep.FromRevision != 4 || rep.ToRevision != 3 {
		t.Errorf("verdicts %v revisions %d->%d, want bridge for %s, 4->3", verdicts(rep), rep.FromRevision, rep.ToRevision, envcfg)
	}
	out, err := helm(t, nil, append([]string{"rollback", "xp"}, ns...)...)
	if err == nil || len(storedVersionsRejected(t, out)) == 0 {
		t.Errorf("helm rollback: err %v, want a storedVersions rejection\n%s", err, out)
	}
}

// TestConfigMapDriver reads releases stored by HELM_DRIVER=configmap, and finds the CRD a
// rollback would delete: kro 0.9.3 added GraphRevision, which 0.2.0 does not render. It
// holds no objects, so nothing is lost and the rollback is safe.
func TestConfigMapDriver(t *testing.T) {
	needCluster(t)
	env := []string{"HELM_DRIVER=configmap"}
	// The live state is this test's own: no kro CRD (nor object) another test left.
	notKro := func(c *apiextv1.CustomResourceDefinition) bool { return !strings.HasSuffix(c.Spec.Group, "kro.run") }
	if err := cp.DeleteCRDs(t.Context(), notKro); err != nil {
		t.Fatal(err)
	}
	mustHelm(t, env, "install", "kro", fixtureChart(t, "kro", "0.2.0", "crds/kro/v0.2.0/kro.run_resourcegraphdefinitions.yaml"), "-n", "kro", "--create-namespace")
	t.Cleanup(func() {
		if err := cp.DeleteCRDs(context.WithoutCancel(t.Context()), notKro); err != nil {
			t.Errorf("delete the kro CRDs: %v", err)
		}
	})
	uninstallOnCleanup(t, env, "kro", "kro")
	mustHelm(t, env, "upgrade", "kro", fixtureChart(t, "kro", "0.9.3", "crds/kro/v0.9.3/kro.run_resourcegraphdefinitions.yaml", "crds/kro/v0.9.3/internal.kro.run_graphrevisions.yaml"), "-n", "kro")

	r := ug(t, "check", "--rollback", "--release", "kro", "-n", "kro", "--helm-driver", "configmap", "-o", "json")
	if r.code != cli.ExitSafe {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	rep := report(t, r)
	if got := verdicts(rep); !slices.Equal(got[predict.OK], []string{"graphrevisions.internal.kro.run", "resourcegraphdefinitions.kro.run"}) {
		t.Errorf("verdicts %v", got)
	}
	for _, c := range rep.CRDs {
		if c.Name == "graphrevisions.internal.kro.run" && !strings.Contains(c.Reason, "Helm deletes the CRD; it holds no GraphRevision objects") {
			t.Errorf("graphrevisions: reason %q does not say the rollback deletes it", c.Reason)
		}
	}
	r = ug(t, "check", "--rollback", "--release", "kro", "-n", "kro", "--helm-driver", "secret")
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "--helm-driver configmap") {
		t.Errorf("secret driver on a configmap release: exit %d stderr %q", r.code, r.stderr)
	}
}

func TestBadInputExit2(t *testing.T) {
	needCluster(t)
	mustHelm(t, nil, "install", "one", fixtureChart(t, "one", "1.0.0", "crds/velero/v1.12.0/velero.io_datauploads.yaml"), "-n", "one", "--create-namespace")
	badCRD, err := testenv.WriteChart(t.TempDir(), "bad", "1.0.0", map[string]string{
		"templates/crd.yaml": "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: things.example.com\nspec:\n  group: example.com\n  versionz: []\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		mention string
	}{
		{"unknown release", []string{"check", "--rollback", "--release", "nope", "-n", "one"}, "helm list -n one"},
		{"unknown revision", []string{"check", "--rollback", "--release", "one", "-n", "one", "--to-revision", "7"}, "helm history one"},
		{"single revision", []string{"check", "--rollback", "--release", "one", "-n", "one"}, "nothing to roll back to"},
		{"missing chart", []string{"check", "--chart", filepath.Join(t.TempDir(), "missing")}, "not found"},
		{"invalid CRD in chart", []string{"check", "--chart", badCRD}, "bad/templates/crd.yaml"},
		{"unreachable repository", []string{"check", "--chart", "flux2", "--repo", "http://127.0.0.1:1"}, "reachable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := ug(t, tc.args...)
			if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
				t.Errorf("exit %d stderr %q, want exit 2 mentioning %q", r.code, r.stderr, tc.mention)
			}
		})
	}
}

// TestReadOnlyAndRBAC proves from the API server's audit log that check persists nothing:
// it sends reads, and dry-run writes of the incoming CRDs (dryRun=All: whether the server
// accepts them) and nothing else. A user without RBAC to read CRDs gets exit 2 with what
// to grant; a reader who may not write CRDs gets the verdicts (the dry run is forbidden,
// and said).
func TestReadOnlyAndRBAC(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	mustHelm(t, nil, "install", "ro", fixtureChart(t, "ro", "0.15.1", "crds/external-secrets/v0.15.1/external-secrets.io_secretstores.yaml"), "-n", "ro", "--create-namespace")
	mustHelm(t, nil, "upgrade", "ro", fixtureChart(t, "ro", "0.16.2", "crds/external-secrets/v0.16.2/external-secrets.io_secretstores.yaml"), "-n", "ro")

	reader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "read-all"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "readers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "read-all"},
		Subjects: []rbacv1.Subject{{Kind: "Group", Name: "readers"}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.WaitAuthorized(t, "checker", []string{"readers"}, "", reader.Rules...)
	checker, err := cp.UserKubeconfig("checker", "readers")
	if err != nil {
		t.Fatal(err)
	}
	upgrade := run(t, "--kubeconfig", checker, "check", "--chart", fixtureChart(t, "ro", "0.17.0", "crds/external-secrets/v0.17.0/external-secrets.io_secretstores.yaml"), "--release", "ro", "-n", "ro")
	rollback := run(t, "--kubeconfig", checker, "check", "--rollback", "--release", "ro", "-n", "ro")
	for _, r := range []result{upgrade, rollback} {
		if r.code == cli.ExitCouldNot {
			t.Fatalf("check as a reader: exit 2: %s", r.stderr)
		}
	}
	events, err := cp.AuditEvents("checker")
	if err != nil {
		t.Fatal(err)
	}
	if len(events) < 4 {
		t.Fatalf("only %d audited requests from checker: the audit log is not recording", len(events))
	}
	dryRuns := 0
	for _, ev := range events {
		switch {
		case ev.Verb == "get" || ev.Verb == "list" || ev.Verb == "watch":
		case (ev.Verb == "update" || ev.Verb == "create") && strings.Contains(ev.RequestURI, "/customresourcedefinitions") &&
			strings.Contains(ev.RequestURI, "dryRun=All"):
			dryRuns++
		default:
			t.Errorf("check sent %s %s", ev.Verb, ev.RequestURI)
		}
	}
	if dryRuns == 0 {
		t.Error("check did not ask the API server whether it accepts the incoming CRD (no dry-run write audited)")
	}
	if !strings.Contains(upgrade.stdout, "admission webhooks were not asked about") {
		t.Errorf("a reader's check does not say the API server was not asked:\n%s", upgrade.stdout)
	}

	nobody, err := cp.UserKubeconfig("nobody")
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, "--kubeconfig", nobody, "check", "--chart", filepath.Join(fixturesDir(t), "charts/flux2-2.18.2"))
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "customresourcedefinitions") || !strings.Contains(r.stderr, "docs/operator-guide.md#rbac") {
		t.Errorf("no RBAC: exit %d stderr %q", r.code, r.stderr)
	}
}
