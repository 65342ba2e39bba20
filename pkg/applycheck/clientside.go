package applycheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"helm.sh/helm/v4/pkg/kube"
	apiextv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/cli-runtime/pkg/resource"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/value"
)

// predictClientSide models Helm's client-side update of one object (patchResourceClientSide
// and createPatch in helm.sh/helm/v4 pkg/kube/client.go): a create when the object does
// not exist; otherwise the three-way strategic merge patch of the current manifest's
// object, the new one and the live object (a two-way JSON merge patch for custom
// resources), sent as a dry run. An empty patch sends nothing.
func predictClientSide(ctx context.Context, dyn dynamic.Interface, t item, original *item, o Options, createdNS map[string]bool) (Object, error) {
	ri := resourceFor(dyn, t)
	res := Object{Object: t.subject, Step: Apply}
	live, err := ri.Get(ctx, t.obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		res.Step = Create
		_, err = ri.Create(ctx, t.obj, metav1.CreateOptions{FieldManager: o.FieldManager, DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			res.Outcome = Created
		case apierrors.IsNotFound(err) && createdNS[t.obj.GetNamespace()]:
			res.Outcome = Created
			res.Note = "its namespace is created earlier by the same upgrade: the dry run cannot check it"
		case isRBACDenied(err) || apierrors.IsUnauthorized(err) || isUnreachable(err):
			return Object{}, fmt.Errorf("%s: dry-run create: %w", t.subject, err)
		default:
			res.Outcome, res.Error = Failed, err.Error()
		}
		return res, nil
	case err != nil:
		return Object{}, fmt.Errorf("%s: read: %w", t.subject, err)
	}
	base := live
	if original != nil {
		base = original.obj
	}
	patch, patchType, err := createPatch(base, t, live)
	if err != nil {
		res.Outcome, res.Error = Failed, "failed to create patch: "+err.Error()
		return res, nil
	}
	if patch == nil || string(patch) == "{}" {
		res.Outcome = Unchanged
		return res, nil
	}
	got, err := ri.Patch(ctx, t.obj.GetName(), patchType, patch, metav1.PatchOptions{FieldManager: o.FieldManager, DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		res.Outcome = Unchanged
		if changed(live, got) {
			res.Outcome = Updated
		}
		res.Overwrites = lost(foreignFields(live, o.FieldManager), foreignFields(got, o.FieldManager))
	case isRBACDenied(err) || apierrors.IsUnauthorized(err) || isUnreachable(err):
		return Object{}, fmt.Errorf("%s: dry-run patch: %w (the check needs the same rights as the upgrade)", t.subject, err)
	default:
		res.Outcome = Failed
		res.Error = fmt.Sprintf("cannot patch %q with kind %s: %v", t.obj.GetName(), t.mapping.GroupVersionKind.Kind, err)
		res.storedVersionsRejected(err)
	}
	return res, nil
}

// createPatch is Helm's createPatch: built-in kinds get a three-way strategic merge
// patch (original manifest, new manifest, live object); custom resources and
// apiextensions/v1beta1 CRDs a two-way JSON merge patch of the manifests.
func createPatch(original *unstructured.Unstructured, target item, live *unstructured.Unstructured) ([]byte, types.PatchType, error) {
	oldData, err := json.Marshal(original)
	if err != nil {
		return nil, types.StrategicMergePatchType, fmt.Errorf("serializing current configuration: %w", err)
	}
	newData, err := json.Marshal(target.obj)
	if err != nil {
		return nil, types.StrategicMergePatchType, fmt.Errorf("serializing target configuration: %w", err)
	}
	currentData, err := json.Marshal(live)
	if err != nil {
		return nil, types.StrategicMergePatchType, fmt.Errorf("serializing live configuration: %w", err)
	}
	versioned := kube.AsVersioned(&resource.Info{Object: target.obj.DeepCopy(), Mapping: target.mapping})
	_, isUnstructured := versioned.(runtime.Unstructured)
	_, isCRD := versioned.(*apiextv1beta1.CustomResourceDefinition)
	if isUnstructured || isCRD {
		patch, err := jsonpatch.CreateMergePatch(oldData, newData)
		return patch, types.MergePatchType, err
	}
	meta, err := strategicpatch.NewPatchMetaFromStruct(versioned)
	if err != nil {
		return nil, types.StrategicMergePatchType, fmt.Errorf("unable to create patch metadata from object: %w", err)
	}
	patch, err := strategicpatch.CreateThreeWayMergePatch(oldData, newData, currentData, meta, true)
	return patch, types.StrategicMergePatchType, err
}

// originalOf is Helm's originals.Get(target): the current manifest's object with the same
// group, kind, namespace and name (nil for an object the release adopts).
func originalOf(current []item, t item) *item {
	for i := range current {
		if sameObject(current[i], t) {
			return &current[i]
		}
	}
	return nil
}

// isRBACDenied tells the API server's authorization refusal apart from an admission
// denial (a webhook or a ValidatingAdmissionPolicy), which is also a 403 but is the
// upgrade's own failure.
func isRBACDenied(err error) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, `is forbidden: User "`) && !strings.Contains(msg, "admission webhook") && !strings.Contains(msg, "ValidatingAdmissionPolicy")
}

// splitConflicts separates the conflicts with the manager's own client-side (Update)
// entries, which Helm moves to its apply before it applies, from the others.
func splitConflicts(cs []FieldConflict, manager string) (own, foreign []FieldConflict) {
	for _, c := range cs {
		if c.Manager == manager {
			own = append(own, c)
		} else {
			foreign = append(foreign, c)
		}
	}
	return own, foreign
}

// conflictError is the 409 the API server returns when only the foreign conflicts are
// left, worded as the API server words it (getConflictMessage in
// k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go).
func conflictError(err error, foreign []FieldConflict) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return err
	}
	var causes []metav1.StatusCause
	byManager := map[string][]string{}
	for _, c := range status.Status().Details.Causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict || !slices.ContainsFunc(foreign, func(f FieldConflict) bool {
			return f.Field == c.Field && strings.Contains(c.Message, `"`+f.Manager+`"`)
		}) {
			continue
		}
		causes = append(causes, c)
		who := strings.TrimPrefix(c.Message, "conflict with ")
		byManager[who] = append(byManager[who], c.Field)
	}
	msg := ""
	if len(causes) == 1 {
		msg = fmt.Sprintf("Apply failed with 1 conflict: %s: %s", causes[0].Message, causes[0].Field)
	} else {
		var parts []string
		for _, who := range slices.Sorted(maps.Keys(byManager)) {
			parts = append(parts, "conflicts with "+who+":")
			for _, f := range byManager[who] {
				parts = append(parts, "- "+f)
			}
		}
		msg = fmt.Sprintf("Apply failed with %d conflicts: %s", len(causes), strings.Join(parts, "\n"))
	}
	return apierrors.NewApplyConflict(causes, msg)
}

// ownUpdateFields lists the leaf fields the manager's client-side (Update) entries own
// on the main resource: what csaupgrade.UpgradeManagedFields, which Helm calls, moves to
// the manager's server-side apply.
func ownUpdateFields(obj *unstructured.Unstructured, manager string) []string {
	var out []string
	for _, mf := range obj.GetManagedFields() {
		if mf.Manager != manager || mf.Operation != metav1.ManagedFieldsOperationUpdate || mf.Subresource != "" {
			continue
		}
		out = append(out, leaves(mf)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func leaves(mf metav1.ManagedFieldsEntry) []string {
	if mf.FieldsV1 == nil {
		return nil
	}
	set := &fieldpath.Set{}
	if err := set.FromJSON(mf.FieldsV1.GetRawReader()); err != nil {
		return nil
	}
	var out []string
	set.Leaves().Iterate(func(p fieldpath.Path) { out = append(out, p.String()) })
	return out
}

// foreignFields lists the leaf fields of an object that managers other than manager own
// (the main resource only, not /status), in field path order.
func foreignFields(obj *unstructured.Unstructured, manager string) []FieldConflict {
	var out []FieldConflict
	for _, mf := range obj.GetManagedFields() {
		if mf.Manager == manager || mf.Subresource != "" {
			continue
		}
		for _, f := range leaves(mf) {
			out = append(out, FieldConflict{Field: f, Manager: mf.Manager})
		}
	}
	slices.SortFunc(out, func(a, b FieldConflict) int { return strings.Compare(a.Field+a.Manager, b.Field+b.Manager) })
	return out
}

// lost lists the fields in before that are not in after.
func lost(before, after []FieldConflict) []FieldConflict {
	var out []FieldConflict
	for _, f := range before {
		if !slices.Contains(after, f) {
			out = append(out, f)
		}
	}
	return out
}

// unreverted keeps the foreign fields that the revision a rollback starts from sets and
// its target does not: a revert would remove them, a server-side apply leaves them.
func unreverted(foreign []FieldConflict, from *item, target item) []FieldConflict {
	if from == nil || len(foreign) == 0 {
		return nil
	}
	had := fieldpath.SetFromValue(value.NewValueInterface(from.obj.Object))
	has := fieldpath.SetFromValue(value.NewValueInterface(target.obj.Object))
	paths := func(s *fieldpath.Set) map[string]bool {
		out := map[string]bool{}
		s.Iterate(func(p fieldpath.Path) { out[p.String()] = true })
		return out
	}
	before, after := paths(had), paths(has)
	var out []FieldConflict
	for _, f := range foreign {
		if before[f.Field] && !after[f.Field] {
			out = append(out, f)
		}
	}
	return out
}
