// Package argocd_test tests the Argo CD health checks upgradeguard ships in
// deploy/argocd (health/*.lua, and argocd-cm.yaml generated from them): each script runs
// in gopher-lua as Argo CD runs an argocd-cm customization, on objects read back from a
// real API server in each state the controllers put them in.
package argocd_test

import (
	"log/slog"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

var cp *testenv.ControlPlane

// TestMain starts one control plane with storagemigration.k8s.io/v1beta1 served beside
// v1, so a StorageVersionMigration is read at both versions.
func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4})))
	os.Exit(testenv.RunTests(m, &cp, testenv.Options{RuntimeConfig: []string{"storagemigration.k8s.io/v1beta1=true"}}))
}
