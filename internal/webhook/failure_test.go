package webhook_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

const webhookConfig = "upgradeguard"

// setWebhook changes the installed ValidatingWebhookConfiguration.
func setWebhook(t *testing.T, mutate func(*admissionregv1.ValidatingWebhook)) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vwc admissionregv1.ValidatingWebhookConfiguration
		if err := s.c.Get(ctx, client.ObjectKey{Name: webhookConfig}, &vwc); err != nil {
			return err
		}
		mutate(&vwc.Webhooks[0])
		return s.c.Update(ctx, &vwc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// deadURL is an https URL on loopback where nothing listens: the gate is down.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "https://" + addr + webhook.Path
}

// pollUpdate repeats a chart-version update (alternating versions, so each is a change)
// until answer accepts the API server's reply. The API server applies a changed webhook
// configuration asynchronously; this waits for it on the observable behaviour. The
// versions do not exist, so the running gate would deny them ("could not check"): only
// an ignored call to the dead endpoint admits them.
func pollUpdate(t *testing.T, ns, name string, answer func(error) bool) error {
	t.Helper()
	versions := []string{"8.0.0", "8.0.1"}
	i := 0
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		i++
		last = setVersion(ctx, s.c, ns, name, versions[i%2])
		return answer(last), nil
	})
	if err != nil {
		t.Fatalf("no expected answer to a chart update of %s/%s: %v (last answer: %v)", ns, name, err, last)
	}
	return last
}

// TestFailurePolicy takes the gate's endpoint down and checks, on the real API server,
// what the shipped configuration does: under Fail a chart-version update is rejected and
// under Ignore it is admitted, while label and finalizer updates (helm-controller's own)
// are admitted under both, because matchConditions never send them.
func TestFailurePolicy(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "failure-policy"
	namespace(t, s.c, ns)
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	helmRelease(t, ns, "probe", "kro", "0.2.0", "charts")

	var orig admissionregv1.ValidatingWebhookConfiguration
	if err := s.c.Get(ctx, client.ObjectKey{Name: webhookConfig}, &orig); err != nil {
		t.Fatal(err)
	}
	if fp := orig.Webhooks[0].FailurePolicy; fp == nil || *fp != admissionregv1.Fail {
		t.Errorf("the shipped failurePolicy is %v, want Fail", fp)
	}
	t.Cleanup(func() {
		setWebhook(t, func(w *admissionregv1.ValidatingWebhook) {
			w.ClientConfig, w.FailurePolicy = orig.Webhooks[0].ClientConfig, orig.Webhooks[0].FailurePolicy
		})
	})
	dead := deadURL(t)

	for _, tc := range []struct {
		policy        admissionregv1.FailurePolicyType
		chartAdmitted bool
	}{
		{admissionregv1.Fail, false},
		{admissionregv1.Ignore, true},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			setWebhook(t, func(w *admissionregv1.ValidatingWebhook) {
				w.ClientConfig.Service, w.ClientConfig.URL, w.FailurePolicy = nil, &dead, ptr.To(tc.policy)
			})
			if tc.chartAdmitted {
				// Admitted: the failed call was ignored (a denial by the gate itself would
				// name upgradeguard).
				pollUpdate(t, ns, "probe", func(err error) bool { return err == nil })
			} else {
				err := pollUpdate(t, ns, "probe", func(err error) bool {
					return err != nil && strings.Contains(err.Error(), `failed calling webhook "helmrelease.upgradeguard.io"`)
				})
				if !strings.Contains(err.Error(), "connection refused") {
					t.Errorf("rejection does not come from the unreachable endpoint: %v", err)
				}
			}
			var hr helmv2.HelmRelease
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "probe"}, &hr); err != nil {
				t.Fatal(err)
			}
			hr.Labels = map[string]string{"policy": strings.ToLower(string(tc.policy))}
			if err := s.c.Update(ctx, &hr); err != nil {
				t.Errorf("label update with the gate down (%s): %v", tc.policy, err)
			}
			hr.Finalizers = append(hr.Finalizers, "finalizers.fluxcd.io")
			if err := s.c.Update(ctx, &hr); err != nil {
				t.Errorf("finalizer update with the gate down (%s): %v", tc.policy, err)
			}
			hr.Finalizers = nil
			if err := s.c.Update(ctx, &hr); err != nil {
				t.Errorf("finalizer removal with the gate down (%s): %v", tc.policy, err)
			}
			// The gate's own annotation patch is metadata too.
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"upgradeguard.io/gate":"{}"}}}`))
			if err := s.c.Patch(ctx, &hr, patch); err != nil {
				t.Errorf("annotation patch with the gate down (%s): %v", tc.policy, err)
			}
		})
	}

	// Back up: a chart the repository does not have is denied by the gate itself, with
	// its reason (could not check), not admitted.
	setWebhook(t, func(w *admissionregv1.ValidatingWebhook) {
		w.ClientConfig, w.FailurePolicy = orig.Webhooks[0].ClientConfig, orig.Webhooks[0].FailurePolicy
	})
	// pollUpdate alternates versions: while the API server still calls the dead
	// endpoint under Ignore, an update is admitted, and repeating the same version would
	// then be a no-op that never reaches the restored gate.
	pollUpdate(t, ns, "probe", func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "upgradeguard could not check the chart change of HelmRelease failure-policy/probe")
	})
}

// TestGateTimeout bounds a decision: a chart repository that never answers ends in a
// denial that says so, within the gate's timeout. The request is a dry run, which also
// shows that a dry run creates nothing.
func TestGateTimeout(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	unblock := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-unblock:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(unblock)
	ns := "timeout"
	namespace(t, s.c, ns)
	helmRepo(t, ns, "slow", sourcev1.HelmRepositorySpec{URL: hang.URL})

	old := &helmv2.HelmRelease{
		TypeMeta:   metav1.TypeMeta{APIVersion: helmv2.GroupVersion.String(), Kind: helmv2.HelmReleaseKind},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "slow"},
		Spec: helmv2.HelmReleaseSpec{Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
			Chart: "app", Version: "1.0.0", SourceRef: helmv2.CrossNamespaceObjectReference{Kind: sourcev1.HelmRepositoryKind, Name: "slow"},
		}}},
	}
	updated := old.DeepCopy()
	updated.Spec.Chart.Spec.Version = "1.0.1"
	g, err := webhook.New(s.c, s.c, s.cp.Config, events.NewFakeRecorder(10), webhook.Options{Timeout: 2 * time.Second, HelmCacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	errorsBefore := decisions(webhook.OutcomeError)
	resp := g.Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, Object: raw(t, updated), OldObject: raw(t, old), DryRun: ptr.To(true),
	}})
	if resp.Allowed {
		t.Fatal("a chart change that could not be checked in time was admitted")
	}
	msg := resp.Result.Message
	for _, want := range []string{"upgradeguard could not check the chart change of HelmRelease timeout/slow", "no answer within the gate's timeout", "It is denied until the check can run"} {
		if !strings.Contains(msg, want) {
			t.Errorf("denial does not say %q: %s", want, msg)
		}
	}
	if got := decisions(webhook.OutcomeError); got != errorsBefore+1 {
		t.Errorf("error decisions = %v, want %v", got, errorsBefore+1)
	}
}

func raw(t *testing.T, obj runtime.Object) runtime.RawExtension {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: data}
}
