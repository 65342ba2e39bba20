package webhook_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// setRecordWebhooks changes the release-record webhook (the ValidatingWebhookConfiguration's
// release.upgradeguard.io) and the CRD gate (the MutatingWebhookConfiguration's
// crd.upgradeguard.io) together.
func setRecordWebhooks(t *testing.T, cc func(name string) admissionregv1.WebhookClientConfig, fp admissionregv1.FailurePolicyType) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vwc admissionregv1.ValidatingWebhookConfiguration
		if err := s.c.Get(ctx, client.ObjectKey{Name: webhookConfig}, &vwc); err != nil {
			return err
		}
		for i := range vwc.Webhooks {
			if vwc.Webhooks[i].Name == "release.upgradeguard.io" {
				vwc.Webhooks[i].ClientConfig, vwc.Webhooks[i].FailurePolicy = cc(vwc.Webhooks[i].Name), ptr.To(fp)
			}
		}
		return s.c.Update(ctx, &vwc)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var mwc admissionregv1.MutatingWebhookConfiguration
		if err := s.c.Get(ctx, client.ObjectKey{Name: webhookConfig}, &mwc); err != nil {
			return err
		}
		mwc.Webhooks[0].ClientConfig, mwc.Webhooks[0].FailurePolicy = cc(mwc.Webhooks[0].Name), ptr.To(fp)
		return s.c.Update(ctx, &mwc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// pendingRecord is a Secret that looks like a pending-upgrade release record to the
// webhook configuration (type and labels) but holds no release: the gate cannot decode it.
func pendingRecord(ns string, n int) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("sh.helm.release.v1.probe.v%d", n),
			Labels: map[string]string{"owner": "helm", "name": "probe", "status": "pending-upgrade", "version": fmt.Sprint(n)}},
		Type: "helm.sh/release.v1",
		Data: map[string][]byte{"release": []byte("not a release")},
	}
}

// TestRecordGatesDown takes the release-record and CRD gates' endpoint down and checks,
// on the real API server, that nothing but what they gate depends on them: with
// failurePolicy Fail (to see the configuration in effect), a pending release record and
// the uninstalling mark of a record are rejected while every other Secret write, the
// records' other updates and a CRD update that drops nothing go through. With the shipped Ignore, a real helm upgrade succeeds, and
// an upgrade across a storage boundary fails with the API server's own rejection, as if
// upgradeguard were not installed. Back up, a record the gate cannot decode is admitted
// with a warning: its own errors fail open too.
func TestRecordGatesDown(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "records-down"
	namespace(t, s.c, ns)

	var vwc admissionregv1.ValidatingWebhookConfiguration
	if err := s.c.Get(ctx, client.ObjectKey{Name: webhookConfig}, &vwc); err != nil {
		t.Fatal(err)
	}
	var mwc admissionregv1.MutatingWebhookConfiguration
	if err := s.c.Get(ctx, client.ObjectKey{Name: webhookConfig}, &mwc); err != nil {
		t.Fatal(err)
	}
	orig := map[string]admissionregv1.WebhookClientConfig{}
	for _, w := range vwc.Webhooks {
		if w.Name == "release.upgradeguard.io" {
			orig[w.Name] = w.ClientConfig
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregv1.Ignore {
				t.Errorf("the shipped failurePolicy of %s is %v, want Ignore", w.Name, w.FailurePolicy)
			}
		}
	}
	for _, w := range mwc.Webhooks {
		orig[w.Name] = w.ClientConfig
		if w.FailurePolicy == nil || *w.FailurePolicy != admissionregv1.Ignore {
			t.Errorf("the shipped failurePolicy of %s is %v, want Ignore", w.Name, w.FailurePolicy)
		}
	}
	restore := func(name string) admissionregv1.WebhookClientConfig { c := orig[name]; return *c.DeepCopy() }
	t.Cleanup(func() { setRecordWebhooks(t, restore, admissionregv1.Ignore) })
	dead := deadURL(t)
	deadConfig := func(name string) admissionregv1.WebhookClientConfig {
		return admissionregv1.WebhookClientConfig{URL: ptr.To(dead), CABundle: orig[name].CABundle}
	}

	// Fail, to see which writes reach the (dead) webhooks at all.
	setRecordWebhooks(t, deadConfig, admissionregv1.Fail)
	n := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n++
		err := s.c.Create(ctx, pendingRecord(ns, n))
		return err != nil && strings.Contains(err.Error(), `failed calling webhook "release.upgradeguard.io"`), nil
	})
	if err != nil {
		t.Fatalf("the pending record never reached the dead endpoint: %v", err)
	}
	plain := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, StringData: map[string]string{"k": "v"}}
	if err := s.c.Create(ctx, plain); err != nil {
		t.Errorf("an unrelated Secret with the gate down: %v", err)
	}
	deployed := pendingRecord(ns, 100)
	deployed.Labels["status"] = "deployed"
	if err := s.c.Create(ctx, deployed); err != nil {
		t.Errorf("a deployed release record with the gate down: %v", err)
	}
	deployed.Labels["status"] = "superseded"
	if err := s.c.Update(ctx, deployed); err != nil {
		t.Errorf("a release record's status update with the gate down: %v", err)
	}
	// The mark helm uninstall writes does reach it.
	deployed.Labels["status"] = "uninstalling"
	if err := s.c.Update(ctx, deployed); err == nil || !strings.Contains(err.Error(), `failed calling webhook "release.upgradeguard.io"`) {
		t.Errorf("a release record marked uninstalling under Fail: %v, want the dead endpoint's rejection", err)
	}
	apply := func(versions ...string) error {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(gadgetCRD("downboxes", versions...)), &crd); err != nil {
			t.Fatal(err)
		}
		return testenv.ApplyCRDServerSide(ctx, s.cp.Config, &crd, "test")
	}
	if err := apply("v1alpha1"); err != nil {
		t.Fatal(err)
	}
	if err := apply("v1alpha1", "v1"); err != nil {
		t.Errorf("a CRD update that drops nothing, with the CRD gate down: %v", err)
	}
	if err := apply("v1"); err == nil || !strings.Contains(err.Error(), `failed calling webhook "crd.upgradeguard.io"`) {
		t.Errorf("a CRD update dropping a stored version under Fail: %v, want the dead endpoint's rejection", err)
	}

	// Ignore, as shipped.
	setRecordWebhooks(t, deadConfig, admissionregv1.Ignore)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n++
		return s.c.Create(ctx, pendingRecord(ns, n)) == nil, nil
	})
	if err != nil {
		t.Fatalf("a pending record is still rejected under Ignore: %v", err)
	}
	// The API server's rejection, in the wording of the minor that runs (it changed in 1.33).
	wording := string(crdversions.WordingFor(s.cp.Minor))
	if err := apply("v1"); err == nil || !strings.Contains(err.Error(), wording) || strings.Contains(err.Error(), "denied the request") {
		t.Errorf("a CRD update dropping a stored version with the gate down: %v, want the API server's own rejection", err)
	}
	v1 := gadgetChart(t, "downgadgets", "1.0.0", "v1alpha1")
	v11 := gadgetChart(t, "downgadgets", "1.1.0", "v1alpha1", "v1")
	v2 := gadgetChart(t, "downgadgets", "2.0.0", "v1")
	mustHelm(t, "install", "gadgets", v1, "-n", ns)
	mustHelm(t, "upgrade", "gadgets", v11, "-n", ns)
	out, err := helmCLI(t, "upgrade", "gadgets", v2, "-n", ns)
	if err == nil || !strings.Contains(out, wording) || strings.Contains(out, "denied the request") {
		t.Errorf("an upgrade across the boundary with the gates down: %v\n%s\nwant the API server's own rejection", err, out)
	}
	// As in production without upgradeguard: the revision is stored, failed.
	if got := revisions(t, ns); !slices.Equal(got, []string{"1:superseded", "2:deployed", "3:failed"}) {
		t.Errorf("history after the unguarded upgrade = %v, want revision 3 failed", got)
	}

	// Back up: an undecodable record is admitted with the gate's warning.
	setRecordWebhooks(t, restore, admissionregv1.Ignore)
	w := &warnings{}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: s.scheme})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n++
		if err := c.Create(ctx, pendingRecord(ns, n)); err != nil {
			return false, err
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		return slices.ContainsFunc(w.list, func(s string) bool {
			return strings.Contains(s, "upgradeguard could not check the release record "+ns+"/sh.helm.release.v1.probe.v") && strings.Contains(s, "admits it unchecked")
		}), nil
	})
	if err != nil {
		t.Errorf("the gate, back up, did not admit an undecodable record with its warning: %v (warnings %v)", err, w.list)
	}
}
