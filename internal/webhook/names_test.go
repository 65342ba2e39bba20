package webhook_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

func TestMigrationName(t *testing.T) {
	for _, tc := range []struct{ ns, name, want string }{
		{"flux-system", "flux", "hr-flux-system-flux"},
		{"a", "b", "hr-a-b"},
	} {
		if got := webhook.MigrationName(tc.ns, tc.name); got != tc.want {
			t.Errorf("MigrationName(%s, %s) = %s, want %s", tc.ns, tc.name, got, tc.want)
		}
	}
	long := webhook.MigrationName(strings.Repeat("n", 63), strings.Repeat("r", 253))
	if errs := validation.IsDNS1123Subdomain(long); len(errs) > 0 || !strings.HasPrefix(long, "hr-nnn") {
		t.Errorf("long name %q: %v", long, errs)
	}
	if webhook.MigrationName(strings.Repeat("n", 63), strings.Repeat("r", 253)) == webhook.MigrationName(strings.Repeat("n", 63), strings.Repeat("r", 252)) {
		t.Error("two long names collide")
	}
}
