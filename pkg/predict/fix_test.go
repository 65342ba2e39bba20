package predict

import (
	"fmt"
	"testing"
)

func TestFixFor(t *testing.T) {
	for _, tc := range []struct {
		name      string
		f         Decision
		want      Fix
		automatic bool
	}{
		{"ok", Decision{Verdict: OK}, NoFix, false},
		{"migrate", Decision{Verdict: Migrate}, FixMigrate, true},
		{"delete", Decision{Verdict: Delete}, FixKeep, false},
		{"data loss", Decision{Verdict: DataLoss}, FixSchema, false},
		{"bridge with a common version", Decision{Verdict: Bridge, StorageSwitchTo: "v1alpha1"}, FixStorageSwitch, false},
		{"bridge without one", Decision{Verdict: Bridge}, FixSteppingStone, false},
	} {
		got := FixFor(tc.f)
		if got != tc.want || got.Automatic() != tc.automatic {
			t.Errorf("%s: FixFor() = %q (automatic %v), want %q (automatic %v)", tc.name, got, got.Automatic(), tc.want, tc.automatic)
		}
	}
}

func TestAnnotations(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  fmt.Stringer
		want string
	}{
		{"keep", Keep([]string{"a.x", "b.x"}), "kubectl annotate crd a.x b.x helm.sh/resource-policy=keep"},
		{"keep an object", KeepObject("ConfigMap", "cfg", "apps"), "kubectl annotate ConfigMap/cfg -n apps helm.sh/resource-policy=keep"},
		{"allow field loss", AllowFieldLoss([]string{"a.x"}), "kubectl annotate crd a.x upgradeguard.io/allow-field-loss=true"},
		{"allow delete", AllowDelete([]string{"a.x"}), "kubectl annotate crd a.x upgradeguard.io/allow-delete=true"},
		{"sync option", ArgoSyncOption([]string{"a.x"}, ArgoPruneFalse, ""), "kubectl annotate crd a.x argocd.argoproj.io/sync-options=Prune=false"},
		{"sync option merged", ArgoSyncOption([]string{"a.x"}, ArgoPruneFalse, "Replace=true,x=a b"),
			"kubectl annotate --overwrite crd a.x 'argocd.argoproj.io/sync-options=Replace=true,x=a b,Prune=false'"},
	} {
		if got := tc.got.String(); got != tc.want {
			t.Errorf("%s: String() = %q, want %q", tc.name, got, tc.want)
		}
	}
}
