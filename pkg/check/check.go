// Package check owns the upgrade and rollback prediction: for every CRD an operation
// brings or drops, it joins the live cluster's state with the pure decision in package
// predict, counts the objects at stake and names the exact next action. It returns a
// typed Report and never writes to the cluster; callers render it.
package check

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// CRDPolicy says which CRDs the operation writes when they already exist (predict.Policy).
type CRDPolicy = predict.Policy

// The CRD policies (predict.PolicyHelm, predict.PolicyCreateReplace).
const (
	PolicyHelm          = predict.PolicyHelm
	PolicyCreateReplace = predict.PolicyCreateReplace
)

// ParsePolicy validates a policy name (predict.ParsePolicy).
func ParsePolicy(s string) (CRDPolicy, error) { return predict.ParsePolicy(s) }

// Cluster is the read-only view of the live cluster that a prediction needs, and what
// check keeps of it between predictions. livecluster.KubeCluster is the one that reads a
// real cluster (and, for a target of livecluster.Clusters, reads it through memory and
// keeps a Memory); it also implements the optional readers below (MigrationLister,
// ExistingMigrationLister, ObjectLister) and Warmer.
type Cluster interface {
	// CRDs returns every CustomResourceDefinition on the cluster, by name.
	CRDs(ctx context.Context) (map[string]*apiextv1.CustomResourceDefinition, error)
	// CountObjects returns how many objects of the CRD's type exist, in all namespaces.
	CountObjects(ctx context.Context, crd *apiextv1.CustomResourceDefinition) (int64, error)
	// Memory is what check keeps of this cluster between predictions, kept with the
	// cluster by whoever keeps the cluster; nil when each prediction starts afresh.
	Memory() *Memory
}

// History lets check look for a stepping-stone chart version when an upgrade needs one.
type History interface {
	// Versions lists the chart versions to try, newest first.
	Versions(ctx context.Context) ([]string, error)
	// CRDs returns the CRDs that one chart version brings.
	CRDs(ctx context.Context, version string) ([]chartcrds.CRD, error)
}

// ChartHistory is a History that loads a whole chart version: the CRDs and the
// StorageVersionMigrations it renders (chartsource.History is one). plan judges the
// migrations at each upgrade step with it.
type ChartHistory interface {
	History
	Chart(ctx context.Context, version string) (*Chart, error)
}

// Request is one prediction.
type Request struct {
	Operation predict.Operation
	// Incoming are the CRDs the upgrade's chart or the rollback's target revision brings.
	Incoming []chartcrds.CRD
	// Current are the CRDs the release deploys today. CRDs rendered from templates/ that
	// the incoming side drops are deleted by Helm. Nil when there is no release.
	Current []chartcrds.CRD
	Policy  CRDPolicy
	// Deployer runs the operation; its rules say which CRDs leave the release and are
	// deleted (predict.Removals). Nil is the newest Helm.
	Deployer predict.Deployer
	// Migrations are the StorageVersionMigrations the incoming side renders
	// (chartcrds.MigrationsFromManifest): each is judged beside the CRD it covers.
	Migrations []chartcrds.Migration
	// History, when set, is searched for a stepping stone for bridge verdicts.
	History History
	// MaxSteppingStones bounds how many older chart versions are loaded (default 10).
	MaxSteppingStones int
	// NoObjectCounts leaves CRDReport.Objects unset, but for the CRDs the operation
	// deletes: a caller that only decides (the admission gate) saves one LIST per CRD.
	// A deletion's verdict depends on whether the CRD holds objects, so those are counted
	// whatever it says (a target of livecluster.Clusters counts them from memory).
	NoObjectCounts bool
	// NoAdmission skips asking the API server whether it accepts each incoming CRD (a
	// dry-run write). An admission webhook sets it: the server judges the write it admits.
	NoAdmission bool
	// NoSchemaCheck skips judging stored objects against the incoming schemas (package
	// crdschema): no pruning, validation or conversion findings, and no object reads.
	NoSchemaCheck bool

	// Upgrade words moving the deployment to a chart version in its deployer's terms (a
	// cmdline.ApplicationRevision: an Argo CD Application's targetRevision, say), for a
	// stepping stone's steps. Nil words it as a Helm upgrade: "upgrade to chart version V".
	Upgrade func(chartVersion string) string

	// What the report and its actions name.
	// ChartRef is the incoming chart as the user named it (a directory, repo/name, an
	// oci:// reference), for the commands that load it again.
	ChartRef     string
	Release      string
	Namespace    string
	Chart        string
	ChartVersion string
	FromRevision int
	ToRevision   int
}

// CRDReport is the verdict for one CRD with the objects at stake and the next action.
type CRDReport struct {
	predict.Decision
	// Objects is the number of objects of this type on the cluster; nil when the CRD does
	// not exist or counting failed (ObjectsError says why).
	Objects      *int64 `json:"objects"`
	ObjectsError string `json:"objectsError,omitempty"`
	// SteppingStone is a chart version that can be upgraded to first, for a bridge.
	SteppingStone string `json:"steppingStone,omitempty"`
	// Action is the exact next command, or advice when no command fixes it.
	Action string `json:"action"`
	// MigratingBy are the StorageVersionMigrations migrating this CRD right now (created by
	// anyone): the migration is under way, so the action is to wait for it.
	MigratingBy []string `json:"migratingBy,omitempty"`
	// Schema is what the incoming schema does to the objects stored today: fields pruned,
	// objects whose next update would be refused, a conversion webhook removed. Nil when
	// the CRD is new, not applied, or no schema that stored objects meet changes.
	Schema *crdschema.Report `json:"schema,omitempty"`
	// SchemaError says why the objects could not be judged (a conversion webhook down,
	// say); the verdict then rests on storedVersions alone.
	SchemaError string `json:"schemaError,omitempty"`
	// Refusal is the API server's refusal of the incoming CRD itself, as its minor's rules
	// decide (a dry-run write, crdschema.Admit): the Refused verdict. Nil when it accepts
	// the CRD or was not asked.
	Refusal *crdschema.Refusal `json:"refusal,omitempty"`
	// AdmissionError says why the API server could not be asked (the dry run needs update
	// and create on customresourcedefinitions); the verdict then rests on the rest.
	AdmissionError string `json:"admissionError,omitempty"`
	// Policies are the admission policies that deny writing the incoming CRD (evaluated
	// here from what the caller may read: admissionpolicy.Policies.Evaluate), each with
	// its binding, message and the way past it: the PolicyDenied verdict.
	Policies []admissionpolicy.Denial `json:"policies,omitempty"`
	// PolicyError says why the admission policies could not be evaluated (they could not
	// be read: RBAC list on validatingadmissionpolicies and their bindings).
	PolicyError string `json:"policyError,omitempty"`
	// ManifestObjects is how many objects of this CRD's kind the rendered manifests
	// carry, for a prediction made from them (PredictManifests); nil otherwise.
	ManifestObjects *int `json:"manifestObjects,omitempty"`
	// BundledMigrations are the StorageVersionMigrations the incoming chart renders for
	// this CRD, each with whether it will run and what to do instead. Advice: they never
	// change the verdict.
	BundledMigrations []predict.BundledMigration `json:"bundledMigrations,omitempty"`
}

// ExistingMigrationLister is what a Cluster implements when it can tell which
// StorageVersionMigrations exist, finished or not (livecluster.KubeCluster does). ok is
// false when it cannot tell (none served, or not allowed to list them).
type ExistingMigrationLister interface {
	ExistingMigrations(ctx context.Context) (m map[string]svm.Existing, ok bool, err error)
}

// MigrationLister is what a Cluster implements when it can tell which CRDs a
// StorageVersionMigration is migrating right now (livecluster.KubeCluster does).
type MigrationLister interface {
	MigrationsInProgress(ctx context.Context) (map[string][]svm.Migration, error)
}

// Report is the result of a prediction.
type Report struct {
	Operation predict.Operation `json:"operation"`
	Safe      bool              `json:"safe"`
	Release   string            `json:"release,omitempty"`
	// Application is the Argo CD Application (namespace/name) whose source was predicted;
	// the front end that read it sets it.
	Application string `json:"application,omitempty"`
	// Deployer runs the operation (Request.Deployer's spec); omitted when the request
	// names none (the newest Helm).
	Deployer     predict.DeployerSpec `json:"deployer,omitzero"`
	Namespace    string               `json:"namespace,omitempty"`
	Chart        string               `json:"chart,omitempty"`
	ChartVersion string               `json:"chartVersion,omitempty"`
	FromRevision int                  `json:"fromRevision,omitempty"`
	ToRevision   int                  `json:"toRevision,omitempty"`
	CRDs         []CRDReport          `json:"crds"`
	// BundledMigrations are the StorageVersionMigrations the incoming chart renders for a
	// CRD that has no entry in CRDs (one only live, or none at all).
	BundledMigrations []predict.BundledMigration `json:"bundledMigrations,omitempty"`
	// BundledMigrationsUnknown says the chart renders StorageVersionMigrations but the
	// cluster could not say which names are taken (none served, not allowed to list them,
	// or the read failed): "will not run" cannot be told from "will run".
	BundledMigrationsUnknown bool `json:"bundledMigrationsUnknown,omitempty"`
	// NextSteps are the actions of all findings, merged into as few commands as possible
	// and in the order to run them.
	NextSteps []string `json:"nextSteps"`
	// Manifests says what the rendered manifests a prediction was made from hold
	// (PredictManifests); nil for a chart or a release.
	Manifests *ManifestSummary `json:"manifests,omitempty"`
	// Unasked are the questions about admission that could not be asked, each with the
	// CRDs and why: the verdicts rest on what was asked, and a front end says so in its
	// headline, not below a SAFE. Empty when every question was asked.
	Unasked []Unasked `json:"unasked,omitempty"`
}

// Unasked is one question about admission that could not be asked, for some CRDs.
type Unasked struct {
	// What was not asked (UnaskedDryRun, UnaskedPolicies, UnaskedValidation).
	What string `json:"what"`
	// CRDs it was not asked about.
	CRDs []string `json:"crds"`
	// Why is the API server's answer to the request that would have asked it, for the
	// first of the CRDs; for UnaskedValidation, by which minor's rules the CRD's own
	// validation was evaluated here, or why it could not be.
	Why string `json:"why"`
	// Local, for UnaskedDryRun and UnaskedValidation, says the CRD's own validation was
	// evaluated here in the dry run's stead, and by which minor's rules (the server's own
	// when Local.Stands); nil when it was not.
	Local *crdschema.Local `json:"local,omitempty"`
}

// What an Unasked did not ask.
const (
	// UnaskedDryRun: the dry-run write, the only question that reaches the cluster's
	// admission webhooks. It needs update and create on customresourcedefinitions. The
	// API server's own validation of the CRD, which it asks too, is evaluated here
	// instead (crdschema.Validate; Local), and is not asked only as UnaskedValidation
	// says.
	UnaskedDryRun = "dry-run"
	// UnaskedValidation: the API server's own validation of the CRD (its schema and CEL
	// rules, by its minor's rules), for a CRD whose dry run could not be asked, when the
	// evaluation here ran by another minor's rules than the server's (a refusal may
	// differ: 1.38 accepts CEL rules 1.37 refuses for their cost), or could not run.
	UnaskedValidation = "validation"
	// UnaskedPolicies: the ValidatingAdmissionPolicies, which could not be read (list on
	// validatingadmissionpolicies and validatingadmissionpolicybindings, and the
	// parameters a binding names).
	UnaskedPolicies = "policies"
)

// Findings returns the CRDs whose verdict is not ok (a Prune verdict among them, though
// it does not make the report unsafe).
func (r *Report) Findings() []CRDReport {
	var out []CRDReport
	for _, c := range r.CRDs {
		if c.Verdict != predict.OK {
			out = append(out, c)
		}
	}
	return out
}

// Run predicts the operation against the live cluster. It only reads.
func Run(ctx context.Context, cluster Cluster, req Request) (*Report, error) {
	if req.Policy == "" {
		req.Policy = PolicyHelm
	}
	live, err := cluster.CRDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("read live CRDs: %w", err)
	}

	rep := &Report{
		Operation: req.Operation, Release: req.Release, Namespace: req.Namespace,
		Chart: req.Chart, ChartVersion: req.ChartVersion, FromRevision: req.FromRevision, ToRevision: req.ToRevision,
		CRDs: []CRDReport{},
	}
	if req.Deployer != nil {
		rep.Deployer = req.Deployer.Spec()
	} else {
		req.Deployer = predict.Helm4
	}
	removed, kept := removals(req, live)
	movedIn := movesIn(req, live)
	var judged, admitted []judgement
	for _, in := range req.Incoming {
		if _, ok := removed[in.CRD.Name]; ok {
			continue // it leaves the release: judged below as a removal
		}
		applied := req.Policy.Applies(in.Source)
		f := predict.Decide(live[in.CRD.Name], predict.Incoming{CRD: in.CRD, Source: in.Source, Applied: applied})
		if r, ok := kept[in.CRD.Name]; ok {
			f.Reason += "; " + predict.DecideRemoved(req.Operation, req.Deployer, r, nil).Reason
		}
		rep.CRDs = append(rep.CRDs, CRDReport{Decision: f})
		if applied && live[in.CRD.Name] != nil && !req.NoSchemaCheck {
			judged = append(judged, judgement{live: live[in.CRD.Name], next: in.CRD})
		}
		if applied && !req.NoAdmission {
			admitted = append(admitted, judgement{live: live[in.CRD.Name], next: in.CRD})
		}
	}
	var deleted []judgement
	for name, r := range removed {
		rep.CRDs = append(rep.CRDs, CRDReport{Decision: predict.Decision{Name: name}})
		if r.Deletes() && !req.NoAdmission {
			// The admission policies judge the DELETE the operation would send.
			deleted = append(deleted, judgement{live: r.Live})
		}
	}
	slices.SortFunc(rep.CRDs, func(a, b CRDReport) int { return strings.Compare(a.Name, b.Name) })

	unasked, err := askCluster(ctx, cluster, req, live, removed, judged, admitted, deleted, rep.CRDs)
	if err != nil {
		return nil, err
	}
	rep.Unasked = unasked
	this := predict.ReleaseRef{Namespace: req.Namespace, Name: req.Release}
	for i := range rep.CRDs {
		if r, ok := removed[rep.CRDs[i].Name]; ok {
			rep.CRDs[i].Decision = predict.DecideRemoved(req.Operation, req.Deployer, r, rep.CRDs[i].Objects)
			if to, ok := movedAway(req, r); ok {
				rep.CRDs[i].Decision = predict.DecideMovedAway(req.Operation, rep.CRDs[i].Decision, r, this, to)
			}
			if ps := rep.CRDs[i].Policies; len(ps) > 0 {
				rep.CRDs[i].Decision = predict.WithDeletionDenied(req.Operation, req.Deployer, rep.CRDs[i].Decision, admissionpolicy.Message(ps))
			}
		}
		if from, ok := movedIn[rep.CRDs[i].Name]; ok {
			rep.CRDs[i].Decision = predict.DecideMovedIn(req.Operation, rep.CRDs[i].Decision, from, this)
		}
	}
	if err := findSteppingStones(ctx, live, req, rep.CRDs); err != nil {
		return nil, err
	}
	rep.Safe = true
	for i := range rep.CRDs {
		rep.CRDs[i].Action = action(req, live, rep.CRDs[i])
		if rep.CRDs[i].Verdict.Blocks() {
			rep.Safe = false
		}
	}
	rep.NextSteps = nextSteps(req, live, rep.CRDs)
	if err := bundled(ctx, cluster, req, live, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// removals are the live CRDs that leave the release with the operation
// (predict.Removals), by name. A CRD the live keep annotation keeps and the incoming
// chart still ships stays, and is judged as incoming (a policy that applies crds/ writes
// it): it is in kept instead.
func removals(req Request, live map[string]*apiextv1.CustomResourceDefinition) (removed, kept map[string]predict.Removal) {
	removed, kept = map[string]predict.Removal{}, map[string]predict.Removal{}
	for _, r := range predict.Removals(predict.ReleaseChange{Deployer: req.Deployer, Operation: req.Operation,
		Release: req.Release, Namespace: req.Namespace, Live: live, Current: req.Current, Incoming: req.Incoming}) {
		if r.Fate == predict.FateKeptLive && r.Shipped != nil {
			kept[r.Name()] = r
			continue
		}
		removed[r.Name()] = r
	}
	return removed, kept
}

// moveChart is the chart the release a CRD moves to is upgraded with, when this operation
// is that upgrade (the CRD moves in); empty otherwise.
func moveChart(req Request, c CRDReport) string {
	if c.Move.To != (predict.ReleaseRef{Namespace: req.Namespace, Name: req.Release}) {
		return ""
	}
	return req.ChartRef
}

// movedAway says whether a CRD that leaves the release has moved to another one: the
// operation is Helm's and the live CRD's ownership metadata names another release, to.
func movedAway(req Request, r predict.Removal) (to predict.ReleaseRef, ok bool) {
	if req.Release == "" || !predict.MovingHelm(req.Deployer) {
		return predict.ReleaseRef{}, false
	}
	owner, ok := predict.HelmOwner(r.Live.Annotations)
	if !ok || owner == (predict.ReleaseRef{Namespace: req.Namespace, Name: req.Release}) {
		return predict.ReleaseRef{}, false
	}
	return owner, true
}

// movesIn are the CRDs that the upgrade of a Helm release takes into its manifest
// (rendered from templates/, not in the manifest today) while their live ownership
// metadata names another release, by name, with that release: Helm's install and upgrade
// refuse them (predict.DecideMovedIn). A rollback checks no ownership.
func movesIn(req Request, live map[string]*apiextv1.CustomResourceDefinition) map[string]predict.ReleaseRef {
	out := map[string]predict.ReleaseRef{}
	if req.Release == "" || req.Operation != predict.Upgrade || !predict.MovingHelm(req.Deployer) {
		return out
	}
	this := predict.ReleaseRef{Namespace: req.Namespace, Name: req.Release}
	for _, in := range req.Incoming {
		l := live[in.CRD.Name]
		if in.Source != predict.Templates || l == nil || slices.ContainsFunc(req.Current, func(c chartcrds.CRD) bool {
			return c.Source == predict.Templates && c.CRD.Name == in.CRD.Name
		}) {
			continue
		}
		if owner, ok := predict.HelmOwner(l.Annotations); ok && owner != this {
			out[in.CRD.Name] = owner
		}
	}
	return out
}

// bundled judges the StorageVersionMigrations the incoming side renders
// (predict.DecideBundled), each beside the CRD it covers. They are advice: Safe and the
// next steps stay what the CRDs' verdicts make them.
func bundled(ctx context.Context, cluster Cluster, req Request, live map[string]*apiextv1.CustomResourceDefinition, rep *Report) error {
	if len(req.Migrations) == 0 {
		return nil
	}
	existing, known := map[string]svm.Existing{}, false
	if el, ok := cluster.(ExistingMigrationLister); ok {
		// Advice never stops a prediction: a failed read leaves the names unknown.
		if m, ok, err := el.ExistingMigrations(ctx); err == nil {
			existing, known = m, ok
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	rep.BundledMigrationsUnknown = !known
	incoming := map[string]chartcrds.CRD{}
	for _, in := range req.Incoming {
		incoming[in.CRD.Name] = in
	}
	index := map[string]int{}
	for i, c := range rep.CRDs {
		index[c.Name] = i
	}
	for _, m := range req.Migrations {
		name := m.CRD()
		facts := predict.BundledFacts{Operation: req.Operation, Live: live[name]}
		if in, ok := incoming[name]; ok {
			facts.Incoming, facts.Applied = in.CRD, live[name] == nil || req.Policy.Applies(in.Source)
		}
		if e, ok := existing[m.Name]; ok && m.Name != "" {
			facts.Existing = &predict.LiveMigration{CRD: e.CRD, State: e.State}
		}
		i, reported := index[name]
		if reported {
			facts.Decision = &rep.CRDs[i].Decision
		}
		b := predict.DecideBundled(m, facts)
		if reported {
			rep.CRDs[i].BundledMigrations = append(rep.CRDs[i].BundledMigrations, b)
		} else {
			rep.BundledMigrations = append(rep.BundledMigrations, b)
		}
	}
	return nil
}

// nextSteps merges per-CRD actions: one migrate command for every migrate fix, the
// deployer's keep commands for every keep fix (predict.Deployer.KeepCommands), and each
// distinct other action once.
func nextSteps(req Request, live map[string]*apiextv1.CustomResourceDefinition, crds []CRDReport) []string {
	var migrate []string
	var keep []*apiextv1.CustomResourceDefinition
	var others []string
	for _, c := range crds {
		switch predict.FixFor(c.Decision) {
		case predict.NoFix:
		case predict.FixMove:
			others = append(others, predict.AdoptCommand(*c.Move, moveChart(req, c)).String())
		case predict.FixMigrate:
			migrate = append(migrate, c.Name)
		case predict.FixKeep:
			keep = append(keep, liveOrNamed(live, c.Name))
		case predict.FixPolicy:
			if admissionpolicy.Deletions(c.Policies) { // a denied deletion: keep the CRD (action)
				keep = append(keep, liveOrNamed(live, c.Name))
			} else if !slices.Contains(others, c.Action) {
				others = append(others, c.Action)
			}
		default:
			if !slices.Contains(others, c.Action) {
				others = append(others, c.Action)
			}
		}
	}
	steps := []string{}
	if len(keep) > 0 {
		for _, c := range req.Deployer.KeepCommands(req.Operation, keep) {
			steps = append(steps, c.String())
		}
	}
	if len(migrate) > 0 {
		steps = append(steps, cmdline.Migrate{CRDs: migrate}.String())
	}
	return append(steps, others...)
}

// askCluster asks the cluster what the verdicts need beyond the CRDs: the stored objects
// the new schemas meet (judgeSchemas), whether the API server accepts each CRD (admit),
// what its admission policies decide about each and about each deletion (evaluatePolicies),
// how many objects each CRD holds (countObjects) and which StorageVersionMigrations are
// in progress (migrating). The questions do not depend on each other, so they are asked
// at once: a check waits for the slowest, not for their sum. Their answers are joined as
// if asked in that order (a schema finding before a policy's denial, and that before a refusal), and so are their errors.
func askCluster(ctx context.Context, cluster Cluster, req Request, live map[string]*apiextv1.CustomResourceDefinition,
	removed map[string]predict.Removal, judged, admitted, deleted []judgement, crds []CRDReport) ([]Unasked, error) {
	var (
		g                                        errgroup.Group
		schemaErr, admitErr, countErr, activeErr error
		policyErr                                error
		refusals                                 []admission
		denials                                  []policyAnswer
		active                                   map[string][]svm.Migration
	)
	// Migrations in progress matter only to a CRD that is not OK. One that is not yet is
	// asked about at once; one that a schema finding or a refusal makes so, after them.
	// (Read before the schema judges start: they write the verdicts, names included.)
	asked := needsMigrations(crds)
	names := make([]string, len(crds))
	for i := range crds {
		names[i] = crds[i].Name
	}
	g.Go(func() error { schemaErr = judgeSchemas(ctx, cluster, judged, crds); return nil })
	g.Go(func() error { refusals, admitErr = admit(ctx, cluster, admitted); return nil })
	g.Go(func() error {
		denials, policyErr = evaluatePolicies(ctx, cluster, slices.Concat(admitted, deleted))
		return nil
	})
	g.Go(func() error {
		countErr = countObjects(ctx, cluster, live, names, crds, func(name string) bool {
			r, ok := removed[name]
			return !req.NoObjectCounts || ok && r.Deletes()
		})
		return nil
	})
	if asked {
		g.Go(func() error { active, activeErr = migrationsInProgress(ctx, cluster); return nil })
	}
	_ = g.Wait()
	if err := firstOf(schemaErr, admitErr, policyErr, countErr); err != nil {
		return nil, err
	}
	unasked := joinAdmission(refusals, denials, deleted, crds)
	if !asked && needsMigrations(crds) {
		active, activeErr = migrationsInProgress(ctx, cluster)
	}
	if activeErr != nil {
		return nil, activeErr
	}
	migrating(active, crds)
	return unasked, nil
}

// firstOf is the first non-nil error.
func firstOf(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// needsMigrations says whether a CRD is not OK, so that the migrations in progress are
// read.
func needsMigrations(crds []CRDReport) bool {
	return slices.ContainsFunc(crds, func(c CRDReport) bool { return c.Verdict != predict.OK })
}

// migrationsInProgress are the StorageVersionMigrations in progress, by CRD, when the
// cluster can tell (none otherwise).
func migrationsInProgress(ctx context.Context, cluster Cluster) (map[string][]svm.Migration, error) {
	ml, ok := cluster.(MigrationLister)
	if !ok {
		return nil, nil
	}
	active, err := ml.MigrationsInProgress(ctx)
	if err != nil {
		return nil, fmt.Errorf("read StorageVersionMigrations in progress: %w", err)
	}
	return active, nil
}

// migrating names the migrations in progress on every CRD that is not OK.
func migrating(active map[string][]svm.Migration, crds []CRDReport) {
	if active == nil {
		return
	}
	for i := range crds {
		if crds[i].Verdict != predict.OK {
			crds[i].MigratingBy = svm.Names(active[crds[i].Name])
			if len(crds[i].MigratingBy) == 0 {
				crds[i].MigratingBy = nil
			}
		}
	}
}

// maxCounts bounds the counts asked at once: the CRDs of most charts (flux2's 14, say)
// in one wave, rather than a second wave that waits for the first.
const maxCounts = 16

// countObjects fills Objects for every CRD that exists live and that want names (names[i]
// is crds[i]'s, read before the schema judges, which run beside it, write the findings).
// A CRD whose objects cannot be listed (a conversion webhook that is down, say) keeps its
// verdict and says why the count is missing; a forbidden list stops the run, since the
// caller lacks RBAC. Each count is one small LIST (CountObjects), asked maxCounts at a
// time.
func countObjects(ctx context.Context, cluster Cluster, live map[string]*apiextv1.CustomResourceDefinition, names []string, crds []CRDReport, want func(name string) bool) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxCounts)
	for i := range crds {
		l := live[names[i]]
		if l == nil || !want(l.Name) {
			continue
		}
		g.Go(func() error {
			n, err := cluster.CountObjects(gctx, l)
			if err != nil {
				if isForbidden(err) {
					return fmt.Errorf("count objects of %s: %w", l.Name, err)
				}
				crds[i].ObjectsError = err.Error()
				return nil
			}
			crds[i].Objects = &n
			return nil
		})
	}
	return g.Wait()
}

func findSteppingStones(ctx context.Context, live map[string]*apiextv1.CustomResourceDefinition, req Request, crds []CRDReport) error {
	if req.History == nil || req.Operation != predict.Upgrade {
		return nil
	}
	var bridges []int
	for i, c := range crds {
		if c.Verdict == predict.Bridge {
			bridges = append(bridges, i)
		}
	}
	if len(bridges) == 0 {
		return nil
	}
	versions, err := req.History.Versions(ctx)
	if err != nil {
		return fmt.Errorf("list chart versions for a stepping stone: %w", err)
	}
	target := map[string]*apiextv1.CustomResourceDefinition{}
	for _, in := range req.Incoming {
		target[in.CRD.Name] = in.CRD
	}
	limit := req.MaxSteppingStones
	if limit <= 0 {
		limit = 10
	}
	tried := 0
	for _, v := range versions {
		if v == req.ChartVersion {
			continue
		}
		if tried == limit {
			break
		}
		tried++
		cand, err := req.History.CRDs(ctx, v)
		if err != nil {
			continue // a version that will not load or render is no stepping stone
		}
		if steppingStoneFits(live, cand, target, crds, bridges) {
			for _, i := range bridges {
				crds[i].SteppingStone = v
			}
			return nil
		}
	}
	return nil
}

// steppingStoneFits checks that a candidate chart version is accepted after migrating to
// the live storage versions, and that the target is accepted after it.
func steppingStoneFits(live map[string]*apiextv1.CustomResourceDefinition, cand []chartcrds.CRD,
	target map[string]*apiextv1.CustomResourceDefinition, crds []CRDReport, bridges []int) bool {
	byName := map[string]*apiextv1.CustomResourceDefinition{}
	for _, c := range cand {
		byName[c.CRD.Name] = c.CRD
	}
	for _, i := range bridges {
		name := crds[i].Name
		if !predict.SteppingStone(live[name], byName[name], target[name]) {
			return false
		}
	}
	for name, c := range byName {
		l := live[name]
		if l == nil {
			continue
		}
		if v := predict.Decide(l, predict.Incoming{CRD: c, Applied: true}).Verdict; v == predict.Bridge {
			return false
		}
	}
	return true
}

// action words the fix of one finding (predict.FixFor) as the next command, or as advice
// when no command carries it out.
func action(req Request, live map[string]*apiextv1.CustomResourceDefinition, c CRDReport) string {
	crd := []string{c.Name}
	switch predict.FixFor(c.Decision) {
	case predict.FixMigrate:
		if len(c.MigratingBy) > 0 {
			return fmt.Sprintf("wait: StorageVersionMigration %s is migrating it now; then check again (or: %s)",
				strings.Join(c.MigratingBy, ", "), cmdline.Migrate{CRDs: crd, Wait: true})
		}
		return cmdline.Migrate{CRDs: crd}.String()
	case predict.FixMove:
		return predict.MoveAdvice(*c.Move, live[c.Name], moveChart(req, c))
	case predict.FixKeep:
		return req.Deployer.KeepAdvice(req.Operation, []*apiextv1.CustomResourceDefinition{liveOrNamed(live, c.Name)}, req.Release, req.Namespace)
	case predict.FixChart:
		return "no migration helps: change the chart (a version whose CRD this API server accepts), or upgrade the control plane " +
			"to a Kubernetes minor that accepts it first; then check again"
	case predict.FixPolicy:
		if admissionpolicy.Deletions(c.Policies) {
			// A policy refuses the deletion: keeping the CRD means it is never asked.
			return req.Deployer.KeepAdvice(req.Operation, []*apiextv1.CustomResourceDefinition{liveOrNamed(live, c.Name)}, req.Release, req.Namespace) +
				"; or, to delete it as the chart means to: " + policyAction(c.Policies)
		}
		return policyAction(c.Policies)
	case predict.FixSchema:
		return fmt.Sprintf("keep the data: declare %s in the incoming CRD's schema (or mark them x-kubernetes-preserve-unknown-fields) and check again; "+
			"or, if the loss is intended, accept it: %s",
			strings.Join(c.Schema.PrunedPaths(), ", "), predict.AllowFieldLoss(crd))
	case predict.FixStorageSwitch:
		if req.Operation == predict.Rollback {
			return fmt.Sprintf("%s (reverse migration: storage %s -> %s)", cmdline.ReverseMigration{
				Release: req.Release, Namespace: req.Namespace, Revision: req.ToRevision}, c.LiveStorageVersion, c.StorageSwitchTo)
		}
		return cmdline.StorageSwitch{CRDs: crd, StorageVersion: c.StorageSwitchTo}.String()
	case predict.FixSteppingStone:
		if c.SteppingStone != "" {
			migrate := cmdline.Migrate{CRDs: crd}
			stone, target := "upgrade to chart version "+c.SteppingStone, "upgrade to "+orUnknown(req.ChartVersion)
			if req.Upgrade != nil {
				stone, target = req.Upgrade(c.SteppingStone), req.Upgrade(orUnknown(req.ChartVersion))
			}
			return fmt.Sprintf("two steps: %s; %s; %s; then %s", migrate, stone, migrate, target)
		}
		return fmt.Sprintf("go through a chart version whose CRD serves %s and stores at one of %s: upgrade to it, migrate, then upgrade to %s (a chart from a repository or OCI registry lets check name one)",
			c.LiveStorageVersion, versionList(c.IncomingVersions), orUnknown(req.ChartVersion))
	}
	return ""
}

// policyAction words the way past each policy that denies a CRD (admissionpolicy.WayOn),
// each policy once: its advice, the command that starts it, and where its authors
// document it.
func policyAction(denials []admissionpolicy.Denial) string {
	var parts []string
	seen := map[string]bool{}
	for _, d := range denials {
		if seen[d.Policy] {
			continue
		}
		seen[d.Policy] = true
		parts = append(parts, d.Policy+": "+d.WayOn.String())
	}
	return strings.Join(parts, "; ") + "; then check again"
}

// liveOrNamed is the live CRD name, or a CRD that only has the name when it is not live.
func liveOrNamed(live map[string]*apiextv1.CustomResourceDefinition, name string) *apiextv1.CustomResourceDefinition {
	if c := live[name]; c != nil {
		return c
	}
	c := &apiextv1.CustomResourceDefinition{}
	c.Name = name
	return c
}

func orUnknown(s string) string {
	if s == "" {
		return "the target version"
	}
	return s
}

func versionList(vs []crdversions.Version) string {
	names := make([]string, 0, len(vs))
	for _, v := range vs {
		names = append(names, v.Name)
	}
	return "[" + strings.Join(names, " ") + "]"
}

// FindingReport is the report as CI reads it: a case per CRD the operation brings or
// drops, named by the CRD. A verdict other than ok is a finding whose check is the verdict
// (migrate, bridge, delete, data-loss, refused: blocking; prune: a warning, as it loses
// nothing now), its message the reason and its remediation the action.
func (r *Report) FindingReport() finding.Report {
	rep := finding.Report{Tool: "check", Cases: []finding.Case{}}
	for _, c := range r.CRDs {
		fc := finding.Case{Name: c.Name}
		if c.Verdict != predict.OK {
			sev := finding.Warning
			if c.Verdict.Blocks() {
				sev = finding.Blocking
			}
			fc.Findings = []finding.Finding{{Check: string(c.Verdict), Subject: c.Name, Severity: sev, Message: c.Reason, Remediation: c.Action}}
		}
		rep.Cases = append(rep.Cases, fc)
	}
	return rep
}
