package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
)

// fluxIncident puts a cluster in the Flux incident's state: n HelmRepositories stored at
// v1beta2, then the flux2 2.17.2 CRDs that store them at v1 (storedVersions [v1beta2 v1]).
func fluxIncident(ctx context.Context, cp *testenv.ControlPlane, n int) error {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	if err := testenv.ApplyFixtureCRDs(ctx, cs, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml"); err != nil {
		return err
	}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: hrV1beta2, Kind: "HelmRepository", Namespaces: []string{"team-a"}, PerNS: n,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		return err
	}
	return testenv.ApplyFixtureCRDs(ctx, cs, "charts/flux2-2.17.2/rendered/crds.yaml")
}

func storedVersionsOn(ctx context.Context, cp *testenv.ControlPlane) ([]string, error) {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return crd.Status.StoredVersions, nil
}

// clusterStatus is the entry of policy "fleet" for cluster, or nil.
func clusterStatus(ctx context.Context, c client.Client, cluster string) (*v1alpha1.ClusterStatus, error) {
	p := &v1alpha1.StorageMigrationPolicy{}
	if err := c.Get(ctx, client.ObjectKey{Name: "fleet"}, p); err != nil {
		return nil, err
	}
	for i := range p.Status.Clusters {
		if p.Status.Clusters[i].Name == cluster {
			return &p.Status.Clusters[i], nil
		}
	}
	return nil, nil
}

// TestFleetProactive: one controller, five target clusters (five kube-apiservers on one
// etcd) in the Flux incident's state, their kubeconfig Secrets in the layouts people have
// (Flux value and value.yaml, Cluster API <cluster>-kubeconfig, a plain kubeconfig key).
// Proactive mode prunes storedVersions on each; a cluster stopped mid-run is reported
// Unreachable while the others complete, and completes once it is back; a rotated
// Secret is picked up (to credentials that may not read CRDs: Forbidden; then to good
// ones: Ready); a deleted Secret drops its target.
func TestFleetProactive(t *testing.T) {
	e := setup(t)
	f := testenv.FleetForTest(t, 5)
	const n = 150
	g, gctx := errgroup.WithContext(e.ctx)
	for _, c := range f.Clusters {
		g.Go(func() error { return fluxIncident(gctx, c, n) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	const ns = "fleet"
	if err := e.c.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	kubeconfig := func(cp *testenv.ControlPlane) []byte {
		data, err := os.ReadFile(cp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	selected := map[string]string{"fleet.example.com/managed": "true"}
	// name -> (Secret name, key, extra labels)
	layouts := []struct{ cluster, secret, key string }{
		{"c0", "c0", "value"},            // Flux
		{"c1", "c1", "value.yaml"},       // Flux
		{"c2", "c2-kubeconfig", "value"}, // Cluster API
		{"c3", "c3", "kubeconfig"},       // plain
		{"c4", "c4", "value"},
	}
	for i, l := range layouts {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: l.secret, Namespace: ns, Labels: selected},
			Data: map[string][]byte{l.key: kubeconfig(f.Clusters[i])}}
		if l.cluster == "c2" {
			s.Labels = map[string]string{"fleet.example.com/managed": "true", controller.LabelCAPICluster: "c2"}
		}
		if err := e.c.Create(e.ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), s) })
	}
	// A Secret the selector leaves out is no target.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-selected", Namespace: ns}, Data: map[string][]byte{"value": kubeconfig(f.Clusters[0])}}
	if err := e.c.Create(e.ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), other) })

	p := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fleet"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"source.toolkit.fluxcd.io"}, Proactive: ptr.To(true),
			Rate:    v1alpha1.RateSettings{QPS: 20, Burst: 1, PageSize: 10, Concurrency: 1},
			Targets: &v1alpha1.FleetTargets{Namespace: ns, Selector: metav1.LabelSelector{MatchLabels: selected}}}}
	if err := e.c.Create(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), p) })
	// Before the controller runs, audit --fleet sees every target's pending CRD.
	rep, code := fleetAudit(t)
	if code != 1 || len(rep.Clusters) != 5 || rep.NeedsAction != 5 {
		t.Fatalf("audit --fleet before the controller: exit %d, %+v; want exit 1 and five clusters needing action", code, rep)
	}
	for _, c := range rep.Clusters {
		if c.Error != "" || len(c.PendingCRDs) != 1 || c.PendingCRDs[0].Name != helmrepos || c.LastMigration != nil {
			t.Errorf("audit --fleet, cluster %s: %+v; want %s pending and no migration yet", c.Name, c, helmrepos)
		}
	}
	succeededC1 := testutil.ToFloat64(metrics.Migrations.WithLabelValues("c1", metrics.ResultSucceeded))

	startController(t, "ug-fleet", controller.Options{MaxConcurrentMigrations: 5, SaveEvery: 100 * time.Millisecond,
		Fleet: controller.FleetOptions{ProbeEvery: time.Second, ProbeTimeout: 3 * time.Second, MaxBackoff: 2 * time.Second}})

	// Stop c2 in the middle of its migration.
	down := f.Clusters[2]
	waitFor(t, 60*time.Second, "c2's migration under way", func() (bool, error) {
		sm := &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: controller.FleetName("c2", helmrepos)}, sm)
		return err == nil && len(sm.Status.Resources) == 1 && sm.Status.Resources[0].Objects >= 10, client.IgnoreNotFound(err)
	})
	if err := down.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "c2 reported Unreachable", func() (bool, error) {
		st, err := clusterStatus(e.ctx, e.c, "c2")
		return st != nil && st.State == v1alpha1.ClusterUnreachable && st.Reason != "", err
	})
	// The stop came mid-migration: part of c2's objects rewritten, the rest, and the
	// prune, still to do.
	midRun := &v1alpha1.StorageMigration{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: controller.FleetName("c2", helmrepos)}, midRun); err != nil {
		t.Fatal(err)
	}
	if rs := midRun.Status.Resources; midRun.Status.Phase == v1alpha1.PhaseSucceeded || len(rs) != 1 || rs[0].Objects == 0 || rs[0].Objects >= n ||
		rs[0].Phase == v1alpha1.PhaseSucceeded || slices.Equal(rs[0].StoredVersionsAfter, []string{"v1"}) {
		t.Fatalf("c2 stopped mid-migration, yet its StorageMigration %s is %s with progress %+v; want part of the %d objects done and nothing pruned",
			midRun.Name, midRun.Status.Phase, rs, n)
	}
	for _, i := range []int{0, 1, 3, 4} {
		waitFor(t, 90*time.Second, fmt.Sprintf("c%d pruned while c2 is down", i), func() (bool, error) {
			got, err := storedVersionsOn(e.ctx, f.Clusters[i])
			return slices.Equal(got, []string{"v1"}), err
		})
	}
	if st, err := clusterStatus(e.ctx, e.c, "c2"); err != nil || st == nil || st.State != v1alpha1.ClusterUnreachable {
		t.Fatalf("c2 while its API server is down: %+v, %v; want Unreachable", st, err)
	}
	pol := &v1alpha1.StorageMigrationPolicy{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: "fleet"}, pol); err != nil {
		t.Fatal(err)
	}
	if len(pol.Status.Clusters) != 5 {
		t.Errorf("status.clusters %+v, want the five selected Secrets' clusters (not the unselected one)", pol.Status.Clusters)
	}

	if err := down.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 120*time.Second, "c2 pruned after it came back", func() (bool, error) {
		got, err := storedVersionsOn(e.ctx, down)
		return slices.Equal(got, []string{"v1"}), client.IgnoreNotFound(err)
	})
	waitFor(t, 30*time.Second, "every cluster Ready with nothing pending", func() (bool, error) {
		p := &v1alpha1.StorageMigrationPolicy{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: "fleet"}, p); err != nil {
			return false, err
		}
		for _, c := range p.Status.Clusters {
			if c.State != v1alpha1.ClusterReady || len(c.PendingCRDs) != 0 || c.EligibleCRDs == 0 {
				return false, nil
			}
		}
		return len(p.Status.Clusters) == 5, nil
	})
	for i, l := range layouts {
		sm := &v1alpha1.StorageMigration{}
		waitFor(t, 30*time.Second, l.cluster+"'s StorageMigration finished", func() (bool, error) {
			err := e.c.Get(e.ctx, client.ObjectKey{Name: controller.FleetName(l.cluster, helmrepos)}, sm)
			return err == nil && terminalPhase(sm.Status.Phase), err
		})
		rp := sm.Status.Resources[0]
		if sm.Status.Phase != v1alpha1.PhaseSucceeded || sm.Labels[controller.LabelCluster] != l.cluster || rp.Objects != n ||
			!slices.Equal(rp.StoredVersionsAfter, []string{"v1"}) {
			t.Errorf("c%d: StorageMigration %s: phase %s, labels %v, progress %+v", i, sm.Name, sm.Status.Phase, sm.Labels, rp)
		}
	}
	if got := testutil.ToFloat64(metrics.Migrations.WithLabelValues("c1", metrics.ResultSucceeded)) - succeededC1; got != 1 {
		t.Errorf("upgradeguard_migrations_total{cluster=c1,result=succeeded} grew by %v, want 1", got)
	}

	// Rotation: c0's Secret now holds credentials that may not read CRDs, then good ones.
	before, err := clusterStatus(e.ctx, e.c, "c0")
	if err != nil || before == nil {
		t.Fatal(before, err)
	}
	rotate := func(path string) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: "c0"}, s); err != nil {
			t.Fatal(err)
		}
		s.Data = map[string][]byte{"value": data}
		if err := e.c.Update(e.ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	weak, err := f.Clusters[0].UserKubeconfig("weak")
	if err != nil {
		t.Fatal(err)
	}
	rotate(weak)
	waitFor(t, 30*time.Second, "c0 Forbidden with the rotated credentials", func() (bool, error) {
		st, err := clusterStatus(e.ctx, e.c, "c0")
		return st != nil && st.State == v1alpha1.ClusterForbidden && st.KubeconfigHash != before.KubeconfigHash, err
	})
	good, err := f.Clusters[0].UserKubeconfig("rotated-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	rotate(good)
	waitFor(t, 30*time.Second, "c0 Ready with the next rotation", func() (bool, error) {
		st, err := clusterStatus(e.ctx, e.c, "c0")
		return st != nil && st.State == v1alpha1.ClusterReady && st.KubeconfigHash != before.KubeconfigHash, err
	})

	// Deletion: c4's Secret goes; its target is dropped.
	if err := e.c.Delete(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c4"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "c4 dropped", func() (bool, error) {
		st, err := clusterStatus(e.ctx, e.c, "c4")
		return st == nil && err == nil, err
	})
	waitFor(t, 10*time.Second, "four running targets", func() (bool, error) {
		return testutil.ToFloat64(metrics.FleetTargets.WithLabelValues(v1alpha1.ClusterReady)) == 4, nil
	})

	// audit --fleet covers the four remaining targets: nothing pending, each with its
	// migration's outcome; nothing needs action.
	rep, code = fleetAudit(t)
	if code != 0 || len(rep.Clusters) != 4 || rep.NeedsAction != 0 {
		t.Fatalf("audit --fleet at the end: exit %d, %+v; want exit 0 and four clusters", code, rep)
	}
	for _, c := range rep.Clusters {
		if c.Error != "" || len(c.PendingCRDs) != 0 || c.LastMigration == nil || c.LastMigration.Phase != v1alpha1.PhaseSucceeded ||
			c.LastMigration.Name != controller.FleetName(c.Name, helmrepos) {
			t.Errorf("audit --fleet, cluster %s: %+v; want nothing pending and its migration Succeeded", c.Name, c)
		}
	}
	// A target that cannot be reached needs action, and the others are still reported.
	if err := f.Clusters[3].StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	rep, code = fleetAudit(t, "--fleet-timeout=5s")
	if code != 1 || len(rep.Clusters) != 4 || rep.NeedsAction != 1 {
		t.Fatalf("audit --fleet with c3 down: exit %d, %+v; want exit 1, four clusters, one needing action", code, rep)
	}
	for _, c := range rep.Clusters {
		if (c.Name == "c3") != (c.Error != "") {
			t.Errorf("audit --fleet with c3 down, cluster %s: error %q", c.Name, c.Error)
		}
	}
	if err := f.Clusters[3].StartAPIServer(); err != nil {
		t.Fatal(err)
	}
}

// fleetAudit runs `upgradeguard audit --fleet` on the platform cluster.
func fleetAudit(t *testing.T, args ...string) (*audit.FleetReport, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Execute(t.Context(), append([]string{"audit", "--fleet", "fleet.example.com/managed=true", "-n", "fleet", "-A", "-o", "json",
		"--kubeconfig", cp.Kubeconfig}, args...), cli.Streams{Out: &out, ErrOut: &errOut})
	rep := &audit.FleetReport{}
	if err := json.Unmarshal(out.Bytes(), rep); err != nil {
		t.Fatalf("audit --fleet: exit %d, output %q, stderr %q: %v", code, out.String(), errOut.String(), err)
	}
	return rep, code
}
