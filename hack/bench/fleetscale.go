package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// scaleTarget is one fleet target of the scale bench: a kubeconfig Secret with its own
// user, on one of the fleet's API servers, and its own CRD group there.
type scaleTarget struct {
	secret string
	server *testenv.ControlPlane
	crd    string
	policy string
}

// benchFleetScale: S kube-apiservers on one etcd (testenv.StartFleet) hold T targets,
// T/S per server. Each target is a kubeconfig Secret with its own user and its own CRD
// group (source-controller's HelmRepository CRD, regrouped), with n objects stored at
// v1beta2 before the storage version moved to v1. The targets that share an API server
// see each other's CRDs (CRDs are cluster-wide), so a policy per slot on a server selects
// the targets of that slot and their CRDs only: each target migrates its own CRD, as a
// tenant's own control plane would. The policies are run by 1 replica, then by 3
// (controller managers in this process, each with its own replica id and user), on the
// same work: a pass after storedVersions is widened again. Then one of the 3 is killed
// (its connections cut first, as a crash) and the time until every target's Lease is
// held by a live replica is measured. RSS per idle target and API requests per target
// are read on the way.
func benchFleetScale(ctx context.Context, servers, targets, n int, stall time.Duration) error {
	// A killed replica's errors are the point, not news: quiet, unless BENCH_LOG_LEVEL
	// (debug, info, warn, error) asks for the replicas' logs to look into a run.
	level := slog.LevelError + 4
	if v := os.Getenv("BENCH_LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			return fmt.Errorf("BENCH_LOG_LEVEL: %w", err)
		}
	}
	quiet := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	ctrl.SetLogger(logr.FromSlogHandler(quiet))
	slog.SetDefault(slog.New(quiet))
	targets = max(targets, servers)
	platform, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = platform.Stop() }()
	if err := testenv.ApplyUpgradeguardCRDs(ctx, platform.Config); err != nil {
		return err
	}
	fmt.Printf("starting %d target API servers on one etcd ...\n", servers)
	started := time.Now()
	fleet, err := testenv.StartFleet(servers)
	if err != nil {
		return err
	}
	defer func() { _ = fleet.Stop() }()
	fmt.Printf("  ready in %s\n", time.Since(started).Round(100*time.Millisecond))

	c, err := client.New(platform.Config, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fleet"}}); err != nil {
		return err
	}
	fmt.Printf("preparing %d targets (%d objects each at v1beta2, then storage v1) ...\n", targets, n)
	started = time.Now()
	all := make([]scaleTarget, targets)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i := range targets {
		g.Go(func() error {
			t, err := prepareTarget(gctx, c, fleet.Clusters[i%servers], i, i/servers, n)
			all[i] = t
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	fmt.Printf("  ready in %s\n", time.Since(started).Round(100*time.Millisecond))

	var policies []*v1alpha1.StorageMigrationPolicy
	for slot := range (targets + servers - 1) / servers {
		only := map[string]string{labelSlot: strconv.Itoa(slot)}
		policies = append(policies, &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: slotPolicy(slot)},
			Spec: v1alpha1.StorageMigrationPolicySpec{
				Selector: &metav1.LabelSelector{MatchLabels: only},
				Targets:  &v1alpha1.FleetTargets{Namespace: "fleet", Selector: metav1.LabelSelector{MatchLabels: only}}}})
	}

	// done waits until every target's StorageMigration has succeeded after since. When
	// the count left has not moved for stall, it gives up and says, for each target left,
	// what the policy's status reports of it, its StorageMigration and its CRD's
	// storedVersions on its API server, so a stall can be told from a lost record.
	done := func(since time.Time) (time.Duration, error) {
		var took time.Duration
		last, moved, before := time.Now(), time.Now(), -1
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Minute, true, func(context.Context) (bool, error) {
			left, why := 0, map[string]int{}
			var behind []scaleTarget
			for _, t := range all {
				sm := &v1alpha1.StorageMigration{}
				err := c.Get(ctx, client.ObjectKey{Name: controller.FleetName(t.secret, t.crd)}, sm)
				if client.IgnoreNotFound(err) != nil {
					return false, err
				}
				switch {
				case err != nil:
					left++
					why["no StorageMigration"]++
					behind = append(behind, t)
				case sm.Status.Phase != v1alpha1.PhaseSucceeded || sm.Status.CompletionTime == nil ||
					sm.Status.CompletionTime.Time.Before(since.Truncate(time.Second)):
					left++
					why[fmt.Sprintf("%s on %s", cmp.Or(string(sm.Status.Phase), "no phase"), cmp.Or(sm.Status.Replica, "no replica"))]++
					behind = append(behind, t)
				}
			}
			if left != before {
				before, moved = left, time.Now()
			}
			if left > 0 && time.Since(moved) > stall {
				err := fmt.Errorf("stalled: %d of %d targets not migrated for %s %v:\n%s",
					left, len(all), stall, why, diagnose(ctx, c, behind))
				// Printed now: stopping the fleet's API servers takes a while.
				fmt.Println(err)
				return false, err
			}
			if left > 0 {
				if time.Since(last) > 30*time.Second {
					last = time.Now()
					fmt.Printf("  %s: %d of %d targets not yet migrated %v\n", time.Since(since).Round(time.Second), left, len(all), why)
				}
				return false, nil
			}
			took = time.Since(since)
			return true, nil
		})
		return took, err
	}
	requestsNow := func() float64 {
		var sum float64
		for _, s := range fleet.Clusters {
			sum += requests(ctx, s.Config)
		}
		return sum
	}
	restale := func() error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for _, t := range all {
			g.Go(func() error {
				return testenv.SetStoredVersions(gctx, apiextclient.NewForConfigOrDie(t.server.Config), t.crd, "v1beta2", "v1")
			})
		}
		return g.Wait()
	}
	rssNone := rssAfterGC()
	// 1. One replica: the first migration (every object rewritten), idle RSS, then a pass.
	one, err := startScaleReplica(ctx, platform, "r0", targets)
	if err != nil {
		return err
	}
	reqBefore := requestsNow()
	t0 := time.Now()
	for _, p := range policies {
		if err := c.Create(ctx, p); err != nil {
			return err
		}
	}
	first, err := done(t0)
	if err != nil {
		return fmt.Errorf("first migration: %w", err)
	}
	firstReqs := (requestsNow() - reqBefore) / float64(targets)
	time.Sleep(5 * time.Second) // idle: informers synced, no migration running
	rssIdle := rssAfterGC()
	// The pass starts as the first CRD is widened: a target widened early may be migrated
	// again before the last is.
	t0 = time.Now()
	if err := restale(); err != nil {
		return err
	}
	passOne, err := done(t0)
	if err != nil {
		return fmt.Errorf("pass with one replica: %w", err)
	}
	one.stop()

	// 2. Three replicas, the same pass.
	replicas := make([]*scaleReplica, 3)
	for i := range replicas {
		if replicas[i], err = startScaleReplica(ctx, platform, fmt.Sprintf("r%d", i+1), targets); err != nil {
			return err
		}
	}
	defer func() {
		for _, r := range replicas {
			r.stop()
		}
	}()
	owned := func(dead string) (map[string]int, error) {
		leases, err := kubernetes.NewForConfigOrDie(platform.Config).CoordinationV1().Leases("default").List(ctx,
			metav1.ListOptions{LabelSelector: shard.LabelShard + "=" + shard.KindTarget})
		if err != nil {
			return nil, err
		}
		by := map[string]int{}
		for _, l := range leases.Items {
			h := ""
			if l.Spec.HolderIdentity != nil {
				h, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
			}
			if h != "" && h != dead && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < shard.DefaultLeaseDuration {
				by[h]++
			}
		}
		return by, nil
	}
	spread := func(dead string) (map[string]int, time.Duration, error) {
		var by map[string]int
		start := time.Now()
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
			var err error
			by, err = owned(dead)
			if err != nil {
				return false, err
			}
			sum := 0
			for _, k := range by {
				sum += k
			}
			return sum == targets, nil
		})
		return by, time.Since(start), err
	}
	if _, _, err := spread(""); err != nil {
		return fmt.Errorf("three replicas never held every target: %w", err)
	}
	// The pass starts as the first CRD is widened: a target widened early may be migrated
	// again before the last is.
	t0 = time.Now()
	if err := restale(); err != nil {
		return err
	}
	passThree, err := done(t0)
	if err != nil {
		return fmt.Errorf("pass with three replicas: %w", err)
	}
	before, _ := owned("")

	// 3. Kill the replica holding the most targets; time until a live one holds each.
	victim := replicas[0]
	for _, r := range replicas {
		if before[r.id] > before[victim.id] {
			victim = r
		}
	}
	victim.kill()
	after, reown, err := spread(victim.id)
	if err != nil {
		return fmt.Errorf("re-own after killing %s: %w", victim.id, err)
	}

	fmt.Printf("\nfleet scale: %d API servers on one etcd, %d targets (%d per server, each its own user and CRD group), %d objects per target, %s\n\n",
		servers, targets, targets/servers, n, machine())
	fmt.Println("| case | time | ratio |")
	fmt.Println("|---|---|---|")
	fmt.Printf("| first migration, 1 replica (every object rewritten) | %s | |\n", first.Round(100*time.Millisecond))
	fmt.Printf("| pass after storedVersions widened, 1 replica (baseline) | %s | 1.00x |\n", passOne.Round(100*time.Millisecond))
	fmt.Printf("| the same pass, 3 replicas | %s | %.2fx |\n", passThree.Round(100*time.Millisecond), passThree.Seconds()/passOne.Seconds())
	fmt.Printf("| re-own: %s (holding %d targets) killed, until every target is held by a live replica | %s | bound %s |\n",
		victim.id, before[victim.id], reown.Round(100*time.Millisecond), shard.DefaultLeaseDuration+shard.DefaultRenewEvery)
	fmt.Println()
	fmt.Println("| measure | value | goal |")
	fmt.Println("|---|---|---|")
	fmt.Printf("| API requests per target, first migration (%d objects) | %.0f | |\n", n, firstReqs)
	fmt.Printf("| bench process RSS before any replica | %d MiB | |\n", rssNone/1024)
	fmt.Printf("| bench process RSS, 1 replica, %d idle targets | %d MiB | |\n", targets, rssIdle/1024)
	fmt.Printf("| RSS per idle target | %.2f MiB | at most 2 MiB |\n", float64(rssIdle-rssNone)/float64(targets)/1024)
	fmt.Printf("| targets per replica, 3 replicas | %v | |\n", before)
	fmt.Printf("| targets per replica after the kill | %v | |\n", after)
	return nil
}

// labelSlot, on a target's CRD and kubeconfig Secret, is the target's slot on its API
// server; slotPolicy(slot) selects the slot's targets and CRDs.
const labelSlot = "bench.upgradeguard.io/slot"

func slotPolicy(slot int) string { return "fleet-" + strconv.Itoa(slot) }

// prepareTarget puts target i, in slot on server, on server: its CRD group
// (source-controller 1.2.0's HelmRepository CRD, regrouped), n objects stored at v1beta2,
// then the 1.6.0 CRD (storage v1), and a kubeconfig Secret for its own user.
func prepareTarget(ctx context.Context, c client.Client, server *testenv.ControlPlane, i, slot, n int) (scaleTarget, error) {
	group := fmt.Sprintf("t%d.scale.upgradeguard.test", i)
	fx, err := testenv.Fixtures()
	if err != nil {
		return scaleTarget{}, err
	}
	crd := func(version string) (*apiextv1.CustomResourceDefinition, error) {
		data, err := os.ReadFile(filepath.Join(fx, "crds/flux-source-controller", version, "source.toolkit.fluxcd.io_helmrepositories.yaml"))
		if err != nil {
			return nil, err
		}
		crds, err := crdversions.FromManifest(version, []byte(strings.ReplaceAll(string(data), "source.toolkit.fluxcd.io", group)))
		if err != nil {
			return nil, err
		}
		crds[0].Labels = map[string]string{labelSlot: strconv.Itoa(slot)}
		return crds[0], nil
	}
	cs := apiextclient.NewForConfigOrDie(server.Config)
	old, err := crd("v1.2.0")
	if err != nil {
		return scaleTarget{}, err
	}
	if err := testenv.ApplyCRD(ctx, cs, old); err != nil {
		return scaleTarget{}, err
	}
	if err := testenv.CreateObjects(ctx, server.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: group, Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{fmt.Sprintf("t%d", i)}, PerNS: n,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		return scaleTarget{}, err
	}
	next, err := crd("v1.6.0")
	if err != nil {
		return scaleTarget{}, err
	}
	if err := testenv.ApplyCRD(ctx, cs, next); err != nil {
		return scaleTarget{}, err
	}
	kubeconfig, err := server.UserKubeconfig(fmt.Sprintf("tenant-%d", i), "system:masters")
	if err != nil {
		return scaleTarget{}, err
	}
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		return scaleTarget{}, err
	}
	name := fmt.Sprintf("t%d", i)
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", Labels: map[string]string{labelSlot: strconv.Itoa(slot)}},
		Data: map[string][]byte{"value": data}}
	if err := c.Create(ctx, s); err != nil {
		return scaleTarget{}, err
	}
	return scaleTarget{secret: name, server: server, crd: next.Name, policy: slotPolicy(slot)}, nil
}

// scaleReplica is one controller replica in this process, with its own user and a switch
// on its connections.
type scaleReplica struct {
	id     string
	cut    *testenv.Cutoff
	cancel context.CancelFunc
	done   chan error
}

func startScaleReplica(ctx context.Context, platform *testenv.ControlPlane, id string, targets int) (*scaleReplica, error) {
	cfg, err := platform.AddUser("ug-"+id, "system:masters")
	if err != nil {
		return nil, err
	}
	r := &scaleReplica{id: id, cut: &testenv.Cutoff{}, done: make(chan error, 1)}
	mgr, err := controller.NewManager(cfg, controller.Options{MetricsAddr: "0", ProbeAddr: "0", LeaderElectionNamespace: "default",
		MaxConcurrentMigrations: targets, SkipNameValidation: true, ReplicaID: id, WrapTransport: r.cut.Wrap})
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go func() { r.done <- mgr.Start(mctx) }()
	return r, nil
}

// stop stops the replica as a rollout does: it releases its Leases on the way out.
func (r *scaleReplica) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
		r.cancel = nil
	}
}

// kill stops the replica as a crash does: its connections are cut first.
func (r *scaleReplica) kill() {
	r.cut.Cut()
	r.stop()
}

// diagnose says, for each target, what its policy's status reports of it (state, reason,
// pending CRDs, owner), its StorageMigration and its CRD's storedVersions read from its
// API server.
func diagnose(ctx context.Context, c client.Client, targets []scaleTarget) string {
	var b strings.Builder
	for _, t := range targets {
		p := &v1alpha1.StorageMigrationPolicy{}
		if err := c.Get(ctx, client.ObjectKey{Name: t.policy}, p); err != nil {
			fmt.Fprintf(&b, "  %s: policy %s: %s\n", t.secret, t.policy, err)
			continue
		}
		state := "not in the policy's status"
		for _, cs := range p.Status.Clusters {
			if cs.Secret == t.secret {
				state = fmt.Sprintf("%s (%.100s) pending %v on %s", cs.State, cs.Reason, cs.PendingCRDs, cmp.Or(cs.Replica, "no replica"))
			}
		}
		var stored string
		if crd, err := apiextclient.NewForConfigOrDie(t.server.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, t.crd, metav1.GetOptions{}); err != nil {
			stored = err.Error()
		} else {
			stored = fmt.Sprint(crd.Status.StoredVersions)
		}
		record := "no StorageMigration"
		sm := &v1alpha1.StorageMigration{}
		if err := c.Get(ctx, client.ObjectKey{Name: controller.FleetName(t.secret, t.crd)}, sm); err == nil {
			record = fmt.Sprintf("StorageMigration %s on %s, created %s, completed %v", cmp.Or(string(sm.Status.Phase), "no phase"),
				cmp.Or(sm.Status.Replica, "no replica"), sm.CreationTimestamp.Format(time.TimeOnly), sm.Status.CompletionTime)
		}
		fmt.Fprintf(&b, "  %s: %s; %s; storedVersions %s\n", t.secret, state, record, stored)
	}
	return b.String()
}
