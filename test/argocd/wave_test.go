//go:build argocd

package argocd_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
)

// waveGroup is the group of the CRD the wave test migrates.
const waveGroup = "wave.upgradeguard.test"

// TestSyncWaveWaitsForStorageMigration: an Application whose wave 0 is a StorageMigration
// and whose wave 1 is a ConfigMap, synced by the real application-controller.
//
// With deploy/argocd/argocd-cm.yaml loaded (the way an operator merges it into argocd-cm),
// Argo CD judges the StorageMigration with upgradeguard's health check: while no
// controller has migrated anything it is Progressing, the sync waits in wave 0 and the
// ConfigMap is not applied. Once upgradeguard's controller starts and the migration
// succeeds, the sync goes on: the ConfigMap is created after the migration's completion
// and the CRD's storedVersions are pruned.
//
// With Argo CD's own settings (the control), Argo CD has no health check for the kind and
// applies wave 1 at once, though the migration never ran: what the shipped file prevents.
func TestSyncWaveWaitsForStorageMigration(t *testing.T) {
	needCluster(t)
	ctrllog.SetLogger(logr.Discard()) // the test reads the API, not the manager's logs
	for _, tc := range []struct {
		name     string
		settings func(*testing.T) map[string]string
		waits    bool
	}{
		{name: "upgradeguard-health-checks", settings: shippedSettings, waits: true},
		{name: "argo-cd-defaults", settings: func(*testing.T) map[string]string { return nil }, waits: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			cp := testenv.ForTest(t)
			if err := testenv.ApplyUpgradeguardCRDs(ctx, cp.Config); err != nil {
				t.Fatal(err)
			}
			crd := staleCRD(t, cp, 30)
			argo := argocd.Start(t, cp, argocd.Options{Settings: tc.settings(t), PersistResourceHealth: true})

			const name, migration, configMap = "wave", "wave-migrate", "after-migration"
			repo := servers.NewGitRepo(t)
			commit := repo.Commit("a migration, then what needs it", map[string]string{
				"wave/storagemigration.yaml": `apiVersion: upgradeguard.io/v1alpha1
kind: StorageMigration
metadata:
  name: ` + migration + `
  annotations:
    argocd.argoproj.io/sync-wave: "0"
spec:
  resources: [` + crd + `]
`,
				"wave/configmap.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: ` + configMap + `
  annotations:
    argocd.argoproj.io/sync-wave: "1"
data:
  needs: ` + crd + `
`,
			}).String()
			app := argocd.AutomatedApplication(name, argocd.GitSource(repo.Dir, "wave", commit), name,
				argocd.SyncRetry{Limit: 2, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second})
			if err := argo.Create(ctx, app); err != nil {
				t.Fatal(err)
			}
			ug, err := client.New(cp.Config, client.Options{Scheme: controller.NewScheme()})
			if err != nil {
				t.Fatal(err)
			}
			cms := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ConfigMaps(name)

			if !tc.waits {
				got := waitSucceeded(t, argo, name, commit)
				t.Logf("%s", got)
				sm := &v1alpha1.StorageMigration{}
				if err := ug.Get(ctx, client.ObjectKey{Name: migration}, sm); err != nil {
					t.Fatal(err)
				}
				if _, err := cms.Get(ctx, configMap, metav1.GetOptions{}); err != nil {
					t.Fatalf("ConfigMap of wave 1: %v", err)
				}
				if sm.Status.Phase != "" {
					t.Fatalf("StorageMigration phase %q with no controller running", sm.Status.Phase)
				}
				t.Logf("without upgradeguard's health checks Argo CD applied wave 1 while the migration had not started (health %q)",
					got.ResourceHealth("StorageMigration", migration))
				return
			}

			// Wave 0 is applied and judged Progressing: the sync waits there.
			held, err := argo.WaitApplication(ctx, name, 3*time.Minute, func(app *argocd.Application) bool {
				op := app.Status.OperationState
				return op != nil && op.Phase == "Running" && app.ResourceHealth("StorageMigration", migration) == "Progressing" &&
					strings.Contains(op.Message, "waiting for healthy state of upgradeguard.io/StorageMigration/"+migration)
			})
			if err != nil {
				t.Fatalf("Argo CD never held wave 0 on a Progressing StorageMigration: %v\n%s", err, argo.LogTail(30))
			}
			t.Logf("held: %s", held)
			script := tc.settings(t)["resource.customizations.health.upgradeguard.io_StorageMigration"]
			sameAsHarness(t, argo, cp, name, migration, script)
			if _, err := cms.Get(ctx, configMap, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("ConfigMap of wave 1 while the migration has not run: %v, want NotFound", err)
			}

			startController(t, cp)
			done := waitSucceeded(t, argo, name, commit)
			t.Logf("%s", done)
			sm := &v1alpha1.StorageMigration{}
			if err := ug.Get(ctx, client.ObjectKey{Name: migration}, sm); err != nil {
				t.Fatal(err)
			}
			if sm.Status.Phase != v1alpha1.PhaseSucceeded || sm.Status.CompletionTime == nil {
				t.Fatalf("StorageMigration %s: phase %q, completed %v; want Succeeded", migration, sm.Status.Phase, sm.Status.CompletionTime)
			}
			cm, err := cms.Get(ctx, configMap, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("ConfigMap of wave 1 after the sync: %v", err)
			}
			// Both times are whole seconds: the ConfigMap is not older than the completion.
			if cm.CreationTimestamp.Before(sm.Status.CompletionTime) {
				t.Errorf("ConfigMap created %s, before the migration completed %s", cm.CreationTimestamp, sm.Status.CompletionTime)
			}
			if h := sameAsHarness(t, argo, cp, name, migration, script); h.Status != "Healthy" {
				t.Errorf("Argo CD reports the succeeded StorageMigration %+v, want Healthy", h)
			}
			live, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(live.Status.StoredVersions, []string{"v1"}) {
				t.Errorf("%s storedVersions %v after the sync, want [v1]", crd, live.Status.StoredVersions)
			}
		})
	}
}

// shippedSettings are the entries of deploy/argocd/argocd-cm.yaml, as an operator merges
// them into argocd-cm.
func shippedSettings(t *testing.T) map[string]string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "argocd", "argocd-cm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatalf("deploy/argocd/argocd-cm.yaml: %v", err)
	}
	if len(cm.Data) == 0 {
		t.Fatal("deploy/argocd/argocd-cm.yaml has no entries")
	}
	return cm.Data
}

// staleCRD creates a CRD with n objects stored at v1alpha1, then makes v1 its storage
// version: storedVersions [v1alpha1 v1], what the wave's StorageMigration migrates.
func staleCRD(t *testing.T, cp *testenv.ControlPlane, n int) string {
	t.Helper()
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD(waveGroup, "widgets", "Widget")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: waveGroup, Version: "v1alpha1", Resource: "widgets"},
		Kind: "Widget", Namespaces: []string{"widgets"}, PerNS: n, Spec: map[string]any{"size": int64(3)}}); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	return crd.Name
}

// startController runs upgradeguard's controller manager (no webhook) until the test ends.
func startController(t *testing.T, cp *testenv.ControlPlane) {
	t.Helper()
	mgr, err := controller.NewManager(cp.Config, controller.Options{
		LeaderElectionNamespace: "default", MetricsAddr: "0", ProbeAddr: "0", SkipNameValidation: true, // one manager per test
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunManager(t, mgr)
}

// sameAsHarness waits until the real Argo CD's health of the Application's
// StorageMigration is what argoenv.RunHealth (the harness deploy/argocd's unit tests judge
// the scripts with) gives for script on the object as the API server holds it, and
// returns it: the harness and Argo CD agree on the same input. The object does not
// change meanwhile (no controller runs, or its migration is over).
func sameAsHarness(t *testing.T, argo *argocd.ArgoCD, cp *testenv.ControlPlane, app, migration, script string) argocd.Health {
	t.Helper()
	obj, err := dynamic.NewForConfigOrDie(cp.Config).Resource(v1alpha1.GroupVersion.WithResource("storagemigrations")).Get(t.Context(), migration, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := argocd.RunHealth(t.Context(), script, obj.Object)
	if err != nil {
		t.Fatalf("the harness on StorageMigration %s: %v", migration, err)
	}
	var got argocd.Health
	_, err = argo.WaitApplication(t.Context(), app, time.Minute, func(a *argocd.Application) bool {
		for _, r := range a.Status.Resources {
			if r.Kind == "StorageMigration" && r.Name == migration && r.Health != nil {
				got = *r.Health
			}
		}
		return got == want
	})
	if err != nil {
		t.Fatalf("Argo CD's health of StorageMigration %s is %+v; the harness gives %+v for the same object", migration, got, want)
	}
	t.Logf("Argo CD and the harness agree on StorageMigration %s: %+v", migration, got)
	return got
}

// waitSucceeded waits until the Application's sync operation of revision has succeeded.
func waitSucceeded(t *testing.T, argo *argocd.ArgoCD, name, revision string) *argocd.Application {
	t.Helper()
	app, err := argo.WaitApplication(t.Context(), name, 4*time.Minute, func(app *argocd.Application) bool {
		op := app.Status.OperationState
		return op != nil && op.Operation.Sync.Revision == revision && op.Phase == "Succeeded"
	})
	if err != nil {
		t.Fatalf("the sync of %s never succeeded: %v\n%s", revision, err, argo.LogTail(30))
	}
	return app
}
