package webhook

import (
	"fmt"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLastAttemptWarnings: helm-controller copies Helm's error into the HelmRelease's
// conditions. The gate recognises a storedVersions rejection there in both of the API
// server's wordings: "must appear in spec.versions" (up to 1.32) and "missing from
// spec.versions; ... must remain in spec.versions" (from 1.33).
func TestLastAttemptWarnings(t *testing.T) {
	const crd = "buckets.source.toolkit.fluxcd.io"
	helmErr := func(wording string) string {
		return fmt.Sprintf(`Helm upgrade failed for release flux-system/flux with chart flux2@2.18.2: failed to update resource: CustomResourceDefinition.apiextensions.k8s.io "%s" is invalid: status.storedVersions[0]: Invalid value: "v1beta2": %s`, crd, wording)
	}
	const newWording = "missing from spec.versions; v1beta2 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1beta2 and removes v1beta2 from status.storedVersions"
	cases := []struct {
		name  string
		conds []metav1.Condition
		want  string
	}{
		{"up to 1.32", []metav1.Condition{{Type: helmv2.ReleasedCondition, Status: metav1.ConditionFalse, Message: helmErr("must appear in spec.versions")}},
			"(condition Released): " + crd + ": v1beta2 is still in status.storedVersions"},
		{"from 1.33", []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Message: helmErr(newWording)}},
			"(condition Ready): " + crd + ": v1beta2 is still in status.storedVersions"},
		{"failed remediation", []metav1.Condition{{Type: helmv2.ReleasedCondition, Status: metav1.ConditionTrue, Message: "Helm upgrade succeeded"},
			{Type: helmv2.RemediatedCondition, Status: metav1.ConditionFalse, Message: helmErr(newWording)}}, "(condition Remediated)"},
		{"another failure", []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Message: "Helm upgrade failed: timed out waiting for the condition"}}, ""},
		{"an old message on a ready release", []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Message: helmErr(newWording)}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hr := &helmv2.HelmRelease{Status: helmv2.HelmReleaseStatus{Conditions: c.conds}}
			got := lastAttemptWarnings(hr)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("warnings %q, want none", got)
			case c.want != "" && (len(got) != 1 || !strings.Contains(got[0], c.want)):
				t.Errorf("warnings %q, want one that says %q", got, c.want)
			}
		})
	}
}
