package admissionpolicy_test

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// load reads the cluster's policies as the identity of cfg.
func load(t *testing.T, cfg *rest.Config) (*admissionpolicy.Policies, error) {
	t.Helper()
	c, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return admissionpolicy.Load(t.Context(), c, dynamic.NewForConfigOrDie(cfg))
}

// TestGatewayAPIRollbackDenied: with Gateway API v1.5.1's CRDs live and its safe-upgrades
// policy installed, writing v1.4.1's CRDs (a rollback) is denied by the policy, named
// with its binding and message, for an admin and for a user who may only read the
// policies; writing v1.5.1's again is not. The real update is then refused by the API
// server with the same policy and message. A user who may not read the policies gets an
// error the caller reports as not asked.
func TestGatewayAPIRollbackDenied(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	crds := kubeclientFor(t, cp.Config).CRDs.ApiextensionsV1().CustomResourceDefinitions()
	newCRDs, err := testenv.GatewayAPICRDs(testenv.GatewayAPINew)
	if err != nil {
		t.Fatal(err)
	}
	oldCRDs, err := testenv.GatewayAPICRDs(testenv.GatewayAPIOld)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]*apiextv1.CustomResourceDefinition{}
	for _, c := range newCRDs {
		created, err := crds.Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live[c.Name] = created
	}
	t.Cleanup(func() {
		for name := range live {
			_ = crds.Delete(t.Context(), name, metav1.DeleteOptions{})
		}
	})
	cp.InstallSafeUpgrades(t)

	reader := "vap-reader"
	cp.Grant(t, reader, rbacv1.PolicyRule{APIGroups: []string{admissionregistrationv1.GroupName},
		Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, Verbs: []string{"list"}})
	readerCfg, err := cp.AddUser(reader)
	if err != nil {
		t.Fatal(err)
	}
	want := admissionpolicy.Denial{Policy: testenv.SafeUpgrades, Binding: testenv.SafeUpgrades, Operation: admissionregistrationv1.Update,
		Message: testenv.SafeUpgradesRefusal, Reason: metav1.StatusReasonInvalid}
	for _, who := range []struct {
		name string
		cfg  *rest.Config
	}{{"admin", cp.Config}, {"reader", readerCfg}} {
		policies, err := load(t, who.cfg)
		if err != nil {
			t.Fatalf("%s: %v", who.name, err)
		}
		for _, next := range oldCRDs {
			got, err := policies.Evaluate(ctx, live[next.Name], next)
			if err != nil {
				t.Fatalf("%s: %s: %v", who.name, next.Name, err)
			}
			if len(got) != 1 {
				t.Fatalf("%s: %s: %d denials, want 1: %+v", who.name, next.Name, len(got), got)
			}
			if got[0].WayOn.Kind != admissionpolicy.WayDocumented || !strings.Contains(got[0].WayOn.Command, "delete validatingadmissionpolicy "+testenv.SafeUpgrades) {
				t.Errorf("%s: %s: way on %+v, want Gateway API's documented one (delete the policy)", who.name, next.Name, got[0].WayOn)
			}
			got[0].WayOn = admissionpolicy.WayOn{}
			if diff := cmp.Diff(want, got[0]); diff != "" {
				t.Errorf("%s: %s: denial (-want +got):\n%s", who.name, next.Name, diff)
			}
		}
		for _, next := range newCRDs {
			if got, err := policies.Evaluate(ctx, live[next.Name], next); err != nil || len(got) != 0 {
				t.Errorf("%s: %s at %s again: denials %+v, %v; want none", who.name, next.Name, testenv.GatewayAPINew, got, err)
			}
		}
	}

	// The real write agrees: the API server refuses the older CRD with the same policy,
	// binding and message.
	old := oldCRDs[0].DeepCopy()
	fresh, err := crds.Get(ctx, old.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old.ResourceVersion = fresh.ResourceVersion
	_, err = crds.Update(ctx, old, metav1.UpdateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+testenv.SafeUpgrades+"' with binding '"+testenv.SafeUpgrades+"' denied request: "+testenv.SafeUpgradesRefusal) {
		t.Errorf("the real update of %s: %v; want the policy's denial", old.Name, err)
	}

	// A user who may not list the policies cannot ask: an error the caller reports.
	blind, err := cp.AddUser("vap-blind")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := load(t, blind); !apierrors.IsForbidden(err) {
		t.Errorf("a user who may not list policies: %v; want forbidden", err)
	}
}

func kubeclientFor(t *testing.T, cfg *rest.Config) *kubeclient.Clients {
	t.Helper()
	c, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
