package admissionpolicy_test

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
)

// TestDeletionPolicies: the deletion of a CRD, evaluated here against deny-deletion
// policies modelled on those users run (sapcc's and Cozystack's: testenv.ConfirmDeletion,
// testenv.NoDelete), agrees with the API server's own answer to the DELETE, for an admin
// and for a user who may only list the policies: the CRD the policy protects is denied,
// named with the policy, its binding, the operation and the message (for the sapcc-like
// policy, the evaluation error the API server answers with), and the way on is to keep
// the CRD; the CRD the policy lets go is deleted, as predicted, for real.
func TestDeletionPolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	reader := policyReader(t, "deletion-reader")
	who := []identity{{"admin", cp.Config}, reader}

	for _, tc := range []struct {
		name        string
		policy      func() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding)
		protected   *apiextv1.CustomResourceDefinition
		message     string
		letGo       *apiextv1.CustomResourceDefinition
		messageSays string
	}{
		{name: "confirm deletion (sapcc)", policy: testenv.ConfirmDeletion,
			protected: widgetCRD("confirm.deletion.test", nil, nil),
			// The API server's own words for the evaluation error (no annotations at all).
			messageSays: "no such key",
			letGo:       widgetCRD("confirmed.deletion.test", nil, map[string]string{testenv.ConfirmDeletionAnnotation: "true"})},
		{name: "no-delete label (cozystack)", policy: testenv.NoDelete,
			protected: widgetCRD("nodelete.deletion.test", map[string]string{testenv.NoDeleteLabel: "true"}, nil),
			message:   testenv.NoDeleteMessage,
			letGo:     widgetCRD("unlabelled.deletion.test", nil, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			protected, letGo := createCRD(t, tc.protected), createCRD(t, tc.letGo)
			policy, binding := tc.policy()
			installPolicy(t, policy, binding, protected, nil)
			for _, w := range who {
				got := agree(t, w, protected, nil)
				if len(got) != 1 {
					t.Fatalf("%s: %d denials of deleting %s, want 1: %+v", w.name, len(got), protected.Name, got)
				}
				d := got[0]
				if d.Policy != policy.Name || d.Binding != binding.Name || d.Operation != admissionregistrationv1.Delete || !d.Deletion() {
					t.Errorf("%s: denial %+v, want %s (binding %s) denying the DELETE", w.name, d, policy.Name, binding.Name)
				}
				if tc.message != "" && d.Message != tc.message || !strings.Contains(d.Message, tc.messageSays) {
					t.Errorf("%s: message %q, want %q", w.name, d.Message, tc.message+tc.messageSays)
				}
				if d.WayOn.Kind != admissionpolicy.WayKeep || !strings.Contains(d.WayOn.Advice, "keep the CRD") {
					t.Errorf("%s: way on %+v, want keeping the CRD", w.name, d.WayOn)
				}
				if msg := admissionpolicy.Message(got); !strings.Contains(msg, "denies the deletion: ") {
					t.Errorf("%s: message %q does not say it is the deletion that is denied", w.name, msg)
				}
				if got := agree(t, w, letGo, nil); len(got) != 0 {
					t.Errorf("%s: deleting %s denied: %+v", w.name, letGo.Name, got)
				}
			}
			// The CRD the policy lets go is deleted for real, as predicted.
			if err := deleteCRD(t, letGo.Name); err != nil {
				t.Errorf("delete %s: %v", letGo.Name, err)
			}
		})
	}
}
