// Package releasediff owns telling what a failed Helm upgrade left behind. Helm 4 applies
// a release's objects one by one and stops at the first error, so a failed revision is
// often half-applied: some objects carry the failed revision, others the previous one.
// Run compares every object of the failed revision (and of the previous one) with the
// live object and says which revision it matches, and Report.NextSteps what to do about
// a release it finds half-applied.
//
// The comparison is the one the API server itself would make. For each revision, the
// rendered object is server-side applied with dryRun=All, forced, as a field manager that
// owns nothing ("upgradeguard-diff"). Such an apply only sets the fields the manifest
// sets, after the server's defaulting and normalisation (quantities, stringData, list
// keys), and removes nothing. If the result equals the live object, every field the
// revision sets already has that value: the live object matches the revision. Status,
// managedFields, resourceVersion and generation are left out. It writes nothing.
package releasediff

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	release "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/redact"
)

// FieldManager is the field manager of the dry runs. It must own no field of any object,
// so that its apply never removes one.
const FieldManager = "upgradeguard-diff"

// Verdict says which revision a live object matches.
type Verdict string

const (
	// Failed means the live object matches the failed revision, which differs from the
	// previous one here. The failed upgrade landed on this object.
	Failed Verdict = "failed"
	// Previous means the live object still matches the previous revision.
	Previous Verdict = "previous"
	// Unchanged means both revisions render the object alike and the live object matches it.
	Unchanged Verdict = "unchanged"
	// Neither means the live object matches no revision (another writer, or a drift).
	Neither Verdict = "neither"
	// Missing means there is no live object.
	Missing Verdict = "missing"
	// Unknown means the API server rejected the comparison (see Error).
	Unknown Verdict = "unknown"
)

// Change says how the failed revision changed an object against the previous one.
type Change string

// Changes.
const (
	Same    Change = "same"
	Changed Change = "changed"
	Added   Change = "added"   // only in the failed revision
	Dropped Change = "dropped" // only in the previous revision: a successful upgrade deletes it
)

// Object is the verdict for one object.
type Object struct {
	Object  string  `json:"object"` // Kind/namespace/name
	Change  Change  `json:"change"`
	Verdict Verdict `json:"verdict"`
	// Landed says whether the failed revision's change is what the cluster holds, for
	// changed, added and dropped objects; nil when there is nothing to land or it matches
	// neither revision.
	Landed *bool `json:"landed,omitempty"`
	// Differs names the fields (never their values) where the live object differs from
	// the failed revision, or from the previous one for dropped objects.
	Differs []string `json:"differs,omitempty"`
	Error   string   `json:"error,omitempty"`
	// Rejected lists, for a CRD, the stored versions the failed revision drops from
	// spec.versions: the API server refuses that revision's CRD until a storage
	// migration removes them from status.storedVersions, so its change cannot land.
	Rejected []crdversions.StoredVersionRejection `json:"storedVersionsRejected,omitempty"`
}

// Report is the state a failed revision left.
type Report struct {
	Release          string   `json:"release"`
	Namespace        string   `json:"namespace"`
	FailedRevision   int      `json:"failedRevision"`
	FailedStatus     string   `json:"failedStatus"`
	PreviousRevision int      `json:"previousRevision"`
	Objects          []Object `json:"objects"`
	// Landed and NotLanded list the changed objects on each side.
	Landed    []string `json:"landed"`
	NotLanded []string `json:"notLanded"`
	// Drifted lists objects that match neither revision, are missing although both
	// revisions have them, or could not be compared.
	Drifted []string `json:"drifted"`
	// Mixed: some of the failed revision's changes landed and others did not.
	Mixed bool `json:"mixed"`
	// StoredVersionsRejected lists the storedVersions rejections that failed the
	// revision (read from its description, as Helm recorded the API server's error) or
	// that the API server answers now for its CRDs. Either of the API server's wordings
	// (up to 1.32, or from 1.33) is recognised.
	StoredVersionsRejected []crdversions.StoredVersionRejection `json:"storedVersionsRejected"`
}

// Clean says that the release is wholly at one revision: not mixed and nothing drifted.
func (r *Report) Clean() bool { return !r.Mixed && len(r.Drifted) == 0 }

// Check IDs of the findings of a failed revision (FindingReport).
const (
	// CheckHalfApplied: some changes of the failed revision landed and others did not.
	CheckHalfApplied = "half-applied"
	// CheckDrifted: an object matches neither revision, is missing, or could not be
	// compared.
	CheckDrifted = "drifted"
	// CheckStoredVersionsRejected: the API server refuses the failed revision's CRD because
	// it drops a version status.storedVersions still lists (StoredVersionsRunbook).
	CheckStoredVersionsRejected = "storedversions-rejected"
)

// FindingReport is the state as CI reads it: one case, the release, with a finding for a
// half-applied release, one per object that drifted, and one per storedVersions
// rejection. Each is a danger while the release is not wholly at one revision (Clean);
// a rejection of a release that is clean is a warning: the next upgrade meets it again.
func (r *Report) FindingReport() finding.Report {
	subject := manifest.SubjectOf("Release", r.Namespace, r.Release)
	fix := map[NextAction]string{}
	var all []string
	for _, n := range r.NextSteps() {
		fix[n.Action] = n.Advice()
		all = append(all, n.Advice())
	}
	c := finding.Case{Name: subject}
	if r.Mixed {
		c.Findings = append(c.Findings, finding.Finding{Check: CheckHalfApplied, Subject: subject, Severity: finding.Danger,
			Message: fmt.Sprintf("revision %d is half-applied: %d change(s) landed and %d did not (%s)", r.FailedRevision, len(r.Landed),
				len(r.NotLanded), strings.Join(r.NotLanded, ", ")),
			Remediation: strings.Join(all, "; and ")})
	}
	for _, o := range r.Objects {
		if !slices.Contains(r.Drifted, o.Object) {
			continue
		}
		msg := fmt.Sprintf("the live object matches neither revision %d nor %d", r.FailedRevision, r.PreviousRevision)
		switch {
		case o.Error != "":
			msg = "it could not be compared: " + o.Error
		case o.Verdict == Missing:
			msg = "there is no live object, although the revisions have it"
		case len(o.Differs) > 0:
			msg += ": " + strings.Join(o.Differs, ", ")
		}
		c.Findings = append(c.Findings, finding.Finding{Check: CheckDrifted, Subject: o.Object, Severity: finding.Danger, Message: msg,
			Remediation: fix[SettleFieldOwners]})
	}
	sev := finding.Danger
	if r.Clean() {
		sev = finding.Warning
	}
	for _, rej := range r.StoredVersionsRejected {
		crd := subject
		if rej.CRD != "" {
			crd = manifest.SubjectOf("CustomResourceDefinition", "", rej.CRD)
		}
		c.Findings = append(c.Findings, finding.Finding{Check: CheckStoredVersionsRejected, Subject: crd, Severity: sev,
			Message: fmt.Sprintf("the API server refuses revision %d's CRD: %s", r.FailedRevision, rej), Remediation: fix[MigrateStoredVersions]})
	}
	return finding.Report{Tool: "diff-failed", Cases: []finding.Case{c}}
}

// NextAction is a step that brings a half-applied release back to one revision.
type NextAction string

const (
	// MigrateStoredVersions means the API server refuses the failed revision's CRDs until the
	// objects stored at the versions they drop are migrated off them; then the upgrade is
	// retried. The step's Command is the check that names the migrate commands.
	MigrateStoredVersions NextAction = "migrate-stored-versions"
	// SettleFieldOwners means changes did not land, or objects match neither revision. Find
	// who owns the fields that did not land (a release apply-check), then re-run the
	// upgrade or roll back: either finishes the half-applied objects.
	SettleFieldOwners NextAction = "settle-field-owners"
)

// StoredVersionsRunbook is the runbook of MigrateStoredVersions.
const StoredVersionsRunbook = "storedversions-rejected"

// NextStep is one step to take.
type NextStep struct {
	Action NextAction `json:"action"`
	// Command is the command that starts the step, when one does.
	Command string `json:"command,omitempty"`
	// Runbook names the runbook of the step, when there is one.
	Runbook string `json:"runbook,omitempty"`
}

// Advice says the step to a person: what to do, and the command that starts it.
func (n NextStep) Advice() string {
	switch n.Action {
	case MigrateStoredVersions:
		return fmt.Sprintf("migrate those objects off the dropped versions, then retry: `%s` names the migrate commands (runbook: %s)", n.Command, n.Runbook)
	case SettleFieldOwners:
		return fmt.Sprintf("find who owns the fields that did not land (`%s`), then re-run the upgrade or roll back; both finish the half-applied objects", cmdline.ApplyCheck{})
	}
	return string(n.Action)
}

// NextSteps are what to do about the release, in order; none when it is Clean. A
// storedVersions rejection comes first; when it is all that keeps the release
// half-applied (every change that did not land is a rejected CRD, and nothing
// drifted), it is the only step.
func (r *Report) NextSteps() []NextStep {
	var next []NextStep
	if len(r.StoredVersionsRejected) > 0 {
		check := cmdline.Check{Release: r.Release, Namespace: r.Namespace,
			Chart: fmt.Sprintf("<the chart of revision %d>", r.FailedRevision)}
		next = append(next, NextStep{Action: MigrateStoredVersions, Command: check.String(), Runbook: StoredVersionsRunbook})
		if r.onlyRejected() {
			return next
		}
	}
	if !r.Clean() {
		next = append(next, NextStep{Action: SettleFieldOwners})
	}
	return next
}

// onlyRejected says that every change that did not land is a CRD the API server refuses
// on storedVersions, and nothing drifted.
func (r *Report) onlyRejected() bool {
	if len(r.Drifted) > 0 {
		return false
	}
	rejected := map[string]bool{}
	for _, o := range r.Objects {
		if len(o.Rejected) > 0 {
			rejected[o.Object] = true
		}
	}
	for _, o := range r.NotLanded {
		if !rejected[o] {
			return false
		}
	}
	return true
}

// Options for Run.
type Options struct {
	// Namespace is the release namespace, for namespaced objects that name none.
	Namespace string
	// Redact lists more strings to keep out of the report and its errors. The values of
	// both revisions and the data of the Secrets they render are always kept out: the API
	// server echoes the values it rejects.
	Redact []string
}

// Run compares the objects of failed and previous with the live cluster. previous may be
// nil (a failed install): then every object is "added".
func Run(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, failed, previous *release.Release, o Options) (*Report, error) {
	red := redactor(failed, previous, o.Redact)
	rep, err := run(ctx, dyn, mapper, failed, previous, o)
	if err != nil {
		return nil, red.Error(err)
	}
	for i := range rep.Objects {
		rep.Objects[i].Error = red.String(rep.Objects[i].Error)
		redactRejections(red, rep.Objects[i].Rejected)
	}
	redactRejections(red, rep.StoredVersionsRejected)
	return rep, nil
}

func redactRejections(red *redact.Redactor, rs []crdversions.StoredVersionRejection) {
	for i := range rs {
		rs[i].Message = red.String(rs[i].Message)
	}
}

// redactor hides the values of both revisions, the data of their Secrets and extra.
func redactor(failed, previous *release.Release, extra []string) *redact.Redactor {
	red := redact.New(extra...)
	for _, r := range []*release.Release{failed, previous} {
		if r != nil {
			red.AddValues(r.Config)
			red.AddManifest(r.Manifest)
		}
	}
	return red
}

func run(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, failed, previous *release.Release, o Options) (*Report, error) {
	rep := &Report{Release: failed.Name, Namespace: o.Namespace, FailedRevision: failed.Version,
		Objects: []Object{}, Landed: []string{}, NotLanded: []string{}, Drifted: []string{},
		StoredVersionsRejected: []crdversions.StoredVersionRejection{}}
	if failed.Info != nil {
		rep.FailedStatus = failed.Info.Status.String()
		rep.rejected(crdversions.StoredVersionRejections(failed.Info.Description))
	}
	failedObjs, err := manifest.All(failed.Manifest)
	if err != nil {
		return nil, fmt.Errorf("revision %d: %w", failed.Version, err)
	}
	prevObjs := map[string]*unstructured.Unstructured{}
	var prevOrder []string
	if previous != nil {
		rep.PreviousRevision = previous.Version
		objs, err := manifest.All(previous.Manifest)
		if err != nil {
			return nil, fmt.Errorf("revision %d: %w", previous.Version, err)
		}
		for _, obj := range objs {
			key, err := resolve(mapper, obj, o.Namespace)
			if err == nil {
				prevObjs[key] = obj
				prevOrder = append(prevOrder, key)
			}
		}
	}
	seen := map[string]bool{}
	for _, obj := range failedObjs {
		res, err := compare(ctx, dyn, mapper, obj, prevObjs, o.Namespace)
		if err != nil {
			return nil, err
		}
		seen[res.Object] = true
		rep.add(res)
	}
	for _, key := range prevOrder {
		if seen[key] {
			continue
		}
		res, err := compareDropped(ctx, dyn, mapper, prevObjs[key], o.Namespace)
		if err != nil {
			return nil, err
		}
		rep.add(res)
	}
	rep.Mixed = len(rep.Landed) > 0 && len(rep.NotLanded) > 0
	return rep, nil
}

// rejected adds storedVersions rejections the report does not hold yet.
func (r *Report) rejected(rs []crdversions.StoredVersionRejection) {
	for _, x := range rs {
		if !slices.ContainsFunc(r.StoredVersionsRejected, func(y crdversions.StoredVersionRejection) bool {
			return y.Version == x.Version && (y.CRD == x.CRD || y.CRD == "")
		}) {
			r.StoredVersionsRejected = append(r.StoredVersionsRejected, x)
		}
	}
}

func (r *Report) add(res Object) {
	r.Objects = append(r.Objects, res)
	r.rejected(res.Rejected)
	switch {
	case res.Landed != nil && *res.Landed:
		r.Landed = append(r.Landed, res.Object)
	case res.Landed != nil:
		r.NotLanded = append(r.NotLanded, res.Object)
	case res.Verdict == Neither, res.Verdict == Unknown, res.Verdict == Missing:
		r.Drifted = append(r.Drifted, res.Object)
	}
}

// resolve sets the release namespace on namespaced objects that name none and returns
// the object's subject.
func resolve(mapper meta.RESTMapper, obj *unstructured.Unstructured, ns string) (string, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return manifest.Subject(obj), err
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace && obj.GetNamespace() == "" {
		obj.SetNamespace(ns)
	}
	return manifest.Subject(obj), nil
}

// client returns the resource client of an object, or nil when the cluster does not
// serve its type.
func client(dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	return dyn.Resource(mapping.Resource)
}

func landed(b bool) *bool { return &b }

func compare(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured, prevObjs map[string]*unstructured.Unstructured, ns string) (Object, error) {
	key, err := resolve(mapper, obj, ns)
	res := Object{Object: key, Change: Added}
	prev := prevObjs[key]
	if prev != nil {
		res.Change = Changed
		if reflect.DeepEqual(prev.Object, obj.Object) {
			res.Change = Same
		}
	}
	if err != nil {
		if res.Change == Added {
			res.Verdict, res.Landed = Missing, landed(false)
			return res, nil
		}
		res.Verdict, res.Error = Missing, fmt.Sprintf("the cluster does not serve %s", obj.GroupVersionKind())
		return res, nil
	}
	ri := client(dyn, mapper, obj)
	live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		res.Verdict = Missing
		if res.Change != Same {
			res.Landed = landed(false)
		}
		return res, nil
	case err != nil:
		return Object{}, fmt.Errorf("%s: read the live object: %w", key, err)
	}
	failedDiff, err := matches(ctx, ri, live, obj)
	if err != nil {
		if !crdversions.IsStoredVersionRejection(err) {
			return unknown(res, err)
		}
		return rejected(ctx, ri, live, res, prev, err)
	}
	if res.Change == Same {
		res.Verdict, res.Differs = Unchanged, failedDiff
		if len(failedDiff) > 0 {
			res.Verdict = Neither
		}
		return res, nil
	}
	var prevDiff []string
	if prev != nil {
		if prevDiff, err = matches(ctx, ri, live, prev); err != nil {
			return unknown(res, err)
		}
	}
	switch {
	case prev != nil && len(prevDiff) == 0 && len(failedDiff) == 0 && len(removed(prev.Object, obj.Object)) == 0:
		// The server reads both revisions alike here (a default written out, say).
		res.Verdict = Unchanged
	case prev != nil && len(prevDiff) == 0:
		// Also when the failed revision's fields match: it only removes fields, and
		// they are still set, so the previous revision is what is live.
		res.Verdict, res.Landed, res.Differs = Previous, landed(false), failedDiff
	case len(failedDiff) == 0:
		res.Verdict, res.Landed = Failed, landed(true)
	default:
		res.Verdict, res.Differs = Neither, failedDiff
	}
	return res, nil
}

func compareDropped(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, prev *unstructured.Unstructured, ns string) (Object, error) {
	key, _ := resolve(mapper, prev, ns)
	res := Object{Object: key, Change: Dropped}
	ri := client(dyn, mapper, prev)
	if ri == nil {
		res.Verdict, res.Landed = Missing, landed(true)
		return res, nil
	}
	live, err := ri.Get(ctx, prev.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		res.Verdict, res.Landed = Missing, landed(true)
		return res, nil
	case err != nil:
		return Object{}, fmt.Errorf("%s: read the live object: %w", key, err)
	}
	diff, err := matches(ctx, ri, live, prev)
	if err != nil {
		return unknown(res, err)
	}
	res.Verdict, res.Landed, res.Differs = Previous, landed(false), diff
	if len(diff) > 0 {
		res.Verdict, res.Landed = Neither, nil
	}
	return res, nil
}

// rejected judges a CRD whose failed revision the API server refuses because it drops a
// stored version: that revision's change cannot have landed. The live CRD is then at the
// previous revision, or at neither.
func rejected(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured, res Object, prev *unstructured.Unstructured, err error) (Object, error) {
	res.Rejected = crdversions.StoredVersionRejections(err.Error())
	res.Verdict = Neither
	if prev == nil || res.Change == Same {
		return res, nil
	}
	prevDiff, perr := matches(ctx, ri, live, prev)
	switch {
	case perr != nil:
		res.Error = perr.Error()
	case len(prevDiff) == 0:
		res.Verdict, res.Landed = Previous, landed(false)
	}
	return res, nil
}

func unknown(res Object, err error) (Object, error) {
	if apierrors.IsForbidden(err) && !strings.Contains(err.Error(), "admission webhook") {
		return Object{}, fmt.Errorf("%s: dry-run apply: %w (diff-failed needs patch permission on the release's objects; it only dry-runs)", res.Object, err)
	}
	res.Verdict, res.Landed, res.Error = Unknown, nil, err.Error()
	return res, nil
}

// matches dry-runs the rendered object over the live one and returns the fields the
// apply would change: none means the live object already holds every field it sets.
func matches(ctx context.Context, ri dynamic.ResourceInterface, live, rendered *unstructured.Unstructured) ([]string, error) {
	obj := rendered.DeepCopy()
	unstructured.RemoveNestedField(obj.Object, "status")
	applied, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true, DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return nil, err
	}
	return Diff(comparable(live), comparable(applied)), nil
}

func comparable(obj *unstructured.Unstructured) map[string]any {
	o := obj.DeepCopy().Object
	for _, f := range [][]string{{"status"}, {"metadata", "managedFields"}, {"metadata", "resourceVersion"}, {"metadata", "generation"}} {
		unstructured.RemoveNestedField(o, f...)
	}
	return o
}

// Diff returns the paths where a and b differ, sorted. List items that all carry a
// "name" are matched by name, as Kubernetes merges containers, ports and env.
func Diff(a, b map[string]any) []string {
	var out []string
	diffValue("", a, b, false, &out)
	slices.Sort(out)
	return slices.Compact(out)
}

// removed returns the paths a sets and b does not.
func removed(a, b map[string]any) []string {
	var out []string
	diffValue("", a, b, true, &out)
	return out
}

func diffValue(path string, a, b any, onlyRemoved bool, out *[]string) {
	record := func() {
		if !onlyRemoved || (b == nil && a != nil) {
			*out = append(*out, orRoot(path))
		}
	}
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			record()
			return
		}
		keys := slices.Sorted(maps.Keys(av))
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			diffValue(path+"."+k, av[k], bv[k], onlyRemoved, out)
		}
	case []any:
		bv, ok := b.([]any)
		if !ok {
			record()
			return
		}
		an, bn := byName(av), byName(bv)
		if an != nil && bn != nil {
			names := slices.Sorted(maps.Keys(an))
			for n := range bn {
				if _, ok := an[n]; !ok {
					names = append(names, n)
				}
			}
			for _, n := range names {
				diffValue(fmt.Sprintf("%s[name=%s]", path, strconv.Quote(n)), an[n], bn[n], onlyRemoved, out)
			}
			return
		}
		if len(av) != len(bv) {
			record()
			return
		}
		for i := range av {
			diffValue(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i], onlyRemoved, out)
		}
	default:
		if !reflect.DeepEqual(a, b) {
			record()
		}
	}
}

func byName(items []any) map[string]any {
	if len(items) == 0 {
		return nil
	}
	out := make(map[string]any, len(items))
	for _, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			return nil
		}
		n, ok := m["name"].(string)
		if !ok {
			return nil
		}
		out[n] = m
	}
	if len(out) != len(items) {
		return nil
	}
	return out
}

func orRoot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// PairReader reads a release's failed revision (revision, or the last one when 0) and the
// revision before it from Helm storage; helmrelease.Reader is one.
type PairReader interface {
	FailedPair(ctx context.Context, name string, revision int) (failed, previous *release.Release, err error)
}

// RunRelease reads release name's failed revision and the one before it, then Run.
func RunRelease(ctx context.Context, releases PairReader, dyn dynamic.Interface, mapper meta.RESTMapper, name string, revision int, o Options) (*Report, error) {
	failed, previous, err := releases.FailedPair(ctx, name, revision)
	if err != nil {
		return nil, err
	}
	return Run(ctx, dyn, mapper, failed, previous, o)
}
