package applycheck

import (
	"fmt"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"

	"github.com/upgradeguard/upgradeguard/pkg/redact"
)

// TestRedactsWhatRedactHides: an upgrade's or rollback's report hides exactly what
// pkg/redact hides, from every source the operation involves (the values given, each
// revision's values, the Secret data of each manifest and hook, the new chart's). Each
// source holds a string of MinLen bytes, one shorter and a blank one; a copy of the rule
// with another minimum, or a source left out, fails here.
func TestRedactsWhatRedactHides(t *testing.T) {
	var all []string
	source := func(name string) (values map[string]any, secret string) {
		long, short := name+"-long", name[:redact.MinLen-1]
		all = append(all, long, short)
		return map[string]any{"k": long, "short": short, "blank": "    "},
			fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\nstringData:\n  long: %s\n  short: %s\n  blank: '    '\n", name, long+"-s", short)
	}
	secretOf := func(name string) string { _, s := source(name); all = append(all, name+"-long-s"); return s }
	rev := func(v int, status common.Status, name string) *release.Release {
		values, _ := source(name + "v")
		return &release.Release{Name: "app", Version: v, Info: &release.Info{Status: status}, Config: values,
			Manifest: secretOf(name + "m"), Hooks: []*release.Hook{{Manifest: secretOf(name + "h")}}}
	}
	given, _ := source("given")
	history := []*release.Release{rev(1, common.StatusSuperseded, "one"), rev(2, common.StatusDeployed, "two"), rev(3, common.StatusFailed, "thr")}
	target := secretOf("target")
	hook := secretOf("thook")

	for _, rc := range []ReleaseCheck{
		{Release: "app", History: history, Operation: OpUpgrade, Values: given, TargetManifest: target, TargetHooks: []*release.Hook{{Manifest: hook}}},
		{Release: "app", History: history, Operation: OpRollback, ToRevision: 2},
	} {
		_, _, got, err := rc.plan(history[2])
		if err != nil {
			t.Fatal(err)
		}
		want := redact.New()
		switch rc.Operation {
		case OpUpgrade: // from the last deployed revision (2), over the last one (3), to the new chart
			want.AddValues(given)
			for _, r := range history[1:] {
				want.AddValues(r.Config)
				want.AddManifest(r.Manifest)
				want.AddManifest(r.Hooks[0].Manifest)
			}
			want.AddManifest(target)
			want.AddManifest(hook)
		case OpRollback: // from the last revision (3) to revision 2
			for _, r := range history[1:] {
				want.AddValues(r.Config)
				want.AddManifest(r.Manifest)
				want.AddManifest(r.Hooks[0].Manifest)
			}
		}
		msg := "rejected: " + strings.Join(all, ", ") + ", indented:    end"
		if g, w := got.String(msg), want.String(msg); g != w {
			t.Errorf("%s: applycheck hides\n%s\npkg/redact hides\n%s", rc.Operation, g, w)
		}
		hidden := 0
		for _, s := range all {
			if !strings.Contains(want.String(msg), s) {
				hidden++
			}
		}
		if hidden == 0 || !strings.Contains(got.String(msg), ", indented:    end") {
			t.Errorf("%s: %d strings hidden, blank kept: %q", rc.Operation, hidden, got.String(msg))
		}
	}
}
