package cli_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

func uninstallChart(t *testing.T) string {
	t.Helper()
	p, err := testenv.WriteChart(t.TempDir(), "creds", "1.0.0", map[string]string{
		"values.yaml": "password: changeme\napiToken: none\n",
		"templates/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ntype: Opaque\nstringData:\n" +
			"  password: {{ .Values.password | quote }}\n",
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func uninstallReport(t *testing.T, r result) *uninstall.Report {
	t.Helper()
	var rep uninstall.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("JSON output: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
	return &rep
}

// TestReleaseUninstallCheckHelmVersion: ownership stripped from the live ConfigMap; the
// verdict, the findings and the exit code follow --helm-version.
func TestReleaseUninstallCheckHelmVersion(t *testing.T) {
	needCluster(t)
	ns := "uc-version"
	ch, err := testenv.WriteChart(t.TempDir(), "cfg", "1.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "cfg", ch, "-n", ns, "--create-namespace")
	strip := []byte(`{"metadata":{"labels":{"app.kubernetes.io/managed-by":null},"annotations":{"meta.helm.sh/release-name":null,"meta.helm.sh/release-namespace":null}}}`)
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ConfigMaps(ns).Patch(t.Context(), "settings", types.MergePatchType, strip, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	def := ug(t, "release", "uninstall-check", "cfg", "-n", ns)
	if def.code != cli.ExitSafe || !strings.Contains(def.stdout, "Verdict for Helm 4.3") || !strings.Contains(def.stdout, "SKIP-NOT-OWNED  ConfigMap/uc-version/settings") {
		t.Errorf("default (4.3): exit %d\n%s%s", def.code, def.stdout, def.stderr)
	}
	old := ug(t, "release", "uninstall-check", "cfg", "-n", ns, "--helm-version", "4.2", "-o", "json")
	if old.code != cli.ExitFindings {
		t.Fatalf("4.2: exit %d, want 1\n%s%s", old.code, old.stdout, old.stderr)
	}
	rep := uninstallReport(t, old)
	if rep.HelmVersion != "4.2" || rep.VerifiesOwnership || len(rep.Findings) != 1 || rep.Findings[0].Check != uninstall.CheckOwnershipStripped ||
		rep.Objects[0].Action != uninstall.Delete {
		t.Errorf("4.2 report: %+v", rep)
	}
	if r := ug(t, "release", "uninstall-check", "cfg", "-n", ns, "--helm-version", "latest"); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "--helm-version") {
		t.Errorf("bad version: exit %d stderr %q", r.code, r.stderr)
	}
	if r := ug(t, "release", "uninstall-check", "nope", "-n", ns); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "release nope not found") {
		t.Errorf("missing release: exit %d stderr %q", r.code, r.stderr)
	}
}

// TestReleaseUninstallCheckNoLeaks plants unique values in a Secret (rendered from
// values) and in release values that no template uses, for both Helm storage drivers,
// and proves neither appears in text output, JSON output, stderr or the backup index; the
// backup's Secret file is the one place that holds the Secret's value, as it must.
func TestReleaseUninstallCheckNoLeaks(t *testing.T) {
	needCluster(t)
	for _, driver := range []string{"secret", "configmap"} {
		t.Run(driver, func(t *testing.T) {
			ns := "uc-leak-" + driver
			secretValue := "pw-sentinel-" + driver + "-4b1d"
			valuesOnly := "token-sentinel-" + driver + "-9e2a"
			env := []string{"HELM_DRIVER=" + driver}
			mustHelm(t, env, "install", "app", uninstallChart(t), "-n", ns, "--create-namespace",
				"--set", "password="+secretValue, "--set", "apiToken="+valuesOnly)
			dir := filepath.Join(t.TempDir(), "backup")
			outputs := map[string]result{
				"text":   ug(t, "release", "uninstall-check", "app", "-n", ns, "--helm-driver", driver),
				"json":   ug(t, "release", "uninstall-check", "app", "-n", ns, "--helm-driver", driver, "-o", "json"),
				"backup": ug(t, "release", "uninstall-check", "app", "-n", ns, "--helm-driver", driver, "--backup", dir, "-o", "json"),
				// The CI formats carry the same findings, and no more of the release.
				"sarif":    ug(t, "release", "uninstall-check", "app", "-n", ns, "--helm-driver", driver, "-o", "sarif"),
				"markdown": ug(t, "release", "uninstall-check", "app", "-n", ns, "--helm-driver", driver, "-o", "markdown"),
			}
			index, err := os.ReadFile(filepath.Join(dir, uninstall.IndexFile))
			if err != nil {
				t.Fatalf("backup index: %v\n%s", err, outputs["backup"].stderr)
			}
			forbidden := []string{secretValue, valuesOnly, b64(secretValue), b64(valuesOnly)}
			for name, r := range outputs {
				if r.code != cli.ExitFindings {
					t.Errorf("%s: exit %d, want 1 (the Secret is deleted)", name, r.code)
				}
				for _, f := range forbidden {
					if strings.Contains(r.stdout, f) || strings.Contains(r.stderr, f) {
						t.Errorf("%s output holds a planted secret value", name)
					}
				}
			}
			for _, f := range forbidden {
				if strings.Contains(string(index), f) {
					t.Error("the backup index holds a planted secret value")
				}
			}
			if want := `"ruleId": "` + uninstall.CheckSecret + `"`; !strings.Contains(outputs["sarif"].stdout, want) {
				t.Errorf("-o sarif: no %s in\n%s", want, outputs["sarif"].stdout)
			}
			if want := "Release/" + ns + "/app"; !strings.Contains(outputs["markdown"].stdout, want) {
				t.Errorf("-o markdown: no %s in\n%s", want, outputs["markdown"].stdout)
			}
			rep := uninstallReport(t, outputs["json"])
			if string(rep.Driver) != driver || len(rep.Findings) != 1 || rep.Findings[0].Check != uninstall.CheckSecret ||
				!strings.Contains(rep.Findings[0].Message, "keys password") || !strings.Contains(rep.Findings[0].Remediation, "--backup") {
				t.Errorf("report: driver %q findings %+v", rep.Driver, rep.Findings)
			}
			secretFile, err := os.ReadFile(filepath.Join(dir, "objects", "secret-"+ns+"-creds.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(secretFile), b64(secretValue)) {
				t.Error("the backup's Secret file does not hold the Secret's value: a restore from it would lose the credentials")
			}
			if strings.Contains(string(secretFile), valuesOnly) || strings.Contains(string(secretFile), b64(valuesOnly)) {
				t.Error("the backup's Secret file holds a release value that is not in the Secret")
			}
			// A second --backup into the same directory refuses (exit 2) and keeps the first.
			again := ug(t, "release", "uninstall-check", "app", "-n", ns, "--helm-driver", driver, "--backup", dir)
			if again.code != cli.ExitCouldNot || !strings.Contains(again.stderr, "already holds a backup") {
				t.Errorf("second backup: exit %d stderr %q", again.code, again.stderr)
			}
		})
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
