package crdbackup

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// restoreObjects restores the objects of one CRD, Concurrency at a time.
func (r *restorer) restoreObjects(ctx context.Context, crd CRD, status bool, rc *RestoredCRD) error {
	f, err := backup.Open(r.dir, crd.Objects.File)
	if err != nil {
		return fmt.Errorf("backup %s: %w", r.dir, err)
	}
	defer func() { _ = f.Close() }() // read only
	start := time.Now()
	var mu sync.Mutex
	var done int64
	progress := func() {
		if r.o.Progress != nil {
			r.o.Progress(Progress{CRD: crd.Name, Done: done, Total: crd.Objects.Count, Elapsed: time.Since(start)})
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.o.Concurrency)
	rerr := backup.ReadObjects(f, func(obj map[string]any) error {
		if err := gctx.Err(); err != nil {
			return err
		}
		g.Go(func() error {
			out, err := r.restoreObject(gctx, crd, status, obj)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			switch out.action {
			case created:
				rc.Created++
			case unchanged:
				rc.Unchanged++
			case overwritten:
				rc.Overwritten++
			case kept:
				rc.Kept = append(rc.Kept, out.subject)
			}
			if out.status {
				rc.StatusRestored++
			}
			if done++; done%DefaultPageSize == 0 {
				progress()
			}
			return nil
		})
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	if rerr != nil {
		return fmt.Errorf("backup %s: %s: %w", r.dir, crd.Objects.File, rerr)
	}
	sort.Strings(rc.Kept)
	progress()
	return nil
}

// objectAction is what restoreObject did with an object (RestoredCRD counts them).
type objectAction int

const (
	created objectAction = iota
	unchanged
	overwritten
	kept
)

type outcome struct {
	action  objectAction
	subject string
	status  bool
}

// restoreObject creates one saved object, or compares it with the one there.
func (r *restorer) restoreObject(ctx context.Context, crd CRD, withStatus bool, obj map[string]any) (outcome, error) {
	u := &unstructured.Unstructured{Object: obj}
	saved := u.GetUID()
	backup.StripServerFields(obj)
	want := u.DeepCopy()
	out := outcome{subject: manifest.SubjectOf(crd.Kind, u.GetNamespace(), u.GetName())}
	refs := u.GetOwnerReferences()
	var outside []metav1.OwnerReference
	for _, ref := range refs {
		if !r.inBackup[ref.UID] {
			outside = append(outside, ref)
		}
	}
	relink := len(outside) < len(refs)
	if relink {
		// The owners in the backup get new UIDs: relink sets them once all are back.
		u.SetOwnerReferences(outside)
	}
	status, hasSavedStatus := obj["status"]
	if withStatus {
		delete(obj, "status") // the API server drops it on create and update
	}
	api := r.c.Dynamic.Resource(crd.gvr()).Namespace(u.GetNamespace())
	live, action, err := r.put(ctx, api, u, want.Object, out.subject)
	if err != nil {
		return out, err
	}
	out.action = action
	r.mu.Lock()
	if saved != "" {
		r.uids[saved] = live.GetUID()
	}
	if relink && out.action != kept {
		r.pending = append(r.pending, owned{crd: crd.Name, gvr: crd.gvr(), ns: u.GetNamespace(), name: u.GetName(), subject: out.subject, refs: refs})
	}
	r.mu.Unlock()
	if withStatus && hasSavedStatus && (out.action == created || out.action == overwritten) {
		if err := restoreStatus(ctx, api, live, status); err != nil {
			return out, fmt.Errorf("%s: restore its status: %w", out.subject, err)
		}
		out.status = true
	}
	return out, nil
}

// put creates u, or reads the object there and compares it with want, the saved object:
// unchanged when they match, kept when they differ, or overwritten with u when the
// options say so. It returns the object on the cluster now.
func (r *restorer) put(ctx context.Context, api dynamic.ResourceInterface, u *unstructured.Unstructured, want map[string]any,
	subject string) (*unstructured.Unstructured, objectAction, error) {
	live, err := api.Create(ctx, u, metav1.CreateOptions{})
	switch {
	case err == nil:
		return live, created, nil
	case !apierrors.IsAlreadyExists(err):
		return nil, 0, fmt.Errorf("%s: create: %w", subject, err)
	}
	if live, err = api.Get(ctx, u.GetName(), metav1.GetOptions{}); err != nil {
		return nil, 0, fmt.Errorf("%s: read: %w", subject, err)
	}
	switch {
	case same(want, live.Object):
		return live, unchanged, nil
	case !r.o.Overwrite:
		return live, kept, nil
	}
	u.SetResourceVersion(live.GetResourceVersion())
	if live, err = api.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		return nil, 0, fmt.Errorf("%s: overwrite: %w", subject, err)
	}
	return live, overwritten, nil
}

// restoreStatus writes status through the status subresource, re-reading the object
// when a controller wrote it in the meantime.
func restoreStatus(ctx context.Context, api dynamic.ResourceInterface, live *unstructured.Unstructured, status any) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			var err error
			if live, err = api.Get(ctx, live.GetName(), metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		live.Object["status"] = runtime.DeepCopyJSONValue(status)
		_, err := api.UpdateStatus(ctx, live, metav1.UpdateOptions{})
		return err
	})
}

// same says whether the object on the cluster is the saved one: everything but the
// fields the API server sets and the ownerReferences (whose UIDs change on restore).
func same(saved, live map[string]any) bool {
	return equality.Semantic.DeepEqual(comparable(saved), comparable(live))
}

func comparable(obj map[string]any) map[string]any {
	c := runtime.DeepCopyJSON(obj)
	backup.StripServerFields(c)
	if md, ok := c["metadata"].(map[string]any); ok {
		delete(md, "ownerReferences")
	}
	return c
}

// relink points the ownerReferences of the restored objects at their owners' new UIDs.
// It returns the count per CRD.
func (r *restorer) relink(ctx context.Context) (map[string]int64, error) {
	counts := map[string]int64{}
	for _, p := range r.pending {
		refs := make([]metav1.OwnerReference, len(p.refs))
		for i, ref := range p.refs {
			if now, ok := r.uids[ref.UID]; ok {
				ref.UID = now
			}
			refs[i] = ref
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": refs}})
		if err != nil {
			return counts, err
		}
		if _, err := r.c.Dynamic.Resource(p.gvr).Namespace(p.ns).Patch(ctx, p.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return counts, fmt.Errorf("%s: point its ownerReferences at the restored owners: %w", p.subject, err)
		}
		counts[p.crd]++
	}
	return counts, nil
}
