package releasediff_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/releasediff"
)

// TestNextSteps: which steps each state of a failed upgrade calls for, and in which order.
func TestNextSteps(t *testing.T) {
	const crd = "CustomResourceDefinition/buckets.source.toolkit.fluxcd.io"
	rej := crdversions.StoredVersionRejection{CRD: "buckets.source.toolkit.fluxcd.io", Version: "v1beta2"}
	migrate := releasediff.NextStep{Action: releasediff.MigrateStoredVersions,
		Command: "upgradeguard check --release flux -n flux-system --chart <the chart of revision 3>", Runbook: releasediff.StoredVersionsRunbook}
	owners := releasediff.NextStep{Action: releasediff.SettleFieldOwners}
	report := func(notLanded, drifted []string, rejected bool) *releasediff.Report {
		r := &releasediff.Report{Release: "flux", Namespace: "flux-system", FailedRevision: 3,
			Landed: []string{"Deployment/flux-system/source-controller"}, NotLanded: notLanded, Drifted: drifted}
		r.Mixed = len(notLanded) > 0
		if rejected {
			r.Objects = []releasediff.Object{{Object: crd, Rejected: []crdversions.StoredVersionRejection{rej}}}
			r.StoredVersionsRejected = []crdversions.StoredVersionRejection{rej}
		}
		return r
	}
	for _, tc := range []struct {
		name string
		rep  *releasediff.Report
		want []releasediff.NextStep
	}{
		{"clean", report(nil, nil, false), nil},
		{"mixed", report([]string{"Deployment/flux-system/web"}, nil, false), []releasediff.NextStep{owners}},
		{"drifted only", report(nil, []string{"Secret/flux-system/token"}, false), []releasediff.NextStep{owners}},
		{"only the rejected CRD did not land", report([]string{crd}, nil, true), []releasediff.NextStep{migrate}},
		{"the rejected CRD and another object did not land", report([]string{crd, "Deployment/flux-system/web"}, nil, true),
			[]releasediff.NextStep{migrate, owners}},
		{"the rejected CRD, and a drift", report([]string{crd}, []string{"Secret/flux-system/token"}, true), []releasediff.NextStep{migrate, owners}},
		{"rejected in the description, nothing half-applied", &releasediff.Report{Release: "flux", Namespace: "flux-system", FailedRevision: 3,
			StoredVersionsRejected: []crdversions.StoredVersionRejection{rej}}, []releasediff.NextStep{migrate}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.rep.NextSteps()); diff != "" {
				t.Errorf("next steps (-want +got):\n%s", diff)
			}
		})
	}
}
