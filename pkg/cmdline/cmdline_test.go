package cmdline_test

import (
	"fmt"
	"testing"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    fmt.Stringer
		want string
	}{
		{"migrate", cmdline.Migrate{CRDs: []string{"a.x", "b.x"}}, "upgradeguard migrate --crd a.x --crd b.x"},
		{"migrate, waiting", cmdline.Migrate{CRDs: []string{"a.x"}, Wait: true}, "upgradeguard migrate --crd a.x --wait"},
		{"migrate manifests", cmdline.Migrate{Manifests: "out.yaml"}, "upgradeguard migrate --manifests out.yaml"},
		{"storage switch", cmdline.StorageSwitch{CRDs: []string{"a.x"}, StorageVersion: "v1"}, "upgradeguard migrate --crd a.x --storage-version v1 --allow-storage-switch"},
		{"reverse migration", cmdline.ReverseMigration{Release: "flux", Namespace: "flux-system", Revision: 3},
			"upgradeguard migrate --rollback --release flux -n flux-system --to-revision 3 --allow-storage-switch"},
		{"reverse migration to the previous revision", cmdline.ReverseMigration{Release: "flux"}, "upgradeguard migrate --rollback --release flux --allow-storage-switch"},
		{"annotate crds", cmdline.Annotate{Resource: "crd", Names: []string{"a.x", "b.x"}, Key: "helm.sh/resource-policy", Value: "keep"},
			"kubectl annotate crd a.x b.x helm.sh/resource-policy=keep"},
		{"annotate an object", cmdline.Annotate{Names: []string{"ConfigMap/cfg"}, Namespace: "apps", Key: "helm.sh/resource-policy", Value: "keep"},
			"kubectl annotate ConfigMap/cfg -n apps helm.sh/resource-policy=keep"},
		{"annotate, quoted and overwritten", cmdline.Annotate{Resource: "crd", Names: []string{"a.x"}, Key: "k", Value: "x=a b", Overwrite: true},
			"kubectl annotate --overwrite crd a.x 'k=x=a b'"},
		{"annotate, several pairs", cmdline.Annotate{Resource: "crd", Names: []string{"a.x"}, Key: "k", Value: "v", More: []cmdline.KeyValue{{Key: "l", Value: "w x"}}, Overwrite: true},
			"kubectl annotate --overwrite crd a.x k=v 'l=w x'"},
		{"label", cmdline.Label{Resource: "crd", Names: []string{"a.x"}, Key: "app.kubernetes.io/managed-by", Value: "Helm", Overwrite: true},
			"kubectl label --overwrite crd a.x app.kubernetes.io/managed-by=Helm"},
		{"crd adopt", cmdline.CRDAdopt{CRD: "a.x", FromNamespace: "apps", FromName: "op", ToNamespace: "apps", ToName: "op-crds", Chart: "repo/op-crds", Apply: true},
			"upgradeguard crd adopt a.x --from apps/op --to apps/op-crds --chart repo/op-crds --apply"},
		{"crd adopt, placeholders", cmdline.CRDAdopt{}, "upgradeguard crd adopt CRD --from NAMESPACE/RELEASE --to NAMESPACE/RELEASE"},
		{"snapshot", cmdline.Snapshot{}, "upgradeguard snapshot -o FILE"},
		{"snapshot, pushed", cmdline.Snapshot{Push: "oci://r.example/fleet/snapshots:prod"}, "upgradeguard snapshot --push oci://r.example/fleet/snapshots:prod"},
		{"helm registry login", cmdline.HelmRegistryLogin{Host: "r.example"}, "helm registry login r.example"},
		{"helm upgrade --install", cmdline.HelmUpgrade{Release: "op-crds", Namespace: "apps", Install: true}, "helm upgrade --install op-crds CHART -n apps"},
		{"crd backup", cmdline.CRDBackup{CRDs: []string{"a.x", "b.x"}, Dir: "./backup"}, "upgradeguard crd backup a.x b.x --dir ./backup"},
		{"crd restore", cmdline.CRDRestore{Dir: "./backup"}, "upgradeguard crd restore --dir ./backup"},
		{"delete objects", cmdline.DeleteObjects{CRDs: []string{"a.x", "b.x"}}, "kubectl delete a.x,b.x --all --all-namespaces"},
		{"plan", cmdline.Plan{Release: "flux", Namespace: "flux-system", Chart: "flux2", Version: "2.18.0"},
			"upgradeguard plan --release flux -n flux-system --chart flux2 --version 2.18.0"},
		{"plan a chart", cmdline.Plan{Chart: "flux2"}, "upgradeguard plan --chart flux2"},
		{"plan a HelmRelease", cmdline.PlanHelmRelease{Name: "flux", Namespace: "flux-system", Version: "2.18.0"},
			"upgradeguard plan --helmrelease flux-system/flux --version 2.18.0"},
		{"plan an Application", cmdline.PlanApplication{Name: "flux", Namespace: "argocd"}, "upgradeguard plan --argocd-app argocd/flux"},
		{"helm upgrade", cmdline.HelmUpgrade{Release: "flux", Namespace: "flux-system", Version: "2.18.0"}, "helm upgrade flux CHART --version 2.18.0 -n flux-system"},
		{"helm upgrade, every flag", cmdline.HelmUpgrade{Release: "web", Namespace: "apps", Chart: "web", Repo: "https://charts.example.io", Version: "1.2.0",
			PlainHTTP: true, ValuesFiles: []string{"a.yaml", "b.yaml"}}, "helm upgrade web web --repo https://charts.example.io --version 1.2.0 --plain-http -f a.yaml -f b.yaml -n apps"},
		{"helm upgrade of a local chart", cmdline.HelmUpgrade{Release: "web", Chart: "./charts/web"}, "helm upgrade web ./charts/web"},
		{"helm upgrade, the operation", cmdline.HelmUpgrade{}, "helm upgrade"},
		{"check", cmdline.Check{Release: "flux", Namespace: "flux-system", Chart: "<the chart of revision 3>"}, "upgradeguard check --release flux -n flux-system --chart <the chart of revision 3>"},
		{"check, the command", cmdline.Check{}, "upgradeguard check"},
		{"helm rollback", cmdline.HelmRollback{Release: "flux", Revision: 2}, "helm rollback flux 2"},
		{"helm rollback to the previous revision", cmdline.HelmRollback{Release: "flux", Namespace: "apps"}, "helm rollback flux -n apps"},
		{"check an Application", cmdline.CheckApplication{Name: "flux", Namespace: "argocd"}, "upgradeguard check --argocd-app argocd/flux"},
		{"check an Application's manifests", cmdline.CheckApplicationManifests{Name: "web"}, "argocd app manifests web | upgradeguard check --manifests -"},
		{"check an Application's manifests in a namespace", cmdline.CheckApplicationManifests{Name: "web", Namespace: "team-a"},
			"argocd app manifests team-a/web | upgradeguard check --manifests -"},
		{"uninstall backup", cmdline.UninstallBackup{Release: "db", Namespace: "apps"}, "upgradeguard release uninstall-check db -n apps --backup DIR"},
		{"HelmRelease version", cmdline.HelmReleaseVersion{Name: "flux", Namespace: "flux-system", Version: "2.18.0"},
			`commit spec.chart.spec.version: "2.18.0" to HelmRelease flux-system/flux (or: kubectl patch helmrelease flux -n flux-system --type merge -p '{"spec":{"chart":{"spec":{"version":"2.18.0"}}}}')`},
		{"Application revision", cmdline.ApplicationRevision{Name: "flux", Namespace: "argocd", Version: "2.18.0"},
			`commit targetRevision: "2.18.0" to the Helm source of Application argocd/flux (or: argocd app set argocd/flux --revision 2.18.0)`},
		{"Application revision of a second source", cmdline.ApplicationRevision{Name: "flux", Namespace: "argocd", Version: "2.18.0", SourcePosition: 2},
			`commit targetRevision: "2.18.0" to the Helm source of Application argocd/flux (or: argocd app set argocd/flux --source-position 2 --revision 2.18.0)`},
		{"helm get manifest", cmdline.HelmGetManifest{Release: "r", Namespace: "ns", Grep: "resource-policy"}, "helm get manifest r -n ns | grep resource-policy"},
		{"rbac", cmdline.RBAC{CRDs: []string{"NAME"}, Engine: "builtin"}, "upgradeguard rbac --crd NAME --engine builtin"},
		{"kubectl get", cmdline.Get{Resource: "applications.argoproj.io", AllNamespaces: true}, "kubectl get applications.argoproj.io -A"},
		{"kubectl get yaml", cmdline.Get{Output: "yaml"}, "kubectl get -o yaml"},
		{"kubectl delete, dry run", cmdline.Delete{Resource: "crd", Name: "a.x", DryRunServer: true}, "kubectl delete crd a.x --dry-run=server"},
		{"job logs", cmdline.JobLogs{Namespace: "ns", Job: "j"}, "kubectl -n ns logs job/j"},
		{"apply", cmdline.Apply{File: "charts/upgradeguard/crds/", ServerSide: true}, "kubectl apply --server-side -f charts/upgradeguard/crds/"},
		{"retain a volume", cmdline.RetainVolume{PersistentVolume: "pv-1"}, `kubectl patch pv pv-1 -p '{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}'`},
		{"flux reconcile", cmdline.Reconcile{Namespace: "ns", Name: "hr", Reset: true}, "flux reconcile helmrelease hr -n ns --reset"},
		{"argocd repo add with credentials", cmdline.RepoAdd{URL: "https://x", Type: "helm", Credentials: true}, "argocd repo add https://x --type helm --username USER --password PASSWORD"},
		{"argocd repo add over plain HTTP", cmdline.RepoAdd{URL: "x.io/c", Type: "helm", EnableOCI: true, PlainHTTP: true},
			"argocd repo add x.io/c --type helm --enable-oci --insecure-oci-force-http"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%s: String() = %q, want %q", tc.name, got, tc.want)
		}
	}
}
