package plan

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// crd builds widgets.example.com with versions; "v1*" is storage, "v1-" is not served.
func crd(stored []string, versions ...string) *apiextv1.CustomResourceDefinition {
	c := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"}}
	for _, v := range versions {
		ver := apiextv1.CustomResourceDefinitionVersion{Name: v, Served: true}
		switch v[len(v)-1] {
		case '*':
			ver.Name, ver.Storage = v[:len(v)-1], true
		case '-':
			ver.Name, ver.Served = v[:len(v)-1], false
		}
		c.Spec.Versions = append(c.Spec.Versions, ver)
	}
	c.Status.StoredVersions = stored
	return c
}

// source is a fake chart source: version -> the widgets CRD it brings, from templates/
// unless crdsDir names the version.
type source struct {
	charts  map[string][]string
	crdsDir map[string]bool
	loads   []string
}

func (s *source) Versions(context.Context) ([]string, error) {
	var out []string
	for v := range s.charts {
		out = append(out, v)
	}
	return out, nil
}

func (s *source) CRDs(_ context.Context, v string) ([]chartcrds.CRD, error) {
	s.loads = append(s.loads, v)
	if s.charts[v] == nil {
		return nil, errors.New("broken chart")
	}
	if s.crdsDir[v] {
		return []chartcrds.CRD{{CRD: crd(nil, s.charts[v]...), Source: predict.CRDsDir}}, nil
	}
	return []chartcrds.CRD{{CRD: crd(nil, s.charts[v]...), Source: predict.Templates}}, nil
}

// cluster is a fake live cluster with one CRD and its object count.
type cluster struct {
	live *apiextv1.CustomResourceDefinition
}

func (c cluster) CRDs(context.Context) (map[string]*apiextv1.CustomResourceDefinition, error) {
	if c.live == nil {
		return map[string]*apiextv1.CustomResourceDefinition{}, nil
	}
	return map[string]*apiextv1.CustomResourceDefinition{c.live.Name: c.live}, nil
}

func (c cluster) CountObjects(context.Context, *apiextv1.CustomResourceDefinition) (int64, error) {
	return 7, nil
}

func (c cluster) Memory() *check.Memory { return nil }

func steps(p *Plan) []string {
	out := []string{}
	for _, s := range p.Steps {
		out = append(out, strings.TrimSpace(string(s.Kind)+" "+s.ChartVersion))
	}
	return out
}

func TestRun(t *testing.T) {
	series := map[string][]string{
		"1.0.0": {"v1alpha1*"},
		"2.0.0": {"v1alpha1", "v1beta1*"},
		"3.0.0": {"v1beta1*"},
		"4.0.0": {"v1beta1", "v1*"},
		"5.0.0": {"v1*"},
	}
	cases := []struct {
		name   string
		live   *apiextv1.CustomResourceDefinition
		target string
		allow  bool
		want   []string
		noPath bool
	}{
		{"one safe upgrade", crd([]string{"v1alpha1"}, "v1alpha1*"), "2.0.0", false, []string{"upgrade 2.0.0"}, false},
		{"migrate then upgrade", crd([]string{"v1alpha1", "v1beta1"}, "v1alpha1", "v1beta1*"), "3.0.0", false, []string{"migrate", "upgrade 3.0.0"}, false},
		{"the highest stepping stone", crd([]string{"v1alpha1"}, "v1alpha1*"), "5.0.0", false,
			[]string{"upgrade 2.0.0", "migrate", "upgrade 4.0.0", "migrate", "upgrade 5.0.0"}, false},
		{"no version serves the live storage", crd([]string{"v2"}, "v2*", "v1"), "5.0.0", false, nil, true},
		{"a switch where allowed", crd([]string{"v1beta1"}, "v1alpha1", "v1beta1*", "v1"), "5.0.0", true, []string{"storage-switch", "upgrade 5.0.0"}, false},
		{"a first install", nil, "3.0.0", false, []string{"upgrade 3.0.0"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := &source{charts: series}
			target := tc.target
			p, err := Run(t.Context(), Request{Cluster: cluster{tc.live}, Versions: src, Target: target, AllowStorageSwitch: tc.allow, Release: "r"})
			var np *NoPathError
			if tc.noPath {
				if !errors.As(err, &np) || p.Reachable || len(np.Blocking) == 0 || np.Blocking[0].CRD != "widgets.example.com" {
					t.Fatalf("want a NoPathError naming widgets, got %v (plan %+v)", err, p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, steps(p)); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if p.ChartLoads != len(src.loads) {
				t.Errorf("ChartLoads %d, loads %d", p.ChartLoads, len(src.loads))
			}
			seen := map[string]bool{}
			for _, v := range src.loads {
				if seen[v] {
					t.Errorf("version %s loaded twice", v)
				}
				seen[v] = true
			}
		})
	}
}

// TestRunPredictsStoredVersions: after each step the predicted storedVersions follow the
// API server's rule (a new storage version is appended; a migration prunes to it).
func TestRunPredictsStoredVersions(t *testing.T) {
	src := &source{charts: map[string][]string{"2.0.0": {"v1alpha1", "v1beta1*"}, "3.0.0": {"v1beta1*"}}}
	p, err := Run(t.Context(), Request{Cluster: cluster{crd([]string{"v1alpha1"}, "v1alpha1*")}, Versions: src, Target: "3.0.0", Release: "r"})
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, s := range p.Steps {
		got = append(got, s.After[0].StoredVersions)
	}
	want := [][]string{{"v1alpha1", "v1beta1"}, {"v1beta1"}, {"v1beta1"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored versions after each step (-want +got):\n%s", diff)
	}
	if p.Steps[1].Objects != 7 {
		t.Errorf("migration rewrites %d objects, want 7", p.Steps[1].Objects)
	}
}

// TestLatest: the newest directly safe version, and what blocks each newer one.
func TestLatest(t *testing.T) {
	src := &source{charts: map[string][]string{"2.0.0": {"v1alpha1", "v1beta1*"}, "3.0.0": {"v1beta1*"}, "4.0.0": {"v1*"}}}
	p, err := Run(t.Context(), Request{Cluster: cluster{crd([]string{"v1alpha1"}, "v1alpha1*")}, Versions: src, Latest: true, Release: "r"})
	var np *NoPathError
	if !errors.As(err, &np) {
		t.Fatalf("want no path to 4.0.0 (nothing serves v1beta1 and v1), got %v", err)
	}
	var blocked []string
	for _, b := range p.Latest.Blocked {
		blocked = append(blocked, b.Version+" "+b.Verdict)
	}
	if p.Latest.DirectlySafe != "2.0.0" || p.Latest.Newest != "4.0.0" || !cmp.Equal(blocked, []string{"4.0.0 bridge", "3.0.0 bridge"}) {
		t.Errorf("latest %+v", p.Latest)
	}
}

func TestRunBadTarget(t *testing.T) {
	src := &source{charts: map[string][]string{"2.0.0": {"v1*"}}}
	if _, err := Run(t.Context(), Request{Cluster: cluster{}, Versions: src, Target: "9.9.9"}); err == nil || !strings.Contains(err.Error(), "does not offer version 9.9.9") {
		t.Errorf("err %v", err)
	}
	p, err := Run(t.Context(), Request{Cluster: cluster{}, Versions: &source{charts: map[string][]string{"2.0.0": {"v1*"}, "2.1.0": {"v1*"}, "3.0.0": {"v1*"}}}, Target: "~2"})
	if err != nil || p.Target != "2.1.0" {
		t.Errorf("range ~2: target %q, err %v; want 2.1.0", p.Target, err)
	}
	if _, err := Run(t.Context(), Request{Cluster: cluster{}, Versions: &source{}}); !errors.Is(err, ErrNoVersions) {
		t.Errorf("err %v, want ErrNoVersions", err)
	}
}

// TestRunDirectLoadsOnlyTarget: when a direct upgrade works (with a migration before
// it), no other version is loaded.
func TestRunDirectLoadsOnlyTarget(t *testing.T) {
	src := &source{charts: map[string][]string{"2.0.0": {"v1alpha1", "v1beta1*"}, "3.0.0": {"v1beta1*"}, "4.0.0": {"v1beta1*", "v1"}}}
	p, err := Run(t.Context(), Request{Cluster: cluster{crd([]string{"v1alpha1", "v1beta1"}, "v1alpha1", "v1beta1*")}, Versions: src, Target: "4.0.0", Release: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"migrate", "upgrade 4.0.0"}, steps(p)); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"4.0.0"}, src.loads); diff != "" {
		t.Errorf("loads (-want +got):\n%s", diff)
	}
}

// TestEdgeKeepsACRDThatLeaves: the next chart version moves the CRD from templates/ to
// crds/ (kubernetes-sigs/lws 0.7.0 -> 0.8.0), so the upgrade would delete it and its
// objects. The plan keeps it first, and the CRD is still there after the upgrade.
func TestEdgeKeepsACRDThatLeaves(t *testing.T) {
	src := &source{charts: map[string][]string{"0.8.0": {"v1*"}}, crdsDir: map[string]bool{"0.8.0": true}}
	r, err := newRunner(t.Context(), Request{Cluster: cluster{crd([]string{"v1"}, "v1*")}, Versions: src, Release: "lws", Namespace: "lws-system"})
	if err != nil {
		t.Fatal(err)
	}
	r.start.version, r.start.current = "0.7.0", []chartcrds.CRD{{CRD: crd(nil, "v1*"), Source: predict.Templates}}
	got, next, blockers, err := r.edge(t.Context(), r.start, "0.8.0")
	if err != nil || len(blockers) > 0 {
		t.Fatalf("edge: %v, blockers %v", err, blockers)
	}
	if len(got) != 2 || got[0].Kind != Keep || got[1].Kind != Upgrade {
		t.Fatalf("steps %+v, want keep then upgrade", got)
	}
	if want := "kubectl annotate crd widgets.example.com helm.sh/resource-policy=keep"; got[0].Commands[0] != want {
		t.Errorf("keep step %q, want %q", got[0].Commands[0], want)
	}
	if c := next.crds["widgets.example.com"]; c == nil || c.Annotations[predict.KeepAnnotation] != predict.KeepValue {
		t.Errorf("after the upgrade the CRD is %v, want it kept", c)
	}
	// Without the keep step the upgrade deletes it, as Helm does.
	if after := r.start.upgraded(predict.Helm4, "0.8.0", src.mustCRDs(t, "0.8.0"), nil, predict.PolicyHelm); after.crds["widgets.example.com"] != nil {
		t.Error("the upgrade to 0.8.0 left the CRD it moved to crds/, want it deleted")
	}
}

func (s *source) mustCRDs(t *testing.T, v string) []chartcrds.CRD {
	t.Helper()
	c, err := s.CRDs(t.Context(), v)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEdgeMovesACRDIn: the next chart version of release widgets-crds renders a CRD that
// release widgets owns today (a chart split into an operator and a -crds chart). Helm
// would refuse it; the plan moves it first (crd adopt), and after the upgrade the CRD is
// widgets-crds', kept on widgets' side.
func TestEdgeMovesACRDIn(t *testing.T) {
	live := crd([]string{"v1"}, "v1*")
	live.Labels = map[string]string{predict.ManagedByLabel: predict.ManagedByHelm}
	live.Annotations = map[string]string{predict.ReleaseNameAnnotation: "widgets", predict.ReleaseNamespaceAnnotation: "apps"}
	src := &source{charts: map[string][]string{"1.0.0": {"v1*"}}}
	r, err := newRunner(t.Context(), Request{Cluster: cluster{live}, Versions: src, Release: "widgets-crds", Namespace: "apps"})
	if err != nil {
		t.Fatal(err)
	}
	r.start.version = "0.1.0"
	got, next, blockers, err := r.edge(t.Context(), r.start, "1.0.0")
	if err != nil || len(blockers) > 0 {
		t.Fatalf("edge: %v, blockers %v", err, blockers)
	}
	if len(got) != 2 || got[0].Kind != Move || got[1].Kind != Upgrade {
		t.Fatalf("steps %+v, want move then upgrade", got)
	}
	if want := "upgradeguard crd adopt widgets.example.com --from apps/widgets --to apps/widgets-crds --apply"; got[0].Commands[0] != want {
		t.Errorf("move step %q, want %q", got[0].Commands[0], want)
	}
	c := next.crds["widgets.example.com"]
	if owner, _ := predict.HelmOwner(c.Annotations); owner != (predict.ReleaseRef{Namespace: "apps", Name: "widgets-crds"}) || c.Annotations[predict.KeepAnnotation] != predict.KeepValue {
		t.Errorf("after the upgrade the CRD carries %v, want it widgets-crds' and kept", c.Annotations)
	}
}

// policyCluster is cluster with the admission policy port: deny is the policy (a stand-in
// for admissionpolicy, which the real API server's tests cover), err an identity that may
// not read the policies.
type policyCluster struct {
	cluster
	deny func(live, next *apiextv1.CustomResourceDefinition) bool
	err  error
}

func (c policyCluster) PolicyDenials(_ context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error) {
	if c.err != nil {
		return nil, c.err
	}
	if live == nil || !c.deny(live, next) {
		return nil, nil
	}
	return []admissionpolicy.Denial{{Policy: "one-change", Binding: "one-change", Message: "move the storage or remove versions, not both",
		WayOn: admissionpolicy.WayOn{Kind: admissionpolicy.WayChart}}}, nil
}

// oneChange denies an update that moves the storage version and removes a version.
func oneChange(live, next *apiextv1.CustomResourceDefinition) bool {
	if crdversions.StorageVersion(live) == crdversions.StorageVersion(next) {
		return false
	}
	for _, v := range live.Spec.Versions {
		if !slices.ContainsFunc(next.Spec.Versions, func(n apiextv1.CustomResourceDefinitionVersion) bool { return n.Name == v.Name }) {
			return true
		}
	}
	return false
}

// TestRunRoutesAroundPolicy: an upgrade a policy denies is impassable. The search goes
// through a version the policy admits; offered none, the plan is denied by the policy;
// with policies it may not read, it takes the direct step and says the policies were not
// asked.
func TestRunRoutesAroundPolicy(t *testing.T) {
	live := crd([]string{"v1beta1"}, "v1alpha1", "v1beta1*")
	series := map[string][]string{"2.0.0": {"v1alpha1", "v1beta1", "v1*"}, "3.0.0": {"v1beta1", "v1*"}}
	run := func(c check.Cluster, charts map[string][]string) (*Plan, error) {
		return Run(t.Context(), Request{Cluster: c, Versions: &source{charts: charts}, Target: "3.0.0", Release: "r"})
	}

	p, err := run(cluster{live}, series)
	if err != nil || !cmp.Equal(steps(p), []string{"upgrade 3.0.0"}) {
		t.Fatalf("without a policy: steps %v, %v; want the direct upgrade", steps(p), err)
	}

	p, err = run(policyCluster{cluster: cluster{live}, deny: oneChange}, series)
	if err != nil || !cmp.Equal(steps(p), []string{"upgrade 2.0.0", "upgrade 3.0.0"}) {
		t.Fatalf("with the policy: steps %v, %v; want the way around through 2.0.0", steps(p), err)
	}
	if d := p.Detour(); len(d) != 1 || d[0].Verdict != string(predict.PolicyDenied) || len(d[0].Policies) != 1 || d[0].Policies[0].Policy != "one-change" {
		t.Errorf("detour %+v, want the direct upgrade denied by one-change", d)
	}

	p, err = run(policyCluster{cluster: cluster{live}, deny: oneChange}, map[string][]string{"3.0.0": series["3.0.0"]})
	var np *NoPathError
	if !errors.As(err, &np) || !p.DeniedByPolicy() || len(p.Detour()) != 0 {
		t.Errorf("offered no way around: %v, denied by policy %v; want no path, denied by the policy", err, p.DeniedByPolicy())
	}

	forbidden := errors.New(`validatingadmissionpolicies.admissionregistration.k8s.io is forbidden`)
	p, err = run(policyCluster{cluster: cluster{live}, err: forbidden}, series)
	want := []check.Unasked{{What: check.UnaskedPolicies, Why: forbidden.Error(), CRDs: []string{"widgets.example.com"}}}
	if err != nil || !cmp.Equal(steps(p), []string{"upgrade 3.0.0"}) || !cmp.Equal(p.Unasked, want) {
		t.Errorf("policies unreadable: steps %v, unasked %+v, %v; want the direct upgrade and %+v", steps(p), p.Unasked, err, want)
	}
}

// TestFindingReport: the plan as CI reads it. A path through a stepping stone is a case
// per upgrade, the migration before the second a warning with the migrate command as its
// fix, and the bridge that blocks the direct upgrade a warning on a case of its own: the
// path fails nothing. A target no path reaches fails on its blocker.
func TestFindingReport(t *testing.T) {
	lines := func(rep finding.Report) []string {
		var out []string
		for _, c := range rep.Cases {
			line := c.Group + " | " + c.Name
			for _, f := range c.Findings {
				line += " | " + strings.Join([]string{f.Check, string(f.Severity), f.Subject, f.Remediation}, " ")
			}
			out = append(out, line)
		}
		return out
	}
	src := &source{charts: map[string][]string{"2.0.0": {"v1alpha1", "v1beta1*"}, "3.0.0": {"v1beta1*"}}}
	p, err := Run(t.Context(), Request{Cluster: cluster{crd([]string{"v1alpha1"}, "v1alpha1*")}, Versions: src, Target: "3.0.0", Release: "r", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"Release/ns/r | (not installed) → 3.0.0 directly | bridge warning widgets.example.com take the plan's path: (not installed) → 2.0.0 → 3.0.0, with the steps it names before each upgrade",
		"Release/ns/r | (not installed) → 2.0.0",
		"Release/ns/r | 2.0.0 → 3.0.0 | migrate warning widgets.example.com step 2 of the plan, before the upgrade to 3.0.0: upgradeguard migrate --crd widgets.example.com",
	}
	rep := p.FindingReport()
	if diff := cmp.Diff(want, lines(rep)); diff != "" || rep.Failed() {
		t.Errorf("path: failed %v, cases (-want +got):\n%s", rep.Failed(), diff)
	}

	src = &source{charts: map[string][]string{"3.0.0": {"v1beta1*"}}}
	p, err = Run(t.Context(), Request{Cluster: cluster{crd([]string{"v1alpha1"}, "v1alpha1*")}, Versions: src, Target: "3.0.0", Release: "r", Namespace: "ns"})
	var np *NoPathError
	if !errors.As(err, &np) {
		t.Fatalf("err %v, want no path", err)
	}
	rep = p.FindingReport()
	if len(rep.Cases) != 1 || len(rep.Cases[0].Findings) != 1 || rep.Cases[0].Findings[0].Check != string(predict.Bridge) ||
		rep.Cases[0].Findings[0].Severity != finding.Blocking || rep.Cases[0].Findings[0].Remediation == "" || !rep.Failed() {
		t.Errorf("no path: %+v, want one failing case blocked by the bridge, with check's action", rep.Cases)
	}
}
