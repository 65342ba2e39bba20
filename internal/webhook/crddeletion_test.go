package webhook_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// deletionObjects is how many LeaderWorkerSets each case holds (the incident had 12).
const deletionObjects = 12

// TestReleaseRecordHoldsCRDDeletion is kubernetes-sigs/lws#880 at the release-record
// gate, with the real lws charts: 0.7.0 renders the LeaderWorkerSet CRD from templates/,
// 0.8.0 moves it to crds/, so the upgrade would delete the CRD and its 12 objects.
func TestReleaseRecordHoldsCRDDeletion(t *testing.T) {
	skipShort(t)
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	holdsDeletion(t, "lws-system", filepath.Join(fx, "charts/lws-0.7.0"), filepath.Join(fx, "charts/lws-0.8.0"), nil, testenv.LWSGroup)
}

// TestReleaseRecordHoldsEveryCRDDeletion: the other ways a CRD leaves a release (a values
// toggle switched off, a subchart removed, a move to another chart), each with the real
// LeaderWorkerSet CRD renamed for it, are held by the release-record gate the same way.
func TestReleaseRecordHoldsEveryCRDDeletion(t *testing.T) {
	skipShort(t)
	for i, tc := range testenv.CRDLeavingCases() {
		t.Run(tc.Name, func(t *testing.T) {
			group := fmt.Sprintf("case%d.gate.deletion.test", i)
			text, err := testenv.LWSCRDText(group)
			if err != nil {
				t.Fatal(err)
			}
			from, err := tc.From(t.TempDir(), text)
			if err != nil {
				t.Fatal(err)
			}
			to, err := tc.To(t.TempDir(), text)
			if err != nil {
				t.Fatal(err)
			}
			holdsDeletion(t, fmt.Sprintf("gate-leave-%d", i), from, to, tc.Set, group)
		})
	}
}

// holdsDeletion installs chart from as the release "widgets" in ns with 12
// LeaderWorkerSets of the CRD of group, whose upgrade to chart to (with values set)
// would delete that CRD. The gate denies the pending-upgrade record of the real Helm 4
// and of the real Helm 3 before anything is applied, naming the CRD, the count and the
// keep annotation: the history, the CRD and every object stay. With that annotation on
// the live CRD the same upgrade is admitted and leaves the CRD and every object.
func holdsDeletion(t *testing.T, ns, from, to string, set []string, group string) {
	t.Helper()
	s.cp.NeedHelm3(t)
	ctx := t.Context()
	crdName := "leaderworkersets." + group
	mustHelm(t, "install", "widgets", from, "-n", ns, "--create-namespace")
	t.Cleanup(func() {
		if out, err := helmCLI(t, "uninstall", "widgets", "-n", ns); err != nil {
			t.Errorf("helm uninstall widgets: %v\n%s", err, out)
		}
		other := func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != crdName }
		if err := s.cp.DeleteCRDs(context.WithoutCancel(ctx), other); err != nil {
			t.Errorf("delete %s: %v", crdName, err)
		}
	})
	if err := testenv.CreateLeaderWorkerSets(ctx, s.cp.Config, group, ns, deletionObjects); err != nil {
		t.Fatal(err)
	}
	intact := func() {
		t.Helper()
		liveCRD(t, crdName)
		if n, err := testenv.CountLeaderWorkerSets(ctx, s.cp.Config, group); err != nil || n != deletionObjects {
			t.Errorf("%d LeaderWorkerSets (%v), want all %d", n, err, deletionObjects)
		}
	}
	upgrade := []string{"upgrade", "widgets", to, "-n", ns}
	for _, v := range set {
		upgrade = append(upgrade, "--set", v)
	}
	before := releaseHistory(t, ns, "widgets")

	for _, helm := range []struct {
		name string
		cmd  func(args ...string) *exec.Cmd
	}{{"helm4", s.cp.Helm}, {"helm3", s.cp.Helm3}} {
		out, err := helm.cmd(upgrade...).CombinedOutput()
		if err == nil {
			t.Fatalf("%s upgrade succeeded; want it denied at the release record:\n%s", helm.name, out)
		}
		mustContain(t, string(out), `admission webhook "release.upgradeguard.io" denied the request`, crdName,
			fmt.Sprintf("so Helm deletes the CRD and all %d LeaderWorkerSet objects", deletionObjects),
			"kubectl annotate crd "+crdName+" helm.sh/resource-policy=keep")
		if diff := cmp.Diff(before, releaseHistory(t, ns, "widgets")); diff != "" {
			t.Errorf("%s: release history changed by the denied upgrade (-before +after):\n%s", helm.name, diff)
		}
		intact()
	}

	patch := []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`)
	crds := apiextclient.NewForConfigOrDie(s.cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Patch(ctx, crdName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	mustHelm(t, upgrade...)
	if got := releaseHistory(t, ns, "widgets"); !slices.Equal(got, []string{"1:superseded", "2:deployed"}) {
		t.Errorf("history after the kept upgrade = %v, want [1:superseded 2:deployed]", got)
	}
	intact()
}

// releaseHistory is the stored revisions of a release and their status labels, as Helm's
// Secret driver keeps them.
func releaseHistory(t *testing.T, ns, name string) []string {
	t.Helper()
	var list corev1.SecretList
	if err := s.c.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{"owner": "helm", "name": name}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sec := range list.Items {
		out = append(out, sec.Labels["version"]+":"+sec.Labels["status"])
	}
	slices.Sort(out)
	return out
}
