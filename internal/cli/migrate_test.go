package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"

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
