package charts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

const fieldManager = "upgradeguard-chart-test"

// cluster is what the apply tests talk to the test API server with.
type cluster struct {
	dyn    dynamic.Interface
	cs     kubernetes.Interface
	apiext apiextclient.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	if cp == nil {
		t.Skip("needs the control plane (not run with -short)")
	}
	dc := discovery.NewDiscoveryClientForConfigOrDie(cp.Config)
	return &cluster{
		dyn:    dynamic.NewForConfigOrDie(cp.Config),
		cs:     kubernetes.NewForConfigOrDie(cp.Config),
		apiext: apiextclient.NewForConfigOrDie(cp.Config),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
	}
}

// apply server-side applies one object, as `kubectl apply --server-side` does.
func (c *cluster) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == "namespace" {
		ri = c.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: fieldManager, Force: ptr.To(true)})
	return err
}

// applyAll applies every rendered object to the API server: the release namespace, then
// the CRDs (waiting until they are established), then everything else.
func (c *cluster) applyAll(t *testing.T, m *manifests, ns string) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.cs.CoreV1().Namespaces().Apply(ctx, applyNamespace(ns, nil), metav1.ApplyOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	for _, o := range m.objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if err := c.apply(ctx, o); err != nil {
			t.Fatalf("apply CRD %s: %v", o.GetName(), err)
		}
		if err := testenv.WaitEstablished(ctx, c.apiext, o.GetName()); err != nil {
			t.Fatal(err)
		}
	}
	c.mapper.Reset()
	for _, o := range m.objs {
		if o.GetKind() == "CustomResourceDefinition" {
			continue
		}
		if o.GetKind() == "ValidatingWebhookConfiguration" {
			// A webhook configuration gates the whole cluster: remove it when the test
			// ends so it does not gate the next test's HelmReleases.
			name := o.GetName()
			t.Cleanup(func() {
				err := c.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete ValidatingWebhookConfiguration %s: %v", name, err)
				}
			})
		}
		if o.GetKind() == "MutatingWebhookConfiguration" {
			// The CRD gate sees CRD updates cluster-wide: remove it too.
			name := o.GetName()
			t.Cleanup(func() {
				err := c.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete MutatingWebhookConfiguration %s: %v", name, err)
				}
			})
		}
		if err := c.apply(ctx, o); err != nil {
			t.Errorf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

// installCRDs installs fixture CRDs and checks that each serves version.
func (c *cluster) installCRDs(t *testing.T, version string, files ...string) {
	t.Helper()
	crds, err := testenv.ReadCRDs(files...)
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		if !servesVersion(crd, version) {
			t.Fatalf("fixture CRD %s does not serve %s", crd.Name, version)
		}
		if err := testenv.ApplyCRD(t.Context(), c.apiext, crd); err != nil {
			t.Fatalf("install %s: %v", crd.Name, err)
		}
	}
	c.mapper.Reset()
}

func servesVersion(crd *apiextv1.CustomResourceDefinition, version string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == version && v.Served {
			return true
		}
	}
	return false
}

// TestApplyRenderedManifests applies the chart's rendered manifests, in its main
// variants, to the real API server: every object must be accepted as it is (schema,
// CEL matchConditions, RBAC rules, cert-manager objects against cert-manager's CRDs).
func TestApplyRenderedManifests(t *testing.T) {
	c := newCluster(t)
	// cert-manager v1.7.0 CRDs: cert-manager.io/v1 only, no conversion webhook.
	c.installCRDs(t, "v1",
		"crds/cert-manager/v1.7.0/crd-certificates.yaml",
		"crds/cert-manager/v1.7.0/crd-issuers.yaml",
		"crds/cert-manager/v1.7.0/crd-certificaterequests.yaml")

	for _, tc := range []struct {
		release string
		set     []string
	}{
		{"defaults", nil},
		{"selfsigned", []string{"certManager.enabled=false"}},
		{"ignore", []string{"webhook.failurePolicy=Ignore", "webhook.excludeNamespaces={flux-system}"}},
		{"ha", []string{"replicas=2", "podDisruptionBudget.enabled=true"}},
		{"narrow", []string{"rbac.customResourceGroups={source.toolkit.fluxcd.io}", "policy.groups={source.toolkit.fluxcd.io}"}},
		// The CRD deletion guard's admission policies, beside its webhook: the API server
		// compiles their CEL at creation.
		{"both", []string{"webhook.crdDeletion.mode=both"}},
	} {
		t.Run(tc.release, func(t *testing.T) {
			ns := tc.release + "-system"
			set := append([]string{"policy.name=" + tc.release}, tc.set...)
			m := render(t, tc.release, ns, set...)
			c.applyAll(t, m, ns)

			// Read back what the API server stored for the webhook.
			vwc, err := c.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), tc.release+"-upgradeguard", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", tc.release+"-upgradeguard")
			if *vwc.Webhooks[0].FailurePolicy != *want.Webhooks[0].FailurePolicy || len(vwc.Webhooks[0].MatchConditions) != 1 {
				t.Errorf("stored webhook %+v", vwc.Webhooks[0])
			}
		})
	}
}

// TestWebhookConfigurationOnAPIServer proves, with the real API server and no webhook
// server running, what the rendered ValidatingWebhookConfiguration does: which
// HelmRelease updates reach the gate (matchConditions), that failurePolicy Fail denies
// them while the controller is unreachable and Ignore lets them through, and that the
// release namespace is never gated.
func TestWebhookConfigurationOnAPIServer(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	c.installCRDs(t, "v2", "crds/flux-helm-controller/v1.5.0/helm.toolkit.fluxcd.io_helmreleases.yaml")

	const release, ns = "gate", "gate-system"
	set := []string{"certManager.enabled=false", "policy.create=false", "webhook.timeoutSeconds=5"}
	c.applyAll(t, render(t, release, ns, set...), ns)

	hr := func(ns, name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.toolkit.fluxcd.io/v2",
			"kind":       "HelmRelease",
			"metadata":   map[string]any{"name": name, "namespace": ns},
			"spec": map[string]any{
				"interval": "5m",
				"chart": map[string]any{"spec": map[string]any{
					"chart":     "podinfo",
					"version":   "6.0.0",
					"sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"},
				}},
				"values": map[string]any{"replicaCount": 1},
			},
		}}
	}
	gvr := hrGVR(t, c)
	if _, err := c.cs.CoreV1().Namespaces().Apply(ctx, applyNamespace("apps", nil), metav1.ApplyOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []*unstructured.Unstructured{hr("apps", "app"), hr(ns, "self"), hr("apps", "probe")} {
		if _, err := c.dyn.Resource(gvr).Namespace(o.GetNamespace()).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create HelmRelease %s/%s (CREATE is not gated): %v", o.GetNamespace(), o.GetName(), err)
		}
	}
	patch := func(ns, name, body string) error {
		_, err := c.dyn.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	const (
		values     = `{"spec":{"values":{"replicaCount":2}}}`
		interval   = `{"spec":{"interval":"10m"}}`
		version    = `{"spec":{"chart":{"spec":{"version":"6.1.0"}}}}`
		chartName  = `{"spec":{"chart":{"spec":{"chart":"podinfo2"}}}}`
		source     = `{"spec":{"chart":{"spec":{"sourceRef":{"name":"other"}}}}}`
		unversion  = `{"spec":{"chart":{"spec":{"version":null}}}}`
		webhookErr = `failed calling webhook "helmrelease.upgradeguard.io"`
	)
	// The API server loads a new webhook configuration from its informer, a moment after
	// it is applied: wait until a chart change on a probe release reaches the webhook.
	attempt := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		attempt++ // a new version each time: an admitted probe must not make the next one a no-op
		err := patch("apps", "probe", `{"spec":{"chart":{"spec":{"version":"7.0.`+strconv.Itoa(attempt)+`"}}}}`)
		return err != nil && strings.Contains(err.Error(), webhookErr), nil
	})
	if err != nil {
		t.Fatalf("the webhook configuration never took effect: %v", err)
	}

	// Fail (the default): changes other than the chart never reach the webhook.
	for _, body := range []string{values, interval, `{"metadata":{"labels":{"team":"a"}}}`} {
		if err := patch("apps", "app", body); err != nil {
			t.Errorf("patch %s with the controller down: %v; want it admitted (not a chart change)", body, err)
		}
	}
	// Chart changes reach it, and are denied while it is unreachable.
	for _, body := range []string{version, chartName, source, unversion} {
		err := patch("apps", "app", body)
		if err == nil || !strings.Contains(err.Error(), webhookErr) {
			t.Errorf("patch %s with failurePolicy Fail and the controller down: err = %v, want %q", body, err, webhookErr)
		}
	}
	got, err := c.dyn.Resource(gvr).Namespace("apps").Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedString(got.Object, "spec", "chart", "spec", "version"); v != "6.0.0" {
		t.Errorf("denied update changed the version to %q", v)
	}
	// The release namespace is never gated: the gate cannot block its own upgrade.
	if err := patch(ns, "self", version); err != nil {
		t.Errorf("chart change in the release namespace %s: %v; want it admitted", ns, err)
	}

	// webhook.gateValuesChanges: values and valuesFrom changes reach the webhook too
	// (denied while it is down); intervals and labels still do not.
	c.applyAll(t, render(t, release, ns, append(set, "webhook.gateValuesChanges=true")...), ns)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		attempt++
		err := patch("apps", "probe", `{"spec":{"values":{"probe":`+strconv.Itoa(attempt)+`}}}`)
		return err != nil && strings.Contains(err.Error(), webhookErr), nil
	})
	if err != nil {
		t.Fatalf("values changes never reached the webhook with webhook.gateValuesChanges=true: %v", err)
	}
	for _, body := range []string{`{"spec":{"values":{"replicaCount":3}}}`, `{"spec":{"values":null}}`, `{"spec":{"valuesFrom":[{"kind":"Secret","name":"prod-values"}]}}`} {
		if err := patch("apps", "app", body); err == nil || !strings.Contains(err.Error(), webhookErr) {
			t.Errorf("patch %s with webhook.gateValuesChanges, failurePolicy Fail and the controller down: err = %v, want %q", body, err, webhookErr)
		}
	}
	for _, body := range []string{`{"spec":{"interval":"15m"}}`, `{"metadata":{"labels":{"team":"b"}}}`} {
		if err := patch("apps", "app", body); err != nil {
			t.Errorf("patch %s with webhook.gateValuesChanges and the controller down: %v; want it admitted", body, err)
		}
	}

	// Ignore: the same chart change goes through while the controller is down. The API
	// server picks up the changed configuration from its informer, a moment later.
	c.applyAll(t, render(t, release, ns, append(set, "webhook.failurePolicy=Ignore")...), ns)
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = patch("apps", "app", version)
		if last != nil && !strings.Contains(last.Error(), webhookErr) {
			return false, last
		}
		return last == nil, nil
	})
	if err != nil {
		t.Errorf("chart change with failurePolicy Ignore and the controller down: %v (last: %v); want it admitted", err, last)
	}
}

func hrGVR(t *testing.T, c *cluster) schema.GroupVersionResource {
	t.Helper()
	m, err := c.mapper.RESTMapping(schema.GroupKind{Group: "helm.toolkit.fluxcd.io", Kind: "HelmRelease"}, "v2")
	if err != nil {
		t.Fatal(err)
	}
	return m.Resource
}

// TestPodSecurityRestricted creates a Pod from the rendered Deployment's template in a
// namespace that enforces the restricted Pod Security Standard: the API server's
// PodSecurity admission must accept it (and reject the same Pod with privilege
// escalation allowed, which proves it is enforcing).
func TestPodSecurityRestricted(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	const ns = "restricted"
	labels := map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}
	if _, err := c.cs.CoreV1().Namespaces().Apply(ctx, applyNamespace(ns, labels), metav1.ApplyOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	d := typed[appsv1.Deployment](t, render(t, "psa", ns), "Deployment", "psa-upgradeguard")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "controller", Namespace: ns, Labels: d.Spec.Template.Labels},
		Spec:       d.Spec.Template.Spec,
	}
	if _, err := c.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("restricted namespace rejects the controller Pod: %v", err)
	}
	bad := pod.DeepCopy()
	bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	_, err := c.cs.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("a Pod allowing privilege escalation: err = %v; want PodSecurity to reject it (is it enforcing?)", err)
	}
}

// TestClusterRoleAuthorizes asks the API server's RBAC authorizer (SubjectAccessReview)
// whether the chart's ServiceAccount may do what the controller does, and nothing
// destructive beyond it.
func TestClusterRoleAuthorizes(t *testing.T) {
	c := newCluster(t)
	for _, tc := range []struct{ release, set string }{
		{"rbac-wide", "rbac.create=true"},
		{"rbac-narrow", "rbac.customResourceGroups={source.toolkit.fluxcd.io}"},
	} {
		ns := tc.release + "-system"
		c.applyAll(t, render(t, tc.release, ns, "policy.create=false", "certManager.enabled=false", tc.set), ns)
	}
	type access struct {
		group, resource, sub, verb, ns string
	}
	need := []access{
		{"apiextensions.k8s.io", "customresourcedefinitions", "", "watch", ""},
		{"apiextensions.k8s.io", "customresourcedefinitions", "", "update", ""},
		{"apiextensions.k8s.io", "customresourcedefinitions", "status", "update", ""},
		{"source.toolkit.fluxcd.io", "helmrepositories", "", "list", ""},
		{"source.toolkit.fluxcd.io", "helmrepositories", "", "patch", "flux-system"},
		{"upgradeguard.io", "storagemigrations", "", "create", ""},
		{"upgradeguard.io", "storagemigrations", "status", "update", ""},
		{"upgradeguard.io", "storagemigrationpolicies", "", "watch", ""},
		{"coordination.k8s.io", "leases", "", "create", "NS"},
		{"coordination.k8s.io", "leases", "", "update", "NS"},
		{"events.k8s.io", "events", "", "create", "apps"},
		{"helm.toolkit.fluxcd.io", "helmreleases", "", "patch", "apps"},
		{"source.toolkit.fluxcd.io", "ocirepositories", "", "watch", ""},
		// The custom-resource rule: the metadata informers that count and read objects.
		{"source.toolkit.fluxcd.io", "buckets", "", "watch", ""},
		{"", "secrets", "", "get", "apps"},
		{"", "secrets", "", "list", "apps"},
	}
	never := []access{
		{"", "secrets", "", "delete", "apps"},
		{"apps", "deployments", "", "create", "apps"},
		{"apiextensions.k8s.io", "customresourcedefinitions", "", "delete", ""},
		{"rbac.authorization.k8s.io", "clusterroles", "", "escalate", ""},
	}
	allowed := func(release string, a access) bool {
		t.Helper()
		ns := a.ns
		if ns == "NS" {
			ns = release + "-system"
		}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + release + "-system:" + release + "-upgradeguard",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + release + "-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: a.group, Resource: a.resource, Subresource: a.sub, Verb: a.verb, Namespace: ns,
			},
		}}
		out, err := c.cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out.Status.Allowed
	}
	for _, release := range []string{"rbac-wide", "rbac-narrow"} {
		for _, a := range need {
			if !allowed(release, a) {
				t.Errorf("%s: the controller may not %s %s/%s %s in %q", release, a.verb, a.group, a.resource, a.sub, a.ns)
			}
		}
		for _, a := range never {
			if allowed(release, a) {
				t.Errorf("%s: the controller may %s %s/%s in %q; it never needs to", release, a.verb, a.group, a.resource, a.ns)
			}
		}
	}
	// The wildcard rule reaches built-in resources too; the narrowed one does not.
	cm := access{"", "configmaps", "", "patch", "apps"}
	if !allowed("rbac-wide", cm) || allowed("rbac-narrow", cm) {
		t.Errorf("patch configmaps: wide %v, narrow %v; want true, false", allowed("rbac-wide", cm), allowed("rbac-narrow", cm))
	}
}

func applyNamespace(name string, labels map[string]string) *corev1apply.NamespaceApplyConfiguration {
	ns := corev1apply.Namespace(name)
	if len(labels) > 0 {
		ns.WithLabels(labels)
	}
	return ns
}

// TestHelmInstallAndUpgrade installs the chart with the real Helm CLI (crds/ first, then
// the templates, the StorageMigrationPolicy included) with the Helm-generated certificate,
// and proves that an upgrade keeps that certificate (lookup) and the caBundle with it.
func TestHelmInstallAndUpgrade(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	const release, ns = "inst", "inst-system"
	helmCLI := func(args ...string) {
		t.Helper()
		if out, err := cp.Helm(args...).CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	helmCLI("install", release, chartDir, "-n", ns, "--create-namespace", "--set", "certManager.enabled=false", "--set", "policy.name=inst")
	t.Cleanup(func() {
		if out, err := cp.Helm("uninstall", release, "-n", ns).CombinedOutput(); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
	})
	secret := func() *corev1.Secret {
		t.Helper()
		s, err := c.cs.CoreV1().Secrets(ns).Get(ctx, release+"-upgradeguard-webhook-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := secret()
	verifyServing(t, before, release+"-upgradeguard."+ns+".svc")
	c.mapper.Reset()
	pol, err := c.dyn.Resource(schema.GroupVersionResource{Group: "upgradeguard.io", Version: "v1alpha1", Resource: "storagemigrationpolicies"}).Get(ctx, "inst", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's StorageMigrationPolicy (needs the CRD from crds/ installed first): %v", err)
	}
	if p, _, _ := unstructured.NestedBool(pol.Object, "spec", "proactive"); !p {
		t.Errorf("policy spec %v", pol.Object["spec"])
	}

	helmCLI("upgrade", release, chartDir, "-n", ns, "--reuse-values", "--set", "replicas=2")
	after := secret()
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if !bytes.Equal(before.Data[k], after.Data[k]) {
			t.Errorf("helm upgrade replaced %s of the webhook Secret; want it kept", k)
		}
	}
	vwc, err := c.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, release+"-upgradeguard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(vwc.Webhooks[0].ClientConfig.CABundle, after.Data["ca.crt"]) {
		t.Error("caBundle after the upgrade is not the kept CA")
	}
}

// TestCRDDeletionGuardOnAPIServer applies the chart's CRD deletion guard to the real API
// server with no controller behind it. With the default failurePolicy Fail a CRD
// deletion is refused; the escape hatch needs no controller (a CRD annotated
// upgradeguard.io/allow-delete=true never reaches the webhook, through matchConditions),
// and with webhook.crdDeletion.failurePolicy=Ignore a deletion goes through.
func TestCRDDeletionGuardOnAPIServer(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	const release, ns, group = "guard", "guard-system", "guard.chart.example.io"
	api := c.apiext.ApiextensionsV1().CustomResourceDefinitions()
	var probeCRD *apiextv1.CustomResourceDefinition
	crd := func(plural, kind string) string {
		t.Helper()
		def := testenv.TwoVersionCRD(group, plural, kind)
		if err := testenv.ApplyCRD(ctx, c.apiext, def); err != nil {
			t.Fatal(err)
		}
		if plural == "probes" {
			probeCRD = def
		}
		t.Cleanup(func() {
			// With the guard gone (its configuration is deleted first): nothing refuses.
			if err := api.Delete(context.WithoutCancel(ctx), def.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete CRD %s: %v", def.Name, err)
			}
		})
		return def.Name
	}
	probe, kept, allowed, ignored := crd("probes", "Probe"), crd("keeps", "Keep"), crd("alloweds", "Allowed"), crd("ignoreds", "Ignored")
	set := []string{"certManager.enabled=false", "policy.create=false", "webhook.crdDeletion.timeoutSeconds=5"}
	c.applyAll(t, render(t, release, ns, set...), ns)

	const webhookErr = `failed calling webhook "crd-delete.upgradeguard.io"`
	del := func(name string) error { return api.Delete(ctx, name, metav1.DeleteOptions{}) }
	// The API server loads a new webhook configuration from its informer, a moment after
	// it is applied: wait until a deletion reaches the webhook.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if last = del(probe); last == nil {
			// Deleted before the configuration took effect: create it again (once its
			// deletion has finished) and retry.
			return false, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				if _, err := api.Get(ctx, probe, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return false, nil
				}
				return true, testenv.ApplyCRD(ctx, c.apiext, probeCRD)
			})
		}
		return strings.Contains(last.Error(), webhookErr), nil
	})
	if err != nil {
		t.Fatalf("the CRD deletion guard never took effect: %v (last answer: %v)", err, last)
	}

	// Fail (the default): refused while the controller is down.
	if err := del(kept); err == nil || !strings.Contains(err.Error(), webhookErr) {
		t.Errorf("delete CRD %s with failurePolicy Fail and the controller down: err = %v, want %q", kept, err, webhookErr)
	}
	if _, err := api.Get(ctx, kept, metav1.GetOptions{}); err != nil {
		t.Errorf("CRD %s after the refused deletion: %v", kept, err)
	}
	// The escape hatch: annotated, it never reaches the webhook and deletes at once.
	patch := `{"metadata":{"annotations":{"upgradeguard.io/allow-delete":"true"}}}`
	if _, err := api.Patch(ctx, allowed, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := del(allowed); err != nil {
		t.Errorf("delete CRD %s annotated upgradeguard.io/allow-delete=true with the controller down: %v; want it deleted", allowed, err)
	}

	// Ignore: the deletion goes through while the controller is down.
	c.applyAll(t, render(t, release, ns, append(set, "webhook.crdDeletion.failurePolicy=Ignore")...), ns)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = del(ignored)
		if last != nil && !strings.Contains(last.Error(), webhookErr) {
			return false, last
		}
		return last == nil, nil
	})
	if err != nil {
		t.Errorf("delete CRD %s with webhook.crdDeletion.failurePolicy=Ignore and the controller down: %v (last: %v); want it deleted", ignored, err, last)
	}
}
