package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

var (
	cp *testenv.ControlPlane
	// sharedDir holds what several tests use: the image binaries and the krew tools.
	sharedDir string
)

func TestMain(m *testing.M) {
	var err error
	if sharedDir, err = os.MkdirTemp("", "upgradeguard-dist-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := testenv.RunTests(m, &cp)
	os.RemoveAll(sharedDir)
	os.Exit(code)
}

const (
	buckets   = "buckets.source.toolkit.fluxcd.io"
	helmchart = "helmcharts.source.toolkit.fluxcd.io"
	helmrepos = "helmrepositories.source.toolkit.fluxcd.io"
)

// fluxIncident installs release flux in flux-system with the real Helm CLI and storage
// driver HELM_DRIVER=configmap, up to the state before the failing upgrade: storage v1,
// storedVersions [v1beta2 v1], objects stored at v1beta2 (FACTS §2). It returns the
// flux2 2.18.2 chart whose upgrade fails.
func fluxIncident(t *testing.T) string {
	t.Helper()
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	rev1, err := testenv.FixtureChart(t.TempDir(), "flux2", "1.0.0", src("buckets"), src("helmcharts"), src("helmrepositories"))
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := testenv.FixtureChart(t.TempDir(), "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	helm(t, []string{"HELM_DRIVER=configmap"}, 0, "install", "flux", rev1, "-n", "flux-system", "--create-namespace")
	if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), helmrepos); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"flux-system"}, PerNS: 2,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}); err != nil {
		t.Fatal(err)
	}
	helm(t, []string{"HELM_DRIVER=configmap"}, 0, "upgrade", "flux", rev2, "-n", "flux-system")
	return filepath.Join(fx, "charts/flux2-2.18.2")
}

// helm runs the real Helm CLI against the control plane, wants exit code want and
// returns its stdout and stderr.
func helm(t *testing.T, env []string, want int, args ...string) (string, string) {
	t.Helper()
	cmd := cp.Helm(args...)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if code := exitCode(err); code != want {
		t.Fatalf("helm %s: exit %d (%v), want %d\n%s%s", strings.Join(args, " "), code, err, want, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String()
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

type checkReport struct {
	Safe bool
	CRDs []struct {
		Name    string
		Verdict string
	}
}

func migrateVerdicts(t *testing.T, out string) []string {
	t.Helper()
	var rep checkReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("check -o json: %v\n%s", err, out)
	}
	var got []string
	for _, c := range rep.CRDs {
		if c.Verdict == "migrate" {
			got = append(got, c.Name)
		}
	}
	slices.Sort(got)
	return got
}

// TestPlugins installs upgradeguard the way users do, from the artefacts `make dist`
// writes, and runs it through the real front doors against the Flux incident:
//   - krew installs the kubectl plugin from the generated manifest and archive, and the
//     real kubectl 1.36 finds it (`kubectl plugin list`) and runs `kubectl upgradeguard
//     check` with kubectl's flags;
//   - the real Helm 4.3.1 installs the Helm plugin directory (`helm plugin install`) and
//     `helm upgradeguard check RELEASE --chart` sees the release Helm installed, through
//     Helm's -n and HELM_DRIVER=configmap.
func TestPlugins(t *testing.T) {
	rel, bins := imageBinaries(t)
	host := Platform{OS: "linux", Arch: "amd64"}
	target := fluxIncident(t)
	want := []string{buckets, helmchart, helmrepos}
	// The host platform's dist folder, as `make dist` writes it.
	dist := t.TempDir()
	if _, err := Package(t.Context(), rel, map[Platform]string{host: bins[host]}, dist, ""); err != nil {
		t.Fatal(err)
	}

	t.Run("helm", func(t *testing.T) {
		// The plugin archive installs (unsigned: --verify=false) and runs ...
		archive := filepath.Join(dist, HelmPluginArchiveName(rel, host))
		if out, _ := helm(t, nil, 0, "plugin", "install", archive, "--verify=false"); !strings.Contains(out, "Installed plugin: upgradeguard") {
			t.Errorf("helm plugin install %s: %s", archive, out)
		}
		if out, _ := helm(t, nil, 0, "upgradeguard", "version"); !strings.Contains(out, "upgradeguard "+rel.Version) {
			t.Errorf("helm upgradeguard version: %s", out)
		}
		helm(t, nil, 0, "plugin", "uninstall", "upgradeguard")
		// ... and so does the plugin directory.
		pluginDir := filepath.Join(dist, HelmPluginDir, host.OS+"_"+host.Arch, "upgradeguard")
		if out, _ := helm(t, nil, 0, "plugin", "install", pluginDir); !strings.Contains(out, `Installed plugin: upgradeguard`) {
			t.Errorf("helm plugin install: %s", out)
		}
		if out, _ := helm(t, nil, 0, "plugin", "list"); !strings.Contains(out, "upgradeguard") || !strings.Contains(out, strings.TrimPrefix(rel.Version, "v")) {
			t.Errorf("helm plugin list lacks upgradeguard %s:\n%s", rel.Version, out)
		}
		if out, _ := helm(t, nil, 0, "upgradeguard", "--help"); !strings.Contains(out, "helm upgradeguard [command]") || !strings.Contains(out, "apply-check") {
			t.Errorf("helm upgradeguard --help does not speak as helm upgradeguard:\n%s", out)
		}

		configmap := []string{"HELM_DRIVER=configmap"}
		out, _ := helm(t, configmap, 1, "upgradeguard", "check", "flux", "--chart", target, "-n", "flux-system", "-o", "json")
		if got := migrateVerdicts(t, out); !slices.Equal(got, want) {
			t.Errorf("helm upgradeguard check: migrate %v, want %v", got, want)
		}
		// Helm's --namespace=, before the plugin name, as HELM_NAMESPACE in the environment.
		helm(t, configmap, 1, "--namespace=flux-system", "upgradeguard", "check", "flux", "--chart", target)
		helm(t, append(configmap, "HELM_NAMESPACE=flux-system"), 1, "upgradeguard", "check", "flux", "--chart", target)
		// Without -n it looks where Helm would (default), and with the Secret driver
		// where Helm would keep it: the release is not there, which is "could not run".
		if _, out := helm(t, configmap, 2, "upgradeguard", "check", "flux", "--chart", target); !strings.Contains(out, "flux not found in namespace default") {
			t.Errorf("check in the default namespace: %s", out)
		}
		if _, out := helm(t, []string{"HELM_DRIVER=secret"}, 2, "upgradeguard", "check", "flux", "--chart", target, "-n", "flux-system"); !strings.Contains(out, "secret") {
			t.Errorf("check with the Secret driver: %s", out)
		}
		// The release commands sit at the top level, as Helm users expect; apply-check
		// predicts the same upgrade to fail (exit 1) on the same CRDs.
		out, _ = helm(t, configmap, 1, "upgradeguard", "apply-check", "flux", "--chart", target, "-n", "flux-system", "-o", "json")
		if !strings.Contains(out, helmrepos) {
			t.Errorf("helm upgradeguard apply-check does not name %s:\n%s", helmrepos, out)
		}
	})

	t.Run("kubectl", func(t *testing.T) {
		dir := dist
		if err := VerifyKrewManifest(dir, []Platform{host}); err != nil {
			t.Fatal(err)
		}
		krewRoot := krewInstall(t, filepath.Join(dir, KrewManifest), filepath.Join(dir, ArchiveName(rel, host)), host)

		path := filepath.Join(krewRoot, "bin") + string(os.PathListSeparator) + cp.Bin + string(os.PathListSeparator) + os.Getenv("PATH")
		kubectl := func(want int, env []string, args ...string) string {
			t.Helper()
			cmd := exec.CommandContext(t.Context(), filepath.Join(cp.KubeBin, "kubectl"), args...)
			cmd.Env = append(os.Environ(), "PATH="+path, "KUBECONFIG=/nonexistent")
			cmd.Env = append(cmd.Env, env...)
			out, err := cmd.CombinedOutput()
			if code := exitCode(err); code != want {
				t.Fatalf("kubectl %s: exit %d (%v), want %d\n%s", strings.Join(args, " "), code, err, want, out)
			}
			return string(out)
		}
		if out := kubectl(0, nil, "plugin", "list"); !strings.Contains(out, filepath.Join(krewRoot, "bin", "kubectl-upgradeguard")) {
			t.Errorf("kubectl plugin list does not show the krew-installed plugin:\n%s", out)
		}
		if out := kubectl(0, nil, "upgradeguard", "check", "--help"); !strings.Contains(out, "kubectl upgradeguard check [RELEASE]") || strings.Contains(out, "\n  upgradeguard ") {
			t.Errorf("kubectl upgradeguard check --help does not speak as kubectl upgradeguard:\n%s", out)
		}
		// kubectl's global flags: --kubeconfig, -n, and the Helm driver.
		out := kubectl(1, nil, "upgradeguard", "check", "--kubeconfig", cp.Kubeconfig, "-n", "flux-system",
			"--chart", target, "--release", "flux", "--helm-driver", "configmap", "-o", "json")
		if got := migrateVerdicts(t, out); !slices.Equal(got, want) {
			t.Errorf("kubectl upgradeguard check: migrate %v, want %v", got, want)
		}
		// KUBECONFIG, as kubectl reads it; --context naming a context that does not
		// exist proves the flag reaches the kubeconfig loader.
		kubectl(1, []string{"KUBECONFIG=" + cp.Kubeconfig, "HELM_DRIVER=configmap"}, "upgradeguard", "check", "flux", "-n", "flux-system", "--chart", target)
		if out := kubectl(2, []string{"KUBECONFIG=" + cp.Kubeconfig}, "upgradeguard", "check", "--context", "nope", "--chart", target); !strings.Contains(out, "nope") {
			t.Errorf("--context nope: %s", out)
		}
	})
}

// krewInstall installs the plugin with the real krew (hack/tools/krew) from the manifest
// and the local archive for p, as `kubectl krew install --manifest --archive` does:
// krew checks the archive's sha256 against the manifest. It also runs krew's own
// manifest validator. It returns KREW_ROOT.
func krewInstall(t *testing.T, manifest, archive string, p Platform) string {
	t.Helper()
	tools := krewTools(t)
	if out, err := exec.CommandContext(t.Context(), filepath.Join(tools, "validate-krew-manifest"), "-manifest", manifest, "-skip-install").CombinedOutput(); err != nil {
		t.Fatalf("validate-krew-manifest: %v\n%s", err, out)
	}
	root := t.TempDir()
	cmd := exec.CommandContext(t.Context(), filepath.Join(tools, "krew"), "install", "--manifest", manifest, "--archive", archive)
	cmd.Env = append(os.Environ(), "KREW_ROOT="+root, "KREW_OS="+p.OS, "KREW_ARCH="+p.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("krew install: %v\n%s", err, out)
	}
	return root
}

func krewTools(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(sharedDir, "krew")
	if _, err := os.Stat(filepath.Join(dir, "krew")); err == nil {
		return dir
	}
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", dir+"/", "sigs.k8s.io/krew/cmd/krew", "sigs.k8s.io/krew/cmd/validate-krew-manifest")
	cmd.Dir = filepath.Join(root, "hack/tools/krew")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	childproc.TieGroup(cmd)
	if err := childproc.Run(cmd); err != nil {
		t.Fatalf("build krew (hack/tools/krew): %v\n%s", err, out.Bytes())
	}
	return dir
}
