package predict

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

var (
	// argoAuto prunes on its automated sync; argoManual does not.
	argoAuto   = ArgoCD(true, nil, false)
	argoManual = ArgoCD(false, []string{"ServerSideApply=true"}, false)
)

func syncOptions(v string) map[string]string { return map[string]string{ArgoSyncOptionsAnnotation: v} }

// TestArgoCD: the Application's sync policy as the deployer reads it.
func TestArgoCD(t *testing.T) {
	for _, tc := range []struct {
		name      string
		autoPrune bool
		options   []string
		skip      bool
		want      ArgoSync
	}{
		{"no options", false, nil, false, ArgoSync{}},
		{"automated prune, helm.skipCrds", true, nil, true, ArgoSync{AutoPrune: true, SkipCRDs: true}},
		{"application Prune (Delete= is the object's alone)", false, []string{"CreateNamespace=true", "Prune=false", "Delete=confirm"}, false, ArgoSync{Prune: "false"}},
		{"orphan", true, []string{"PrunePropagationPolicy=orphan"}, false, ArgoSync{AutoPrune: true, PropagationPolicy: ArgoOrphan}},
		{"background wins, as controller/sync.go tests it first", false, []string{"PrunePropagationPolicy=orphan", "PrunePropagationPolicy=background"}, false,
			ArgoSync{PropagationPolicy: "background"}},
	} {
		d := ArgoCD(tc.autoPrune, tc.options, tc.skip)
		if d.Spec().Kind != KindArgoCD || d.Sync != tc.want || d.String() != "Argo CD" {
			t.Errorf("%s: ArgoCD() = %s %+v, want Argo CD %+v", tc.name, d, d.Sync, tc.want)
		}
	}
}

// tracked is d with the tracking settings t.
func tracked(d ArgoCDDeployer, t ArgoTracking) ArgoCDDeployer {
	d.Sync.Tracking = t
	return d
}

// labelled gives crd the instance label value.
func labelled(crd *apiextv1.CustomResourceDefinition, value string) *apiextv1.CustomResourceDefinition {
	crd.Labels = map[string]string{ArgoDefaultInstanceLabel: value}
	return crd
}

// TestArgoFate: Argo CD's rules for one object that leaves an Application, on a sync and
// on the Application's (cascading) deletion.
func TestArgoFate(t *testing.T) {
	keep := map[string]string{KeepAnnotation: KeepValue}
	for _, tc := range []struct {
		name string
		d    Deployer
		op   Operation
		l    Leaving
		want Fate
	}{
		{"automated prune deletes it", argoAuto, Upgrade, Leaving{Exists: true, CRD: true}, FateDeleted},
		{"without automated prune the sync leaves it", argoManual, Upgrade, Leaving{Exists: true, CRD: true}, FatePruneOnSync},
		{"automated sync turned off", ArgoCD(false, nil, false), Upgrade, Leaving{Exists: true}, FatePruneOnSync},
		{"a rollback prunes only when asked", argoAuto, Rollback, Leaving{Exists: true, CRD: true}, FatePruneOnSync},
		{"Prune=false alone", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Live: syncOptions("Prune=false")}, FateNoPrune},
		{"Prune=false among other options, spaced", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Live: syncOptions("ServerSideApply=true, Prune=false ,Replace=true")}, FateNoPrune},
		{"Prune=false on the Application", ArgoCD(true, []string{"Prune=false"}, false), Upgrade, Leaving{Exists: true, CRD: true}, FateNoPrune},
		{"the object's option overrides the Application's", ArgoCD(true, []string{"Prune=false"}, false), Upgrade,
			Leaving{Exists: true, CRD: true, Live: syncOptions("Prune=true")}, FateDeleted},
		{"Prune=confirm waits", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Live: syncOptions("Prune=confirm")}, FateConfirm},
		{"helm.sh/resource-policy: keep does not stop a prune", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Live: keep}, FateDeleted},
		{"Delete=false does not stop a prune", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Live: syncOptions("Delete=false")}, FateDeleted},
		{"not on the cluster", argoAuto, Upgrade, Leaving{CRD: true}, FateAbsent},
		{"Application deletion deletes an object", argoAuto, Uninstall, Leaving{Exists: true}, FateDeleted},
		{"Application deletion never deletes a CRD", argoAuto, Uninstall, Leaving{Exists: true, CRD: true}, FateCRDKept},
		{"Application deletion keeps Delete=false among other options", argoAuto, Uninstall, Leaving{Exists: true, Live: syncOptions("Prune=false,Delete=false")}, FateNoDelete},
		{"Application deletion reads Delete=false from the object alone", ArgoCD(false, []string{"Delete=false"}, false), Uninstall, Leaving{Exists: true}, FateDeleted},
		{"Application deletion keeps helm.sh/resource-policy: keep", argoAuto, Uninstall, Leaving{Exists: true, Live: keep}, FateNoDelete},
		{"Application deletion ignores Prune=false", argoAuto, Uninstall, Leaving{Exists: true, Live: syncOptions("Prune=false")}, FateDeleted},
		{"Application deletion waits on Delete=confirm", argoAuto, Uninstall, Leaving{Exists: true, Live: syncOptions("Delete=confirm")}, FateConfirm},
		{"an untracked CRD is never pruned", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Untracked: true}, FateUntracked},
		{"an untracked CRD needs no Prune=false", argoAuto, Upgrade, Leaving{Exists: true, CRD: true, Untracked: true, Live: syncOptions("Prune=false")}, FateUntracked},
		{"an untracked CRD without automated prune", argoManual, Upgrade, Leaving{Exists: true, CRD: true, Untracked: true}, FateUntracked},
		{"the Application's deletion of an untracked CRD", argoAuto, Uninstall, Leaving{Exists: true, CRD: true, Untracked: true}, FateCRDKept},
	} {
		if got := tc.d.Fate(tc.op, tc.l); got != tc.want {
			t.Errorf("%s: %s.Fate(%s) = %s, want %s", tc.name, tc.d, tc.op, got, tc.want)
		}
	}
}

// TestArgoTracking: whether Argo CD counts a live object as the Application's, by its
// tracking method (argo-cd v3.6 GetAppName): the instance label under label tracking, the
// tracking-id annotation (with the installation id, when one is set) otherwise; unknown
// settings count everything as tracked.
func TestArgoTracking(t *testing.T) {
	label := ArgoTracking{Method: ArgoTrackingLabel, Instance: "widgets"}
	annotation := ArgoTracking{Method: "annotation", Instance: "widgets"}
	id := func(v string) map[string]string { return map[string]string{ArgoTrackingAnnotation: v} }
	for _, tc := range []struct {
		name                string
		t                   ArgoTracking
		labels, annotations map[string]string
		want                bool
	}{
		{"unknown settings: tracked", ArgoTracking{}, nil, nil, true},
		{"label tracking, the chart's instance label", label, map[string]string{ArgoDefaultInstanceLabel: "widgets"}, nil, true},
		{"label tracking, another release's label", label, map[string]string{ArgoDefaultInstanceLabel: "other"}, nil, false},
		{"label tracking, no label", label, nil, id("widgets:apiextensions.k8s.io/CustomResourceDefinition:/a.x"), false},
		{"label tracking, own label key", ArgoTracking{Method: ArgoTrackingLabel, LabelKey: "argocd.argoproj.io/instance", Instance: "widgets"},
			map[string]string{ArgoDefaultInstanceLabel: "widgets", "argocd.argoproj.io/instance": "x"}, nil, false},
		{"annotation tracking, no annotation (what Argo CD renders for a CRD)", annotation, map[string]string{ArgoDefaultInstanceLabel: "widgets"}, nil, false},
		{"annotation tracking, the tracking id", annotation, nil, id("widgets:apiextensions.k8s.io/CustomResourceDefinition:/a.x"), true},
		{"annotation tracking, another Application's id", annotation, nil, id("other:apiextensions.k8s.io/CustomResourceDefinition:/a.x"), false},
		{"annotation tracking, a malformed id", annotation, nil, id("widgets"), false},
		{"annotation+label reads the annotation", ArgoTracking{Method: "annotation+label", Instance: "widgets"},
			map[string]string{ArgoDefaultInstanceLabel: "widgets"}, nil, false},
		{"an installation id the object does not carry", ArgoTracking{Method: "annotation", Instance: "widgets", InstallationID: "prod"},
			nil, id("widgets:apiextensions.k8s.io/CustomResourceDefinition:/a.x"), false},
		{"an Application outside Argo CD's namespace", ArgoTracking{Method: "annotation", Instance: "team_widgets"},
			nil, id("team_widgets:apiextensions.k8s.io/CustomResourceDefinition:/a.x"), true},
	} {
		if got := tc.t.Tracks(tc.labels, tc.annotations); got != tc.want {
			t.Errorf("%s: Tracks() = %t, want %t", tc.name, got, tc.want)
		}
	}
}

// TestArgoRemovals: which live CRDs leave an Application, for each way a CRD leaves a
// chart, and which of them Argo CD deletes.
func TestArgoRemovals(t *testing.T) {
	const a, b = "as.example.com", "bs.example.com"
	live := func(ann map[string]string) map[string]*apiextv1.CustomResourceDefinition {
		return map[string]*apiextv1.CustomResourceDefinition{a: named(a, ann, []string{"v1"}, "v1*"), b: named(b, nil, []string{"v1"}, "v1*")}
	}
	// managed is what the resource tree names: the CRD, without its source.
	managed := []ChartCRD{{CRD: named(a, nil, nil)}, {CRD: named(b, nil, nil)}}
	tpl := func(name string) ChartCRD { return ChartCRD{CRD: named(name, nil, nil, "v1*"), Source: Templates} }
	dir := func(name string) ChartCRD { return ChartCRD{CRD: named(name, nil, nil, "v1*"), Source: CRDsDir} }
	type got struct {
		Name    string
		Fate    Fate
		Shipped bool
	}
	for _, tc := range []struct {
		name string
		c    ReleaseChange
		want []got
	}{{
		name: "templates/ to crds/ (lws 0.7.0 to 0.8.0): Argo CD renders crds/, so nothing leaves",
		c:    ReleaseChange{Deployer: argoAuto, Operation: Upgrade, Live: live(nil), Current: managed, Incoming: []ChartCRD{dir(a), tpl(b)}},
	}, {
		name: "templates/ to crds/ under helm.skipCrds: it leaves, and is pruned",
		c:    ReleaseChange{Deployer: ArgoCD(true, nil, true), Operation: Upgrade, Live: live(nil), Current: managed, Incoming: []ChartCRD{dir(a), tpl(b)}},
		want: []got{{a, FateDeleted, true}},
	}, {
		name: "values toggle with automated prune: deleted",
		c:    ReleaseChange{Deployer: argoAuto, Operation: Upgrade, Live: live(nil), Current: managed, Incoming: []ChartCRD{tpl(b)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "values toggle without automated prune: left for a sync that prunes",
		c:    ReleaseChange{Deployer: argoManual, Operation: Upgrade, Live: live(nil), Current: managed, Incoming: []ChartCRD{dir(b)}},
		want: []got{{a, FatePruneOnSync, false}},
	}, {
		name: "Prune=false in a multi-option annotation keeps it",
		c: ReleaseChange{Deployer: argoAuto, Operation: Upgrade, Live: live(syncOptions("ServerSideApply=true,Prune=false")), Current: managed,
			Incoming: []ChartCRD{tpl(b)}},
		want: []got{{a, FateNoPrune, false}},
	}, {
		name: "PrunePropagationPolicy=orphan: still deleted",
		c: ReleaseChange{Deployer: ArgoCD(true, []string{"PrunePropagationPolicy=orphan"}, false), Operation: Upgrade, Live: live(nil), Current: managed,
			Incoming: []ChartCRD{tpl(b)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "chart to chart: none rendered",
		c:    ReleaseChange{Deployer: argoAuto, Operation: Upgrade, Live: live(nil), Current: managed},
		want: []got{{a, FateDeleted, false}, {b, FateDeleted, false}},
	}, {
		name: "not on the cluster: nothing to delete",
		c:    ReleaseChange{Deployer: argoAuto, Operation: Upgrade, Live: map[string]*apiextv1.CustomResourceDefinition{}, Current: managed},
	}, {
		name: "values toggle under annotation tracking: the CRD carries no tracking id, so it leaves untracked",
		c: ReleaseChange{Deployer: tracked(argoAuto, ArgoTracking{Method: "annotation", Instance: "app"}), Operation: Upgrade, Live: live(nil), Current: managed,
			Incoming: []ChartCRD{tpl(b)}},
		want: []got{{a, FateUntracked, false}},
	}, {
		name: "values toggle under label tracking, the CRD labelled with the Application: deleted",
		c: ReleaseChange{Deployer: tracked(argoAuto, ArgoTracking{Method: ArgoTrackingLabel, Instance: "app"}), Operation: Upgrade,
			Live: map[string]*apiextv1.CustomResourceDefinition{a: labelled(named(a, nil, []string{"v1"}, "v1*"), "app")}, Current: managed,
			Incoming: []ChartCRD{tpl(b)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "the Application's deletion never deletes its CRDs, Delete=false or not",
		c:    ReleaseChange{Deployer: argoAuto, Operation: Uninstall, Live: live(syncOptions("Delete=false")), Current: managed},
		want: []got{{a, FateCRDKept, false}, {b, FateCRDKept, false}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var gotten []got
			for _, r := range Removals(tc.c) {
				gotten = append(gotten, got{r.Name(), r.Fate, r.Shipped != nil})
			}
			if diff := cmp.Diff(tc.want, gotten); diff != "" {
				t.Errorf("Removals() mismatch (-want +got):\n%s", diff)
			}
			var deletes []string
			for _, g := range tc.want {
				if g.Fate == FateDeleted {
					deletes = append(deletes, g.Name)
				}
			}
			if diff := cmp.Diff(deletes, Deletes(tc.c)); diff != "" {
				t.Errorf("Deletes() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestArgoDecideRemoved: the verdict and reason on a CRD that leaves an Application.
func TestArgoDecideRemoved(t *testing.T) {
	lws := func(ann map[string]string) *apiextv1.CustomResourceDefinition {
		c := named("leaderworkersets.x-k8s.io", ann, []string{"v1"}, "v1*")
		c.Spec.Names.Kind = "LeaderWorkerSet"
		return c
	}
	removal := func(ann map[string]string, fate Fate) Removal {
		return Removal{Live: lws(ann), From: ChartCRD{CRD: lws(nil)}, Fate: fate}
	}
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name    string
		op      Operation
		d       Deployer
		r       Removal
		objects *int64
		want    Verdict
		reason  []string
		not     []string
	}{
		{"values toggle with automated prune", Upgrade, argoAuto, removal(nil, FateDeleted), n(12), Delete,
			[]string{"no longer renders it", "automated sync prunes it: Argo CD deletes the CRD and all 12 LeaderWorkerSet objects"}, []string{"Helm", "orphan"}},
		{"count unknown", Upgrade, argoAuto, removal(nil, FateDeleted), nil, Delete, []string{"how many could not be read"}, nil},
		{"no objects, nothing lost", Upgrade, argoAuto, removal(nil, FateDeleted), n(0), OK, []string{"nothing is lost"}, nil},
		{"PrunePropagationPolicy=orphan saves nothing", Upgrade, ArgoCD(true, []string{"PrunePropagationPolicy=orphan"}, false), removal(nil, FateDeleted), n(3), Delete,
			[]string{"all 3 LeaderWorkerSet objects", "PrunePropagationPolicy=orphan does not save them", "whatever the propagation policy", "ownerReferences"}, nil},
		{"without automated prune: not deleted now", Upgrade, argoManual, removal(nil, FatePruneOnSync), n(12), Prune,
			[]string{"automated.prune is not true", "OutOfSync, the CRD requiring pruning", "argocd app sync --prune", "would delete the CRD and all 12 LeaderWorkerSet objects"}, nil},
		{"without automated prune, empty", Upgrade, argoManual, removal(nil, FatePruneOnSync), n(0), OK, []string{"nothing would be lost"}, nil},
		{"a rollback", Rollback, argoAuto, removal(nil, FatePruneOnSync), n(2), Prune, []string{"prunes only with --prune"}, nil},
		{"Prune=confirm", Upgrade, argoAuto, removal(syncOptions("Prune=confirm"), FateConfirm), n(2), Prune, []string{"Confirm Pruning", "would delete"}, nil},
		{"Prune=false on the CRD", Upgrade, argoAuto, removal(syncOptions("ServerSideApply=true,Prune=false"), FateNoPrune), n(12), OK,
			[]string{"Prune=false in its argocd.argoproj.io/sync-options annotation", "stay"}, nil},
		{"Prune=false on the Application", Upgrade, ArgoCD(true, []string{"Prune=false"}, false), removal(nil, FateNoPrune), n(12), OK,
			[]string{"Prune=false in the Application's spec.syncPolicy.syncOptions"}, nil},
		{"the Application's deletion", Uninstall, argoAuto, removal(syncOptions("Delete=false"), FateCRDKept), n(12), OK, []string{"never a CRD"}, nil},
		{"untracked", Upgrade, tracked(argoAuto, ArgoTracking{Method: ArgoTrackingLabel, Instance: "app"}), removal(nil, FateUntracked), n(12), OK,
			[]string{"no longer renders it, but Argo CD does not track the CRD as the Application's",
				"no app.kubernetes.io/instance label (application.resourceTrackingMethod: label) naming app", "no sync prunes it: the CRD and its objects stay"},
			[]string{"deletes the CRD"}},
		{"under helm.skipCrds, moved to crds/, empty", Upgrade, ArgoCD(true, nil, true),
			Removal{Live: lws(nil), From: ChartCRD{CRD: lws(nil)}, Shipped: &ChartCRD{CRD: lws(nil), Source: CRDsDir, File: "crds/lws.yaml"}, Fate: FateDeleted}, n(0), Delete,
			[]string{"helm.skipCrds", "does not create it again", "(chart file now crds/lws.yaml)"}, nil},
	} {
		f := DecideRemoved(tc.op, tc.d, tc.r, tc.objects)
		if f.Verdict != tc.want || f.Name != "leaderworkersets.x-k8s.io" {
			t.Errorf("%s: DecideRemoved() = %s (%s), want %s: %s", tc.name, f.Verdict, f.Name, tc.want, f.Reason)
		}
		for _, r := range tc.reason {
			if !strings.Contains(f.Reason, r) {
				t.Errorf("%s: reason %q does not say %q", tc.name, f.Reason, r)
			}
		}
		for _, r := range tc.not {
			if strings.Contains(f.Reason, r) {
				t.Errorf("%s: reason %q says %q", tc.name, f.Reason, r)
			}
		}
	}
}

// TestArgoKeep: Argo CD's fix is the Prune=false sync option on the live CRD, merged into
// the options it already lists, and what the plan's state holds after it.
func TestArgoKeep(t *testing.T) {
	bare := named("a.x", nil, []string{"v1"}, "v1*")
	other := named("b.x", nil, []string{"v1"}, "v1*")
	listed := named("c.x", syncOptions("ServerSideApply=true, Prune=confirm"), []string{"v1"}, "v1*")
	var got []string
	for _, c := range argoAuto.KeepCommands(Upgrade, []*apiextv1.CustomResourceDefinition{bare, listed, other}) {
		got = append(got, c.String())
	}
	want := []string{
		"kubectl annotate crd a.x b.x argocd.argoproj.io/sync-options=Prune=false",
		"kubectl annotate --overwrite crd c.x argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("KeepCommands() (-want +got):\n%s", diff)
	}
	if got := argoAuto.KeepCommands(Uninstall, []*apiextv1.CustomResourceDefinition{bare})[0].String(); got != "kubectl annotate crd a.x argocd.argoproj.io/sync-options=Delete=false" {
		t.Errorf("KeepCommands(Uninstall) = %q", got)
	}
	if got := ArgoSyncOption([]string{"a.x"}, ArgoPruneFalse, "Replace=true,x=a b").String(); got != "kubectl annotate --overwrite crd a.x 'argocd.argoproj.io/sync-options=Replace=true,x=a b,Prune=false'" {
		t.Errorf("a value with a space is not quoted: %q", got)
	}
	if got := Helm4.KeepCommands(Upgrade, []*apiextv1.CustomResourceDefinition{bare, other})[0].String(); got != "kubectl annotate crd a.x b.x helm.sh/resource-policy=keep" {
		t.Errorf("Helm's KeepCommands() = %q", got)
	}

	advice := argoAuto.KeepAdvice(Upgrade, []*apiextv1.CustomResourceDefinition{listed}, "", "")
	for _, w := range []string{"kubectl annotate --overwrite crd c.x argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false", "before the sync",
		"adds the option to those the annotation already lists", "helm.sh/resource-policy: keep does not stop an Argo CD prune",
		// Argo CD's own confirmation, beside Prune=false.
		"argocd.argoproj.io/sync-options: Prune=confirm", "kubectl annotate --overwrite crd c.x argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=confirm"} {
		if !strings.Contains(advice, w) {
			t.Errorf("advice %q does not say %q", advice, w)
		}
	}

	kept := argoAuto.Kept(listed.Annotations)
	if kept[ArgoSyncOptionsAnnotation] != "ServerSideApply=true,Prune=false" || listed.Annotations[ArgoSyncOptionsAnnotation] != "ServerSideApply=true, Prune=confirm" {
		t.Errorf("Kept() = %v (live %v)", kept, listed.Annotations)
	}
	if f := argoAuto.Fate(Upgrade, Leaving{Exists: true, CRD: true, Live: kept}); f != FateNoPrune {
		t.Errorf("after KeepCommands the fate is %s, want %s", f, FateNoPrune)
	}
	if kept := Helm4.Kept(nil); kept[KeepAnnotation] != KeepValue {
		t.Errorf("Helm's Kept() = %v", kept)
	}
}

// TestArgoApply: the cluster after a sync: a CRD the chart stops rendering is gone under
// automated prune and stays without it; a CRD moved to crds/ is applied and stays.
func TestArgoApply(t *testing.T) {
	const a, b = "as.example.com", "bs.example.com"
	live := map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*"), b: named(b, nil, []string{"v1"}, "v1*")}
	current := []ChartCRD{{CRD: named(a, nil, nil)}, {CRD: named(b, nil, nil)}}
	incoming := []ChartCRD{{CRD: named(b, nil, nil, "v2*", "v1"), Source: CRDsDir}}
	for _, tc := range []struct {
		d    ArgoCDDeployer
		want []string
	}{{argoAuto, []string{b}}, {argoManual, []string{a, b}}} {
		after := Apply(tc.d, Upgrade, live, incoming, current, PolicyCreateReplace)
		var got []string
		for _, n := range []string{a, b} {
			if after[n] != nil {
				got = append(got, n)
			}
		}
		if !cmp.Equal(tc.want, got) || after[b].Status.StoredVersions[len(after[b].Status.StoredVersions)-1] != "v2" {
			t.Errorf("%+v: after the sync %v (b stores %v), want %v", tc.d.Sync, got, after[b].Status.StoredVersions, tc.want)
		}
	}
}

func TestPruneVerdict(t *testing.T) {
	if Prune.Blocks() || OK.Blocks() || !Delete.Blocks() || !Migrate.Blocks() {
		t.Error("Blocks: want false for ok and prune, true for the others")
	}
	if FixFor(Decision{Verdict: Prune}) != FixKeep {
		t.Error("a Prune verdict is fixed by keeping the CRD")
	}
}
