package charts_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/upgradeguard/upgradeguard/pkg/crdguard"
)

// TestCRDDeletionPolicyIsTheLibrarys: with webhook.crdDeletion.mode policy or both the
// chart renders the admission policies and bindings of pkg/crdguard for the release's
// ServiceAccount (which pkg/crdguard's tests prove on the API server), and the controller
// keeps the label they read; mode webhook (the default) renders the webhook alone.
// TestApplyRenderedManifests applies them.
func TestCRDDeletionPolicyIsTheLibrarys(t *testing.T) {
	keep := map[string]string{"helm.sh/resource-policy": "keep"}
	for _, tc := range []struct {
		name, release string
		set           []string
		opts          crdguard.Options
		webhook       bool // the crd-delete webhook is rendered too
	}{
		{"policy", "upgradeguard", []string{"webhook.crdDeletion.mode=policy"},
			crdguard.Options{Name: "upgradeguard-crd-deletion", ServiceAccountNamespace: "ug-system", ServiceAccountName: "upgradeguard", Annotations: keep}, false},
		{"both", "platform", []string{"webhook.crdDeletion.mode=both", "serviceAccount.name=guard", "webhook.crdDeletion.keepPolicyOnUninstall=false"},
			crdguard.Options{Name: "platform-upgradeguard-crd-deletion", ServiceAccountNamespace: "ug-system", ServiceAccountName: "guard"}, true},
		{"no webhooks", "nowebhook", []string{"webhook.crdDeletion.mode=policy", "webhook.enabled=false"},
			crdguard.Options{Name: "nowebhook-upgradeguard-crd-deletion", ServiceAccountNamespace: "ug-system", ServiceAccountName: "nowebhook-upgradeguard", Annotations: keep}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, tc.release, "ug-system", tc.set...)
			gotDel := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, m, "ValidatingAdmissionPolicy", tc.opts.Name)
			tc.opts.Labels = gotDel.Labels
			want := crdguard.Objects(tc.opts)
			for _, d := range []struct{ want, got any }{
				{want.Deletion, gotDel},
				{want.DeletionBinding, typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, m, "ValidatingAdmissionPolicyBinding", tc.opts.Name)},
				{want.Label, typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, m, "ValidatingAdmissionPolicy", tc.opts.Name+"-label")},
				{want.LabelBinding, typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, m, "ValidatingAdmissionPolicyBinding", tc.opts.Name+"-label")},
			} {
				if diff := cmp.Diff(d.want, d.got); diff != "" {
					t.Errorf("(-library +chart):\n%s", diff)
				}
			}
			if gotDel.Labels["app.kubernetes.io/instance"] != tc.release {
				t.Errorf("labels %v", gotDel.Labels)
			}
			assertGuard(t, m, strings.TrimSuffix(tc.opts.Name, "-crd-deletion"), true, tc.webhook)
		})
	}
	for _, set := range [][]string{nil, {"webhook.crdDeletion.mode=both", "webhook.crdDeletion.enabled=false"}} {
		m := render(t, "plain", "ug-system", set...)
		if m.has("ValidatingAdmissionPolicy") || m.has("ValidatingAdmissionPolicyBinding") {
			t.Errorf("--set %v rendered %v", set, m.kinds())
		}
		assertGuard(t, m, "plain-upgradeguard", false, set == nil)
	}
}

// assertGuard checks that the controller keeps the label when the policies are rendered,
// and whether the crd-delete webhook is registered.
func assertGuard(t *testing.T, m *manifests, fullname string, label, webhook bool) {
	t.Helper()
	_, fs := controllerArgs(t, typed[appsv1.Deployment](t, m, "Deployment", fullname))
	if got := flag(t, fs, "crd-holds-objects-label"); got != map[bool]string{true: "true", false: "false"}[label] {
		t.Errorf("--crd-holds-objects-label=%s, want %t", got, label)
	}
	registered := false
	if m.has("ValidatingWebhookConfiguration") {
		vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", fullname)
		for _, w := range vwc.Webhooks {
			registered = registered || w.Name == "crd-delete.upgradeguard.io"
		}
	}
	if registered != webhook {
		t.Errorf("crd-delete webhook registered: %t, want %t", registered, webhook)
	}
}
