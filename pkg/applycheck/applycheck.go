// Package applycheck predicts, object by object, what a Helm 4 upgrade or rollback does to
// the cluster, server-side or client-side, and what it leaves behind when it fails.
//
// Predict is the entry point of a front end: one upgrade or rollback of a stored release,
// from its history (and, for an upgrade, the new chart, loaded and rendered once) to one
// Prediction, which adds the CRD storage-version check of the same chart and says
// whether the operation is safe by both. CheckRelease is the replay of a stored release:
// it resolves the apply method as Helm 4.3.1 does (ResolveMode), predicts flag errors,
// sorts hooks, redacts release values and Secret data, and runs Run. Run is the loop
// itself, described below for server-side apply; client-side (Options.ClientSide)
// differs only in how one object is updated (predictClientSide: Helm's three-way merge
// patch, no conflicts).
//
// The model is Helm's own upgrade loop (pkg/kube Client.update and pkg/action
// Upgrade.performUpgrade), identical in every Helm 4 release the Go module proxy serves,
// v4.2.1 to v4.3.2 (see HelmVersions):
//
//   - Before anything is applied, every object the new chart renders and the current
//     release does not list is looked up. One that exists without this release's
//     ownership metadata makes Helm refuse the upgrade: nothing is applied and no
//     revision is recorded. So does a kind the cluster does not serve.
//   - Pre-upgrade hooks run next, then Helm walks the new chart's objects one by one in
//     install order, creates and updates interleaved. An object that exists is
//     server-side applied as field manager "helm" without forcing conflicts. When that
//     fails (a field another manager owns, or a rejection), the object is left exactly
//     as it was, the error is collected and Helm goes on with the next object. An object
//     that does not exist is created; when a create fails, Helm stops there: the objects
//     after it are not touched and the update errors collected so far are not reported.
//   - Objects the new chart dropped are deleted only when every apply and create
//     succeeded, and only when the live object does not carry
//     helm.sh/resource-policy: keep.
//   - Any error marks the new revision (last revision + 1) failed with the description
//     `Upgrade "<name>" failed: <error>`; the revision the upgrade started from keeps its
//     status, and post-upgrade hooks do not run. Without --rollback-on-failure (or
//     --cleanup-on-fail, which deletes the objects it created) the cluster keeps the
//     partial state: what applied stays applied.
//
// Run reproduces each step with the API server's own answers: a GET, then a server-side
// apply with dryRun=All, the same field manager, strict field validation and no force,
// which returns the same 409 with the conflicting fields and their managers, and a
// dry-run delete. It writes nothing.
package applycheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/redact"
)

// HelmVersions are the Helm releases whose upgrade this package models. Their upgrade
// loop is the same line for line; only the retry of a create on a ResourceQuota conflict
// (v4.2.4 and later) differs, which changes no outcome here.
const HelmVersions = "v4.2.1 to v4.3.2"

// Step is what Helm does with an object.
type Step string

const (
	// Apply means the object exists, Helm server-side applies the new chart's version.
	Apply Step = "apply"
	// Create means the object does not exist, Helm creates it (a server-side apply too).
	Create Step = "create"
	// Delete means the new chart no longer renders the object.
	Delete Step = "delete"
)

// Outcome is what a real upgrade does to one object.
type Outcome string

const (
	// Updated means the apply succeeds and changes the object.
	Updated Outcome = "updated"
	// Unchanged means the apply succeeds and changes nothing.
	Unchanged Outcome = "unchanged"
	// Created means the object is created.
	Created Outcome = "created"
	// Conflict means another field manager owns fields the chart sets. The whole apply is
	// rejected: none of the object's changes land, and Helm goes on with the next object.
	Conflict Outcome = "conflict"
	// Failed means the apply, create or delete is rejected for another reason (validation,
	// admission). The object stays as it was.
	Failed Outcome = "failed"
	// NotReached means a create before it failed, and Helm stopped there.
	NotReached Outcome = "notReached"
	// Deleted means the dropped object is deleted.
	Deleted Outcome = "deleted"
	// NotDeleted means the dropped object stays, because an apply or create failed (Helm
	// deletes dropped objects only after every one succeeded) or because Helm refused the
	// upgrade.
	NotDeleted Outcome = "notDeleted"
	// Kept means the dropped object stays because the live object carries
	// helm.sh/resource-policy: keep.
	Kept Outcome = "kept"
	// AlreadyGone means the dropped object is not on the cluster.
	AlreadyGone Outcome = "alreadyGone"
	// CannotImport means the new chart adds the object, it exists, and its ownership metadata
	// does not name this release. Helm refuses the whole upgrade.
	CannotImport Outcome = "cannotImport"
	// NotServed means the cluster does not serve the object's kind. Helm refuses the whole
	// upgrade.
	NotServed Outcome = "notServed"
)

// Result is how the whole upgrade ends.
type Result string

const (
	// Succeeds means every object applies; the new revision is deployed (before any --wait
	// and post-upgrade hooks, which this package does not predict).
	Succeeds Result = "succeeds"
	// Fails means the new revision is recorded as failed, with what landed left on the
	// cluster.
	Fails Result = "fails"
	// Refused means Helm stops before it records a revision or applies anything.
	Refused Result = "refused"
)

// FieldConflict is one field another manager owns.
type FieldConflict struct {
	Field   string `json:"field"`
	Manager string `json:"manager"`
}

// Object is the prediction for one object, in the order Helm handles it.
type Object struct {
	Object    string          `json:"object"` // Kind/namespace/name
	Step      Step            `json:"step"`
	Outcome   Outcome         `json:"outcome"`
	Conflicts []FieldConflict `json:"conflicts,omitempty"`
	// Error is this object's error as Helm reports it.
	Error string `json:"error,omitempty"`
	// DryRun is what the dry run answered for an object Helm does not reach.
	DryRun Outcome `json:"dryRun,omitempty"`
	Note   string  `json:"note,omitempty"`
	// TakenOver lists the fields that move from Helm's client-side apply (manager "helm",
	// operation Update) to its server-side apply when a release moves to server-side.
	TakenOver []string `json:"takenOver,omitempty"`
	// NotReverted lists, for a server-side rollback, the fields the revision it starts
	// from sets and the target does not, which another manager owns: the rollback leaves
	// them as they are instead of removing them (rancher/fleet#4879). Fields inside lists
	// are not judged.
	NotReverted []FieldConflict `json:"notReverted,omitempty"`
	// Overwrites lists, for a client-side apply, the fields other managers own that the
	// patch changes: no conflict stops it, they simply become Helm's.
	Overwrites []FieldConflict `json:"overwrites,omitempty"`
	// StoredVersionsRejected lists, for a failed CRD, the stored versions the API server
	// refuses to see dropped from spec.versions (either wording, up to 1.32 or from 1.33).
	StoredVersionsRejected []crdversions.StoredVersionRejection `json:"storedVersionsRejected,omitempty"`
}

// Record is the release record the upgrade leaves.
type Record struct {
	// Revision is the revision the upgrade records (last revision + 1), 0 when Helm
	// refuses the upgrade before recording one.
	Revision int `json:"revision"`
	// Status of that revision: deployed or failed; empty when none is recorded.
	Status string `json:"status,omitempty"`
	// Description is the revision's description when it fails.
	Description string `json:"description,omitempty"`
	// Previous is the revision the upgrade starts from and PreviousStatus the status it
	// has afterwards: superseded after a success, unchanged otherwise.
	Previous       int    `json:"previous"`
	PreviousStatus string `json:"previousStatus"`
}

// Report is the prediction of one upgrade.
type Report struct {
	// HelmVersions are the Helm releases the prediction models.
	HelmVersions string    `json:"helmVersions"`
	Operation    Operation `json:"operation"`
	// Method is the apply method modelled: ssa (server-side apply) or csa (Helm's
	// client-side three-way merge patch).
	Method       string `json:"method"`
	FieldManager string `json:"fieldManager"`
	Force        bool   `json:"forceConflicts"`
	Safe         bool   `json:"safe"`
	Result       Result `json:"result"`
	// Objects are the new chart's objects in apply order, then the dropped ones.
	Objects []Object `json:"objects"`
	// Failing lists the objects whose apply, create or delete fails, or that make Helm
	// refuse the upgrade.
	Failing []string `json:"failing"`
	// Landed lists what a failed upgrade changes all the same (updated, created); NotLanded
	// what the new chart changes but a failed upgrade does not (failing objects, objects
	// not reached, dropped objects not deleted). Both are empty when the upgrade succeeds.
	Landed    []string `json:"landed"`
	NotLanded []string `json:"notLanded"`
	// Error is what `helm upgrade` prints after "Error: UPGRADE FAILED: " (`helm rollback`
	// after "Error: ").
	Error  string `json:"error,omitempty"`
	Record Record `json:"record"`
	// PreUpgradeHooks run before any object is applied; PostUpgradeHooks do not run when
	// the upgrade fails.
	PreUpgradeHooks  []string `json:"preUpgradeHooks"`
	PostUpgradeHooks []string `json:"postUpgradeHooks"`

	// dropped are the objects the new manifest no longer renders, as the old one has them.
	dropped []*unstructured.Unstructured
}

// Upgrade describes the upgrade to predict.
type Upgrade struct {
	// Operation is OpUpgrade (the default) or OpRollback. A rollback's current manifest is
	// the last revision's, whatever its status, and its target the rollback revision's.
	Operation Operation
	Release   string
	Namespace string
	// CurrentManifest is the manifest of the revision the upgrade starts from (the last
	// deployed one), and Current that revision's number and CurrentStatus its status.
	CurrentManifest string
	Current         int
	CurrentStatus   string
	// LastRevision is the highest stored revision, whatever its status, and LastStatus
	// its status: a pending-* status makes Helm refuse the upgrade.
	LastRevision int
	LastStatus   string
	// TargetManifest is the new chart's rendered non-hook manifest.
	TargetManifest string
	// PreUpgradeHooks and PostUpgradeHooks name the new chart's hooks (Kind/name).
	PreUpgradeHooks, PostUpgradeHooks []string
}

// Options for Run.
type Options struct {
	// FieldManager is the manager of the upgrade: "helm" for the Helm CLI.
	FieldManager string
	// Force forces conflicts (helm --force-conflicts; Flux's helm-controller always does).
	Force bool
	// Redact hides what must never appear in the report (release values, Secret data):
	// every occurrence in an error or a field path is replaced with redact.Mask. Nil
	// hides nothing.
	Redact *redact.Redactor
	// ClientSide models Helm's client-side apply (--server-side=false, or auto after a
	// client-side revision): a three-way merge patch of the current manifest, the new
	// one and the live object, sent without conflicts.
	ClientSide bool
	// TakeOverClientSide models Helm moving the fields its client-side applies own (manager
	// "helm", operation Update) to its server-side apply before it applies: those fields
	// then never conflict.
	TakeOverClientSide bool
	// FlagError is a flag error Helm meets after recording the revision and before it
	// applies anything (see Mode.FlagError).
	FlagError string
	// TakeOwnership models helm upgrade --take-ownership: a new object that exists is
	// adopted whatever its ownership metadata says (requireAdoption), instead of refusing
	// the upgrade.
	TakeOwnership bool
}

type item struct {
	obj     *unstructured.Unstructured
	mapping *meta.RESTMapping
	subject string
}

// Run predicts the upgrade. It returns an error only when it cannot ask the API server
// (unreachable, forbidden).
func Run(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, u Upgrade, o Options) (*Report, error) {
	if u.Operation == "" {
		u.Operation = OpUpgrade
	}
	method := MethodSSA
	if o.ClientSide {
		method = MethodCSA
	}
	r := &run{dyn: dyn, u: u, o: o, red: o.Redact, createErr: o.FlagError, createdNS: map[string]bool{}}
	r.rep = &Report{HelmVersions: HelmVersions, Operation: u.Operation, Method: method, FieldManager: o.FieldManager, Force: o.Force, Objects: []Object{}, Failing: []string{},
		Landed: []string{}, NotLanded: []string{}, PreUpgradeHooks: orEmpty(u.PreUpgradeHooks), PostUpgradeHooks: orEmpty(u.PostUpgradeHooks),
		Record: Record{Previous: u.Current, PreviousStatus: u.CurrentStatus}}
	if u.Operation == OpUpgrade && strings.HasPrefix(u.LastStatus, "pending-") {
		return refuse(r.rep, "another operation (install/upgrade/rollback) is in progress"), nil
	}
	if refused := r.build(mapper); refused {
		return r.rep, nil
	}
	refused, err := r.checkOwnership(ctx)
	if err != nil {
		return nil, err
	}
	if refused {
		return r.rep, nil
	}
	if err := r.apply(ctx); err != nil {
		return nil, err
	}
	if err := r.deletes(ctx); err != nil {
		return nil, err
	}
	return r.finish(), nil
}

// run is one prediction in progress: Helm's upgrade loop, phase by phase.
type run struct {
	dyn                 dynamic.Interface
	u                   Upgrade
	o                   Options
	red                 *redact.Redactor
	rep                 *Report
	current, target     []item
	createErr           string // a flag error stops Helm before the first object
	updateErrs, delErrs []string
	createdNS           map[string]bool
}

// build builds both manifests first, as Helm does: a kind the cluster does not serve
// stops it. It reports whether the operation is refused.
func (r *run) build(mapper meta.RESTMapper) bool {
	rep, u := r.rep, r.u
	current, cerrs := build(mapper, u.CurrentManifest, u.Namespace)
	target, terrs := build(mapper, u.TargetManifest, u.Namespace)
	for _, t := range target {
		stamp(t.obj, u.Release, u.Namespace)
	}
	r.current, r.target = current, target
	if len(cerrs)+len(terrs) == 0 {
		return false
	}
	for _, e := range append(cerrs, terrs...) {
		rep.Objects = append(rep.Objects, Object{Object: e.subject, Step: Apply, Outcome: NotServed, Error: r.red.String(e.err.Error())})
		rep.Failing = append(rep.Failing, e.subject)
	}
	which := "new release manifest"
	if len(cerrs) > 0 {
		which = "current release manifest"
	}
	refuse(rep, fmt.Sprintf("unable to build kubernetes objects from %s: %s", which, rep.Objects[0].Error))
	return true
}

// checkOwnership requires new objects that exist to belong to this release already. It
// reports whether the operation is refused.
func (r *run) checkOwnership(ctx context.Context) (bool, error) {
	rep, u := r.rep, r.u
	inCurrent := map[string]bool{}
	for _, c := range r.current {
		inCurrent[objectKey(c)] = true
	}
	for _, t := range r.target {
		if inCurrent[objectKey(t)] || u.Operation == OpRollback { // a rollback takes ownership without asking
			continue
		}
		live, err := resourceFor(r.dyn, t).Get(ctx, t.obj.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("%s: read: %w", t.subject, err)
		}
		if msg := ownership(live, u.Release, u.Namespace); msg != "" && !r.o.TakeOwnership {
			rep.Objects = append(rep.Objects, Object{Object: t.subject, Step: Create, Outcome: CannotImport,
				Error: fmt.Sprintf("%s exists and cannot be imported into the current release: %s", resourceString(t), msg)})
			rep.Failing = append(rep.Failing, t.subject)
			refuse(rep, "unable to continue with update: "+rep.Objects[len(rep.Objects)-1].Error)
			return true, nil
		}
		r.current = append(r.current, t) // adopted: Helm updates it, and may delete it later
	}
	return false, nil
}

// apply predicts each object of the target in Helm's order.
func (r *run) apply(ctx context.Context) error {
	for _, t := range r.target {
		res, err := r.predict(ctx, t)
		if err != nil {
			return err
		}
		r.record(t, res)
	}
	return nil
}

// predict asks the API server what applying t does, redacted.
func (r *run) predict(ctx context.Context, t item) (Object, error) {
	var res Object
	var err error
	if r.o.ClientSide {
		res, err = predictClientSide(ctx, r.dyn, t, originalOf(r.current, t), r.o, r.createdNS)
	} else {
		res, err = predictApply(ctx, r.dyn, t, r.o, r.createdNS)
	}
	if err != nil {
		return Object{}, err
	}
	res.Error = r.red.String(res.Error)
	for i := range res.Conflicts {
		res.Conflicts[i].Field = r.red.String(res.Conflicts[i].Field)
	}
	if r.u.Operation == OpRollback {
		res.NotReverted = unreverted(res.NotReverted, originalOf(r.current, t), t)
	} else {
		res.NotReverted = nil
	}
	for i := range res.NotReverted {
		res.NotReverted[i].Field = r.red.String(res.NotReverted[i].Field)
	}
	for i := range res.TakenOver {
		res.TakenOver[i] = r.red.String(res.TakenOver[i])
	}
	for i := range res.Overwrites {
		res.Overwrites[i].Field = r.red.String(res.Overwrites[i].Field)
	}
	return res, nil
}

// record adds one applied object's outcome: after a create error Helm applies nothing more.
func (r *run) record(t item, res Object) {
	rep := r.rep
	switch {
	case r.createErr != "":
		res.DryRun, res.Outcome = res.Outcome, NotReached
		res.Conflicts, res.Error, res.NotReverted, res.TakenOver, res.Overwrites = nil, "", nil, nil, nil
		if r.o.FlagError != "" {
			res.Note = "Helm stops at the flag error before it applies anything"
		}
		if res.DryRun != Unchanged {
			rep.NotLanded = append(rep.NotLanded, res.Object)
		}
	case res.Outcome == Conflict || res.Outcome == Failed:
		rep.Failing = append(rep.Failing, res.Object)
		rep.NotLanded = append(rep.NotLanded, res.Object)
		if res.Step == Create {
			r.createErr = "failed to create resource: " + res.Error
		} else {
			r.updateErrs = append(r.updateErrs, res.Error)
		}
	case res.Outcome == Updated || res.Outcome == Created:
		rep.Landed = append(rep.Landed, res.Object)
		if res.Outcome == Created && t.obj.GetKind() == "Namespace" && t.mapping.Resource.Group == "" {
			r.createdNS[t.obj.GetName()] = true
		}
	}
	rep.Objects = append(rep.Objects, res)
}

// deletes predicts the deletes of objects the target no longer renders.
func (r *run) deletes(ctx context.Context) error {
	rep := r.rep
	failed := r.createErr != "" || len(r.updateErrs) > 0
	for _, c := range r.current {
		if slices.ContainsFunc(r.target, func(t item) bool { return sameObject(t, c) }) {
			continue
		}
		rep.dropped = append(rep.dropped, c.obj)
		res, err := predictDelete(ctx, r.dyn, c, predict.Operation(r.u.Operation), failed)
		if err != nil {
			return err
		}
		res.Error = r.red.String(res.Error)
		switch res.Outcome {
		case NotDeleted:
			rep.NotLanded = append(rep.NotLanded, res.Object)
		case Failed:
			rep.Failing = append(rep.Failing, res.Object)
			rep.NotLanded = append(rep.NotLanded, res.Object)
			r.delErrs = append(r.delErrs, res.Error)
		case Deleted:
			rep.Landed = append(rep.Landed, res.Object)
		}
		rep.Objects = append(rep.Objects, res)
	}
	return nil
}

// finish writes the result and the release record Helm leaves.
func (r *run) finish() *Report {
	rep, u := r.rep, r.u
	createErr, updateErrs, deleteErrs := r.createErr, r.updateErrs, r.delErrs
	switch {
	case createErr != "":
		rep.Error = createErr
	case len(updateErrs) > 0:
		rep.Error = strings.Join(updateErrs, " && ")
	case len(deleteErrs) > 0:
		rep.Error = strings.Join(deleteErrs, " && ")
	}
	rep.Record.Revision = u.LastRevision + 1
	if rep.Error == "" {
		rep.Safe, rep.Result = true, Succeeds
		rep.Record.Status, rep.Record.PreviousStatus = "deployed", "superseded"
		rep.Landed, rep.NotLanded = []string{}, []string{}
		return rep
	}
	rep.Result = Fails
	rep.Record.Status = "failed"
	rep.Record.Description = fmt.Sprintf("Upgrade %q failed: %s", u.Release, rep.Error)
	if u.Operation == OpRollback {
		// performRollback marks the revision it started from superseded, even on failure.
		rep.Record.Description = fmt.Sprintf("Rollback %q failed: %s", u.Release, rep.Error)
		rep.Record.PreviousStatus = "superseded"
	}
	return rep
}

func refuse(rep *Report, msg string) *Report {
	rep.Result, rep.Error = Refused, msg
	rep.Record.Revision, rep.Record.Status = 0, ""
	return rep
}

func predictApply(ctx context.Context, dyn dynamic.Interface, t item, o Options, createdNS map[string]bool) (Object, error) {
	ri := resourceFor(dyn, t)
	res := Object{Object: t.subject, Step: Apply}
	live, err := ri.Get(ctx, t.obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		res.Step, live = Create, nil
	case err != nil:
		return Object{}, fmt.Errorf("%s: read: %w", t.subject, err)
	}
	data, err := t.obj.MarshalJSON()
	if err != nil {
		return Object{}, fmt.Errorf("%s: encode: %w", t.subject, err)
	}
	force := o.Force
	opts := metav1.PatchOptions{FieldManager: o.FieldManager, Force: &force, DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
	got, err := ri.Patch(ctx, t.obj.GetName(), types.ApplyPatchType, data, opts)
	if live != nil && o.TakeOverClientSide {
		res.TakenOver = ownUpdateFields(live, o.FieldManager)
	}
	if err != nil && live != nil && o.TakeOverClientSide && apierrors.IsConflict(err) {
		// Helm first hands the fields its client-side applies own to its server-side
		// apply; conflicts with those never happen.
		own, foreign := splitConflicts(conflicts(err), o.FieldManager)
		if len(foreign) == 0 && len(own) > 0 {
			yes := true // ask again, taking exactly those
			opts.Force = &yes
			got, err = ri.Patch(ctx, t.obj.GetName(), types.ApplyPatchType, data, opts)
		} else if len(own) > 0 {
			err = conflictError(err, foreign)
		}
	}
	where := fmt.Sprintf("%s/%s %s", t.obj.GetNamespace(), t.obj.GetName(), t.mapping.GroupVersionKind.String())
	switch {
	case err == nil && live == nil:
		res.Outcome = Created
	case err == nil:
		res.Outcome = Unchanged
		if changed(live, got) {
			res.Outcome = Updated
		}
		res.NotReverted = foreignFields(got, o.FieldManager)
	case res.Step == Create && apierrors.IsNotFound(err) && createdNS[t.obj.GetNamespace()]:
		res.Outcome = Created
		res.Note = "its namespace is created earlier by the same upgrade: the dry run cannot check it"
	case apierrors.IsConflict(err):
		res.Outcome, res.Conflicts = Conflict, conflicts(err)
		res.Error = fmt.Sprintf("conflict occurred while applying object %s: %v", where, err)
	case isRBACDenied(err):
		return Object{}, fmt.Errorf("%s: dry-run apply: %w (the check needs the same rights as the upgrade)", t.subject, err)
	case apierrors.IsUnauthorized(err) || isUnreachable(err):
		return Object{}, fmt.Errorf("%s: dry-run apply: %w", t.subject, err)
	default:
		res.Outcome = Failed
		res.Error = fmt.Sprintf("server-side apply failed for object %s: %v", where, err)
		res.storedVersionsRejected(err)
	}
	return res, nil
}

// storedVersionsRejected notes a CRD the API server refuses because it drops a version
// still in status.storedVersions: no chart change fixes that, a storage migration does.
func (res *Object) storedVersionsRejected(err error) {
	res.StoredVersionsRejected = crdversions.StoredVersionRejections(err.Error())
	if len(res.StoredVersionsRejected) > 0 {
		res.Note = "the CRD drops a version still in status.storedVersions: migrate its objects first (upgradeguard check names the command)"
	}
}

// predictDelete predicts the delete of an object the target dropped: Helm's rule
// (predict.Deployer.Fate) on the live object, then a dry-run delete.
func predictDelete(ctx context.Context, dyn dynamic.Interface, c item, op predict.Operation, failed bool) (Object, error) {
	res := Object{Object: c.subject, Step: Delete}
	ri := resourceFor(dyn, c)
	live, err := ri.Get(ctx, c.obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		res.Outcome = AlreadyGone
		return res, nil
	case err != nil:
		return Object{}, fmt.Errorf("%s: read: %w", c.subject, err)
	case failed:
		res.Outcome = NotDeleted
		res.Note = "Helm deletes dropped objects only when every apply and create succeeded"
		return res, nil
	case predict.Helm4.Fate(op, predict.Leaving{Exists: true, Live: live.GetAnnotations()}) == predict.FateKeptLive:
		res.Outcome = Kept
		res.Note = "the live object carries helm.sh/resource-policy: keep"
		return res, nil
	}
	policy := metav1.DeletePropagationBackground
	err = ri.Delete(ctx, c.obj.GetName(), metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}, PropagationPolicy: &policy})
	switch {
	case err == nil:
		res.Outcome = Deleted
	case apierrors.IsNotFound(err):
		res.Outcome = AlreadyGone
	case isRBACDenied(err):
		return Object{}, fmt.Errorf("%s: dry-run delete: %w (the check needs the same rights as the upgrade)", c.subject, err)
	default:
		res.Outcome = Failed
		res.Error = fmt.Sprintf("failed to delete resource namespace=%s, name=%s, kind=%s: %v", c.obj.GetNamespace(), c.obj.GetName(), c.mapping.GroupVersionKind.Kind, err)
	}
	return res, nil
}

func isUnreachable(err error) bool {
	var status apierrors.APIStatus
	return !errors.As(err, &status)
}

// changed reports whether a dry-run apply result differs from the live object in more
// than the bookkeeping the apply itself rewrites.
func changed(live, got *unstructured.Unstructured) bool {
	strip := func(u *unstructured.Unstructured) map[string]any {
		c := u.DeepCopy()
		unstructured.RemoveNestedField(c.Object, "metadata", "managedFields")
		unstructured.RemoveNestedField(c.Object, "metadata", "resourceVersion")
		return c.Object
	}
	return !equality.Semantic.DeepEqual(strip(live), strip(got))
}

// ownership is Helm's check that an existing object belongs to the release; empty when it does.
func ownership(live *unstructured.Unstructured, release, namespace string) string {
	var errs []string
	need := func(what string, m map[string]string, k, v string) {
		got, ok := m[k]
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("%s validation error: missing key %q: must be set to %q", what, k, v))
		case got != v:
			errs = append(errs, fmt.Sprintf("%s validation error: key %q must equal %q: current value is %q", what, k, v, got))
		}
	}
	need("label", live.GetLabels(), "app.kubernetes.io/managed-by", "Helm")
	need("annotation", live.GetAnnotations(), "meta.helm.sh/release-name", release)
	need("annotation", live.GetAnnotations(), "meta.helm.sh/release-namespace", namespace)
	if len(errs) == 0 {
		return ""
	}
	return "invalid ownership metadata; " + strings.Join(errs, "; ")
}

func resourceString(t item) string {
	return fmt.Sprintf("%s %q in namespace %q", t.mapping.GroupVersionKind.Kind, t.obj.GetName(), t.obj.GetNamespace())
}

type buildErr struct {
	subject string
	err     error
}

// build maps every object of a manifest, in Helm's install order, as Helm's builder
// does: namespaced objects without a namespace get the release namespace, and every
// object gets Helm's ownership metadata (as helm upgrade sets it before applying).
func build(mapper meta.RESTMapper, text, namespace string) ([]item, []buildErr) {
	objs, err := manifest.All(text)
	if err != nil {
		return nil, []buildErr{{subject: "(manifest)", err: err}}
	}
	var out []item
	var errs []buildErr
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, buildErr{subject: manifest.Subject(obj), err: fmt.Errorf("no matches for kind %q in version %q (the cluster does not serve it: install its CRD first, or drop the object)",
				gvk.Kind, gvk.GroupVersion().String())})
			continue
		}
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace(namespace)
			}
		} else {
			obj.SetNamespace("")
		}
		out = append(out, item{obj: obj, mapping: mapping, subject: manifest.Subject(obj)})
	}
	return out, errs
}

// stamp sets the ownership metadata helm upgrade puts on every object it applies.
func stamp(obj *unstructured.Unstructured, release, namespace string) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["app.kubernetes.io/managed-by"] = "Helm"
	obj.SetLabels(labels)
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann["meta.helm.sh/release-name"] = release
	ann["meta.helm.sh/release-namespace"] = namespace
	obj.SetAnnotations(ann)
}

func resourceFor(dyn dynamic.Interface, t item) dynamic.ResourceInterface {
	if t.mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return dyn.Resource(t.mapping.Resource).Namespace(t.obj.GetNamespace())
	}
	return dyn.Resource(t.mapping.Resource)
}

// objectKey is Helm's key for "the current release lists it": version included.
func objectKey(t item) string {
	gvk := t.mapping.GroupVersionKind
	return gvk.GroupVersion().String() + "/" + gvk.Kind + "/" + t.obj.GetNamespace() + "/" + t.obj.GetName()
}

// sameObject is Helm's match for deletion: group, kind, namespace and name; the version
// does not count.
func sameObject(a, b item) bool {
	return a.obj.GetName() == b.obj.GetName() && a.obj.GetNamespace() == b.obj.GetNamespace() &&
		a.mapping.GroupVersionKind.GroupKind() == b.mapping.GroupVersionKind.GroupKind()
}

// conflicts reads the field manager conflicts out of a 409.
func conflicts(err error) []FieldConflict {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	var out []FieldConflict
	for _, c := range status.Status().Details.Causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict {
			continue
		}
		manager := c.Message
		if _, rest, ok := strings.Cut(c.Message, `conflict with "`); ok {
			manager, _, _ = strings.Cut(rest, `"`)
		}
		out = append(out, FieldConflict{Field: c.Field, Manager: manager})
	}
	return out
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
