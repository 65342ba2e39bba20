package applycheck_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
)

// TestObjectsKeepDocumentOrder: Helm applies a stored manifest in document order. With more
// than ten documents of one kind, re-sorting by the split names ("manifest-10" before
// "manifest-2") would reorder them.
func TestObjectsKeepDocumentOrder(t *testing.T) {
	var b strings.Builder
	var want []string
	for i := range 12 {
		fmt.Fprintf(&b, "---\n# Source: app/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%02d\n  namespace: apps\n", 11-i)
		want = append(want, fmt.Sprintf("ConfigMap/apps/cm-%02d", 11-i))
	}
	b.WriteString("---\n# Source: app/templates/empty.yaml\n")
	if diff := cmp.Diff(want, applycheck.Subjects(b.String())); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if _, err := applycheck.Objects("---\nkind: [unclosed\n"); err == nil {
		t.Error("a manifest that does not parse gave no error")
	}
}
