package migrate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// TestFailingConversionWebhook: objects stored at v1alpha1 need a conversion webhook that
// fails every conversion. The run stops at its deadline, does not prune, and names the
// webhook.
func TestFailingConversionWebhook(t *testing.T) {
	e := emptyCluster(t)
	wh := testenv.StartWebhook(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review apiextv1.ConversionReview
		_ = json.NewDecoder(r.Body).Decode(&review)
		review.Response = &apiextv1.ConversionResponse{UID: review.Request.UID,
			Result: metav1.Status{Status: metav1.StatusFailure, Message: "conversion refused by the test webhook"}}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	}))
	defer wh.Close()

	crd := testenv.TwoVersionCRD("example.com", "widgets", "Widget")
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1alpha1", Resource: "widgets"},
		Kind: "Widget", Namespaces: []string{"w"}, PerNS: 5, Spec: map[string]any{"size": int64(1)}}); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	crd.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter, Webhook: &apiextv1.WebhookConversion{
		ConversionReviewVersions: []string{"v1"},
		ClientConfig:             &apiextv1.WebhookClientConfig{URL: ptr.To(wh.URL + "/convert"), CABundle: wh.CABundle},
	}}
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}

	o := opts()
	o.Deadline = 3 * time.Second
	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: crd.Name}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != migrate.Incomplete || !strings.Contains(res.Message, "conversion webhook") || !strings.Contains(res.Message, "conversion refused by the test webhook") {
		t.Errorf("status %s message %q, want incomplete naming the conversion webhook and its answer", res.Status, res.Message)
	}
	if got := storedVersions(t, e, crd.Name); strings.Join(got, ",") != "v1alpha1,v1" {
		t.Errorf("storedVersions %v, want untouched", got)
	}
}

// TestRejectingAdmissionWebhook: a validating webhook denies updates of two objects.
// They are reported by name with the webhook's reason, the others are migrated, and
// storedVersions is not pruned.
func TestRejectingAdmissionWebhook(t *testing.T) {
	e := fluxState(t, []string{"a"}, 10)
	wh := testenv.StartWebhook(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		_ = json.NewDecoder(r.Body).Decode(&review)
		allowed := review.Request.Name != "obj-3" && review.Request.Name != "obj-7"
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: allowed,
			Result: &metav1.Status{Message: "frozen by policy"}}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	}))
	defer wh.Close()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	vwc := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "freeze"},
		Webhooks: []admissionregv1.ValidatingWebhook{{
			Name:                    "freeze.example.com",
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: ptr.To(wh.URL + "/validate"), CABundle: wh.CABundle},
			Rules:                   []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Update}, Rule: admissionregv1.Rule{APIGroups: []string{"source.toolkit.fluxcd.io"}, APIVersions: []string{"*"}, Resources: []string{"helmrepositories"}}}},
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregv1.Fail),
		}},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(e.ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.WithoutCancel(e.ctx), "freeze", metav1.DeleteOptions{})
	})

	res, err := newMigrator(t, cp.Config).Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != migrate.Incomplete || res.FailedCount != 2 || res.Rewritten != 8 {
		t.Fatalf("status %s failed %d rewritten %d, want incomplete with 2 failed and 8 rewritten", res.Status, res.FailedCount, res.Rewritten)
	}
	for _, f := range res.Failed {
		if (f.Object != "a/obj-3" && f.Object != "a/obj-7") || !strings.Contains(f.Error, "frozen by policy") {
			t.Errorf("failure %+v, want a/obj-3 or a/obj-7 with the webhook's reason", f)
		}
	}
	if got := storedVersions(t, e, helmrepos); strings.Join(got, ",") != "v1beta2,v1" {
		t.Errorf("storedVersions %v, want untouched", got)
	}
}

// TestThrottledByAPF: API Priority and Fairness gives the migrating user a few seats and
// rejects what does not fit, so the 429s (with Retry-After) are the API server's own. A
// Migrator built with the library's defaults (no client-side rate limit) honours them:
// the run completes and prunes storedVersions.
func TestThrottledByAPF(t *testing.T) {
	e := fluxState(t, []string{"a", "b"}, 50)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	pl := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "ug-throttle"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: ptr.To(int32(1)), LendablePercent: ptr.To(int32(0)),
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}},
	}
	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "ug-throttle"},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "ug-throttle"},
			MatchingPrecedence: 100,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:         []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "throttled"}}},
				ResourceRules:    []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}, ClusterScope: true, Namespaces: []string{"*"}}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
			}},
		},
	}
	if _, err := cs.FlowcontrolV1().PriorityLevelConfigurations().Create(e.ctx, pl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.FlowcontrolV1().FlowSchemas().Create(e.ctx, fs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.FlowcontrolV1().FlowSchemas().Delete(context.WithoutCancel(e.ctx), fs.Name, metav1.DeleteOptions{})
		_ = cs.FlowcontrolV1().PriorityLevelConfigurations().Delete(context.WithoutCancel(e.ctx), pl.Name, metav1.DeleteOptions{})
	})
	// Not in system:masters: that group matches the mandatory "exempt" FlowSchema.
	throttled, err := cp.AddUser("throttled")
	if err != nil {
		t.Fatal(err)
	}
	cp.GrantClusterAdmin(t, "throttled")
	var tooMany atomic.Int64
	throttled.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil && resp.StatusCode == http.StatusTooManyRequests {
				tooMany.Add(1)
			}
			return resp, err
		})
	})
	before := rejected(t, cs)
	o := opts()
	o.Concurrency, o.PageSize = 64, 10
	m, err := migrate.New(throttled) // no RateLimit: the default, unlimited client
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, o)
	if err != nil || res.Status != migrate.Migrated || res.Rewritten != 100 {
		t.Fatalf("%v %+v", err, res)
	}
	if got := storedVersions(t, e, helmrepos); strings.Join(got, ",") != "v1" {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	after := rejected(t, cs)
	t.Logf("429 responses seen by the client: %d; APF rejections of the flow: %v", tooMany.Load(), after-before)
	if tooMany.Load() == 0 || after <= before {
		t.Errorf("the throttle never bit: %d 429s, %v APF rejections", tooMany.Load(), after-before)
	}
}

// rejected reads apiserver_flowcontrol_rejected_requests_total for the test's flow
// schema from the API server's metrics.
func rejected(t *testing.T, cs kubernetes.Interface) float64 {
	return flowMetric(t, cs, "apiserver_flowcontrol_rejected_requests_total", "ug-throttle")
}

// flowMetric sums the API server's counter name over the series of flowSchema.
func flowMetric(t *testing.T, cs kubernetes.Interface, name, flowSchema string) float64 {
	t.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, `flow_schema="`+flowSchema+`"`) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
				total += v
			}
		}
	}
	return total
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
