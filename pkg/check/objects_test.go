package check_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/metadata"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func freshCluster(t *testing.T) (context.Context, apiextclient.Interface, *livecluster.KubeCluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	if err := cp.DeleteAllCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteAllCRDs(context.WithoutCancel(ctx)) })
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, cs, cluster
}

func templates(crds []*apiextv1.CustomResourceDefinition) []chartcrds.CRD {
	out := make([]chartcrds.CRD, 0, len(crds))
	for _, c := range crds {
		out = append(out, chartcrds.CRD{CRD: c, Source: predict.Templates})
	}
	return out
}

func find(t *testing.T, rep *check.Report, name string) check.CRDReport {
	t.Helper()
	for _, c := range rep.CRDs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no verdict for %s in %+v", name, rep.CRDs)
	return check.CRDReport{}
}

// TestObjectsCountedAcrossNamespaces reproduces the production upgrade incident with
// real objects: HelmRepositories created at v1beta2 by source-controller 1.2.0, then the
// flux2 2.17.2 chart, then a check of 2.18.2.
func TestObjectsCountedAcrossNamespaces(t *testing.T) {
	ctx, cs, cluster := freshCluster(t)
	applyAll(t, ctx, cs, mustRead(t, dir(t, "flux-source-controller/v1.2.0")...))
	objs := testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"team-a", "team-b", "team-c"}, PerNS: 3,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	}
	if err := testenv.CreateObjects(ctx, cp.Config, objs); err != nil {
		t.Fatal(err)
	}
	objs.GVR.Resource, objs.Kind, objs.Namespaces, objs.PerNS = "buckets", "Bucket", []string{"team-a"}, 1
	objs.Spec = map[string]any{"bucketName": "b", "endpoint": "minio:9000", "interval": "10m"}
	if err := testenv.CreateObjects(ctx, cp.Config, objs); err != nil {
		t.Fatal(err)
	}
	applyAll(t, ctx, cs, mustRead(t, "charts/flux2-2.17.2/rendered/crds.yaml"))

	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: templates(mustRead(t, "charts/flux2-2.18.2/rendered/crds.yaml"))})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{helmrepos: 9, buckets: 1, charts: 0, gitrepos: 0} {
		c := find(t, rep, name)
		if c.Objects == nil || *c.Objects != want {
			t.Errorf("%s: objects = %v, want %d (error %q)", name, c.Objects, want, c.ObjectsError)
		}
	}
	// Only the three kinds that 1.2.0 stored at v1beta2 carry it in storedVersions.
	for name, want := range map[string]predict.Verdict{helmrepos: predict.Migrate, buckets: predict.Migrate, charts: predict.Migrate, gitrepos: predict.OK, ocirepos: predict.OK} {
		if got := find(t, rep, name).Verdict; got != want {
			t.Errorf("%s: verdict %s, want %s", name, got, want)
		}
	}
	if got := find(t, rep, helmrepos).Action; got != "upgradeguard migrate --crd "+helmrepos {
		t.Errorf("action = %q", got)
	}
}

// TestConversionWebhookDownKeepsVerdict stores cert-manager Certificates at v1alpha2 (as
// an old cert-manager did), then installs the real 1.5.5 CRDs, whose Webhook conversion
// has no webhook running here. Listing the objects fails; the verdict must not.
func TestConversionWebhookDownKeepsVerdict(t *testing.T) {
	ctx, cs, cluster := freshCluster(t)
	const certs = "certificates.cert-manager.io"
	v155 := mustRead(t, "crds/cert-manager/v1.5.5/crd-certificates.yaml")[0]
	old := v155.DeepCopy()
	old.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.NoneConverter}
	for i := range old.Spec.Versions {
		old.Spec.Versions[i].Storage = old.Spec.Versions[i].Name == "v1alpha2"
	}
	applyAll(t, ctx, cs, []*apiextv1.CustomResourceDefinition{old})
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1alpha2", Resource: "certificates"},
		Kind: "Certificate", Namespaces: []string{"apps"}, PerNS: 2,
		Spec: map[string]any{"secretName": "tls", "issuerRef": map[string]any{"name": "ca"}},
	}); err != nil {
		t.Fatal(err)
	}
	applyAll(t, ctx, cs, []*apiextv1.CustomResourceDefinition{v155})
	// The API server switches a CRD's converter asynchronously after the update: wait until
	// a list at the version check reads goes through the (absent) webhook, so the test
	// checks the verdict with the webhook down rather than racing the switch.
	meta := metadata.NewForConfigOrDie(cp.Config)
	gvr := schema.GroupVersionResource{Group: "cert-manager.io", Version: crdversions.ServedVersion(v155), Resource: "certificates"}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := meta.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
		return err != nil && strings.Contains(err.Error(), "conversion webhook"), nil
	}); err != nil {
		t.Fatalf("the API server never started converting %s through the webhook: %v", certs, err)
	}

	incoming := mustRead(t, "crds/cert-manager/v1.7.0/crd-certificates.yaml")
	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: templates(incoming)})
	if err != nil {
		t.Fatalf("a conversion webhook that is down must not stop the check: %v", err)
	}
	c := find(t, rep, certs)
	if c.Verdict != predict.Migrate || strings.Join(c.MissingStoredVersions, ",") != "v1alpha2" {
		t.Errorf("verdict %s missing %v, want migrate missing [v1alpha2]", c.Verdict, c.MissingStoredVersions)
	}
	if c.Objects != nil || !strings.Contains(c.ObjectsError, "conversion webhook") {
		t.Errorf("objects = %v, error %q; want no count and the conversion webhook named", c.Objects, c.ObjectsError)
	}
	if err := testenv.ApplyCRD(ctx, cs, incoming[0]); err == nil || !strings.Contains(err.Error(), "storedVersions") {
		t.Errorf("API server: %v, want a storedVersions rejection", err)
	}
}

// TestDeleteVerdict uses Kyverno 1.12.6 -> 1.13.4, which drops the AdmissionReport CRDs
// outright: Helm deletes a templates/ CRD that the new chart no longer renders.
func TestDeleteVerdict(t *testing.T) {
	ctx, cs, cluster := freshCluster(t)
	const reports = "admissionreports.kyverno.io"
	current := mustRead(t, dir(t, "kyverno/v1.12.6")...)
	applyAll(t, ctx, cs, current)
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "kyverno.io", Version: "v1alpha2", Resource: "admissionreports"},
		Kind: "AdmissionReport", Namespaces: []string{"apps"}, PerNS: 4,
		Spec: map[string]any{"owner": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}},
	}); err != nil {
		t.Fatal(err)
	}
	req := check.Request{Operation: predict.Upgrade, Current: templates(current), Incoming: templates(mustRead(t, dir(t, "kyverno/v1.13.4")...))}
	rep, err := check.Run(ctx, cluster, req)
	if err != nil {
		t.Fatal(err)
	}
	c := find(t, rep, reports)
	if c.Verdict != predict.Delete || c.Objects == nil || *c.Objects != 4 {
		t.Fatalf("verdict %s objects %v, want delete with 4 objects", c.Verdict, c.Objects)
	}
	if !strings.Contains(c.Action, "helm.sh/resource-policy=keep") {
		t.Errorf("action %q does not name the keep policy", c.Action)
	}

	// Crds/ files are never deleted by Helm: the same CRD from crds/ is not at risk.
	req.Current = []chartcrds.CRD{{CRD: current[0], Source: predict.CRDsDir}}
	if rep, err = check.Run(ctx, cluster, req); err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.CRDs {
		if c.Verdict == predict.Delete {
			t.Errorf("%s: delete verdict for a crds/ file", c.Name)
		}
	}
}

// history serves fixture CRD sets as chart versions.
type history map[string][]*apiextv1.CustomResourceDefinition

func (h history) Versions(context.Context) ([]string, error) {
	return []string{"1.2.0", "1.1.0", "1.0.0", "0.35.2"}, nil
}

func (h history) CRDs(_ context.Context, v string) ([]chartcrds.CRD, error) {
	return templates(h[v]), nil
}

// TestSteppingStone skips image-reflector 1.0.0 (0.35.2 -> 1.2.0). The newest chart
// version that bridges is found, and the two-step path it names works on the API server.
func TestSteppingStone(t *testing.T) {
	ctx, cs, cluster := freshCluster(t)
	applyAll(t, ctx, cs, mustRead(t, dir(t, "flux-image-reflector-controller/v0.35.2")...))
	h := history{
		"1.2.0":  mustRead(t, dir(t, "flux-image-reflector-controller/v1.2.0")...),
		"1.1.0":  mustRead(t, dir(t, "flux-image-reflector-controller/v1.2.0")...),
		"1.0.0":  mustRead(t, dir(t, "flux-image-reflector-controller/v1.0.0")...),
		"0.35.2": mustRead(t, dir(t, "flux-image-reflector-controller/v0.35.2")...),
	}
	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: templates(h["1.2.0"]), History: h, ChartVersion: "1.2.0"})
	if err != nil {
		t.Fatal(err)
	}
	c := find(t, rep, imgrepos)
	if c.Verdict != predict.Bridge || c.SteppingStone != "1.0.0" || c.StorageSwitchTo != "" {
		t.Fatalf("verdict %s stepping stone %q switch %q, want bridge via 1.0.0", c.Verdict, c.SteppingStone, c.StorageSwitchTo)
	}
	if !strings.Contains(c.Action, "1.0.0") {
		t.Errorf("action %q does not name the stepping stone", c.Action)
	}
	// The path: (migrate: nothing stored, so prune) -> 1.0.0 -> migrate -> 1.2.0.
	for _, crd := range h["1.0.0"] {
		if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
			t.Fatalf("stepping stone %s rejected: %v", crd.Name, err)
		}
		if err := testenv.SetStoredVersions(ctx, cs, crd.Name, "v1"); err != nil {
			t.Fatal(err)
		}
	}
	for _, crd := range h["1.2.0"] {
		if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
			t.Errorf("target %s rejected after the stepping stone: %v", crd.Name, err)
		}
	}
}
