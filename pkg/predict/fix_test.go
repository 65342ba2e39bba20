package predict

import "testing"

func TestFixFor(t *testing.T) {
	for _, tc := range []struct {
		name      string
		f         Finding
		want      Fix
		automatic bool
	}{
		{"ok", Finding{Verdict: OK}, NoFix, false},
		{"migrate", Finding{Verdict: Migrate}, FixMigrate, true},
		{"delete", Finding{Verdict: Delete}, FixKeep, false},
		{"data loss", Finding{Verdict: DataLoss}, FixSchema, false},
		{"bridge with a common version", Finding{Verdict: Bridge, StorageSwitchTo: "v1alpha1"}, FixStorageSwitch, false},
		{"bridge without one", Finding{Verdict: Bridge}, FixSteppingStone, false},
	} {
		got := FixFor(tc.f)
		if got != tc.want || got.Automatic() != tc.automatic {
			t.Errorf("%s: FixFor() = %q (automatic %v), want %q (automatic %v)", tc.name, got, got.Automatic(), tc.want, tc.automatic)
		}
	}
}

func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		c    Command
		want string
	}{
		{Command{Kind: CommandMigrate, CRDs: []string{"a.x", "b.x"}}, "upgradeguard migrate --crd a.x --crd b.x"},
		{Command{Kind: CommandMigrate, CRDs: []string{"a.x"}, Wait: true}, "upgradeguard migrate --crd a.x --wait"},
		{Command{Kind: CommandStorageSwitch, CRDs: []string{"a.x"}, StorageVersion: "v1"}, "upgradeguard migrate --crd a.x --storage-version v1 --allow-storage-switch"},
		{Command{Kind: CommandReverseMigration, Release: "flux", Namespace: "flux-system", Revision: 3},
			"upgradeguard migrate --rollback --release flux -n flux-system --to-revision 3 --allow-storage-switch"},
		{Command{Kind: CommandReverseMigration, Release: "flux"}, "upgradeguard migrate --rollback --release flux --allow-storage-switch"},
		{Command{Kind: CommandKeep, CRDs: []string{"a.x", "b.x"}}, "kubectl annotate crd a.x b.x helm.sh/resource-policy=keep"},
		{Command{Kind: CommandAllowFieldLoss, CRDs: []string{"a.x"}}, "kubectl annotate crd a.x upgradeguard.io/allow-field-loss=true"},
		{Command{Kind: CommandAllowDelete, CRDs: []string{"a.x"}}, "kubectl annotate crd a.x upgradeguard.io/allow-delete=true"},
		{Command{Kind: CommandCRDBackup, CRDs: []string{"a.x", "b.x"}, Dir: "./backup"}, "upgradeguard crd backup a.x b.x --dir ./backup"},
		{Command{Kind: CommandCRDRestore, Dir: "./backup"}, "upgradeguard crd restore --dir ./backup"},
		{Command{Kind: CommandDeleteObjects, CRDs: []string{"a.x", "b.x"}}, "kubectl delete a.x,b.x --all --all-namespaces"},
		{Command{Kind: CommandPlan, Release: "flux", Namespace: "flux-system", Chart: "flux2", ChartVersion: "2.18.0"},
			"upgradeguard plan --release flux -n flux-system --chart flux2 --version 2.18.0"},
		{Command{Kind: CommandPlan, Chart: "flux2"}, "upgradeguard plan --chart flux2"},
		{Command{Kind: CommandPlanHelmRelease, Release: "flux", Namespace: "flux-system", ChartVersion: "2.18.0"},
			"upgradeguard plan --helmrelease flux-system/flux --version 2.18.0"},
		{Command{Kind: CommandPlanApplication, Release: "flux", Namespace: "argocd"}, "upgradeguard plan --argocd-app argocd/flux"},
		{Command{Kind: CommandHelmUpgrade, Release: "flux", Namespace: "flux-system", ChartVersion: "2.18.0"}, "helm upgrade flux CHART --version 2.18.0 -n flux-system"},
		{Command{Kind: CommandHelmUpgrade, Release: "web", Namespace: "apps", Chart: "web", Repo: "https://charts.example.io", ChartVersion: "1.2.0",
			PlainHTTP: true, ValuesFiles: []string{"a.yaml", "b.yaml"}}, "helm upgrade web web --repo https://charts.example.io --version 1.2.0 --plain-http -f a.yaml -f b.yaml -n apps"},
		{Command{Kind: CommandHelmUpgrade, Release: "web", Chart: "./charts/web"}, "helm upgrade web ./charts/web"},
		{Command{Kind: CommandCheck, Release: "flux", Namespace: "flux-system", Chart: "<the chart of revision 3>"}, "upgradeguard check --release flux -n flux-system --chart <the chart of revision 3>"},
		{Command{Kind: CommandHelmRollback, Release: "flux", Revision: 2}, "helm rollback flux 2"},
		{Command{Kind: CommandCheckApplication, Release: "flux", Namespace: "argocd"}, "upgradeguard check --argocd-app argocd/flux"},
		{Command{Kind: CommandCheckApplicationManifests, Release: "web"}, "argocd app manifests web | upgradeguard check --manifests -"},
		{Command{Kind: CommandCheckApplicationManifests, Release: "web", Namespace: "team-a"}, "argocd app manifests team-a/web | upgradeguard check --manifests -"},
		{Command{Kind: CommandUninstallBackup, Release: "db", Namespace: "apps"}, "upgradeguard release uninstall-check db -n apps --backup DIR"},
		{Command{Kind: CommandHelmReleaseVersion, Release: "flux", Namespace: "flux-system", ChartVersion: "2.18.0"},
			`commit spec.chart.spec.version: "2.18.0" to HelmRelease flux-system/flux (or: kubectl patch helmrelease flux -n flux-system --type merge -p '{"spec":{"chart":{"spec":{"version":"2.18.0"}}}}')`},
		{Command{Kind: CommandApplicationRevision, Release: "flux", Namespace: "argocd", ChartVersion: "2.18.0"},
			`commit targetRevision: "2.18.0" to the Helm source of Application argocd/flux (or: argocd app set argocd/flux --revision 2.18.0)`},
		{Command{Kind: CommandApplicationRevision, Release: "flux", Namespace: "argocd", ChartVersion: "2.18.0", SourcePosition: 2},
			`commit targetRevision: "2.18.0" to the Helm source of Application argocd/flux (or: argocd app set argocd/flux --source-position 2 --revision 2.18.0)`},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%s: String() = %q, want %q", tc.c.Kind, got, tc.want)
		}
	}
}
