package predict

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

func TestDecideBundled(t *testing.T) {
	m := ChartMigration{Name: "widgets-v2", APIVersion: "storagemigration.k8s.io/v1", Group: "example.com", Resource: "widgets", File: "c/templates/svm.yaml"}
	type want struct {
		Verdict BundledVerdict
		Reason  []string
		Action  []string
	}
	migrate := cmdline.Migrate{CRDs: []string{"widgets.example.com"}}.String()
	cases := []struct {
		name  string
		m     ChartMigration
		facts func() BundledFacts
		want  want
	}{
		{
			name: "no CRD anywhere",
			facts: func() BundledFacts {
				return BundledFacts{}
			},
			want: want{BundledNoCRD, []string{"widgets.example.com names no CRD"}, []string{"spec.resource"}},
		},
		{
			name: "arrives with the CRD that drops the stored version: too late",
			facts: func() BundledFacts {
				live, in := crd([]string{"v1beta1", "v1"}, "v1beta1", "v1*"), crd(nil, "v1*")
				f := Decide(live, Incoming{CRD: in, Source: Templates, Applied: true})
				return BundledFacts{Operation: Upgrade, Live: live, Incoming: in, Applied: true, Decision: &f}
			},
			want: want{BundledTooLate, []string{"drops stored v1beta1", "rejects that CRD write", "the upgrade fails"}, []string{"before the upgrade", migrate}},
		},
		{
			name: "too late for a bridge: the CRD's own step",
			facts: func() BundledFacts {
				live, in := crd([]string{"v1beta1"}, "v1beta1*"), crd(nil, "v1*")
				f := Decide(live, Incoming{CRD: in, Source: Templates, Applied: true})
				return BundledFacts{Operation: Rollback, Live: live, Incoming: in, Applied: true, Decision: &f}
			},
			want: want{BundledTooLate, []string{"drops stored v1beta1"}, []string{"the CRD's own next step"}},
		},
		{
			name: "a crds/ CRD Helm does not write, a stored version it lacks, and a new name: will run",
			facts: func() BundledFacts {
				live, in := crd([]string{"v1beta1", "v1"}, "v1beta1", "v1*"), crd(nil, "v1*")
				f := Decide(live, Incoming{CRD: in, Source: CRDsDir, Applied: false})
				return BundledFacts{Live: live, Incoming: in, Applied: false, Decision: &f}
			},
			want: want{BundledWillRun, []string{"stored at v1beta1 to v1"}, []string{migrate + " --wait"}},
		},
		{
			name: "a release ahead of the drop with a new name: will run, nothing waits",
			facts: func() BundledFacts {
				live, in := crd([]string{"v1beta1"}, "v1beta1*"), crd(nil, "v1beta1", "v1*")
				f := Decide(live, Incoming{CRD: in, Source: Templates, Applied: true})
				return BundledFacts{Live: live, Incoming: in, Applied: true, Decision: &f}
			},
			want: want{BundledWillRun, []string{"stored at v1beta1 to v1", "nothing waits for it"}, []string{migrate + " --wait"}},
		},
		{
			name: "a new CRD: will run with nothing to migrate",
			facts: func() BundledFacts {
				in := crd(nil, "v1*")
				f := Decide(nil, Incoming{CRD: in, Source: Templates, Applied: true})
				return BundledFacts{Incoming: in, Applied: true, Decision: &f}
			},
			want: want{BundledWillRun, []string{"nothing to migrate: storedVersions will be [v1]"}, []string{"--wait"}},
		},
		{
			name: "the name ran before and versions remain: will not run",
			facts: func() BundledFacts {
				live, in := crd([]string{"v1beta1", "v1"}, "v1beta1", "v1*"), crd(nil, "v1beta1", "v1*")
				f := Decide(live, Incoming{CRD: in, Source: Templates, Applied: true})
				return BundledFacts{Live: live, Incoming: in, Applied: true, Decision: &f,
					Existing: &LiveMigration{CRD: "widgets.example.com", State: "succeeded"}}
			},
			want: want{BundledWillNotRun, []string{"already exists (succeeded)", "migrates nothing"},
				[]string{"stored v1beta1 remain", migrate, "new name for each chart version"}},
		},
		{
			name: "the name ran before for another resource",
			facts: func() BundledFacts {
				live := crd([]string{"v1"}, "v1*")
				return BundledFacts{Live: live, Existing: &LiveMigration{CRD: "gadgets.example.com", State: "running"}}
			},
			want: want{BundledWillNotRun, []string{"running, for gadgets.example.com", "refuses to change spec.resource"},
				[]string{"nothing to migrate after this release"}},
		},
		{
			name: "a generateName migration is new on every apply",
			m:    ChartMigration{APIVersion: "storagemigration.k8s.io/v1", Group: "example.com", Resource: "widgets"},
			facts: func() BundledFacts {
				live := crd([]string{"v1beta1", "v1"}, "v1beta1", "v1*")
				return BundledFacts{Live: live, Existing: &LiveMigration{CRD: "widgets.example.com", State: "succeeded"}}
			},
			want: want{BundledWillRun, []string{"stored at v1beta1 to v1"}, nil},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mig := m
			if c.m.Resource != "" {
				mig = c.m
			}
			got := DecideBundled(mig, c.facts())
			if got.CRD != "widgets.example.com" || got.Name != mig.Name || got.File != mig.File || got.APIVersion != mig.APIVersion {
				t.Errorf("identity %+v, want the migration's name, file, apiVersion and widgets.example.com", got)
			}
			if diff := cmp.Diff(c.want.Verdict, got.Verdict); diff != "" {
				t.Errorf("verdict (-want +got):\n%s\nreason: %s", diff, got.Reason)
			}
			for _, s := range c.want.Reason {
				if !strings.Contains(got.Reason, s) {
					t.Errorf("reason %q, want it to say %q", got.Reason, s)
				}
			}
			for _, s := range c.want.Action {
				if !strings.Contains(got.Action, s) {
					t.Errorf("action %q, want it to say %q", got.Action, s)
				}
			}
		})
	}
}

func TestChartMigrationCRD(t *testing.T) {
	if got := (ChartMigration{Group: "example.com", Resource: "widgets"}).CRD(); got != "widgets.example.com" {
		t.Errorf("CRD() = %q", got)
	}
	if got := (ChartMigration{Resource: "secrets"}).CRD(); got != "secrets" {
		t.Errorf("core group CRD() = %q, want secrets", got)
	}
}
