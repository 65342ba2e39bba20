package webhook_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

const guardGroup = "guard.upgradeguard.io"

// kubectl runs the real kubectl of the control plane's Kubernetes version as the suite's
// admin user.
func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(s.cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", s.cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// guardedCRD creates the CRD <plural>.guard.upgradeguard.io (kind from plural) with
// labels and annotations, and n objects of it spread over namespaces; the clean-up
// deletes the objects, then the CRD (which the guard admits).
func guardedCRD(t *testing.T, plural string, labels, annotations map[string]string, n int, namespaces ...string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	ctx := t.Context()
	crd := testenv.TwoVersionCRD(guardGroup, plural, kindOf(plural))
	crd.Labels, crd.Annotations = labels, annotations
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != crd.Name }); err != nil {
			t.Errorf("delete CRD %s and its objects: %v", crd.Name, err)
		}
	})
	for _, ns := range namespaces {
		namespace(t, s.c, ns)
	}
	for i := range n {
		u := crateObject(crd, namespaces[i%len(namespaces)], fmt.Sprintf("%s-%d", strings.TrimSuffix(plural, "s"), i/len(namespaces)))
		// The kind is served a moment after the CRD is established.
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return s.c.Create(ctx, u) == nil, nil
		})
		if err != nil {
			t.Fatalf("create %s %s/%s: %v", crd.Spec.Names.Kind, u.GetNamespace(), u.GetName(), err)
		}
	}
	return crd
}

func crateObject(crd *apiextv1.CustomResourceDefinition, ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(crd.Spec.Group + "/v1")
	u.SetKind(crd.Spec.Names.Kind)
	u.SetNamespace(ns)
	u.SetName(name)
	u.Object["spec"] = map[string]any{"size": int64(len(name))}
	return u
}

// objectsIntact fails unless the CRD is still there, not being deleted, and every object
// of want (namespace/name) reads back at v1, with nothing else.
func objectsIntact(t *testing.T, crd *apiextv1.CustomResourceDefinition, want ...string) {
	t.Helper()
	if live := liveCRD(t, crd.Name); live.DeletionTimestamp != nil {
		t.Fatalf("CRD %s is being deleted", crd.Name)
	}
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(crd.Spec.Group + "/v1")
	list.SetKind(crd.Spec.Names.ListKind)
	if err := s.c.List(t.Context(), list); err != nil {
		t.Fatalf("list %s: %v", crd.Name, err)
	}
	if len(list.Items) != len(want) {
		t.Errorf("%d %s objects, want %d", len(list.Items), crd.Spec.Names.Kind, len(want))
	}
	for _, key := range want {
		ns, name, _ := strings.Cut(key, "/")
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(crd.Spec.Group + "/v1")
		u.SetKind(crd.Spec.Names.Kind)
		if err := s.c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
			t.Errorf("read %s %s: %v", crd.Spec.Names.Kind, key, err)
		}
	}
}

// waitCRDEvent waits for an event with the reason regarding the CRD, whose note says note.
func waitCRDEvent(t *testing.T, crd, reason, note string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// A cluster-scoped object's events are in the default namespace.
		var list eventsv1.EventList
		if err := s.c.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "CustomResourceDefinition" && e.Regarding.Name == crd && e.Reason == reason && strings.Contains(e.Note, note) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no event %s saying %q on CRD %s: %v", reason, note, crd, err)
	}
}

func crdGone(t *testing.T, name string) {
	t.Helper()
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("CRD %s is still there: %v", name, err)
	}
}

// TestCRDDeletionGuard: the real kubectl deletes a CRD that holds objects, and the CRD
// deletion guard refuses it, naming the count with examples, the user, and how to go on
// (the backup and restore commands, deleting the objects first, the allow-delete
// annotation). The CRD and every object are still there and readable, an event is on the
// CRD, and the metric counts it. Then each way on the denial names works: the objects
// deleted first, the CRD deletes; an empty CRD deletes at once; one annotated
// upgradeguard.io/allow-delete=true deletes with its objects.
func TestCRDDeletionGuard(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	crates := guardedCRD(t, "crates", nil, nil, 5, "guard-a", "guard-b")
	all := []string{"guard-a/crate-0", "guard-a/crate-1", "guard-a/crate-2", "guard-b/crate-0", "guard-b/crate-1"}
	denied := testutil.ToFloat64(metrics.CRDDeletionsDenied.WithLabelValues(crates.Name))
	blocked := decisions(webhook.OutcomeBlocked)

	out, err := kubectl(t, "delete", "crd", crates.Name)
	if err == nil {
		t.Fatalf("kubectl delete crd %s succeeded; want it denied:\n%s", crates.Name, out)
	}
	t.Logf("kubectl delete crd: %s", out)
	backup := "./" + crates.Name + "-backup"
	mustContain(t, out, `admission webhook "crd-delete.upgradeguard.io" denied the request`,
		"upgradeguard denied the deletion of CustomResourceDefinition "+crates.Name+" by user admin: deleting a CRD deletes every object of its type",
		crates.Name+": the API server deletes all 5 Crate objects with it, for good (for example guard-a/crate-0, guard-a/crate-1, guard-a/crate-2)",
		"Next steps: back up the CRD and its objects: upgradeguard crd backup "+crates.Name+" --dir "+backup,
		"upgradeguard crd restore --dir "+backup+" brings them back",
		"then delete its objects first (kubectl delete "+crates.Name+" --all --all-namespaces)",
		"or let them go with it (kubectl annotate crd "+crates.Name+" upgradeguard.io/allow-delete=true)",
		"then delete the CRD again")
	objectsIntact(t, crates, all...)
	waitCRDEvent(t, crates.Name, webhook.ReasonCRDDeletionBlocked, "all 5 Crate objects")
	if got := testutil.ToFloat64(metrics.CRDDeletionsDenied.WithLabelValues(crates.Name)); got != denied+1 {
		t.Errorf("upgradeguard_crd_deletions_denied_total{crd=%q} = %v, want %v", crates.Name, got, denied+1)
	}
	if got := decisions(webhook.OutcomeBlocked); got != blocked+1 {
		t.Errorf("upgradeguard_gate_decisions_total{outcome=blocked} = %v, want %v", got, blocked+1)
	}
	if !slices.ContainsFunc(strings.Split(s.logs.all(), "\n"), func(l string) bool {
		return strings.Contains(l, `"CRD deletion decision"`) && strings.Contains(l, `"crd"="`+crates.Name+`"`) && strings.Contains(l, `"user"="admin"`)
	}) {
		t.Errorf("no log line of the decision on %s by admin", crates.Name)
	}

	// A dry run is refused the same way, and changes nothing.
	if out, err := kubectl(t, "delete", "crd", crates.Name, "--dry-run=server"); err == nil || !strings.Contains(out, "all 5 Crate objects") {
		t.Errorf("kubectl delete crd --dry-run=server: %v\n%s\nwant it denied", err, out)
	}
	if got := testutil.ToFloat64(metrics.CRDDeletionsDenied.WithLabelValues(crates.Name)); got != denied+1 {
		t.Errorf("a dry run counted as a denied deletion: %v, want %v", got, denied+1)
	}

	// The objects first, as the denial says: then the CRD deletes.
	if out, err := kubectl(t, "delete", crates.Name, "--all", "--all-namespaces"); err != nil {
		t.Fatalf("kubectl delete %s --all --all-namespaces: %v\n%s", crates.Name, err, out)
	}
	if out, err := kubectl(t, "delete", "crd", crates.Name); err != nil {
		t.Fatalf("kubectl delete crd %s after its objects: %v\n%s", crates.Name, err, out)
	}
	crdGone(t, crates.Name)

	// A CRD with no objects deletes at once.
	blanks := guardedCRD(t, "blanks", nil, nil, 0)
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, blanks.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the empty CRD %s: %v", blanks.Name, err)
	}
	crdGone(t, blanks.Name)

	// Annotated with the command the denial names, a CRD deletes with its objects.
	discards := guardedCRD(t, "discards", nil, nil, 2, "guard-a")
	if out, err := kubectl(t, "delete", "crd", discards.Name); err == nil {
		t.Fatalf("kubectl delete crd %s succeeded before the annotation:\n%s", discards.Name, out)
	}
	if out, err := kubectl(t, "annotate", "crd", discards.Name, "upgradeguard.io/allow-delete=true"); err != nil {
		t.Fatalf("kubectl annotate: %v\n%s", err, out)
	}
	if out, err := kubectl(t, "delete", "crd", discards.Name); err != nil {
		t.Fatalf("kubectl delete crd %s annotated upgradeguard.io/allow-delete=true: %v\n%s", discards.Name, err, out)
	}
	crdGone(t, discards.Name)
}

// TestCRDDeletionGuardNamesTheOwner: the denial names what applies the CRD. A CRD that a
// Flux HelmRelease applies (helm-controller's labels) and whose Helm release owns it
// (Helm's annotations) is refused with the HelmRelease, helm-controller's retry and
// Helm's keep policy, and the event is on the HelmRelease too.
func TestCRDDeletionGuardNamesTheOwner(t *testing.T) {
	skipShort(t)
	const ns = "guard-flux"
	namespace(t, s.c, ns)
	helmRelease(t, ns, "app", "crates", "1.0.0", "charts")
	parcels := guardedCRD(t, "parcels",
		map[string]string{webhook.LabelFluxName: "app", webhook.LabelFluxNamespace: ns},
		map[string]string{"meta.helm.sh/release-name": ns + "-app", "meta.helm.sh/release-namespace": ns}, 1, ns)

	out, err := kubectl(t, "delete", "crd", parcels.Name)
	if err == nil {
		t.Fatalf("kubectl delete crd %s succeeded; want it denied:\n%s", parcels.Name, out)
	}
	mustContain(t, out, "upgradeguard denied the deletion of CustomResourceDefinition "+parcels.Name+" by user admin (a CRD that HelmRelease guard-flux/app applies)",
		"the API server deletes its one Parcel object with it, for good (for example guard-flux/parcel-0)",
		"then let helm-controller retry (flux reconcile helmrelease app -n guard-flux --reset)",
		"kubectl annotate crd "+parcels.Name+" helm.sh/resource-policy=keep makes Helm's next upgrade leave them")
	objectsIntact(t, parcels, "guard-flux/parcel-0")
	waitCRDEvent(t, parcels.Name, webhook.ReasonCRDDeletionBlocked, "its one Parcel object")
	waitEvent(t, ns, "app", webhook.ReasonCRDDeletionBlocked, "its one Parcel object")
}

// TestCRDDeletionGuardHelmUninstall: the real Helm 4 and Helm 3 CLIs uninstall a
// release whose templates/ render a CRD that holds objects, with the release-record gate
// on and, through the namespace's break-glass label, off (the CRD deletion guard alone).
//
// With the gate on, it denies the uninstalling mark of the release record, and Helm
// prints its warning; but Helm 3 and 4 only log a refused write of that mark and go on
// (pkg/action/uninstall.go), so they delete the release's other objects (its ConfigMap
// here) before the CRD. In both cases the guard refuses the CRD's DELETE, helm uninstall
// fails with "failed to delete release", prints the guard's warning, and leaves the CRD
// and every object readable. The record stays deployed when the gate refused its
// uninstalling mark (helm upgrade then puts back what the uninstall deleted), and is left
// uninstalling without the gate (helm upgrade then finds no deployed release). Running
// helm uninstall again fails the same way; once the CRD is annotated
// upgradeguard.io/allow-delete=true, as the warnings say, it succeeds and the CRD goes.
func TestCRDDeletionGuardHelmUninstall(t *testing.T) {
	skipShort(t)
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gadgets-config\n"
	for _, tc := range []struct {
		name, plural   string
		helm3, gateOff bool
	}{
		{"helm4", "spools", false, false},
		{"helm3", "reels", true, false},
		{"helm4-record-gate-off", "bobbins", false, true},
		{"helm3-record-gate-off", "cones", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			cli := s.cp.Helm
			if tc.helm3 {
				s.cp.NeedHelm3(t)
				cli = s.cp.Helm3
			}
			helm := func(args ...string) (string, error) {
				out, err := cli(args...).CombinedOutput()
				return string(out), err
			}
			ns := "uninstall-" + tc.name
			namespace(t, s.c, ns)
			if tc.gateOff {
				var n corev1.Namespace
				if err := s.c.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
					t.Fatal(err)
				}
				n.Labels[webhook.LabelGate] = "off"
				if err := s.c.Update(ctx, &n); err != nil {
					t.Fatal(err)
				}
			}
			crdName, kind := tc.plural+"."+gadgetGroup, kindOf(tc.plural)
			chart, err := testenv.WriteChart(filepath.Join(t.TempDir(), "1"), "gadgets", "1.0.0",
				map[string]string{"templates/crd.yaml": gadgetCRD(tc.plural, "v1"), "templates/configmap.yaml": cm})
			if err != nil {
				t.Fatal(err)
			}
			if out, err := helm("install", "gadgets", chart, "-n", ns); err != nil {
				t.Fatalf("helm install: %v\n%s", err, out)
			}
			readable := createObjects(t, ns, tc.plural, "v1", 3)
			status := "1:deployed"
			if tc.gateOff {
				status = "1:uninstalling"
			}

			for attempt := 1; attempt <= 2; attempt++ {
				out, err := helm("uninstall", "gadgets", "-n", ns)
				if err == nil {
					t.Fatalf("helm uninstall (attempt %d) succeeded; want it to fail on the CRD:\n%s", attempt, out)
				}
				t.Logf("helm uninstall (attempt %d): %v\n%s", attempt, err, out)
				mustContain(t, out, "Error: failed to delete release: gadgets",
					"upgradeguard denied the deletion of CustomResourceDefinition "+crdName+" by user admin (a CRD of Helm release "+ns+"/gadgets): "+
						"deleting a CRD deletes every object of its type: "+crdName+": the API server deletes all 3 "+kind+" objects with it",
					"kubectl delete crd "+crdName+" --dry-run=server shows the next steps")
				if !tc.gateOff {
					mustContain(t, out, "upgradeguard denied the uninstalling mark of release "+ns+"/gadgets (revision 1, chart gadgets@1.0.0)",
						"upgradeguard crd backup "+crdName, "kubectl annotate crd "+crdName+" upgradeguard.io/allow-delete=true",
						"Helm only logs this refusal and goes on deleting the release's other objects")
				}
				if got := revisions(t, ns); !slices.Equal(got, []string{status}) {
					t.Errorf("release records after the failed uninstall = %v, want [%s]", got, status)
				}
				if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gadgets-config"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
					t.Errorf("the release's ConfigMap after the failed uninstall: %v, want it deleted (Helm goes on)", err)
				}
				if live := liveCRD(t, crdName); live.DeletionTimestamp != nil {
					t.Fatalf("CRD %s is being deleted", crdName)
				}
				if n := readable("v1"); n != 3 {
					t.Fatalf("%d %s objects readable after the failed uninstall, want 3", n, kind)
				}
			}
			waitCRDEvent(t, crdName, webhook.ReasonCRDDeletionBlocked, "by user admin (a CRD of Helm release "+ns+"/gadgets)")

			// A release left deployed can be upgraded again, which puts back what the
			// uninstall deleted; one left uninstalling cannot.
			out, err := helm("upgrade", "gadgets", chart, "-n", ns)
			if tc.gateOff {
				if err == nil || !strings.Contains(out, "has no deployed releases") {
					t.Errorf("helm upgrade of the release left uninstalling: %v\n%s\nwant it refused by Helm (no deployed release)", err, out)
				}
			} else {
				if err != nil {
					t.Fatalf("helm upgrade of the release left deployed: %v\n%s", err, out)
				}
				if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gadgets-config"}, &corev1.ConfigMap{}); err != nil {
					t.Errorf("the release's ConfigMap after helm upgrade: %v, want it back", err)
				}
			}

			// The way on that the warnings name: let the objects go with the CRD.
			if out, err := kubectl(t, "annotate", "crd", crdName, "upgradeguard.io/allow-delete=true"); err != nil {
				t.Fatalf("kubectl annotate: %v\n%s", err, out)
			}
			if out, err := helm("uninstall", "gadgets", "-n", ns); err != nil {
				t.Fatalf("helm uninstall after the allow-delete annotation: %v\n%s", err, out)
			}
			if got := revisions(t, ns); len(got) != 0 {
				t.Errorf("release records after the uninstall = %v, want none", got)
			}
			crdGone(t, crdName)
		})
	}
}

// TestCRDDeletionGuardHelmUpgrade: an upgrade whose chart stops rendering a CRD that
// holds objects, with the release-record gate off for the namespace (it would hold the
// upgrade before anything is applied), so only the CRD deletion guard stands. Helm 4
// applies the new revision, fails on the refused DELETE ("failed to delete resource") and
// marks it failed; its next upgrade tries the deletion again, and succeeds once the CRD
// carries helm.sh/resource-policy=keep, as the guard's answer says, leaving the CRD
// outside the release. Helm 3 logs the refused DELETE and succeeds, leaving the CRD
// outside the release at once. Every object stays readable throughout.
func TestCRDDeletionGuardHelmUpgrade(t *testing.T) {
	skipShort(t)
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gadgets-config\n"
	for _, tc := range []struct {
		name, plural string
		helm3        bool
	}{
		{"helm4", "lathes", false},
		{"helm3", "anvils", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			cli := s.cp.Helm
			if tc.helm3 {
				s.cp.NeedHelm3(t)
				cli = s.cp.Helm3
			}
			helm := func(args ...string) (string, error) {
				out, err := cli(args...).CombinedOutput()
				return string(out), err
			}
			ns := "upgrade-" + tc.name
			namespace(t, s.c, ns)
			var n corev1.Namespace
			if err := s.c.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
				t.Fatal(err)
			}
			n.Labels[webhook.LabelGate] = "off"
			if err := s.c.Update(ctx, &n); err != nil {
				t.Fatal(err)
			}
			crdName, kind := tc.plural+"."+gadgetGroup, kindOf(tc.plural)
			v1, err := testenv.WriteChart(filepath.Join(t.TempDir(), "1"), "gadgets", "1.0.0",
				map[string]string{"templates/crd.yaml": gadgetCRD(tc.plural, "v1"), "templates/configmap.yaml": cm})
			if err != nil {
				t.Fatal(err)
			}
			v2, err := testenv.WriteChart(filepath.Join(t.TempDir(), "2"), "gadgets", "2.0.0", map[string]string{"templates/configmap.yaml": cm})
			if err != nil {
				t.Fatal(err)
			}
			if out, err := helm("install", "gadgets", v1, "-n", ns); err != nil {
				t.Fatalf("helm install: %v\n%s", err, out)
			}
			readable := createObjects(t, ns, tc.plural, "v1", 3)
			intact := func() {
				t.Helper()
				if live := liveCRD(t, crdName); live.DeletionTimestamp != nil {
					t.Fatalf("CRD %s is being deleted", crdName)
				}
				if n := readable("v1"); n != 3 {
					t.Fatalf("%d %s objects readable, want 3", n, kind)
				}
			}
			t.Cleanup(func() {
				if err := s.cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != crdName }); err != nil {
					t.Errorf("delete CRD %s and its objects: %v", crdName, err)
				}
			})

			out, err := helm("upgrade", "gadgets", v2, "-n", ns)
			t.Logf("helm upgrade to 2.0.0: %v\n%s", err, out)
			mustContain(t, out, "upgradeguard denied the deletion of CustomResourceDefinition "+crdName+" by user admin (a CRD of Helm release "+ns+"/gadgets): "+
				"deleting a CRD deletes every object of its type: "+crdName+": the API server deletes all 3 "+kind+" objects with it")
			intact()
			if tc.helm3 {
				if err != nil {
					t.Fatalf("Helm 3's upgrade failed; want it to log the refused DELETE and succeed: %v", err)
				}
				if got := revisions(t, ns); !slices.Equal(got, []string{"1:superseded", "2:deployed"}) {
					t.Errorf("release records = %v, want revision 2 deployed", got)
				}
				return
			}
			if err == nil || !strings.Contains(out, "failed to delete resource") {
				t.Fatalf("Helm 4's upgrade: %v; want it to fail on the refused DELETE", err)
			}
			mustContain(t, out, `admission webhook "crd-delete.upgradeguard.io" denied the request`,
				"kubectl annotate crd "+crdName+" helm.sh/resource-policy=keep makes Helm's next upgrade leave them")
			if got := revisions(t, ns); !slices.Equal(got, []string{"1:deployed", "2:failed"}) {
				t.Errorf("release records = %v, want revision 2 failed", got)
			}
			if out, err := helm("upgrade", "gadgets", v2, "-n", ns); err == nil || !strings.Contains(out, "failed to delete resource") {
				t.Errorf("Helm 4's next upgrade: %v\n%s\nwant it to try the deletion again and fail", err, out)
			}
			intact()
			if out, err := kubectl(t, "annotate", "crd", crdName, "helm.sh/resource-policy=keep"); err != nil {
				t.Fatalf("kubectl annotate: %v\n%s", err, out)
			}
			if out, err := helm("upgrade", "gadgets", v2, "-n", ns); err != nil {
				t.Fatalf("Helm 4's upgrade with the CRD kept: %v\n%s", err, out)
			}
			intact()
			if got := revisions(t, ns); !slices.Equal(got, []string{"1:superseded", "2:failed", "3:failed", "4:deployed"}) {
				t.Errorf("release records = %v, want revision 4 deployed", got)
			}
		})
	}
}
