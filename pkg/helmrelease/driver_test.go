package helmrelease_test

import (
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// TestParseDriver: the names Helm takes for its storage drivers, Helm's default for "",
// and an error that lists the drivers for anything else; NewReader takes the same.
func TestParseDriver(t *testing.T) {
	for name, want := range map[string]helmrelease.Driver{
		"": helmrelease.DriverSecret, "secret": helmrelease.DriverSecret, "secrets": helmrelease.DriverSecret,
		"configmap": helmrelease.DriverConfigMap, "configmaps": helmrelease.DriverConfigMap,
	} {
		got, err := helmrelease.ParseDriver(name)
		if err != nil || got != want {
			t.Errorf("ParseDriver(%q) = %q, %v; want %q", name, got, err, want)
		}
		r, err := helmrelease.NewReader(fake.NewClientset(), "ns", helmrelease.Driver(name))
		if err != nil || r.Driver() != want {
			t.Errorf("NewReader(%q): %v", name, err)
		}
	}
	for _, name := range []string{"sql", "memory", "Secret"} {
		const want = `: use secret or configmap`
		if _, err := helmrelease.ParseDriver(name); err == nil || err.Error() != `unknown Helm storage driver "`+name+`"`+want {
			t.Errorf("ParseDriver(%q): %v", name, err)
		}
		if _, err := helmrelease.NewReader(fake.NewClientset(), "ns", helmrelease.Driver(name)); err == nil {
			t.Errorf("NewReader(%q) accepted it", name)
		}
	}
}
