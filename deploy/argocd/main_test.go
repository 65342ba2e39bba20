// Package argocd_test tests the Argo CD health checks upgradeguard ships in
// deploy/argocd (health/*.lua, and argocd-cm.yaml generated from them): each script runs
// in gopher-lua as Argo CD runs an argocd-cm customization, on objects read back from a
// real API server in each state the controllers put them in.
package argocd_test

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

var cp *testenv.ControlPlane

// TestMain starts one control plane. From 1.35 on it also serves
// storagemigration.k8s.io/v1beta1 (off by default), beside v1 from 1.37, so a
// StorageVersionMigration is read at both versions.
func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4})))
	var o testenv.Options
	if minor, err := testenv.KubeMinor(); err == nil {
		if _, m, _ := strings.Cut(minor, "."); atLeast(m, 35) {
			o.RuntimeConfig = []string{"storagemigration.k8s.io/v1beta1=true"}
		}
	}
	os.Exit(testenv.RunTests(m, &cp, o))
}

func atLeast(minor string, want int) bool {
	n, err := strconv.Atoi(minor)
	return err == nil && n >= want
}
