package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestCheckBundledMigrations: check renders the StorageVersionMigrations a chart bundles,
// in text and JSON, and they do not change the exit code: a chart whose one CRD is new
// (safe) and that bundles one migration for it and one for a resource nothing serves
// exits 0, with both judged.
func TestCheckBundledMigrations(t *testing.T) {
	needCluster(t)
	const g = "cli.bundled.upgradeguard.test"
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(fx, "crds/flux-source-controller/v1.8.0/source.toolkit.fluxcd.io_helmrepositories.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	svm := func(name, group string) string {
		return "apiVersion: storagemigration.k8s.io/v1\nkind: StorageVersionMigration\nmetadata:\n  name: " + name +
			"\nspec:\n  resource:\n    group: " + group + "\n    resource: helmrepositories\n"
	}
	dir, err := testenv.WriteChart(t.TempDir(), "clibundled", "1.0.0", map[string]string{
		"templates/crd.yaml":      strings.ReplaceAll(string(data), "source.toolkit.fluxcd.io", g),
		"templates/svm.yaml":      svm("cli-bundled-{{ .Chart.Version }}", g),
		"templates/svm-gone.yaml": svm("cli-bundled-gone", "gone."+g),
	})
	if err != nil {
		t.Fatal(err)
	}

	r := ug(t, "check", "--chart", dir, "-o", "json")
	if r.code != cli.ExitSafe {
		t.Fatalf("exit %d, want %d (bundled migrations are advice)\nstdout: %s\nstderr: %s", r.code, cli.ExitSafe, r.stdout, r.stderr)
	}
	rep := report(t, r)
	crd := "helmrepositories." + g
	if len(rep.CRDs) != 1 || rep.CRDs[0].Name != crd || len(rep.CRDs[0].BundledMigrations) != 1 {
		t.Fatalf("crds %+v, want %s with its bundled migration", rep.CRDs, crd)
	}
	if b := rep.CRDs[0].BundledMigrations[0]; b.Name != "cli-bundled-1.0.0" || b.Verdict != predict.BundledWillRun || b.CRD != crd {
		t.Errorf("bundled %+v, want cli-bundled-1.0.0 will-run for %s", b, crd)
	}
	if len(rep.BundledMigrations) != 1 || rep.BundledMigrations[0].Verdict != predict.BundledNoCRD ||
		rep.BundledMigrations[0].CRD != "helmrepositories.gone."+g {
		t.Errorf("report-level bundled %+v, want cli-bundled-gone no-crd", rep.BundledMigrations)
	}

	text := ug(t, "check", "--chart", dir)
	if text.code != cli.ExitSafe {
		t.Fatalf("text: exit %d\n%s%s", text.code, text.stdout, text.stderr)
	}
	for _, want := range []string{
		"SAFE:",
		"StorageVersionMigrations the chart bundles (advice; they do not change the verdicts):",
		"cli-bundled-1.0.0 (storagemigration.k8s.io/v1, clibundled/templates/svm.yaml) for " + crd + ": will-run",
		"next: before the release that drops a version: upgradeguard migrate --crd " + crd + " --wait",
		"cli-bundled-gone (storagemigration.k8s.io/v1, clibundled/templates/svm-gone.yaml) for helmrepositories.gone." + g + ": no-crd",
	} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
}
