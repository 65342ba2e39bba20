package crdbackup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
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
	return fmt.Sprintf("the backup's objects live in namespaces that do not exist: %s; nothing was restored: create them first (%s)", strings.Join(e.Names, ", "), cmdline.CreateNamespace{})
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
