package argocd_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	argoenv "github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
)

// health is a health script's answer, as Argo CD keeps it. The harness that runs the
// scripts as Argo CD does is argoenv.RunHealth; test/argocd compares it with the real Argo
// CD's assessment of the same objects.
type health = argoenv.Health

// The shipped scripts, by the argocd-cm key suffix their file is named after.
const (
	keyCRD              = "apiextensions.k8s.io_CustomResourceDefinition"
	keySVM              = "storagemigration.k8s.io_StorageVersionMigration"
	keyStorageMigration = "upgradeguard.io_StorageMigration"
)

// script reads a shipped health script.
func script(t *testing.T, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("health", key+".lua"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// judge runs the shipped script for key on obj and fails the test if it does not run.
func judge(t *testing.T, key string, obj map[string]any) health {
	t.Helper()
	h, err := argoenv.RunHealth(t.Context(), script(t, key), obj)
	if err != nil {
		t.Fatalf("%s on %s: %v", key, describe(obj), err)
	}
	return h
}

func describe(obj map[string]any) string {
	data, _ := json.Marshal(obj)
	return strings.TrimSpace(string(data))
}
