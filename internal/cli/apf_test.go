package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/apf"
)

// TestAPF: a user outside system:masters migrates, and migrate says the writes shared a
// priority level with other clients and names `upgradeguard apf --apply`; that command
// applies the objects for the user (from a SelfSubjectReview), and the next migration's
// writes run at upgradeguard's level, as its JSON result says (read from the real API
// server's response headers). An administrator in system:masters is told that no
// FlowSchema can hold them.
func TestAPF(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	crds := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD("cli-apf.example.com", "gears", "Gear")
	if err := testenv.ApplyCRD(ctx, crds, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != crd.Name })
	})
	const ns = "cli-apf"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// store writes n Gears at v1alpha1, then makes v1 the storage version (storedVersions
	// [v1alpha1, v1]).
	gvr := schema.GroupVersionResource{Group: "cli-apf.example.com", Version: "v1alpha1", Resource: "gears"}
	store := func(round int) {
		t.Helper()
		live, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live.Spec.Versions[0].Storage, live.Spec.Versions[1].Storage = true, false
		if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, live, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cli-apf.example.com/v1alpha1", "kind": "Gear",
				"metadata": map[string]any{"name": fmt.Sprintf("g-%d-%d", round, i), "namespace": ns}}}
			if _, err := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if live, err = crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		live.Spec.Versions[0].Storage, live.Spec.Versions[1].Storage = false, true
		if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, live, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	const user = "apf-platform"
	cp.GrantClusterAdmin(t, user)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = cs.FlowcontrolV1().FlowSchemas().Delete(ctx, apf.Name, metav1.DeleteOptions{})
		_ = cs.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, apf.Name, metav1.DeleteOptions{})
	})
	kc, err := cp.UserKubeconfig(user)
	if err != nil {
		t.Fatal(err)
	}
	as := func(args ...string) result {
		t.Helper()
		return run(t, append([]string{"--kubeconfig", kc}, args...)...)
	}

	store(0)
	r := as("migrate", "--crd", crd.Name, "--lease-namespace", ns)
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "shared with other clients: `upgradeguard apf --apply`") {
		t.Fatalf("migrate before apf: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	if r := ug(t, "apf"); r.code != cli.ExitSafe || !strings.Contains(r.stdout, "You are in system:masters") {
		t.Errorf("apf as an administrator in system:masters: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := as("apf", "--apply"); r.code != cli.ExitSafe || !strings.Contains(r.stdout, "Applied PriorityLevelConfiguration upgradeguard-migrations") {
		t.Fatalf("apf --apply: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	fs, err := cs.FlowcontrolV1().FlowSchemas().Get(ctx, apf.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := fs.Spec.Rules[0].Subjects; len(s) != 1 || s[0].User == nil || s[0].User.Name != user {
		t.Errorf("FlowSchema subjects %+v, want the user %s", s, user)
	}

	store(1)
	r = as("migrate", "--crd", crd.Name, "--lease-namespace", ns, "-o", "json")
	var out struct {
		CRDs []struct {
			Objects   int `json:"objects"`
			Rewritten int `json:"rewritten"`
		} `json:"crds"`
		PriorityAndFairness *apf.Placement `json:"priorityAndFairness"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitSafe {
		t.Fatalf("migrate after apf: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if p := out.PriorityAndFairness; p == nil || !p.Ours || p.PriorityLevel != apf.Name || p.FlowSchemaUID != fs.UID {
		t.Errorf("placement %+v, want FlowSchema %s (%s)", p, apf.Name, fs.UID)
	}
	// The API server takes a CRD's storage switch in asynchronously, so a Gear created
	// just after the switch back may already be stored at v1 (counted current, not
	// rewritten); every one of the 12 is patched either way.
	if len(out.CRDs) != 1 || out.CRDs[0].Objects != 12 || out.CRDs[0].Rewritten < 1 {
		t.Errorf("results %+v, want the 12 Gears passed over and the new ones rewritten", out.CRDs)
	}

	if r := as("apf", "--serviceaccount", "nonamespace"); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "give NAMESPACE/NAME") {
		t.Errorf("apf --serviceaccount without a namespace: exit %d, %s", r.code, r.stderr)
	}
}
