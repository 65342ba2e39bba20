package crdversions_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// TestFixturesUnchanged checks every fixture file against SHA256SUMS, and that every CRD
// fixture parses strictly.
func TestFixturesUnchanged(t *testing.T) {
	root, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(root, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s differs from its upstream copy", name)
		}
		if strings.HasPrefix(name, "./crds/") && !strings.Contains(name, "helm-source") && strings.HasSuffix(name, ".yaml") {
			if _, err := crdversions.FromManifest(name, data); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		n++
	}
	if n < 100 {
		t.Errorf("only %d fixture files checked", n)
	}
}
