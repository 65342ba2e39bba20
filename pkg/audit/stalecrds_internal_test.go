package audit

import (
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
)

// helm-controller v1.6 takes an unset upgrade.crds as Create, which updates the CRDs of
// crds/ that exist when the upgrade applies server-side (its default) and skips them
// under client-side apply: only Skip, and Create without server-side apply, leave them
// stale.
func TestStaleCRDs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		upgrade *helmv2.Upgrade
		want    string // "" when the upgrades update them
	}{
		{"unset", nil, ""},
		{"unset, auto", &helmv2.Upgrade{ServerSideApply: helmv2.ServerSideApplyAuto}, ""},
		{"Create, enabled", &helmv2.Upgrade{CRDs: helmv2.Create, ServerSideApply: helmv2.ServerSideApplyEnabled}, ""},
		{"CreateReplace, disabled", &helmv2.Upgrade{CRDs: helmv2.CreateReplace, ServerSideApply: helmv2.ServerSideApplyDisabled}, ""},
		{"Skip", &helmv2.Upgrade{CRDs: helmv2.Skip}, "spec.upgrade.crds=Skip"},
		{"unset, disabled", &helmv2.Upgrade{ServerSideApply: helmv2.ServerSideApplyDisabled}, "spec.upgrade.crds unset (Create) with spec.upgrade.serverSideApply=disabled"},
		{"Create, disabled", &helmv2.Upgrade{CRDs: helmv2.Create, ServerSideApply: helmv2.ServerSideApplyDisabled}, "spec.upgrade.crds=Create with spec.upgrade.serverSideApply=disabled"},
	} {
		hr := &helmv2.HelmRelease{Spec: helmv2.HelmReleaseSpec{Upgrade: tc.upgrade}}
		got := staleCRDs(hr)
		if (got == "") != (tc.want == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
