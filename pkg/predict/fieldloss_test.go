package predict

import "testing"

// TestAcceptsFieldLoss: only the annotation set to "true" on a live CRD accepts the loss,
// and WithSchema's verdict follows that one answer.
func TestAcceptsFieldLoss(t *testing.T) {
	s := Schema{Pruned: []string{".spec.old"}, Summary: "drops .spec.old (1 object)"}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		nilCRD      bool
		want        bool
		wantVerdict Verdict
	}{
		{name: "no live CRD", nilCRD: true, want: false, wantVerdict: DataLoss},
		{name: "no annotation", want: false, wantVerdict: DataLoss},
		{name: "annotation false", annotations: map[string]string{AllowFieldLossAnnotation: "false"}, want: false, wantVerdict: DataLoss},
		{name: "annotation true", annotations: map[string]string{AllowFieldLossAnnotation: "true"}, want: true, wantVerdict: OK},
	} {
		live := crd([]string{"v1"}, "v1*")
		live.Annotations = tc.annotations
		if tc.nilCRD {
			live = nil
		}
		if got := AcceptsFieldLoss(live); got != tc.want {
			t.Errorf("%s: AcceptsFieldLoss() = %v, want %v", tc.name, got, tc.want)
		}
		if got := WithSchema(Decision{Verdict: OK}, live, s).Verdict; got != tc.wantVerdict {
			t.Errorf("%s: WithSchema() verdict = %q, want %q", tc.name, got, tc.wantVerdict)
		}
	}
}
