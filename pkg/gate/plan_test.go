package gate

import (
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestJudgeBridgeNamesPlan: a decision blocked by a bridge names the plan command, the
// caller's or one written from the report; other blocks do not.
func TestJudgeBridgeNamesPlan(t *testing.T) {
	report := func(v predict.Verdict) *check.Report {
		return &check.Report{Release: "flux", Namespace: "flux-system", Chart: "flux2", ChartVersion: "2.18.2",
			CRDs: []check.CRDReport{{Decision: predict.Decision{Name: "buckets.source.toolkit.fluxcd.io", Verdict: v, Reason: "r"}}}}
	}
	cases := []struct {
		name    string
		verdict predict.Verdict
		o       Options
		want    string
	}{
		{"bridge, from the report", predict.Bridge, Options{}, "upgradeguard plan --release flux -n flux-system --chart flux2 --version 2.18.2"},
		{"bridge, the caller's", predict.Bridge, Options{PlanCommand: "upgradeguard plan --helmrelease flux-system/flux"}, "upgradeguard plan --helmrelease flux-system/flux"},
		{"delete", predict.Delete, Options{}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Judge(t.Context(), report(tc.verdict), tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != Blocked || d.Plan != tc.want {
				t.Errorf("outcome %s plan %q, want Blocked and %q", d.Outcome, d.Plan, tc.want)
			}
			if tc.want != "" && !strings.Contains(d.Message, "The whole safe path: "+tc.want) {
				t.Errorf("message does not name the plan: %s", d.Message)
			}
		})
	}
}
