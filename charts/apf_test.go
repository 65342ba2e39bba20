package charts_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"

	"github.com/upgradeguard/upgradeguard/pkg/apf"
)

// TestAPFObjectsAreTheLibrarys: the chart's FlowSchema and PriorityLevelConfiguration are
// those of pkg/apf for the release's ServiceAccount (which `upgradeguard apf` prints and
// the migrate tests prove on the API server), with the chart's values for the knobs;
// apf.enabled=false renders neither. TestApplyRenderedManifests applies them.
func TestAPFObjectsAreTheLibrarys(t *testing.T) {
	for _, tc := range []struct {
		name, release string
		set           []string
		opts          apf.Options
	}{
		{"defaults", "upgradeguard", nil,
			apf.Options{Name: "upgradeguard-migrations", Subjects: []flowcontrolv1.Subject{apf.ServiceAccount("ug-system", "upgradeguard")}}},
		{"tuned", "platform", []string{"apf.nominalConcurrencyShares=5", "apf.queues=8", "apf.handSize=2", "apf.queueLengthLimit=20", "apf.matchingPrecedence=700", "serviceAccount.name=migrator"},
			apf.Options{Name: "platform-upgradeguard-migrations", Subjects: []flowcontrolv1.Subject{apf.ServiceAccount("ug-system", "migrator")},
				NominalConcurrencyShares: 5, Queues: 8, HandSize: 2, QueueLengthLimit: 20, MatchingPrecedence: 700}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, tc.release, "ug-system", tc.set...)
			gotPL := typed[flowcontrolv1.PriorityLevelConfiguration](t, m, "PriorityLevelConfiguration", tc.opts.Name)
			gotFS := typed[flowcontrolv1.FlowSchema](t, m, "FlowSchema", tc.opts.Name)
			tc.opts.Labels = gotFS.Labels
			wantPL, wantFS := apf.Objects(tc.opts)
			if diff := cmp.Diff(wantPL, gotPL); diff != "" {
				t.Errorf("PriorityLevelConfiguration (-library +chart):\n%s", diff)
			}
			if diff := cmp.Diff(wantFS, gotFS); diff != "" {
				t.Errorf("FlowSchema (-library +chart):\n%s", diff)
			}
			if gotPL.Labels["app.kubernetes.io/instance"] != tc.release {
				t.Errorf("labels %v", gotPL.Labels)
			}
		})
	}
	if m := render(t, "off", "ug-system", "apf.enabled=false"); m.has("FlowSchema") || m.has("PriorityLevelConfiguration") {
		t.Errorf("apf.enabled=false rendered %v", m.kinds())
	}
}
