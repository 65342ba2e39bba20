package migrate

import (
	"context"
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
)

// cleanManagedFields drops managedFields entries that name a version the CRD no longer
// serves: once a version is gone, such entries break later server-side applies
// (kubernetes/kubernetes#111937). The patch carries the resourceVersion as a
// precondition, so a concurrent writer wins and nothing is lost.
func (w *worker) cleanManagedFields(ctx context.Context, ri metadata.ResourceInterface, obj *metav1.PartialObjectMetadata, served map[string]bool) {
	keep := make([]metav1.ManagedFieldsEntry, 0, len(obj.ManagedFields))
	for _, e := range obj.ManagedFields {
		if served[e.APIVersion] {
			keep = append(keep, e)
		}
	}
	if len(keep) == len(obj.ManagedFields) || len(keep) == 0 {
		return // nothing to drop, or dropping would reset ownership altogether
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"managedFields": keep, "resourceVersion": obj.ResourceVersion}})
	if err != nil {
		return
	}
	if _, err := ri.Patch(ctx, obj.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
		w.cleaned.Add(1)
	}
}
