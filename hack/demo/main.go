// Command demo reproduces the Flux storage-version incidents on an embedded control
// plane (real kube-apiserver, etcd and Helm), shows upgradeguard predicting them, and
// shows the real Helm upgrade and rollback failing exactly where predicted; then the
// controller's proactive mode making the next storage-version change a non-event; and
// last, the real Flux controllers upgrading a semver-range HelmRelease through the gate.
// Run it with `make demo` (`make demo-flux` runs only the Flux act);
// UPGRADEGUARD_KUBE_VERSION picks the Kubernetes minor and UPGRADEGUARD_BIN another build
// of the CLI.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

func main() {
	only := flag.String("only", "", `run only this act: "flux" (the real Flux controllers upgrading through the gate)`)
	buildLog := flag.String("flux-build-log", "", "the log of the background build of Flux's controllers (make demo)")
	buildStatus := flag.String("flux-build-status", "", "the file the background build writes its exit status to; the Flux act waits for it")
	flag.Parse()
	if *only != "" && *only != "flux" {
		fmt.Fprintf(os.Stderr, "demo: -only %q: the only act that runs alone is flux\n", *only)
		os.Exit(2)
	}
	ctx := context.Background()
	err := func() error {
		if *only == "" {
			if err := run(ctx); err != nil {
				return err
			}
		}
		if err := waitFluxBuild(ctx, *buildLog, *buildStatus); err != nil {
			return err
		}
		return flux(ctx)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

type demo struct {
	cp   *testenv.ControlPlane
	work string
	ug   string
	crds apiextclient.Interface
}

func run(ctx context.Context) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	minor, err := testenv.KubeMinor() // $UPGRADEGUARD_KUBE_VERSION, else the default
	if err != nil {
		return err
	}
	step("Start an embedded control plane: kube-apiserver " + minor + " and etcd, built from source by `make testbin`.")
	cp, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() {
		step("Tear down the control plane.")
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop:", err)
		}
	}()
	work, err := os.MkdirTemp("", "upgradeguard-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	ug := os.Getenv("UPGRADEGUARD_BIN") // another build of the CLI; default: make build's
	if ug == "" {
		ug = filepath.Join(root, "bin", "upgradeguard")
	}
	d := &demo{cp: cp, work: work, ug: ug, crds: apiextclient.NewForConfigOrDie(cp.Config)}
	if err := d.incident(ctx, root); err != nil {
		return err
	}
	return d.automatic(ctx)
}

func (d *demo) incident(ctx context.Context, root string) error {
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	charts := filepath.Join(d.work, "charts")
	if _, err := testenv.FixtureChart(filepath.Join(charts, "flux2-2.2"), "flux2", "2.12.0", src("buckets"), src("helmcharts"), src("helmrepositories")); err != nil {
		return err
	}
	if _, err := testenv.FixtureChart(filepath.Join(charts, "flux2-2.17.2"), "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml"); err != nil {
		return err
	}
	if err := os.CopyFS(filepath.Join(charts, "flux2-2.18.2"), os.DirFS(filepath.Join(root, "test/fixtures/charts/flux2-2.18.2"))); err != nil {
		return err
	}

	step(`A cluster has run Flux for a long time. An old release stored HelmRepositories at
v1beta2 (source-controller 1.2: HelmRepository storage is v1beta2).`)
	if err := d.helm("install", "flux", "charts/flux2-2.2/flux2", "-n", "flux-system", "--create-namespace"); err != nil {
		return err
	}
	if err := testenv.WaitEstablished(ctx, d.crds, "helmrepositories.source.toolkit.fluxcd.io"); err != nil {
		return err
	}
	if err := testenv.CreateObjects(ctx, d.cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"flux-system", "team-a"}, PerNS: 3,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}); err != nil {
		return err
	}
	fmt.Println("  created 6 HelmRepositories at source.toolkit.fluxcd.io/v1beta2")

	step(`Upgrade to the flux2 chart 2.17.2. Storage moves to v1; the API server appends v1
to status.storedVersions and never removes v1beta2 by itself.`)
	if err := d.helm("upgrade", "flux", "charts/flux2-2.17.2/flux2", "-n", "flux-system"); err != nil {
		return err
	}
	if err := d.storedVersions(ctx, "helmrepositories.source.toolkit.fluxcd.io"); err != nil {
		return err
	}

	step(`Before upgrading to flux2 2.18.2 (which drops v1beta2), ask upgradeguard. It only reads
from the cluster. Exit code 1 means findings.`)
	d.upgradeguard("check", "--chart", "charts/flux2-2.18.2", "--release", "flux", "-n", "flux-system")

	step(`Press the button anyway: the real Helm upgrade fails on exactly the CRDs predicted,
after applying the others (a partial state).`)
	if err := d.helmExpectFailure("upgrade", "flux", "charts/flux2-2.18.2", "-n", "flux-system"); err != nil {
		return err
	}

	step(`What did the failed upgrade leave? diff-failed compares both revisions with the live
objects: the rejected CRDs stayed at the previous revision, the rest landed.`)
	d.upgradeguard("release", "diff-failed", "flux", "-n", "flux-system")

	step(`The operator tries to roll back to revision 1. upgradeguard predicts that too: the
live storage version v1 is unknown to revision 1 (a bridge), and revision 1 would delete
the 11 CRDs it does not render.`)
	d.upgradeguard("check", "--rollback", "--release", "flux", "-n", "flux-system", "--to-revision", "1")

	step("The real rollback fails the other way round, as predicted.")
	if err := d.helmExpectFailure("rollback", "flux", "1", "-n", "flux-system"); err != nil {
		return err
	}

	step(`The rollback can be unblocked with a reverse migration: switch the live storage version
back to v1beta2 (which the live CRDs still serve), migrate, prune. It changes live CRDs, so
migrate asks for confirmation first.`)
	d.upgradeguard("migrate", "--rollback", "--release", "flux", "-n", "flux-system", "--to-revision", "1")
	d.upgradeguard("migrate", "--rollback", "--release", "flux", "-n", "flux-system", "--to-revision", "1", "--allow-storage-switch")
	if err := d.storedVersions(ctx, "helmrepositories.source.toolkit.fluxcd.io"); err != nil {
		return err
	}

	step("The real rollback to revision 1 now succeeds.")
	if err := d.helm("rollback", "flux", "1", "-n", "flux-system"); err != nil {
		return err
	}

	step(`Back on the old release, upgrade properly. Going straight to 2.18.2 is a bridge: it drops
the live storage version v1beta2 itself, so 2.17.2 is the stepping stone.`)
	d.upgradeguard("check", "--chart", "charts/flux2-2.18.2", "--release", "flux", "-n", "flux-system")
	d.upgradeguard("check", "--chart", "charts/flux2-2.17.2/flux2", "--release", "flux", "-n", "flux-system")
	if err := d.helm("upgrade", "flux", "charts/flux2-2.17.2/flux2", "-n", "flux-system"); err != nil {
		return err
	}

	step(`Before 2.18.2: a dry run of the migration that check asks for, then the migration itself. Every
object is re-persisted at v1 with an empty patch; then storedVersions is pruned to [v1].`)
	d.upgradeguard("migrate", "--chart", "charts/flux2-2.18.2", "--release", "flux", "-n", "flux-system", "--dry-run")
	d.upgradeguard("migrate", "--chart", "charts/flux2-2.18.2", "--release", "flux", "-n", "flux-system")
	if err := d.storedVersions(ctx, "helmrepositories.source.toolkit.fluxcd.io"); err != nil {
		return err
	}

	step("check now says the upgrade is safe, and the real Helm upgrade succeeds.")
	d.upgradeguard("check", "--chart", "charts/flux2-2.18.2", "--release", "flux", "-n", "flux-system")
	if err := d.helm("upgrade", "flux", "charts/flux2-2.18.2", "-n", "flux-system"); err != nil {
		return err
	}

	step("Running migrate again writes nothing: every CRD is already migrated.")
	d.upgradeguard("migrate", "--all")

	step(`Summary: check named each blocked CRD before Helm touched the cluster; migrate fixed
them without changing any object's data, and a re-run made no writes. JSON for scripts:
add -o json to either command.`)
	return nil
}

func (d *demo) storedVersions(ctx context.Context, name string) error {
	crd, err := d.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("  %s status.storedVersions = %v\n", name, crd.Status.StoredVersions)
	return nil
}

func (d *demo) helm(args ...string) error {
	fmt.Printf("\n$ helm %s\n", strings.Join(args, " "))
	cmd := d.cp.Helm(args...)
	cmd.Dir = d.work
	out, err := cmd.CombinedOutput()
	fmt.Print(indent(lastLines(string(out), 6)))
	return err
}

func (d *demo) helmExpectFailure(args ...string) error {
	fmt.Printf("\n$ helm %s\n", strings.Join(args, " "))
	cmd := d.cp.Helm(args...)
	cmd.Dir = d.work
	out, err := cmd.CombinedOutput()
	if err == nil {
		return fmt.Errorf("helm %s succeeded, but it was predicted to fail", args[0])
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fmt.Print(indent(shorten(line)))
	}
	// The API server words the rejection one way up to 1.32 and another from 1.33; the
	// shared matcher reads both.
	rejected := crdversions.StoredVersionRejections(string(out))
	if len(rejected) == 0 {
		return fmt.Errorf("helm %s failed, but not on status.storedVersions as predicted:\n%s", args[0], out)
	}
	fmt.Println("  -> rejected on status.storedVersions, as predicted:")
	for _, r := range rejected {
		fmt.Printf("     %s\n", r)
	}
	return nil
}

func (d *demo) upgradeguard(args ...string) {
	fmt.Printf("\n$ upgradeguard %s\n", strings.Join(args, " "))
	cmd := exec.Command(d.ug, args...)
	cmd.Dir = d.work
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.cp.Kubeconfig)
	out, err := cmd.CombinedOutput()
	fmt.Print(indent(string(out)))
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	fmt.Printf("  (exit code %d)\n", code)
}

var stepNo int

func step(text string) {
	stepNo++
	fmt.Printf("\n=== %d. %s\n", stepNo, text)
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// shorten keeps Helm's long error lines readable.
func shorten(line string) string {
	const max = 400
	if len(line) > max {
		return line[:max] + " ..."
	}
	return line
}
