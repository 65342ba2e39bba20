package argoapp_test

import (
	"testing"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
)

func TestTrackedBy(t *testing.T) {
	for _, c := range []struct {
		value, ns, name string
		ok              bool
	}{
		// As Argo CD v3.6.1 wrote it on a CRD it synced (test/argocd).
		{"bridge:apiextensions.k8s.io/CustomResourceDefinition:bridge/cleanuppolicies.kyverno.io", "argocd", "bridge", true},
		{"team-a_web:/ConfigMap:web/settings", "team-a", "web", true},
		{"", "", "", false},
		{"web", "", "", false},
		{":apps/Deployment:web/web", "", "", false},
		{"_web:apps/Deployment:web/web", "", "", false},
		{"web:apps/Deployment", "", "", false},
	} {
		ns, name, ok := argoapp.TrackedBy(map[string]string{argoapp.TrackingAnnotation: c.value})
		if ns != c.ns || name != c.name || ok != c.ok {
			t.Errorf("TrackedBy(%q) = %q, %q, %t; want %q, %q, %t", c.value, ns, name, ok, c.ns, c.name, c.ok)
		}
	}
}
