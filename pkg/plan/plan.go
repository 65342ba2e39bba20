// Package plan owns the safe path of a Helm release across CRD storage-version changes:
// the shortest sequence of chart upgrades, migrations, storage switches and keep
// annotations from what runs now to a target chart version, the newest version that is
// safe in one step, and which release revisions a rollback can still reach. It is a pure
// search over predicted states (storedVersions and the storage version of every CRD
// after each step), and every upgrade step is judged by package check's decision on the
// state the steps before it leave, the cluster's admission policies included: a step a
// ValidatingAdmissionPolicy denies is impassable, and the search goes around it through
// other versions where it can. It only reads from the cluster; callers render the typed
// Plan.
package plan

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	release "helm.sh/helm/v4/pkg/release/v1"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// StepKind is what one step does.
type StepKind string

const (
	// Upgrade is a chart upgrade (helm upgrade, or a HelmRelease version commit).
	Upgrade StepKind = "upgrade"
	// Migrate rewrites the objects of CRDs at their storage version and prunes
	// storedVersions (upgradeguard migrate).
	Migrate StepKind = "migrate"
	// StorageSwitch moves a live CRD's storage version to one both sides serve, then
	// migrates and prunes (upgradeguard migrate --storage-version --allow-storage-switch).
	StorageSwitch StepKind = "storage-switch"
	// Keep annotates CRDs helm.sh/resource-policy=keep so that an upgrade that drops them
	// does not delete them and their objects.
	Keep StepKind = "keep"
	// Move keeps a CRD that moves between Helm releases on the side it leaves and moves
	// Helm's ownership metadata to the release it joins (upgradeguard crd adopt), so that
	// neither release's upgrade deletes or refuses it.
	Move StepKind = "move"
)

// CRDState is one CRD as the plan predicts it after a step.
type CRDState struct {
	Name           string   `json:"name"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
}

// Step is one action of a plan.
type Step struct {
	Kind StepKind `json:"kind"`
	// ChartVersion is the version an upgrade step moves to.
	ChartVersion string `json:"chartVersion,omitempty"`
	// Commands are the exact commands to run, in order.
	Commands []string `json:"commands"`
	// CRDs are the CRDs the step writes.
	CRDs []string `json:"crds"`
	// Objects is how many objects a migrate or storage-switch step may rewrite (the
	// objects of its CRDs; those already at the storage version are left as they are).
	Objects int64 `json:"objects,omitempty"`
	// After are the CRDs the step touches as they will be after it.
	After []CRDState `json:"after"`
	// Check is, for an upgrade step, check's report on the state the steps before it
	// leave: the report `upgradeguard check` gives when the step is reached. It is safe.
	Check *check.Report `json:"check,omitempty"`
	// Because are, for a step before an upgrade, the findings of check's on that upgrade
	// that the step answers.
	Because []Cause `json:"because,omitempty"`
}

// Cause is one finding of check's that a step answers: the CRD, the verdict (the check
// ID of the finding) and check's reason.
type Cause struct {
	CRD     string `json:"crd"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

func causeOf(c check.CRDReport) Cause {
	return Cause{CRD: c.Name, Verdict: string(c.Verdict), Reason: c.Reason}
}

// Blocker says why a chart version cannot be reached: the CRD and the version that
// blocks it.
type Blocker struct {
	Version string `json:"version"`
	CRD     string `json:"crd"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	// Policies are, for the policy verdict, the admission policies that deny writing
	// the CRD at this version, each with its binding, message and way on.
	Policies []admissionpolicy.Denial `json:"policies,omitempty"`
	// Action is check's next action for the CRD, when it has one.
	Action string `json:"action,omitempty"`
}

// blocker is what blocks one CRD of a report on the way to version.
func blocker(version string, c check.CRDReport) Blocker {
	return Blocker{Version: version, CRD: c.Name, Verdict: string(c.Verdict), Reason: c.Reason, Policies: c.Policies, Action: c.Action}
}

// Latest is the answer to --latest.
type Latest struct {
	// Newest is the newest version the source offers.
	Newest string `json:"newest"`
	// DirectlySafe is the newest version an upgrade to is safe now, in one step; empty
	// when none newer than the running version is.
	DirectlySafe string `json:"directlySafe,omitempty"`
	// Blocked says, for each version newer than DirectlySafe, what blocks a direct upgrade.
	Blocked []Blocker `json:"blocked"`
}

// Reach is whether a rollback target can be reached.
type Reach string

const (
	// ReachableNow means helm rollback succeeds as things are.
	ReachableNow Reach = "reachable-now"
	// ReachableAfterSteps means helm rollback succeeds after the named steps.
	ReachableAfterSteps Reach = "reachable-after-steps"
	// Unreachable means no step makes helm rollback succeed.
	Unreachable Reach = "unreachable"
	// DeniedByPolicy means an admission policy of the cluster denies the CRDs the
	// rollback writes: no migration helps, the policy's way on (Rollback.Policies) does.
	DeniedByPolicy Reach = "denied-by-policy"
)

// Rollback is one revision of the release's history, as a rollback target.
type Rollback struct {
	Revision     int    `json:"revision"`
	ChartVersion string `json:"chartVersion,omitempty"`
	Status       string `json:"status,omitempty"`
	Reach        Reach  `json:"reach"`
	// Steps are the commands to run, the rollback itself last; none when unreachable.
	Steps []string `json:"steps,omitempty"`
	// Why says what makes it unreachable, per CRD: "CRD: reason".
	Why []string `json:"why,omitempty"`
	// Denied are, when DeniedByPolicy, the CRDs whose writes the policies deny, and
	// Policies the denials (each once), with their way on.
	Denied   []string                 `json:"denied,omitempty"`
	Policies []admissionpolicy.Denial `json:"policies,omitempty"`
}

// Plan is the result of Run.
type Plan struct {
	// Application is the Argo CD Application (namespace/name) planned for, set by the
	// front end that read it; Release is then the release name Argo CD renders with.
	Application string `json:"application,omitempty"`
	Release     string `json:"release,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Chart       string `json:"chart,omitempty"`
	// From is the chart version the release runs (empty with no release).
	From string `json:"from,omitempty"`
	// FromSource says where From was read when there is no Helm release (Request.From):
	// an Argo CD Application's status.history, say.
	FromSource string `json:"fromSource,omitempty"`
	// Target is the chart version the plan reaches.
	Target string `json:"target,omitempty"`
	// Reachable says whether a path was found; Steps is empty when not.
	Reachable bool   `json:"reachable"`
	Steps     []Step `json:"steps"`
	// Blocking names what blocks a direct upgrade to the target: what blocks the target
	// when no path exists, and what the path goes around when one does.
	Blocking []Blocker `json:"blocking,omitempty"`
	Latest   *Latest   `json:"latest,omitempty"`
	// Rollbacks are every revision of the history (but the running one) as rollback
	// targets, when asked for.
	Rollbacks []Rollback `json:"rollbacks,omitempty"`
	// KeepsRollback says, when asked for, whether the running revision stays reachable
	// by a rollback once the plan is carried out.
	KeepsRollback *Rollback `json:"keepsRollback,omitempty"`
	// ChartLoads is how many chart versions were loaded and rendered.
	ChartLoads int `json:"chartLoads"`
	// VersionsConsidered is how many versions of the source lay on the way.
	VersionsConsidered int `json:"versionsConsidered"`
	// Unasked are the questions about admission the plan could not ask: the cluster's
	// ValidatingAdmissionPolicies, when this identity may not read them (check's
	// UnaskedPolicies). The steps rest on what was asked.
	Unasked []check.Unasked `json:"unasked,omitempty"`
}

// Upgrades counts the upgrade steps.
func (p *Plan) Upgrades() int {
	n := 0
	for _, s := range p.Steps {
		if s.Kind == Upgrade {
			n++
		}
	}
	return n
}

// OneStep says whether the target is reached by a single step (or is already running).
func (p *Plan) OneStep() bool { return p.Reachable && len(p.Steps) <= 1 }

// DeniedByPolicy says that no path reaches the target and that admission policies alone
// deny the upgrade to it (every Blocker has the policy verdict): the policies' way on,
// not a migration, opens it.
func (p *Plan) DeniedByPolicy() bool {
	if p.Reachable || len(p.Blocking) == 0 {
		return false
	}
	for _, b := range p.Blocking {
		if predict.Verdict(b.Verdict) != predict.PolicyDenied {
			return false
		}
	}
	return true
}

// Detour are the blockers of the direct upgrade that a path goes around: admission
// policies' denials, when the plan reaches the target by another way.
func (p *Plan) Detour() []Blocker {
	if !p.Reachable {
		return nil
	}
	var out []Blocker
	for _, b := range p.Blocking {
		if len(b.Policies) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// Commands builds the commands a plan's steps name. The defaults are those of plain Helm
// and upgradeguard's CLI.
type Commands struct {
	// Upgrade is the command that moves the release to a chart version.
	Upgrade func(version string) string
	// Rollback is the command that rolls the release back to a revision (for
	// ReachableAfterSteps, check's own reverse-migration command comes before it).
	Rollback func(revision int) string
}

// Request is what Run plans.
type Request struct {
	// Cluster is the live cluster (read only).
	Cluster check.Cluster
	// Releases reads the release's history; nil plans for a first install.
	Releases *helmrelease.Reader
	// Release and Namespace name the release.
	Release, Namespace string
	// Versions are the chart versions the source offers (chartsource.History).
	Versions check.History
	// Target is the version to reach; empty means the newest the source offers.
	Target string
	// Latest also reports the newest directly safe version and what blocks each newer one.
	Latest bool
	// Policy says which CRDs Helm applies.
	Policy check.CRDPolicy
	// Deployer runs the upgrades; its rules say which CRDs they delete (check.Request).
	Deployer predict.Deployer
	// AllowStorageSwitch lets the plan switch a live storage version where both sides
	// serve a common version.
	AllowStorageSwitch bool
	// Rollbacks also reports every revision of the history as a rollback target.
	Rollbacks bool
	// KeepsRollback also says whether the running revision stays reachable after the plan.
	KeepsRollback bool
	// Commands write the steps' commands.
	Commands Commands
	// MaxSearch bounds how many predicted states are expanded (default 5000).
	MaxSearch int
	// From is the chart version deployed today when no Helm release says it (Argo CD
	// keeps none): the plan starts there and only steps through newer versions. FromSource
	// says where it was read. Ignored when Releases finds a deployed revision.
	From, FromSource string
	// Current are the CRDs the deployment applies today when no Helm release says (an
	// Argo CD Application's resource tree): the first upgrade finds those it drops.
	// Ignored when Releases finds a deployed revision.
	Current []chartcrds.CRD
}

// deployer is Deployer, or the newest Helm when it is nil.
func (r Request) deployer() predict.Deployer {
	if r.Deployer == nil {
		return predict.Helm4
	}
	return r.Deployer
}

// NoPathError says that no sequence of steps reaches the target; it names what blocks it.
type NoPathError struct {
	Target   string
	Blocking []Blocker
}

func (e *NoPathError) Error() string {
	var parts []string
	for _, b := range e.Blocking {
		parts = append(parts, fmt.Sprintf("%s (%s)", b.CRD, b.Reason))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("no safe path to chart version %s", e.Target)
	}
	return fmt.Sprintf("no safe path to chart version %s: blocked by %s", e.Target, strings.Join(parts, "; "))
}

// ErrNoVersions says that the source offers no chart version to plan with.
var ErrNoVersions = errors.New("the chart source lists no versions: give a repository, an OCI reference or local charts")

// Run plans the path. A plan that finds no path is returned with Reachable false and
// Blocking set, together with a *NoPathError; other errors mean it could not run.
func Run(ctx context.Context, req Request) (*Plan, error) {
	r, err := newRunner(ctx, req)
	if err != nil {
		return nil, err
	}
	p := &Plan{Release: req.Release, Namespace: req.Namespace, Chart: r.chart, From: r.start.version, Steps: []Step{}}
	if r.deployed == nil && p.From != "" {
		p.FromSource = req.FromSource
	}
	defer func() { p.ChartLoads, p.Unasked = r.loads.n, r.counts.unasked() }()
	if p.Target, err = r.target(); err != nil {
		return p, err
	}
	if req.Latest {
		if p.Latest, err = r.latest(ctx); err != nil {
			return p, err
		}
	}
	if req.Rollbacks {
		if p.Rollbacks, err = r.rollbacks(ctx); err != nil {
			return p, err
		}
	}
	final, err := r.search(ctx, p)
	if err != nil {
		return p, err
	}
	if req.KeepsRollback && r.deployed != nil && final != nil {
		rb, err := r.rollbackFrom(ctx, final, r.deployed)
		if err != nil {
			return p, err
		}
		p.KeepsRollback = &rb
	}
	if !p.Reachable {
		return p, &NoPathError{Target: p.Target, Blocking: p.Blocking}
	}
	return p, nil
}

type runner struct {
	req      Request
	start    *state
	counts   *counter
	loads    *loader
	versions []*semver.Version
	history  []*release.Release
	deployed *release.Release
	chart    string
}

func newRunner(ctx context.Context, req Request) (*runner, error) {
	if req.Versions == nil {
		return nil, ErrNoVersions
	}
	if req.Policy == "" {
		req.Policy = check.PolicyHelm
	}
	if req.Commands.Upgrade == nil {
		req.Commands.Upgrade = func(v string) string {
			return cmdline.HelmUpgrade{Release: req.Release, Namespace: req.Namespace, Version: v}.String()
		}
	}
	if req.Commands.Rollback == nil {
		req.Commands.Rollback = func(rev int) string {
			return cmdline.HelmRollback{Release: req.Release, Namespace: req.Namespace, Revision: rev}.String()
		}
	}
	live, err := req.Cluster.CRDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("read live CRDs: %w", err)
	}
	r := &runner{req: req, start: &state{crds: live, version: req.From, current: req.Current}, loads: newLoader(req.Versions),
		counts: &counter{live: req.Cluster, liveMap: live, memo: map[string]countResult{}}}
	if req.Releases != nil {
		h, err := req.Releases.History(ctx, req.Release)
		var nf *helmrelease.NotFoundError
		if err != nil && !errors.As(err, &nf) {
			return nil, err
		}
		r.history, r.deployed = h, helmrelease.Deployed(h)
	}
	if d := r.deployed; d != nil {
		if r.start.current, err = chartcrds.All(d.Chart, d.Manifest); err != nil {
			return nil, fmt.Errorf("revision %d of release %s: %w", d.Version, req.Release, err)
		}
		if d.Chart != nil && d.Chart.Metadata != nil {
			r.start.version, r.chart = d.Chart.Metadata.Version, d.Chart.Metadata.Name
		}
	}
	raw, err := req.Versions.Versions(ctx)
	if err != nil {
		return nil, fmt.Errorf("list chart versions: %w", err)
	}
	for _, s := range raw {
		if v, err := semver.NewVersion(s); err == nil {
			r.versions = append(r.versions, v)
		}
	}
	slices.SortFunc(r.versions, func(a, b *semver.Version) int { return b.Compare(a) })
	if len(r.versions) == 0 {
		return nil, ErrNoVersions
	}
	return r, nil
}

func (r *runner) target() (string, error) {
	if r.req.Target == "" {
		return r.versions[0].Original(), nil
	}
	t, err := semver.NewVersion(r.req.Target)
	if err != nil {
		// A range, as helm takes: the highest version it matches.
		c, cerr := semver.NewConstraint(r.req.Target)
		if cerr != nil {
			return "", fmt.Errorf("target version %q is neither a version nor a semver range: %w", r.req.Target, cerr)
		}
		for _, v := range r.versions {
			if c.Check(v) {
				return v.Original(), nil
			}
		}
		return "", fmt.Errorf("the chart source offers no version in %s (newest: %s)", r.req.Target, r.versions[0].Original())
	}
	for _, v := range r.versions {
		if v.Equal(t) {
			return v.Original(), nil
		}
	}
	return "", fmt.Errorf("the chart source does not offer version %s (newest: %s)", r.req.Target, r.versions[0].Original())
}

// candidates are the versions an upgrade from `from` may move to on the way to target:
// newer than from, not newer than target; target first, then newest first.
func (r *runner) candidates(from, target string) []string {
	t, _ := semver.NewVersion(target)
	f, ferr := semver.NewVersion(from)
	out := []string{target}
	for _, v := range r.versions {
		if v.Equal(t) || v.GreaterThan(t) || (ferr == nil && !v.GreaterThan(f)) {
			continue
		}
		out = append(out, v.Original())
	}
	return out
}

// judge runs check's decision for an upgrade of s to version.
func (r *runner) judge(ctx context.Context, s *state, version string, incoming []chartcrds.CRD) (*check.Report, error) {
	rep, err := check.Run(ctx, predicted{s: s, counts: r.counts}, check.Request{
		Operation: predict.Upgrade, Incoming: incoming, Current: s.current, Policy: r.req.Policy, Deployer: r.req.Deployer,
		Release: r.req.Release, Namespace: r.req.Namespace, Chart: r.chart, ChartVersion: version,
		Migrations: r.loads.migrations(version),
	})
	if rep != nil && rep.Chart == "" {
		rep.Chart = r.chart
	}
	return rep, err
}

// edge is the steps that move s to version, or the blockers when none do.
func (r *runner) edge(ctx context.Context, s *state, version string) ([]Step, *state, []Blocker, error) {
	incoming, err := r.loads.crds(ctx, version)
	if err != nil {
		return nil, nil, nil, err
	}
	rep, err := r.judge(ctx, s, version, incoming)
	if err != nil {
		return nil, nil, nil, err
	}
	var steps []Step
	var migrate, keep []string
	var migrateWhy, keepWhy []Cause
	var moves []check.CRDReport
	var objects int64
	var blockers []Blocker
	cur := s
	for _, c := range rep.Findings() {
		if !c.Verdict.Blocks() {
			continue // nothing is lost by this upgrade (a CRD left for a later prune)
		}
		switch fix := predict.FixFor(c.Decision); {
		case fix == predict.FixMigrate:
			migrate, migrateWhy = append(migrate, c.Name), append(migrateWhy, causeOf(c))
			if c.Objects != nil {
				objects += *c.Objects
			}
		case fix == predict.FixKeep:
			keep, keepWhy = append(keep, c.Name), append(keepWhy, causeOf(c))
		case fix == predict.FixMove:
			moves = append(moves, c)
		case fix == predict.FixStorageSwitch && r.req.AllowStorageSwitch:
			cur = cur.switched(c.Name, c.StorageSwitchTo)
			st := Step{Kind: StorageSwitch, CRDs: []string{c.Name}, After: states(cur, c.Name), Because: []Cause{causeOf(c)},
				Commands: []string{cmdline.StorageSwitch{CRDs: []string{c.Name}, StorageVersion: c.StorageSwitchTo}.String()}}
			if c.Objects != nil {
				st.Objects = *c.Objects
			}
			steps = append(steps, st)
		default: // a policy's denial among them: impassable, the search goes around it
			blockers = append(blockers, blocker(version, c))
		}
	}
	if len(blockers) > 0 {
		return nil, nil, blockers, nil
	}
	if len(keep) > 0 {
		var commands []string
		for _, c := range r.req.deployer().KeepCommands(predict.Upgrade, cur.live(keep)) {
			commands = append(commands, c.String())
		}
		cur = cur.kept(r.req.deployer(), keep)
		steps = append(steps, Step{Kind: Keep, CRDs: keep, After: states(cur, keep...), Commands: commands, Because: keepWhy})
	}
	for _, c := range moves {
		m := *c.Move
		cur = cur.moved(m)
		steps = append(steps, Step{Kind: Move, CRDs: []string{m.CRD}, After: states(cur, m.CRD),
			Commands: []string{predict.AdoptCommand(m, "").String()}, Because: []Cause{causeOf(c)}})
	}
	if len(migrate) > 0 {
		cur = cur.migrated(migrate)
		steps = append(steps, Step{Kind: Migrate, CRDs: migrate, Objects: objects, After: states(cur, migrate...),
			Commands: []string{cmdline.Migrate{CRDs: migrate}.String()}, Because: migrateWhy})
	}
	if len(steps) > 0 {
		// The upgrade is judged again on the state the steps before it leave.
		if rep, err = r.judge(ctx, cur, version, incoming); err != nil {
			return nil, nil, nil, err
		}
		for _, c := range rep.Findings() {
			blockers = append(blockers, blocker(version, c))
		}
		if len(blockers) > 0 {
			return nil, nil, blockers, nil
		}
	}
	next := cur.upgraded(r.req.deployer(), version, incoming, r.loads.migrations(version), r.req.Policy)
	var touched []string
	for _, c := range rep.CRDs {
		if c.Verdict == predict.OK && !r.req.Policy.Applies(c.Source) && cur.crds[c.Name] != nil {
			continue // crds/ files are not upgraded by Helm
		}
		touched = append(touched, c.Name)
	}
	steps = append(steps, Step{Kind: Upgrade, ChartVersion: version, CRDs: touched, After: states(next, touched...),
		Commands: []string{r.req.Commands.Upgrade(version)}, Check: rep})
	return steps, next, nil, nil
}

func states(s *state, names ...string) []CRDState {
	out := []CRDState{}
	for _, n := range names {
		c := s.crds[n]
		if c == nil {
			continue
		}
		out = append(out, CRDState{Name: n, StorageVersion: crdversions.StorageVersion(c), StoredVersions: slices.Clone(c.Status.StoredVersions)})
	}
	return out
}

// cost orders paths: fewest chart upgrades first (each is a rollout), then fewest
// other steps.
func cost(steps []Step) int {
	c := 0
	for _, s := range steps {
		if s.Kind == Upgrade {
			c += 100
		} else {
			c++
		}
	}
	return c
}

type node struct {
	s     *state
	steps []Step
	cost  int
	seq   int
}

type queue []*node

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].cost != q[j].cost {
		return q[i].cost < q[j].cost
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*node)) }
func (q *queue) Pop() any {
	old := *q
	n := old[len(old)-1]
	*q = old[:len(old)-1]
	return n
}

// search is a cheapest-first search over predicted states, from the live state to the
// target version. It returns the final predicted state (nil when no path exists).
func (r *runner) search(ctx context.Context, p *Plan) (*state, error) {
	if r.start.version == p.Target {
		p.Reachable = true
		return r.start, nil
	}
	limit := r.req.MaxSearch
	if limit <= 0 {
		limit = 5000
	}
	p.VersionsConsidered = len(r.candidates(r.start.version, p.Target))
	// A direct upgrade, with whatever steps it needs before it, is one chart upgrade: no
	// other path can be cheaper, so no other version needs loading.
	steps, next, blockers, err := r.edge(ctx, r.start, p.Target)
	if err != nil {
		return nil, err
	}
	if next != nil {
		p.Reachable, p.Steps = true, steps
		return next, nil
	}
	p.Blocking = blockers
	q := &queue{{s: r.start}}
	seen := map[string]bool{}
	seq := 0
	for expanded := 0; q.Len() > 0; expanded++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if expanded == limit {
			return nil, fmt.Errorf("no path found within %d predicted states", limit)
		}
		n := heap.Pop(q).(*node)
		if n.s.version == p.Target {
			p.Reachable, p.Steps = true, n.steps
			return n.s, nil
		}
		k := n.s.key()
		if seen[k] {
			continue
		}
		seen[k] = true
		for _, v := range r.candidates(n.s.version, p.Target) {
			steps, next, _, err := r.edge(ctx, n.s, v)
			var le *LoadError
			if errors.As(err, &le) && v != p.Target {
				continue // a version that does not load is no stepping stone
			}
			if err != nil {
				return nil, err
			}
			if next == nil {
				continue
			}
			seq++
			all := append(slices.Clone(n.steps), steps...)
			heap.Push(q, &node{s: next, steps: all, cost: cost(all), seq: seq})
		}
	}
	return nil, nil
}

// latest finds the newest version that is safe in one step now, and what blocks each
// newer one.
func (r *runner) latest(ctx context.Context) (*Latest, error) {
	l := &Latest{Newest: r.versions[0].Original(), Blocked: []Blocker{}}
	from, ferr := semver.NewVersion(r.start.version)
	for _, v := range r.versions {
		if ferr == nil && !v.GreaterThan(from) {
			break
		}
		incoming, err := r.loads.crds(ctx, v.Original())
		var le *LoadError
		if errors.As(err, &le) {
			l.Blocked = append(l.Blocked, Blocker{Version: v.Original(), Verdict: "load", Reason: le.Error()})
			continue
		}
		if err != nil {
			return nil, err
		}
		rep, err := r.judge(ctx, r.start, v.Original(), incoming)
		if err != nil {
			return nil, err
		}
		if rep.Safe {
			l.DirectlySafe = v.Original()
			return l, nil
		}
		for _, c := range rep.Findings() {
			l.Blocked = append(l.Blocked, blocker(v.Original(), c))
		}
	}
	return l, nil
}

// rollbacks classifies every revision but the running one as a rollback target.
func (r *runner) rollbacks(ctx context.Context) ([]Rollback, error) {
	out := []Rollback{}
	if r.deployed == nil {
		return out, nil
	}
	for i := len(r.history) - 1; i >= 0; i-- {
		rel := r.history[i]
		if rel.Version == r.deployed.Version {
			continue
		}
		rb, err := r.rollbackFrom(ctx, r.start, rel)
		if err != nil {
			return nil, err
		}
		out = append(out, rb)
	}
	return out, nil
}

// rollbackFrom predicts a rollback from state s to revision rel with check's decision.
func (r *runner) rollbackFrom(ctx context.Context, s *state, rel *release.Release) (Rollback, error) {
	rb := Rollback{Revision: rel.Version}
	if rel.Chart != nil && rel.Chart.Metadata != nil {
		rb.ChartVersion = rel.Chart.Metadata.Version
	}
	if rel.Info != nil {
		rb.Status = string(rel.Info.Status)
	}
	incoming, err := chartcrds.All(rel.Chart, rel.Manifest)
	if err != nil {
		return rb, fmt.Errorf("revision %d of release %s: %w", rel.Version, r.req.Release, err)
	}
	rep, err := check.Run(ctx, predicted{s: s, counts: r.counts}, check.Request{
		Operation: predict.Rollback, Incoming: incoming, Current: s.current, Policy: r.req.Policy, Deployer: r.req.Deployer,
		Release: r.req.Release, Namespace: r.req.Namespace, ChartVersion: rb.ChartVersion,
		FromRevision: revisionOf(r.deployed), ToRevision: rel.Version,
	})
	if err != nil {
		return rb, err
	}
	rollback := r.req.Commands.Rollback(rel.Version)
	if rep.Safe {
		rb.Reach, rb.Steps = ReachableNow, []string{rollback}
		return rb, nil
	}
	var denied []string
	var denials []admissionpolicy.Denial
	for _, c := range rep.Findings() {
		switch predict.FixFor(c.Decision) {
		case predict.FixSteppingStone:
			rb.Why = append(rb.Why, c.Name+": "+c.Reason)
		case predict.FixPolicy:
			denied = append(denied, c.Name)
			for _, d := range c.Policies {
				if !slices.Contains(denials, d) {
					denials = append(denials, d)
				}
			}
		}
	}
	if len(rb.Why) > 0 {
		rb.Reach = Unreachable
		return rb, nil
	}
	if len(denied) > 0 {
		rb.Reach, rb.Denied, rb.Policies = DeniedByPolicy, denied, denials
		return rb, nil
	}
	rb.Reach, rb.Steps = ReachableAfterSteps, append(slices.Clone(rep.NextSteps), rollback)
	return rb, nil
}

func revisionOf(r *release.Release) int {
	if r == nil {
		return 0
	}
	return r.Version
}

// LoadError says that one chart version could not be loaded or rendered.
type LoadError struct {
	Version string
	Err     error
}

func (e *LoadError) Error() string { return fmt.Sprintf("chart version %s: %v", e.Version, e.Err) }

func (e *LoadError) Unwrap() error { return e.Err }

// loader loads each chart version's CRDs (and, from a check.ChartHistory, the
// StorageVersionMigrations it renders) once and counts the loads.
type loader struct {
	src  check.History
	memo map[string][]chartcrds.CRD
	svms map[string][]chartcrds.Migration
	errs map[string]error
	n    int
}

func newLoader(src check.History) *loader {
	return &loader{src: src, memo: map[string][]chartcrds.CRD{}, svms: map[string][]chartcrds.Migration{}, errs: map[string]error{}}
}

func (l *loader) crds(ctx context.Context, version string) ([]chartcrds.CRD, error) {
	if c, ok := l.memo[version]; ok {
		return c, nil
	}
	if err, ok := l.errs[version]; ok {
		return nil, err
	}
	l.n++
	var c []chartcrds.CRD
	var err error
	if ch, isChart := l.src.(check.ChartHistory); isChart {
		var loaded *check.Chart
		if loaded, err = ch.Chart(ctx, version); err == nil {
			c, l.svms[version] = loaded.CRDs, loaded.Migrations
		}
	} else {
		c, err = l.src.CRDs(ctx, version)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		err = &LoadError{Version: version, Err: err}
		l.errs[version] = err
		return nil, err
	}
	l.memo[version] = c
	return c, nil
}

// migrations are the StorageVersionMigrations a version loaded by crds renders.
func (l *loader) migrations(version string) []chartcrds.Migration { return l.svms[version] }
