package livecluster_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// policyReads counts the reads of ValidatingAdmissionPolicies and their bindings.
func policyReads(r *http.Request) bool {
	return strings.Contains(r.URL.Path, "/validatingadmissionpolic")
}

// TestKeptTargetPolicyVerdict: a target kept by Clusters (what the gates decide with)
// evaluates the cluster's admission policies as a check does: with Gateway API v1.5.1's
// CRDs live and its safe-upgrades policy installed, a rollback to v1.4.1's CRDs judged
// as the gates judge it (no dry run) is the policy verdict naming safe-upgrades, for an
// admin and for a user who may only read (and watch) the CRDs and the policies. The
// warm-up (what the gates run before they are Ready) compiles the policies, so that even
// the first decision reads them from memory, with no request for them, as do the ones
// after it; a policy removed is seen by the next decision.
func TestKeptTargetPolicyVerdict(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	newCRDs, err := testenv.GatewayAPICRDs(testenv.GatewayAPINew)
	if err != nil {
		t.Fatal(err)
	}
	oldCRDs, err := testenv.GatewayAPICRDs(testenv.GatewayAPIOld)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range newCRDs {
		if err := testenv.ApplyCRD(ctx, cs, c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range newCRDs {
			_ = cs.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		}
	})
	cp.InstallSafeUpgrades(t)

	reader := "kept-vap-reader"
	cp.Grant(t, reader,
		rbacv1.PolicyRule{APIGroups: []string{admissionregistrationv1.GroupName},
			Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{apiextv1.GroupName}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch"}})
	readerCfg, err := cp.AddUser(reader)
	if err != nil {
		t.Fatal(err)
	}
	var incoming []chartcrds.CRD
	for _, c := range oldCRDs {
		incoming = append(incoming, chartcrds.CRD{CRD: c, Source: predict.Templates, File: c.Name})
	}
	req := check.Request{Operation: predict.Rollback, Incoming: incoming, NoSchemaCheck: true, NoObjectCounts: true}

	// The reader may not list Helm's release Secrets, whose informer the warm-up starts
	// too: it waits for that one this long at most.
	clusters := livecluster.NewClusters(livecluster.ClustersOptions{SyncTimeout: 3 * time.Second})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = clusters.Start(runCtx) }()

	for _, who := range []struct {
		name string
		cfg  *rest.Config
	}{{"admin", cp.Config}, {"reader", readerCfg}} {
		var reads atomic.Int64
		cfg := rest.CopyConfig(who.cfg)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return counted{rt: rt, n: &reads, count: policyReads} })
		target := keptTarget(t, clusters, livecluster.Key("policy", who.name), cfg)
		_ = target.Cluster.Warm(ctx, check.Warming{}) // its error is the forbidden Secrets' LIST, for the reader
		synced := livecluster.Synced(target.Cluster)
		if !synced["validatingadmissionpolicies"] || !synced["validatingadmissionpolicybindings"] || !livecluster.PoliciesCompiled(target.Cluster) {
			t.Errorf("%s: after the warm-up the policies are not compiled from synced informers (informers: %v)", who.name, synced)
		}
		warmed := reads.Load()
		denied := func() []string {
			t.Helper()
			rep, err := check.Run(ctx, target.Cluster, req)
			if err != nil {
				t.Fatalf("%s: %v", who.name, err)
			}
			var names []string
			for _, c := range rep.CRDs {
				if c.Verdict == predict.PolicyDenied && len(c.Policies) == 1 && c.Policies[0].Policy == testenv.SafeUpgrades &&
					c.Policies[0].Message == testenv.SafeUpgradesRefusal {
					names = append(names, c.Name)
				}
			}
			if len(rep.Unasked) > 0 {
				t.Errorf("%s: not asked: %+v", who.name, rep.Unasked)
			}
			return names
		}
		if got := denied(); len(got) != len(oldCRDs) {
			t.Fatalf("%s: %d of %d CRDs denied by %s (%v), want every one", who.name, len(got), len(oldCRDs), testenv.SafeUpgrades, got)
		}
		for range 3 {
			if got := denied(); len(got) != len(oldCRDs) {
				t.Fatalf("%s: again: %d of %d CRDs denied", who.name, len(got), len(oldCRDs))
			}
		}
		if got := reads.Load() - warmed; got != 0 {
			t.Errorf("%s: %d reads of the policies after the warm-up, want 0 (from memory, the first decision too)", who.name, got)
		}
	}

	// The policy removed: the kept target's next decision sees it gone, and the rollback
	// is no longer the policy verdict.
	target := keptTarget(t, clusters, livecluster.Key("policy", "admin"), cp.Config)
	binding := kubernetes.NewForConfigOrDie(cp.Config).AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if err := binding.Delete(ctx, testenv.SafeUpgrades, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		rep, err := check.Run(ctx, target.Cluster, req)
		if err != nil {
			return false, err
		}
		for _, c := range rep.CRDs {
			if c.Verdict == predict.PolicyDenied {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("the binding deleted: the kept target still predicts the policy verdict: %v", err)
	}
}

// keptTarget is the target key of clusters for cfg, once Clusters keeps it.
func keptTarget(t *testing.T, clusters *livecluster.Clusters, key string, cfg *rest.Config) *livecluster.Target {
	t.Helper()
	var target *livecluster.Target
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		target, err = clusters.Get(ctx, key, cfg, false)
		if err != nil {
			return false, err
		}
		again, err := clusters.Get(ctx, key, cfg, false)
		return err == nil && again.Cluster == target.Cluster && target.Cluster.Memory() != nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return target
}
