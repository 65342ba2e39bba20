package crdbackup_test

import (
	"os"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
}
