//go:build e2e

// Package e2e_test runs upgradeguard the way users install it: the image `make image`
// builds, deployed by charts/upgradeguard with the real Helm CLI onto a real node
// (internal/testenv's Node: containerd, runc, the kubelet, kube-proxy and kube-scheduler)
// registered to a real control plane. It needs root and the host packages that
// hack/node-deps.sh installs; `make e2e` installs them and builds what else it needs.
package e2e_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/node"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // the tests use controller-runtime's client only
	code := node.RunTests(m, &cp)
	if images.dir != "" {
		_ = os.RemoveAll(images.dir)
	}
	os.Exit(code)
}

// e2eVersion is the version the test image is built with.
const e2eVersion = "v0.0.0-e2e"

// images are the images built so far in this test binary, by version: each test starts
// a node of its own and imports the archive, but the build is done once.
var images struct {
	sync.Mutex
	dir   string
	built map[string][3]string // version -> reference, tag, archive
}

// buildImage runs `make image`'s builder for this machine's platform only and returns the
// image's reference (repository:tag), its tag and its `docker save` archive. A version
// already built in this test binary is not built again.
func buildImage(t *testing.T, version string) (ref, tag, archive string) {
	t.Helper()
	images.Lock()
	defer images.Unlock()
	if b, ok := images.built[version]; ok {
		return b[0], b[1], b[2]
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if images.dir == "" {
		if images.dir, err = os.MkdirTemp("", "upgradeguard-e2e-images-"); err != nil {
			t.Fatal(err)
		}
		images.built = map[string][3]string{}
	}
	out := filepath.Join(images.dir, version)
	started := time.Now()
	cmd := exec.Command("go", "run", "./hack/dist", "-out", out, "-version", version,
		"-platforms", "linux/"+runtime.GOARCH, "image")
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("build the image: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if a, ok := strings.CutPrefix(line, "docker archive "); ok {
			archive = a
		}
		if r, ok := strings.CutPrefix(line, "image "); ok {
			ref, tag = r, r[strings.LastIndex(r, ":")+1:]
		}
	}
	if archive == "" || tag == "" {
		t.Fatalf("the image builder printed no image and archive:\n%s", stdout.String())
	}
	t.Logf("image %s built in %v", tag, time.Since(started).Round(time.Second))
	images.built[version] = [3]string{ref, tag, archive}
	return ref, tag, archive
}

// kubectl runs the control plane's kubectl as its admin, failing the test if it fails.
func kubectl(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// kubectlOut is kubectl for diagnostics: its output, or the error.
func kubectlOut(args ...string) string {
	cmd := exec.Command(filepath.Join(cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: %v", out, err)
	}
	return string(out)
}

// helm runs the real Helm 4 CLI against the control plane, failing the test if it fails.
func helm(t *testing.T, args ...string) {
	t.Helper()
	out, err := cp.Helm(args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func chartDir(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "charts", "upgradeguard")
}

func must(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
