// Package crdbackup owns the backup of CustomResourceDefinitions with every object of
// their kinds, and its restore. Deleting a CRD deletes all its objects at once and for
// good; Backup is the one step to take before a CRD is deleted on purpose, and Restore
// brings the CRD and its objects back into a cluster where the CRD is absent.
//
// The files are package backup's format, kind backup.KindCRD, in DIR:
//   - crds/NAME.yaml, the CRD without what the API server owns (status, uid,
//     resourceVersion, managedFields and the other server fields);
//   - objects/NAME.yaml, every object of the CRD, all namespaces, as a YAML stream listed
//     in pages at one version (the storage version when it is served), without
//     managedFields;
//   - index.json, last, with each stream's object count and SHA-256: Restore refuses a
//     backup without an index (it did not finish) or with a stream that does not match
//     it, before it creates anything.
//
// Neither function prints: they return typed results, and report progress through a
// callback.
package crdbackup

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// Defaults of the options.
const (
	DefaultPageSize         = 500
	DefaultConcurrency      = 8
	DefaultEstablishTimeout = time.Minute
)

// CRDsDir holds the CRDs of a backup, one file each.
const CRDsDir = "crds"

var crdResource = apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")

// Clients are the API clients Backup and Restore use: the dynamic client reads and
// writes the CRDs as the API server serves them (every field kept, whatever this
// build's types know) and their objects.
type Clients struct {
	Dynamic dynamic.Interface
}

// NewClients builds the clients from cfg, without a client-side rate limit unless cfg
// sets one (kubeclient.DefaultRateLimit): Restore bounds its load by concurrency.
func NewClients(cfg *rest.Config) (*Clients, error) {
	dyn, err := dynamic.NewForConfig(kubeclient.DefaultRateLimit(cfg))
	if err != nil {
		return nil, err
	}
	return &Clients{Dynamic: dyn}, nil
}

// Index is DIR/index.json.
type Index struct {
	backup.Header
	CRDs []CRD `json:"crds"`
}

// CRD is one CRD of a backup: where its definition and its objects are, and the version
// the objects were read at (and are restored at).
type CRD struct {
	Name       string  `json:"name"`
	Group      string  `json:"group"`
	Kind       string  `json:"kind"`
	Resource   string  `json:"resource"`
	Namespaced bool    `json:"namespaced"`
	Version    string  `json:"version"`
	File       string  `json:"file"`
	Objects    Objects `json:"objects"`
}

// Objects is the stream of a CRD's objects in a backup.
type Objects struct {
	File   string `json:"file"`
	Count  int64  `json:"count"`
	SHA256 string `json:"sha256"`
}

func (c CRD) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: c.Group, Version: c.Version, Resource: c.Resource}
}

// Progress is how far a Backup or Restore has come with one CRD's objects.
type Progress struct {
	CRD  string
	Done int64
	// Total is the number of objects expected: the backup's count on restore, the API
	// server's estimate on backup (0 when it gives none).
	Total   int64
	Elapsed time.Duration
}

// BackupOptions tune Backup.
type BackupOptions struct {
	// PageSize is the LIST page size (DefaultPageSize when 0).
	PageSize int64
	// Progress, when set, is called after each page.
	Progress func(Progress)
}

// BackupResult is what Backup wrote.
type BackupResult struct {
	Dir  string `json:"dir"`
	CRDs []CRD  `json:"crds"`
}

// Objects is the number of objects saved, all CRDs together.
func (r *BackupResult) Objects() int64 {
	var n int64
	for _, c := range r.CRDs {
		n += c.Objects.Count
	}
	return n
}

// NotFoundError says a CRD named for a backup is not on the cluster.
type NotFoundError struct{ Name string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("CustomResourceDefinition %s not found", e.Name)
}

// Backup writes the CRDs named, and every object of theirs, to dir through package
// backup's writer (files 0600, the directory 0700, each file atomically, the index last).
// Each CRD's objects are listed in pages (Limit and Continue) in every namespace at one
// version: the storage version when it is served, otherwise the first served version.
// A directory that already holds a backup is refused (backup.ExistsError). Every CRD is
// read before anything is written, so a name that is wrong writes nothing.
func Backup(ctx context.Context, c *Clients, names []string, dir string, o BackupOptions) (*BackupResult, error) {
	if len(names) == 0 {
		return nil, errors.New("no CustomResourceDefinition named: name at least one")
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	type source struct {
		entry CRD
		def   map[string]any
	}
	var sources []source
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			continue
		}
		seen[name] = true
		u, err := c.Dynamic.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, &NotFoundError{Name: name}
		}
		if err != nil {
			return nil, fmt.Errorf("CustomResourceDefinition %s: read: %w", name, err)
		}
		crd, err := typed(u.Object)
		if err != nil {
			return nil, fmt.Errorf("CustomResourceDefinition %s: %w", name, err)
		}
		version := crdversions.ServedVersion(crd)
		if version == "" {
			return nil, fmt.Errorf("CustomResourceDefinition %s serves no version, so its objects cannot be listed: serve one (spec.versions[].served) to back them up", name)
		}
		sources = append(sources, source{def: cleanCRD(u.Object), entry: CRD{
			Name: name, Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Resource: crd.Spec.Names.Plural,
			Namespaced: crd.Spec.Scope == apiextv1.NamespaceScoped, Version: version,
			File:    filepath.Join(CRDsDir, name+".yaml"),
			Objects: Objects{File: filepath.Join(backup.ObjectsDir, name+".yaml")},
		}})
	}
	w, err := backup.Create(dir, backup.KindCRD)
	if err != nil {
		return nil, err
	}
	res := &BackupResult{Dir: dir, CRDs: []CRD{}}
	for _, s := range sources {
		if err := w.WriteYAML(s.entry.File, s.def); err != nil {
			return nil, fmt.Errorf("CustomResourceDefinition %s: %w", s.entry.Name, err)
		}
		objs, err := backupObjects(ctx, c, w, s.entry, o)
		if err != nil {
			return nil, err
		}
		s.entry.Objects = objs
		res.CRDs = append(res.CRDs, s.entry)
	}
	if err := w.Commit(&Index{CRDs: res.CRDs}); err != nil {
		return nil, err
	}
	return res, nil
}

// backupObjects streams every object of crd into its file, page by page.
func backupObjects(ctx context.Context, c *Clients, w *backup.Writer, crd CRD, o BackupOptions) (Objects, error) {
	out := crd.Objects
	f, err := w.Create(out.File)
	if err != nil {
		return out, err
	}
	start := time.Now()
	var total int64
	first := true
	for list, err := range kubeclient.Pages(ctx, c.Dynamic.Resource(crd.gvr()).List, metav1.ListOptions{Limit: o.PageSize}) {
		if err != nil {
			f.Abort()
			return out, fmt.Errorf("%s: list the objects at %s to back them up: %w", crd.Name, crd.Version, err)
		}
		if first {
			first = false
			total = int64(len(list.Items))
			if n := list.GetRemainingItemCount(); n != nil {
				total += *n
			} else if list.GetContinue() != "" {
				total = 0 // unknown
			}
		}
		for i := range list.Items {
			obj := list.Items[i].Object
			if md, ok := obj["metadata"].(map[string]any); ok {
				delete(md, "managedFields")
			}
			if err := f.WriteObject(obj); err != nil {
				f.Abort()
				return out, fmt.Errorf("%s: %w", crd.Name, err)
			}
		}
		if o.Progress != nil {
			o.Progress(Progress{CRD: crd.Name, Done: f.Objects(), Total: max(total, f.Objects()), Elapsed: time.Since(start)})
		}
	}
	if err := f.Close(); err != nil {
		return out, fmt.Errorf("%s: %w", crd.Name, err)
	}
	out.Count, out.SHA256 = f.Objects(), f.SHA256()
	return out, nil
}

// cleanCRD is the CRD as a backup keeps it: without status and the fields the API server
// sets, so that it can be created again.
func cleanCRD(obj map[string]any) map[string]any {
	def := runtime.DeepCopyJSON(obj)
	delete(def, "status")
	backup.StripServerFields(def)
	return def
}

// typed reads a CRD's unstructured content into the API type, for the fields this
// package decides on (versions, scope, names, subresources).
func typed(obj map[string]any) (*apiextv1.CustomResourceDefinition, error) {
	var crd apiextv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &crd); err != nil {
		return nil, fmt.Errorf("read as a CustomResourceDefinition: %w", err)
	}
	return &crd, nil
}

// names lists the CRDs of an index, for messages.
func names(crds []CRD) string {
	out := make([]string, 0, len(crds))
	for _, c := range crds {
		out = append(out, c.Name)
	}
	return strings.Join(out, ", ")
}
