package applycheck

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	release "helm.sh/helm/v4/pkg/release/v1"
)

// TestHookNames: Helm runs hooks by weight, then name (hookByWeight in pkg/action/hooks.go),
// whatever order the chart lists them in; a hook on several events is listed for each.
func TestHookNames(t *testing.T) {
	hooks := []*release.Hook{
		{Name: "z-migrate", Kind: "Job", Weight: -5, Events: []release.HookEvent{release.HookPreUpgrade}},
		{Name: "b-smoke", Kind: "Job", Weight: 0, Events: []release.HookEvent{release.HookPostUpgrade, release.HookPostRollback}},
		{Name: "a-backup", Kind: "Job", Weight: 0, Events: []release.HookEvent{release.HookPreUpgrade, release.HookPreRollback}},
		{Name: "c-cleanup", Kind: "Job", Weight: 0, Events: []release.HookEvent{release.HookPreDelete}},
		{Name: "a-notify", Kind: "ConfigMap", Weight: 10, Events: []release.HookEvent{release.HookPostUpgrade}},
	}
	pre, post := hookNames(hooks, release.HookPreUpgrade, release.HookPostUpgrade)
	if diff := cmp.Diff([]string{"Job/z-migrate", "Job/a-backup"}, pre); diff != "" {
		t.Errorf("pre-upgrade (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Job/b-smoke", "ConfigMap/a-notify"}, post); diff != "" {
		t.Errorf("post-upgrade (-want +got):\n%s", diff)
	}
	pre, post = hookNames(hooks, release.HookPreRollback, release.HookPostRollback)
	if !cmp.Equal(pre, []string{"Job/a-backup"}) || !cmp.Equal(post, []string{"Job/b-smoke"}) {
		t.Errorf("rollback: pre %v post %v", pre, post)
	}
	if hooks[0].Name != "z-migrate" {
		t.Error("hookNames sorted the caller's slice")
	}
}
