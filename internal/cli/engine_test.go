package cli_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// migrateJSON is migrate -o json.
type migrateJSON struct {
	CRDs []*migrate.Result `json:"crds"`
}

func migrateResults(t *testing.T, r result) []*migrate.Result {
	t.Helper()
	var out migrateJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("JSON output: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
	return out.CRDs
}

// asUser runs upgradeguard with a kubeconfig.
func asUser(t *testing.T, kubeconfig string, args ...string) result {
	t.Helper()
	return run(t, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

// builtinRoleUser binds a new user to exactly what `upgradeguard rbac --engine builtin`
// prints for crds, and returns its kubeconfig.
func builtinRoleUser(t *testing.T, name, leaseNS string, crds ...string) string {
	t.Helper()
	args := []string{"rbac", "--engine", "builtin", "--name", name, "--lease-namespace", leaseNS, "-o", "json"}
	for _, c := range crds {
		args = append(args, "--crd", c)
	}
	r := ug(t, args...)
	if r.code != cli.ExitSafe {
		t.Fatalf("rbac --engine builtin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var p migrate.Permissions
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatal(err)
	}
	// The custom resources are only listed (to judge field loss), never written.
	for _, rule := range p.ClusterRole.Rules {
		if slices.Contains(rule.Verbs, "patch") || slices.Contains(rule.APIGroups, "source.toolkit.fluxcd.io") && !slices.Equal(rule.Verbs, []string{"list"}) {
			t.Fatalf("the builtin role may do more than list the custom resources: %+v", rule)
		}
	}
	cp.BindRoles(t, name, p.ClusterRole, p.Role)
	kc, err := cp.UserKubeconfig(name)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestMigrateEngines: the Flux incident, migrated by a user who holds only the builtin
// engine's role. On a minor that serves StorageVersionMigrations the built-in migrator in
// kube-controller-manager does it (auto picks builtin for that user, client for an admin)
// and the real helm upgrade to 2.18.2 then succeeds; with the migrator disabled, auto and
// builtin stop and say so. Where the API is not served, builtin fails saying so and auto
// picks client.
func TestMigrateEngines(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "fluxcd.io")
	const ns = "flux-svm"
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	rev1 := fixtureChart(t, "flux2", "1.0.0", src("buckets"), src("helmcharts"), src("helmrepositories"))
	rev2 := fixtureChart(t, "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	mustHelm(t, nil, "install", "fluxsvm", rev1, "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "fluxsvm", "-n", ns) })
	for _, crd := range []string{buckets, charts, helmrepos} {
		if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), crd); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []testenv.Objects{
		{GVR: sourceGVR("helmrepositories", "v1beta2"), Kind: "HelmRepository", Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}},
		{GVR: sourceGVR("buckets", "v1beta2"), Kind: "Bucket", Spec: map[string]any{"bucketName": "charts", "endpoint": "minio.example.com", "interval": "10m"}},
		{GVR: sourceGVR("helmcharts", "v1beta2"), Kind: "HelmChart",
			Spec: map[string]any{"chart": "podinfo", "interval": "10m", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "obj-0"}}},
	} {
		o.Namespaces, o.PerNS = []string{ns}, 3
		if err := testenv.CreateObjects(t.Context(), cp.Config, o); err != nil {
			t.Fatal(err)
		}
	}
	mustHelm(t, nil, "upgrade", "fluxsvm", rev2, "-n", ns)
	all := []string{buckets, charts, helmrepos}
	sourceStoredAt(t, "before any migration", "v1beta2", all...)
	user := builtinRoleUser(t, "svm-cli", ns, all...)
	crdArgs := func(engine string, crds ...string) []string {
		args := []string{"migrate", "--engine", engine, "--lease-namespace", ns}
		for _, c := range crds {
			args = append(args, "--crd", c)
		}
		return args
	}

	if cp.Minor < 37 {
		// 1.35 and 1.36 serve it only when enabled; older minors not at all.
		r := asUser(t, user, crdArgs("builtin", helmrepos)...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "not served on this server, use --engine client") {
			t.Fatalf("builtin on 1.%d: exit %d, stderr %q; want exit 2 saying it is not served", cp.Minor, r.code, r.stderr)
		}
		r = ug(t, append(crdArgs("auto", helmrepos), "--dry-run", "-o", "json")...)
		if res := migrateResults(t, r); res[0].Engine != migrate.EngineClient {
			t.Fatalf("auto on 1.%d picked %s (%s), want client", cp.Minor, res[0].Engine, res[0].EngineReason)
		}
		return
	}

	// Who runs what: a dry run says the engine and why, before anything is written.
	r := ug(t, append(crdArgs("auto", helmrepos), "--dry-run", "-o", "json")...)
	if res := migrateResults(t, r); res[0].Engine != migrate.EngineClient || !strings.Contains(res[0].EngineReason, "may patch") {
		t.Errorf("admin auto: %s (%s), want client because it may patch", res[0].Engine, res[0].EngineReason)
	}

	// The migrator disabled: auto (for a user who may not patch) and builtin stop within
	// the start timeout and name the controller.
	startKCM(t, "garbage-collector-controller")
	for _, engine := range []string{"builtin", "auto"} {
		r := asUser(t, user, append(crdArgs(engine, helmrepos), "--builtin-start-timeout", "3s")...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "storage-version-migrator-controller") || !strings.Contains(r.stderr, "not running") {
			t.Errorf("%s without the migrator: exit %d, stderr %q; want exit 2 naming storage-version-migrator-controller", engine, r.code, r.stderr)
		}
	}
	sourceStoredAt(t, "builtin and auto without the migrator", "v1beta2", all...)
	stopKCM(t)

	// The migrator running: builtin for one CRD, auto for the other two.
	startKCM(t, "garbage-collector-controller", "storage-version-migrator-controller")
	r = asUser(t, user, append(crdArgs("builtin", helmrepos), "-o", "json")...)
	if r.code != cli.ExitSafe {
		t.Fatalf("builtin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	results := migrateResults(t, r)
	sourceStoredAt(t, "builtin", "v1", helmrepos)
	sourceStoredAt(t, "builtin (not asked to migrate these)", "v1beta2", buckets, charts)
	r = asUser(t, user, crdArgs("auto", buckets, charts)...)
	if r.code != cli.ExitSafe || strings.Count(r.stdout, "builtin engine (auto: may not patch") != 2 || !strings.Contains(r.stdout, "storedVersions pruned by") {
		t.Fatalf("auto as the builtin-role user: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	sourceStoredAt(t, "auto as the builtin-role user", "v1", all...)
	// The one result asked for: a loop over no result would assert nothing.
	if len(results) != 1 {
		t.Fatalf("builtin: %d results, want 1 for %s", len(results), helmrepos)
	}
	if res := results[0]; res.Name != helmrepos || res.Engine != migrate.EngineBuiltin || res.Status != migrate.Migrated ||
		!slices.Equal(res.StoredVersionsAfter, []string{"v1"}) || res.Objects != 3 {
		t.Errorf("builtin: %+v, want %s migrated by the builtin engine, 3 objects, storedVersions [v1]", res, helmrepos)
	}
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	for _, name := range all {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || !slices.Equal(crd.Status.StoredVersions, []string{"v1"}) {
			t.Errorf("%s storedVersions: %v (%v), want [v1]", name, crd.Status.StoredVersions, err)
		}
	}
	// The real upgrade that failed in the incident now succeeds.
	mustHelm(t, nil, "upgrade", "fluxsvm", filepath.Join(fixturesDir(t), "charts/flux2-2.18.2"), "-n", ns)
}

func sourceGVR(resource, version string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: version, Resource: resource}
}

// sourceStoredAt asserts what etcd holds after when: for each CRD, exactly the three
// objects the test created, each stored at source.toolkit.fluxcd.io/version. Read through
// the API every object looks the same at any storage version; only etcd shows which
// objects an engine rewrote.
func sourceStoredAt(t *testing.T, when, version string, crds ...string) {
	t.Helper()
	want := "source.toolkit.fluxcd.io/" + version
	for _, crd := range crds {
		resource, _, _ := strings.Cut(crd, ".")
		stored, err := cp.StoredVersions(t.Context(), sourceGVR(resource, version).GroupResource())
		if err != nil {
			t.Fatal(err)
		}
		var other []string
		for key, v := range stored {
			if v != want {
				other = append(other, key+" at "+v)
			}
		}
		slices.Sort(other)
		if len(stored) != 3 || len(other) > 0 {
			t.Errorf("%s: etcd holds %d %s, want 3; not stored at %s: %v", when, len(stored), resource, want, other)
		}
	}
}

func startKCM(t *testing.T, controllers ...string) {
	t.Helper()
	if err := cp.StartControllerManager(controllers...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.StopControllerManager() })
}

func stopKCM(t *testing.T) {
	t.Helper()
	if err := cp.StopControllerManager(); err != nil {
		t.Fatal(err)
	}
}
