package predict

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// named is crd with another name and optional annotations.
func named(name string, annotations map[string]string, stored []string, versions ...string) *apiextv1.CustomResourceDefinition {
	c := crd(stored, versions...)
	c.Name, c.Annotations = name, annotations
	return c
}

// shape is what the lifecycle decides about one CRD after the chart is applied.
type shape struct {
	Storage     string
	Stored      []string
	Versions    int
	Annotations map[string]string
}

func shapes(m map[string]*apiextv1.CustomResourceDefinition) map[string]shape {
	out := map[string]shape{}
	for n, c := range m {
		s := shape{Stored: c.Status.StoredVersions, Versions: len(c.Spec.Versions), Annotations: c.Annotations}
		for _, v := range c.Spec.Versions {
			if v.Storage {
				s.Storage = v.Name
			}
		}
		out[n] = s
	}
	return out
}

func TestApply(t *testing.T) {
	const a, b = "as.example.com", "bs.example.com"
	keep := map[string]string{KeepAnnotation: KeepValue}
	cases := []struct {
		name     string
		live     map[string]*apiextv1.CustomResourceDefinition
		incoming []ChartCRD
		current  []ChartCRD
		policy   Policy
		want     map[string]shape
	}{{
		name:     "new CRD is created with only its storage version stored",
		live:     map[string]*apiextv1.CustomResourceDefinition{},
		incoming: []ChartCRD{{CRD: named(a, nil, []string{"v1alpha1"}, "v1*", "v1alpha1"), Source: CRDsDir}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 2}},
	}, {
		name:     "templates/ CRD takes the incoming spec and adds its storage version",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1beta1"}, "v1beta1*")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*", "v1beta1"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1beta1", "v1"}, Versions: 2}},
	}, {
		name:     "storage version already stored is not added twice",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1", "v1beta1"}, "v1*", "v1beta1")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1", "v1beta1"}, Versions: 1}},
	}, {
		name:     "crds/ CRD is left as it is by plain Helm",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1beta1"}, "v1beta1*")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: CRDsDir}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1beta1", Stored: []string{"v1beta1"}, Versions: 1}},
	}, {
		name:     "crds/ CRD is applied under create-replace",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1beta1"}, "v1beta1*")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*", "v1beta1"), Source: CRDsDir}},
		policy:   PolicyCreateReplace,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1beta1", "v1"}, Versions: 2}},
	}, {
		name:     "live annotations stay unless the incoming CRD sets them",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, map[string]string{"x": "live", "y": "live"}, []string{"v1"}, "v1*")},
		incoming: []ChartCRD{{CRD: named(a, map[string]string{"y": "chart"}, nil, "v1*"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 1, Annotations: map[string]string{"x": "live", "y": "chart"}}},
	}, {
		name:     "templates/ CRD the chart drops is deleted",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*"), b: named(b, nil, []string{"v1"}, "v1*")},
		current:  []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}, {CRD: named(b, nil, nil, "v1*"), Source: Templates}},
		incoming: []ChartCRD{{CRD: named(b, nil, nil, "v1*"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{b: {Storage: "v1", Stored: []string{"v1"}, Versions: 1}},
	}, {
		name:    "dropped CRD that the live object keeps stays",
		live:    map[string]*apiextv1.CustomResourceDefinition{a: named(a, keep, []string{"v1"}, "v1*")},
		current: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}},
		policy:  PolicyHelm,
		want:    map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 1, Annotations: keep}},
	}, {
		name:    "keep in the chart only does not save it from an upgrade",
		live:    map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*")},
		current: []ChartCRD{{CRD: named(a, keep, nil, "v1*"), Source: Templates}},
		policy:  PolicyHelm,
		want:    map[string]shape{},
	}, {
		name:     "templates/ CRD the chart moves to crds/ is deleted, and not created again",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*")},
		current:  []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: CRDsDir}},
		policy:   PolicyHelm,
		want:     map[string]shape{},
	}, {
		name:     "templates/ CRD moved to crds/ that the live object keeps stays as it is",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, keep, []string{"v1beta1"}, "v1beta1*")},
		current:  []ChartCRD{{CRD: named(a, nil, nil, "v1beta1*"), Source: Templates}},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*", "v1beta1"), Source: CRDsDir}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1beta1", Stored: []string{"v1beta1"}, Versions: 1, Annotations: keep}},
	}, {
		name:    "crds/ CRD the chart drops stays",
		live:    map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*")},
		current: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: CRDsDir}},
		policy:  PolicyCreateReplace,
		want:    map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 1}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := shapes(tc.live)
			got := Apply(Helm4, Upgrade, tc.live, tc.incoming, tc.current, tc.policy)
			if diff := cmp.Diff(tc.want, shapes(got)); diff != "" {
				t.Errorf("Apply() mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, shapes(tc.live)); diff != "" {
				t.Errorf("Apply() changed the live CRDs (-before +after):\n%s", diff)
			}
		})
	}
}

func TestPolicyApplies(t *testing.T) {
	for _, tc := range []struct {
		policy Policy
		source Source
		want   bool
	}{
		{PolicyHelm, Templates, true}, {PolicyHelm, CRDsDir, false},
		{PolicyCreateReplace, Templates, true}, {PolicyCreateReplace, CRDsDir, true},
	} {
		if got := tc.policy.Applies(tc.source); got != tc.want {
			t.Errorf("%s.Applies(%s) = %v, want %v", tc.policy, tc.source, got, tc.want)
		}
	}
	for in, want := range map[string]Policy{"": PolicyHelm, "helm": PolicyHelm, "create-replace": PolicyCreateReplace} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParsePolicy("CreateReplace"); err == nil {
		t.Error("ParsePolicy(CreateReplace): want an error")
	}
}

// TestFate: Helm's rules for an object that leaves a release, from helm.sh/helm/v4
// v4.3.1 and v3.22.0 (pkg/kube Client.Update, pkg/action filterManifestsToKeep and
// verifyOwnershipBeforeDelete).
func TestFate(t *testing.T) {
	keep := map[string]string{KeepAnnotation: KeepValue}
	helm42, err := Helm("4.2.4")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		d    Deployer
		op   Operation
		l    Leaving
		want Fate
	}{
		{"upgrade deletes", Helm4, Upgrade, Leaving{Exists: true, Owned: true}, FateDeleted},
		{"upgrade reads keep on the live object", Helm4, Upgrade, Leaving{Exists: true, Live: keep}, FateKeptLive},
		{"Helm 3 upgrade too", Helm3, Upgrade, Leaving{Exists: true, Live: keep}, FateKeptLive},
		{"rollback too", Helm4, Rollback, Leaving{Exists: true, Live: keep}, FateKeptLive},
		{"upgrade ignores keep in the old manifest", Helm4, Upgrade, Leaving{Manifest: keep, Exists: true}, FateDeleted},
		{"upgrade deletes under another live policy", Helm4, Rollback, Leaving{Exists: true, Live: map[string]string{KeepAnnotation: "retain"}}, FateDeleted},
		{"upgrade compares the live value exactly", Helm4, Upgrade, Leaving{Exists: true, Live: map[string]string{KeepAnnotation: " Keep"}}, FateDeleted},
		{"upgrade deletes an object of another release", Helm4, Upgrade, Leaving{Exists: true, Owned: false}, FateDeleted},
		{"upgrade of an object not there", Helm4, Upgrade, Leaving{}, FateAbsent},
		{"uninstall deletes", Helm4, Uninstall, Leaving{Exists: true, Owned: true}, FateDeleted},
		{"uninstall reads keep in the manifest", Helm4, Uninstall, Leaving{Manifest: keep, Exists: true, Owned: true}, FateKeptManifest},
		{"uninstall trims and lower-cases it", Helm3, Uninstall, Leaving{Manifest: map[string]string{KeepAnnotation: " Keep "}, Exists: true}, FateKeptManifest},
		{"uninstall leaves another policy untouched", Helm4, Uninstall, Leaving{Manifest: map[string]string{KeepAnnotation: "retain"}, Exists: true}, FateUntouched},
		{"uninstall ignores keep on the live object", Helm4, Uninstall, Leaving{Exists: true, Live: keep, Owned: true}, FateDeleted},
		{"Helm 4.3 uninstall skips what another release owns", Helm4, Uninstall, Leaving{Exists: true}, FateNotOwned},
		{"Helm 4.2 uninstall deletes it", helm42, Uninstall, Leaving{Exists: true}, FateDeleted},
		{"Helm 3 uninstall deletes it", Helm3, Uninstall, Leaving{Exists: true}, FateDeleted},
		{"the zero deployer is Helm 4", HelmDeployer{}, Uninstall, Leaving{Exists: true}, FateNotOwned},
		{"uninstall of an object not there", Helm3, Uninstall, Leaving{}, FateAbsent},
	} {
		if got := tc.d.Fate(tc.op, tc.l); got != tc.want {
			t.Errorf("%s: %s.Fate(%s) = %s, want %s", tc.name, tc.d, tc.op, got, tc.want)
		}
	}
}

// TestRemovals: which live CRDs leave a release with each operation, for each way a CRD
// leaves a chart, and which of them Helm deletes.
func TestRemovals(t *testing.T) {
	const a, b = "as.example.com", "bs.example.com"
	keep := map[string]string{KeepAnnotation: KeepValue}
	owner := map[string]string{ReleaseNameAnnotation: "r", ReleaseNamespaceAnnotation: "ns"}
	owned := func(c *apiextv1.CustomResourceDefinition) *apiextv1.CustomResourceDefinition {
		c.Labels = map[string]string{ManagedByLabel: ManagedByHelm}
		for k, v := range owner {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[k] = v
		}
		return c
	}
	tpl := func(name string, ann map[string]string) ChartCRD {
		return ChartCRD{CRD: named(name, ann, nil, "v1*"), Source: Templates, File: "templates/" + name + ".yaml"}
	}
	dir := func(name string) ChartCRD {
		return ChartCRD{CRD: named(name, nil, nil, "v1*"), Source: CRDsDir, File: "crds/" + name + ".yaml"}
	}
	live := func(cs ...*apiextv1.CustomResourceDefinition) map[string]*apiextv1.CustomResourceDefinition {
		m := map[string]*apiextv1.CustomResourceDefinition{}
		for _, c := range cs {
			m[c.Name] = c
		}
		return m
	}
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
		name: "templates/ to crds/ (lws 0.7.0 to 0.8.0)",
		c:    ReleaseChange{Operation: Upgrade, Live: live(named(a, nil, []string{"v1"}, "v1*")), Current: []ChartCRD{tpl(a, nil)}, Incoming: []ChartCRD{dir(a)}},
		want: []got{{a, FateDeleted, true}},
	}, {
		name: "values toggle or subchart removed: the target no longer renders it",
		c: ReleaseChange{Operation: Upgrade, Live: live(named(a, nil, []string{"v1"}, "v1*"), named(b, nil, []string{"v1"}, "v1*")),
			Current: []ChartCRD{tpl(a, nil), tpl(b, nil)}, Incoming: []ChartCRD{tpl(b, nil)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "chart-to-chart: the other chart renders none of them",
		c:    ReleaseChange{Deployer: Helm3, Operation: Upgrade, Live: live(named(a, nil, []string{"v1"}, "v1*")), Current: []ChartCRD{tpl(a, nil)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "rollback to a revision that did not render it",
		c:    ReleaseChange{Operation: Rollback, Live: live(named(a, nil, []string{"v1"}, "v1*")), Current: []ChartCRD{tpl(a, nil)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "the live keep annotation keeps it",
		c:    ReleaseChange{Operation: Upgrade, Live: live(named(a, keep, []string{"v1"}, "v1*")), Current: []ChartCRD{tpl(a, nil)}, Incoming: []ChartCRD{dir(a)}},
		want: []got{{a, FateKeptLive, true}},
	}, {
		name: "keep in the old manifest only does not keep it from an upgrade",
		c:    ReleaseChange{Operation: Upgrade, Live: live(named(a, nil, []string{"v1"}, "v1*")), Current: []ChartCRD{tpl(a, keep)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "still rendered: it does not leave",
		c:    ReleaseChange{Operation: Upgrade, Live: live(named(a, nil, []string{"v1"}, "v1*")), Current: []ChartCRD{tpl(a, nil)}, Incoming: []ChartCRD{tpl(a, nil)}},
	}, {
		name: "crds/ files never leave",
		c:    ReleaseChange{Operation: Upgrade, Live: live(named(a, nil, []string{"v1"}, "v1*")), Current: []ChartCRD{dir(a)}},
	}, {
		name: "not on the cluster: nothing to delete",
		c:    ReleaseChange{Operation: Upgrade, Live: live(), Current: []ChartCRD{tpl(a, nil)}},
	}, {
		name: "uninstall deletes what the manifest renders",
		c: ReleaseChange{Operation: Uninstall, Release: "r", Namespace: "ns", Live: live(owned(named(a, nil, []string{"v1"}, "v1*")), owned(named(b, nil, []string{"v1"}, "v1*"))),
			Current: []ChartCRD{tpl(a, nil), dir(b)}, Incoming: []ChartCRD{tpl(a, nil)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "uninstall reads keep from the manifest",
		c:    ReleaseChange{Operation: Uninstall, Release: "r", Namespace: "ns", Live: live(owned(named(a, nil, []string{"v1"}, "v1*"))), Current: []ChartCRD{tpl(a, keep)}},
		want: []got{{a, FateKeptManifest, false}},
	}, {
		name: "uninstall ignores keep on the live CRD",
		c:    ReleaseChange{Operation: Uninstall, Release: "r", Namespace: "ns", Live: live(owned(named(a, keep, []string{"v1"}, "v1*"))), Current: []ChartCRD{tpl(a, nil)}},
		want: []got{{a, FateDeleted, false}},
	}, {
		name: "Helm 4.3 uninstall skips a CRD another release owns",
		c:    ReleaseChange{Operation: Uninstall, Release: "other", Namespace: "ns", Live: live(owned(named(a, nil, []string{"v1"}, "v1*"))), Current: []ChartCRD{tpl(a, nil)}},
		want: []got{{a, FateNotOwned, false}},
	}, {
		name: "Helm 3 uninstall deletes it",
		c: ReleaseChange{Deployer: Helm3, Operation: Uninstall, Release: "other", Namespace: "ns", Live: live(owned(named(a, nil, []string{"v1"}, "v1*"))),
			Current: []ChartCRD{tpl(a, nil)}},
		want: []got{{a, FateDeleted, false}},
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

// TestDecideRemoved: a CRD the operation deletes is a finding while it holds objects,
// when their number is unknown, and when the chart still ships it in crds/; an empty CRD
// the chart no longer brings goes without one.
func TestDecideRemoved(t *testing.T) {
	live := named("lws.x-k8s.io", nil, []string{"v1"}, "v1*")
	live.Spec.Names.Kind = "LeaderWorkerSet"
	from := ChartCRD{CRD: live, Source: Templates, File: "lws/templates/crds/lws.yaml"}
	shipped := &ChartCRD{CRD: live, Source: CRDsDir, File: "lws/crds/lws.yaml"}
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name    string
		r       Removal
		objects *int64
		want    Verdict
		reason  []string
	}{
		{"deleted with objects", Removal{Live: live, From: from, Fate: FateDeleted}, n(12), Delete,
			[]string{"no longer renders it, so Helm deletes the CRD and all 12 LeaderWorkerSet objects (chart file lws/templates/crds/lws.yaml)"}},
		{"moved to crds/ with objects", Removal{Live: live, From: from, Shipped: shipped, Fate: FateDeleted}, n(12), Delete,
			[]string{"moves it from templates/ to crds/", "all 12 LeaderWorkerSet objects; the upgrade does not create it again",
				"(chart file lws/templates/crds/lws.yaml, now lws/crds/lws.yaml)"}},
		{"deleted with one object", Removal{Live: live, From: from, Fate: FateDeleted}, n(1), Delete, []string{"deletes the CRD and its one LeaderWorkerSet object"}},
		{"count unknown", Removal{Live: live, From: from, Fate: FateDeleted}, nil, Delete, []string{"how many could not be read"}},
		{"moved to crds/, empty", Removal{Live: live, From: from, Shipped: shipped, Fate: FateDeleted}, n(0), Delete,
			[]string{"left without the CRD its chart ships"}},
		{"dropped, empty", Removal{Live: live, From: from, Fate: FateDeleted}, n(0), OK, []string{"holds no LeaderWorkerSet objects, so nothing is lost"}},
		{"kept by the live annotation", Removal{Live: live, From: from, Shipped: shipped, Fate: FateKeptLive}, n(12), OK, []string{"helm.sh/resource-policy=keep", "outside the release"}},
	} {
		f := DecideRemoved(Upgrade, nil, tc.r, tc.objects)
		if f.Verdict != tc.want || f.Name != live.Name || f.Source != Templates {
			t.Errorf("%s: DecideRemoved() = %s (%s, %s), want %s", tc.name, f.Verdict, f.Name, f.Source, tc.want)
		}
		for _, r := range tc.reason {
			if !strings.Contains(f.Reason, r) {
				t.Errorf("%s: reason %q does not say %q", tc.name, f.Reason, r)
			}
		}
	}
}

// TestKeepAdvice: an upgrade is fixed by the live annotation; an uninstall reads the
// stored manifest, and the advice says so.
func TestKeepAdvice(t *testing.T) {
	ax := []*apiextv1.CustomResourceDefinition{named("a.x", nil, []string{"v1"}, "v1*")}
	up := Helm4.KeepAdvice(Upgrade, ax, "r", "ns")
	for _, want := range []string{"kubectl annotate crd a.x helm.sh/resource-policy=keep", "before the upgrade", "from the live CRD"} {
		if !strings.Contains(up, want) {
			t.Errorf("upgrade advice %q does not say %q", up, want)
		}
	}
	un := Helm3.KeepAdvice(Uninstall, ax, "r", "ns")
	for _, want := range []string{"stored manifest, not from the live CRD", "helm get manifest r -n ns"} {
		if !strings.Contains(un, want) {
			t.Errorf("uninstall advice %q does not say %q", un, want)
		}
	}
	if strings.Contains(un, "kubectl annotate") {
		t.Errorf("uninstall advice %q names the live annotation, which an uninstall ignores", un)
	}
}

func TestHelm(t *testing.T) {
	for in, want := range map[string]bool{"": true, "4.3": true, "v4.3.1": true, "4.2.4": false, "3.18": false} {
		d, err := Helm(in)
		if err != nil || d.VerifiesOwnership() != want {
			t.Errorf("Helm(%q) = %v, %v; VerifiesOwnership want %v", in, d, err, want)
		}
	}
	for _, in := range []string{"2.17", "latest"} {
		if _, err := Helm(in); err == nil {
			t.Errorf("Helm(%q): want an error", in)
		}
	}
}

// TestDeployerSpec: a report's spec gives the deployer back, and the zero spec (a report
// that names none) is the newest Helm.
func TestDeployerSpec(t *testing.T) {
	argo := ArgoCD(true, []string{"Prune=confirm"}, true)
	for _, d := range []Deployer{Helm3, Helm4, argo} {
		if got := d.Spec().Deployer(); got != d {
			t.Errorf("%s: Spec().Deployer() = %#v, want %#v", d, got, d)
		}
	}
	if got := (DeployerSpec{}).Deployer(); got != Helm4 {
		t.Errorf("the zero spec's deployer = %#v, want Helm4", got)
	}
	if got := (HelmDeployer{}).Spec(); got != Helm4.Spec() {
		t.Errorf("the zero HelmDeployer's spec = %+v, want Helm4's", got)
	}
}
