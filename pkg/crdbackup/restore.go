package crdbackup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// CRDs restores only these CRDs of the backup; every one when empty.
	CRDs []string
	// Overwrite replaces the objects that exist and differ from the backup. Without it
	// they are left as they are and reported (RestoredCRD.Kept).
	Overwrite bool
	// Concurrency bounds the writes in flight (DefaultConcurrency when 0).
	Concurrency int
	// EstablishTimeout bounds the wait for a CRD to be Established and to serve its
	// objects' version (DefaultEstablishTimeout when 0).
	EstablishTimeout time.Duration
	// Progress, when set, is called every few hundred objects and after each CRD.
	Progress func(Progress)
}

// Action is what Restore did with a CRD.
type Action string

const (
	// Created means the CRD was absent and is created from the backup.
	Created Action = "created"
	// Existed means the CRD was on the cluster; it is left as it is and the objects are
	// restored into it.
	Existed Action = "existed"
)

// RestoreResult is what Restore did, per CRD.
type RestoreResult struct {
	Dir  string        `json:"dir"`
	CRDs []RestoredCRD `json:"crds"`
}

// Complete says whether every object of the backup is now on the cluster as the backup
// holds it: none was kept in another state.
func (r *RestoreResult) Complete() bool {
	for _, c := range r.CRDs {
		if len(c.Kept) > 0 {
			return false
		}
	}
	return true
}

// RestoredCRD is one CRD's restore.
type RestoredCRD struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Version string `json:"version"`
	// CRD is Created, or Existed.
	CRD Action `json:"crd"`
	// Objects is how many objects the backup holds; each one is counted once below.
	Objects int64 `json:"objects"`
	Created int64 `json:"created"`
	// Unchanged objects were already on the cluster as the backup holds them.
	Unchanged int64 `json:"unchanged"`
	// Overwritten objects existed, differed, and were replaced (RestoreOptions.Overwrite).
	Overwritten int64 `json:"overwritten"`
	// Kept are the objects that exist and differ from the backup, left as they are, by
	// subject (Kind/namespace/name).
	Kept []string `json:"kept"`
	// StatusRestored counts the objects whose status was written back through the
	// status subresource.
	StatusRestored int64 `json:"statusRestored"`
	// OwnersRelinked counts the objects whose ownerReferences to other objects of the
	// backup were pointed at those objects' new UIDs.
	OwnersRelinked int64 `json:"ownersRelinked"`
}

// CorruptError says a file of a backup does not match its index: the backup was cut
// short or altered after it was written.
type CorruptError struct {
	Dir, File, Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("backup %s is damaged: %s %s; nothing was restored: restore from an intact copy, or take the backup again", e.Dir, e.File, e.Reason)
}

// MissingNamespacesError says namespaces the backup's objects live in do not exist.
// Restore creates no namespace: one that is missing may be missing on purpose.
type MissingNamespacesError struct{ Names []string }

func (e *MissingNamespacesError) Error() string {
	return fmt.Sprintf("the backup's objects live in namespaces that do not exist: %s; nothing was restored: create them first (kubectl create namespace NAME)", strings.Join(e.Names, ", "))
}

// Restore brings back the CRDs of the backup in dir and every object of theirs:
//
//   - the backup is checked first, whole: an index must be there (backup.IncompleteError
//     otherwise), each object stream must match its count and SHA-256 (CorruptError), and
//     every namespace the objects live in must exist (MissingNamespacesError), all
//     before anything is created;
//   - a CRD that is absent is created, one that exists is left as it is (Existed), and
//     Restore waits until it is Established and serves the objects' version;
//   - each object is created at the version it was saved at, without the fields the
//     API server sets; when that version has a status subresource, the saved status is
//     written through it. An object that exists is Unchanged when it matches the backup
//     and Kept otherwise, unless Overwrite replaces it;
//   - ownerReferences to other objects of the backup are pointed at their new UIDs once
//     every object is back (references to objects outside the backup are kept).
//
// Running it again after a failure resumes: what it restored before is Unchanged.
func Restore(ctx context.Context, c *Clients, dir string, o RestoreOptions) (*RestoreResult, error) {
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.EstablishTimeout <= 0 {
		o.EstablishTimeout = DefaultEstablishTimeout
	}
	var idx Index
	if err := backup.Read(dir, backup.KindCRD, &idx); err != nil {
		return nil, err
	}
	crds, err := selectCRDs(idx.CRDs, o.CRDs, dir)
	if err != nil {
		return nil, err
	}
	r := &restorer{c: c, dir: dir, o: o, inBackup: map[types.UID]bool{}, uids: map[types.UID]types.UID{}}
	namespaces := map[string]bool{}
	for _, crd := range crds {
		if err := r.verify(crd, namespaces); err != nil {
			return nil, err
		}
	}
	if err := r.checkNamespaces(ctx, namespaces); err != nil {
		return nil, err
	}
	res := &RestoreResult{Dir: dir, CRDs: []RestoredCRD{}}
	for _, crd := range crds {
		rc, err := r.restoreCRD(ctx, crd)
		res.CRDs = append(res.CRDs, *rc)
		if err != nil {
			return res, err
		}
	}
	relinked, err := r.relink(ctx)
	for i := range res.CRDs {
		res.CRDs[i].OwnersRelinked = relinked[res.CRDs[i].Name]
	}
	return res, err
}

// selectCRDs picks the CRDs of the backup to restore.
func selectCRDs(all []CRD, only []string, dir string) ([]CRD, error) {
	if len(only) == 0 {
		return all, nil
	}
	var out []CRD
	for _, name := range only {
		i := slices.IndexFunc(all, func(c CRD) bool { return c.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("the backup in %s holds no CustomResourceDefinition %s (it holds %s)", dir, name, names(all))
		}
		if !slices.ContainsFunc(out, func(c CRD) bool { return c.Name == name }) {
			out = append(out, all[i])
		}
	}
	return out, nil
}

type restorer struct {
	c   *Clients
	dir string
	o   RestoreOptions
	// inBackup are the UIDs the objects had when they were saved.
	inBackup map[types.UID]bool

	mu sync.Mutex
	// uids maps a saved object's UID to the UID it has now.
	uids map[types.UID]types.UID
	// pending are the objects whose ownerReferences name objects of the backup.
	pending []owned
}

// owned is an object to relink once every object is back.
type owned struct {
	crd     string
	gvr     schema.GroupVersionResource
	ns      string
	name    string
	subject string
	refs    []metav1.OwnerReference
}

// verify reads a CRD's files whole and checks them against the index; it collects the
// namespaces and UIDs the objects had.
func (r *restorer) verify(crd CRD, namespaces map[string]bool) error {
	corrupt := func(file, format string, args ...any) error {
		return &CorruptError{Dir: r.dir, File: file, Reason: fmt.Sprintf(format, args...)}
	}
	def, err := backup.ReadYAML(r.dir, crd.File)
	if err != nil {
		return corrupt(crd.File, "cannot be read (%v)", err)
	}
	if u := (unstructured.Unstructured{Object: def}); u.GetKind() != "CustomResourceDefinition" || u.GetName() != crd.Name {
		return corrupt(crd.File, "is not CustomResourceDefinition %s", crd.Name)
	}
	f, err := backup.Open(r.dir, crd.Objects.File)
	if err != nil {
		return corrupt(crd.Objects.File, "cannot be read (%v)", err)
	}
	defer func() { _ = f.Close() }() // read only
	// The whole file is hashed, even past a document that does not read: a file cut
	// short or altered is named as such first.
	h := sha256.New()
	in := io.TeeReader(f, h)
	var n int64
	var bad error
	err = backup.ReadObjects(in, func(obj map[string]any) error {
		n++
		u := unstructured.Unstructured{Object: obj}
		if u.GetKind() != crd.Kind || u.GetName() == "" || (u.GetNamespace() != "") != crd.Namespaced {
			if bad == nil {
				bad = fmt.Errorf("object %d is not a %s", n, crd.Kind)
			}
			return nil
		}
		if crd.Namespaced {
			namespaces[u.GetNamespace()] = true
		}
		if uid := u.GetUID(); uid != "" {
			r.inBackup[uid] = true
		}
		return nil
	})
	if _, cerr := io.Copy(io.Discard, in); cerr != nil {
		return corrupt(crd.Objects.File, "cannot be read (%v)", cerr)
	}
	if err == nil {
		err = bad
	}
	switch {
	case hex.EncodeToString(h.Sum(nil)) != crd.Objects.SHA256:
		return corrupt(crd.Objects.File, "does not match its SHA-256 in the index (it was cut short or altered after the backup)")
	case err != nil:
		return corrupt(crd.Objects.File, "cannot be read (%v)", err)
	case n != crd.Objects.Count:
		return corrupt(crd.Objects.File, "holds %d object(s) where the index says %d", n, crd.Objects.Count)
	}
	return nil
}

var namespaceResource = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// checkNamespaces fails when a namespace the objects live in does not exist.
func (r *restorer) checkNamespaces(ctx context.Context, namespaces map[string]bool) error {
	var missing []string
	for ns := range namespaces {
		_, err := r.c.Dynamic.Resource(namespaceResource).Get(ctx, ns, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, ns)
		case err != nil:
			return fmt.Errorf("read namespace %s: %w", ns, err)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return &MissingNamespacesError{Names: missing}
	}
	return nil
}

// restoreCRD creates the CRD when it is absent, waits until it serves the objects'
// version, and restores the objects.
func (r *restorer) restoreCRD(ctx context.Context, crd CRD) (*RestoredCRD, error) {
	rc := &RestoredCRD{Name: crd.Name, Kind: crd.Kind, Version: crd.Version, Objects: crd.Objects.Count, Kept: []string{}}
	api := r.c.Dynamic.Resource(crdResource)
	live, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		def, err := backup.ReadYAML(r.dir, crd.File)
		if err != nil {
			return rc, err
		}
		_, err = api.Create(ctx, &unstructured.Unstructured{Object: cleanCRD(def)}, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
			rc.CRD = Existed
		case err != nil:
			return rc, fmt.Errorf("CustomResourceDefinition %s: create: %w", crd.Name, err)
		default:
			rc.CRD = Created
		}
	case err != nil:
		return rc, fmt.Errorf("CustomResourceDefinition %s: read: %w", crd.Name, err)
	case live.GetDeletionTimestamp() != nil:
		return rc, fmt.Errorf("CustomResourceDefinition %s is being deleted, with its objects: wait until it is gone (kubectl wait --for=delete crd/%s), then restore again", crd.Name, crd.Name)
	default:
		rc.CRD = Existed
	}
	status, err := r.waitServed(ctx, crd)
	if err != nil {
		return rc, err
	}
	return rc, r.restoreObjects(ctx, crd, status, rc)
}

// waitServed waits until the CRD is Established and answers at the objects' version, and
// says whether that version has a status subresource.
func (r *restorer) waitServed(ctx context.Context, crd CRD) (bool, error) {
	var status bool
	var why string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, r.o.EstablishTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := r.c.Dynamic.Resource(crdResource).Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("CustomResourceDefinition %s: read: %w", crd.Name, err)
		}
		live, err := typed(u.Object)
		if err != nil {
			return false, fmt.Errorf("CustomResourceDefinition %s: %w", crd.Name, err)
		}
		if err := fits(live, crd); err != nil {
			return false, err
		}
		established := false
		for _, c := range live.Status.Conditions {
			switch {
			case c.Type == apiextv1.NamesAccepted && c.Status == apiextv1.ConditionFalse:
				return false, fmt.Errorf("CustomResourceDefinition %s: its names are not accepted (%s): %s", crd.Name, c.Reason, c.Message)
			case c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue:
				established = true
			}
		}
		if !established {
			why = "it is not Established"
			return false, nil
		}
		status = hasStatus(live, crd.Version)
		_, err = r.c.Dynamic.Resource(crd.gvr()).List(ctx, metav1.ListOptions{Limit: 1})
		if apierrors.IsNotFound(err) {
			why = "its objects are not served yet"
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("%s: list: %w", crd.gvr().GroupResource(), err)
		}
		return true, nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		return false, fmt.Errorf("CustomResourceDefinition %s: %s after %s: see its conditions (kubectl describe crd %s)", crd.Name, why, r.o.EstablishTimeout, crd.Name)
	}
	return status, err
}

// fits says whether the CRD on the cluster can take the backup's objects: same kind,
// resource and scope, and the version they were saved at served.
func fits(live *apiextv1.CustomResourceDefinition, crd CRD) error {
	switch {
	case live.Spec.Group != crd.Group || live.Spec.Names.Kind != crd.Kind || live.Spec.Names.Plural != crd.Resource:
		return fmt.Errorf("CustomResourceDefinition %s on the cluster is not the one backed up (kind %s, resource %s.%s; the backup's: %s, %s.%s)",
			crd.Name, live.Spec.Names.Kind, live.Spec.Names.Plural, live.Spec.Group, crd.Kind, crd.Resource, crd.Group)
	case (live.Spec.Scope == apiextv1.NamespaceScoped) != crd.Namespaced:
		return fmt.Errorf("CustomResourceDefinition %s on the cluster is %s, but its objects in the backup are not", crd.Name, live.Spec.Scope)
	case !crdversions.Serves(live, crd.Version):
		return fmt.Errorf("CustomResourceDefinition %s on the cluster does not serve %s, the version its objects were saved at: serve it (spec.versions[].served), then restore again", crd.Name, crd.Version)
	}
	return nil
}

func hasStatus(crd *apiextv1.CustomResourceDefinition, version string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			return v.Subresources != nil && v.Subresources.Status != nil
		}
	}
	return false
}

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
	live, err := api.Create(ctx, u, metav1.CreateOptions{})
	switch {
	case err == nil:
		out.action = created
	case apierrors.IsAlreadyExists(err):
		if live, err = api.Get(ctx, u.GetName(), metav1.GetOptions{}); err != nil {
			return out, fmt.Errorf("%s: read: %w", out.subject, err)
		}
		switch {
		case same(want.Object, live.Object):
			out.action = unchanged
		case !r.o.Overwrite:
			out.action = kept
		default:
			u.SetResourceVersion(live.GetResourceVersion())
			if live, err = api.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
				return out, fmt.Errorf("%s: overwrite: %w", out.subject, err)
			}
			out.action = overwritten
		}
	default:
		return out, fmt.Errorf("%s: create: %w", out.subject, err)
	}
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
