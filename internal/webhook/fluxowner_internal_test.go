package webhook

import (
	"fmt"
	"testing"
)

// TestFluxOwner: the HelmRelease is read from the first object, in document order, that
// carries both of helm-controller's origin labels; a broken document before it is passed
// over.
func TestFluxOwner(t *testing.T) {
	obj := func(name, labels string) string {
		return fmt.Sprintf("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  labels: {%s}\n", name, labels)
	}
	owned := func(ns, hr string) string {
		return fmt.Sprintf("%s: %s, %s: %s", LabelFluxName, hr, LabelFluxNamespace, ns)
	}
	for _, tc := range []struct {
		name, manifest, wantNS, wantName string
	}{
		{name: "no labels", manifest: obj("a", "") + obj("b", "app: b")},
		{name: "name without namespace", manifest: obj("a", LabelFluxName+": web")},
		{name: "first in document order", manifest: obj("a", "") + obj("b", owned("flux-system", "first")) + obj("c", owned("flux-system", "second")),
			wantNS: "flux-system", wantName: "first"},
		{name: "after a broken document", manifest: obj("a", "") + "---\nkind: [unclosed\n" + obj("b", owned("apps", "web")),
			wantNS: "apps", wantName: "web"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, name := fluxOwner(tc.manifest)
			if ns != tc.wantNS || name != tc.wantName {
				t.Errorf("fluxOwner = %q/%q, want %q/%q", ns, name, tc.wantNS, tc.wantName)
			}
		})
	}
}
