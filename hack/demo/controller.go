package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

const cleanups = "cleanuppolicies.kyverno.io"

// automatic shows the controller's proactive mode: a chart switches a storage version,
// the controller migrates within seconds, and the next upgrade, which drops the old
// version, goes through with no human action.
func (d *demo) automatic(ctx context.Context) error {
	kyverno := func(v string) []string {
		dir := "crds/kyverno/" + v + "/"
		return []string{dir + "kyverno.io_policyexceptions.yaml", dir + "kyverno.io_cleanuppolicies.yaml", dir + "kyverno.io_updaterequests.yaml"}
	}
	charts := filepath.Join(d.work, "charts")
	for _, v := range []string{"1.10.7", "1.11.4", "1.13.4"} {
		if _, err := testenv.FixtureChart(filepath.Join(charts, "kyverno-"+v), "kyverno", v, kyverno("v"+v)...); err != nil {
			return err
		}
	}

	step(`Now the automatic way. Install upgradeguard's CRDs, start 'upgradeguard controller' and
give it a StorageMigrationPolicy in proactive mode for the kyverno.io group.`)
	if err := testenv.ApplyUpgradeguardCRDs(ctx, d.cp.Config); err != nil {
		return err
	}
	c, err := client.New(d.cp.Config, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		return err
	}
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "kyverno"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"kyverno.io"}, Proactive: ptr.To(true)}}
	if err := c.Create(ctx, policy); err != nil {
		return err
	}
	metrics, err := freeAddr()
	if err != nil {
		return err
	}
	args := []string{"controller", "--enable-webhook=false", "--leader-election-namespace", "default",
		"--metrics-bind-address", metrics, "--health-probe-bind-address", "0"}
	fmt.Printf("\n$ upgradeguard %s &\n", strings.Join(args, " "))
	ctl := exec.CommandContext(ctx, d.ug, args...)
	ctl.Env = append(ctl.Environ(), "KUBECONFIG="+d.cp.Kubeconfig)
	if err := ctl.Start(); err != nil {
		return err
	}
	defer func() { _ = ctl.Process.Kill(); _ = ctl.Wait() }()

	step(`Kyverno 1.10 stores CleanupPolicies at v2alpha1; 20 are created. The upgrade to 1.11
switches the storage version to v2beta1 (kyverno#12633 starts here: 1.13 later drops
v2alpha1, and clusters that still list it in storedVersions cannot upgrade).`)
	if err := d.helm("install", "kyverno", "charts/kyverno-1.10.7/kyverno", "-n", "kyverno", "--create-namespace"); err != nil {
		return err
	}
	if err := testenv.WaitEstablished(ctx, d.crds, cleanups); err != nil {
		return err
	}
	if err := testenv.CreateObjects(ctx, d.cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "kyverno.io", Version: "v2alpha1", Resource: "cleanuppolicies"},
		Kind: "CleanupPolicy", Namespaces: []string{"team-a"}, PerNS: 20,
		Spec: map[string]any{"schedule": "*/30 * * * *"},
	}); err != nil {
		return err
	}
	if err := d.helm("upgrade", "kyverno", "charts/kyverno-1.11.4/kyverno", "-n", "kyverno"); err != nil {
		return err
	}
	switched := time.Now()

	step(`Within seconds the controller has re-persisted every CleanupPolicy at v2beta1 and pruned
storedVersions: nobody ran anything.`)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd, err := d.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, cleanups, metav1.GetOptions{})
		return err == nil && slices.Equal(crd.Status.StoredVersions, []string{"v2beta1"}), nil
	})
	if err != nil {
		return fmt.Errorf("the controller did not prune %s: %w", cleanups, err)
	}
	fmt.Printf("  storedVersions became [v2beta1] %s after the storage switch\n", time.Since(switched).Round(100*time.Millisecond))
	sm := &v1alpha1.StorageMigration{}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := c.Get(ctx, client.ObjectKey{Name: controller.ProactiveName(cleanups)}, sm)
		return err == nil && sm.Status.Phase == v1alpha1.PhaseSucceeded, nil
	})
	if err != nil {
		return fmt.Errorf("StorageMigration %s did not succeed: %w", controller.ProactiveName(cleanups), err)
	}
	for _, r := range sm.Status.Resources {
		fmt.Printf("  StorageMigration %s: %s, %s: %d objects, %d rewritten, storedVersions %v -> %v\n",
			sm.Name, sm.Status.Phase, r.Name, r.Objects, r.Rewritten, r.StoredVersionsBefore, r.StoredVersionsAfter)
	}
	if body, err := get("http://" + metrics + "/metrics"); err == nil {
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "upgradeguard_migrations_total") || strings.HasPrefix(line, "upgradeguard_objects_rewritten_total{crd=\""+cleanups) {
				fmt.Println("  " + line)
			}
		}
	}

	step(`So the upgrade to 1.13, which drops v2alpha1, is safe: check agrees, and Helm succeeds.`)
	d.upgradeguard("check", "--chart", "charts/kyverno-1.13.4/kyverno", "--release", "kyverno", "-n", "kyverno")
	return d.helm("upgrade", "kyverno", "charts/kyverno-1.13.4/kyverno", "-n", "kyverno")
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
