package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Helm3 returns a command running the real Helm 3 CLI (bin/helm3, v3.22.0) against the
// control plane, with the same isolated Helm home as Helm. Releases it installs have no
// apply_method in their record, as for every Helm 3 user: Helm 4 upgrades them client-side.
func (cp *ControlPlane) Helm3(args ...string) *exec.Cmd { return cp.helmCLI("helm3", args) }

// NeedHelm3 fails the test when bin/helm3 is missing: `make testbin` builds it.
func (cp *ControlPlane) NeedHelm3(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cp.Bin, "helm3")); err != nil {
		t.Fatalf("%s/helm3 is missing: run `make testbin` first", cp.Bin)
	}
}
