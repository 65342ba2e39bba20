package uninstall

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Release backup layout (package backup's format, kind backup.KindRelease): DIR/index.json
// lists what was saved; DIR/objects/*.yaml hold the objects, ready for
// `kubectl apply -f DIR/objects`.
const (
	IndexFile  = backup.IndexFile
	ObjectsDir = backup.ObjectsDir
)

// BackupResult is what Backup wrote. It is also the content of DIR/index.json; it holds
// Secret key names but never their values.
type BackupResult struct {
	backup.Header
	Dir       string       `json:"-"`
	Release   string       `json:"release"`
	Namespace string       `json:"namespace"`
	Revision  int          `json:"revision"`
	Files     []BackupFile `json:"files"`
}

// BackupFile is one saved object.
type BackupFile struct {
	Subject   string `json:"subject"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// File is relative to the backup directory.
	File string `json:"file"`
	// Keys are a Secret's key names (never values).
	Keys []string `json:"keys,omitempty"`
	// Volume is the PersistentVolume a PVC is bound to; Claim is the namespace/name a
	// PersistentVolume is bound to; ReclaimPolicy is the PV's.
	Volume        string `json:"volume,omitempty"`
	Claim         string `json:"claim,omitempty"`
	ReclaimPolicy string `json:"reclaimPolicy,omitempty"`
}

// Backup saves what a restore after `helm uninstall` needs: every Secret and PVC the
// release's last stored manifest lists, and the PersistentVolumes bound to those PVCs
// (or listed themselves). Objects are sanitised for re-apply: no uid, resourceVersion,
// generation, creationTimestamp, managedFields, ownerReferences, status,
// last-applied-configuration or binder annotations; a PV's claimRef keeps the claim's
// namespace and name but not its uid and resourceVersion, so a re-created claim of that
// name binds to it again (see Sanitize).
// The files are package backup's: written 0600 (the directory 0700), each one atomically,
// and the index last, so a directory without index.json is an incomplete backup; a
// directory that holds a backup is refused (backup.ExistsError).
func Backup(ctx context.Context, c *Clients, o Options, dir string) (*BackupResult, error) {
	w, err := backup.Create(dir, backup.KindRelease)
	if err != nil {
		return nil, err
	}
	return WriteBackup(ctx, c, o, w)
}

// WriteBackup is Backup with a writer of kind backup.KindRelease that the caller created,
// and may have written other files of the same backup with (the StatefulSet claims of a
// chart migration): they are synced with the objects, before the index is committed.
func WriteBackup(ctx context.Context, c *Clients, o Options, w *backup.Writer) (*BackupResult, error) {
	dir := w.Dir()
	l, err := load(ctx, c, o)
	if err != nil {
		return nil, err
	}
	objs, err := parseManifest(l.last.Manifest, o.Namespace, c.Mapper)
	if err != nil {
		return nil, fmt.Errorf("release %s revision %d: %w", o.Release, l.last.Version, err)
	}
	res := &BackupResult{Dir: dir, Release: o.Release, Namespace: o.Namespace, Revision: l.last.Version, Files: []BackupFile{}}
	core := c.Kube.CoreV1()
	pvs := map[string]bool{}
	for _, mo := range objs {
		if mo.apiVersion != "v1" {
			continue
		}
		switch mo.kind {
		case "Secret":
			s, err := core.Secrets(mo.namespace).Get(ctx, mo.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s: read for backup: %w", mo.subject(), err)
			}
			keys := make([]string, 0, len(s.Data))
			for k := range s.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			f := BackupFile{Subject: mo.subject(), Kind: mo.kind, Namespace: mo.namespace, Name: mo.name, Keys: keys}
			if err := writeObject(w, &f, s, "v1"); err != nil {
				return nil, err
			}
			res.Files = append(res.Files, f)
		case "PersistentVolumeClaim":
			p, err := core.PersistentVolumeClaims(mo.namespace).Get(ctx, mo.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s: read for backup: %w", mo.subject(), err)
			}
			f := BackupFile{Subject: mo.subject(), Kind: mo.kind, Namespace: mo.namespace, Name: mo.name, Volume: p.Spec.VolumeName}
			if err := writeObject(w, &f, p, "v1"); err != nil {
				return nil, err
			}
			res.Files = append(res.Files, f)
			if p.Spec.VolumeName != "" {
				pvs[p.Spec.VolumeName] = true
			}
		case "PersistentVolume":
			pvs[mo.name] = true
		}
	}
	names := make([]string, 0, len(pvs))
	for n := range pvs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		pv, err := core.PersistentVolumes().Get(ctx, n, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("PersistentVolume/%s: read for backup: %w", n, err)
		}
		f := BackupFile{Subject: manifest.SubjectOf("PersistentVolume", "", n), Kind: "PersistentVolume", Name: n, ReclaimPolicy: string(pv.Spec.PersistentVolumeReclaimPolicy)}
		if ref := pv.Spec.ClaimRef; ref != nil {
			f.Claim = ref.Namespace + "/" + ref.Name
		}
		if err := writeObject(w, &f, pv, "v1"); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, f)
	}
	if err := w.Commit(res); err != nil {
		return nil, err
	}
	return res, nil
}

// writeObject writes one sanitised object to DIR/objects and records its file name.
func writeObject(w *backup.Writer, f *BackupFile, obj runtime.Object, apiVersion string) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Subject, err)
	}
	u["apiVersion"], u["kind"] = apiVersion, f.Kind
	Sanitize(u)
	name := strings.ToLower(f.Kind)
	if f.Namespace != "" {
		name += "-" + f.Namespace
	}
	f.File = filepath.Join(ObjectsDir, name+"-"+f.Name+".yaml")
	if err := w.WriteYAML(f.File, u); err != nil {
		return fmt.Errorf("%s: %w", f.Subject, err)
	}
	return nil
}

// Sanitize removes from an object (as unstructured content) what the API server owns or
// what would stop it from being applied again elsewhere: the fields the API server sets
// (backup.ServerFields: uid, resourceVersion, generation, creationTimestamp, deletion
// fields, managedFields), ownerReferences, status,
// the kubectl last-applied-configuration annotation and the PV binder's bind-completed and
// bound-by-controller annotations; and a PersistentVolume claimRef's uid and
// resourceVersion. A claim keeps spec.volumeName and a volume keeps its claimRef's
// namespace and name, so the two pre-bind to each other when re-created.
func Sanitize(u map[string]any) {
	delete(u, "status")
	backup.StripServerFields(u)
	if md, ok := u["metadata"].(map[string]any); ok {
		delete(md, "ownerReferences")
		if ann, ok := md["annotations"].(map[string]any); ok {
			delete(ann, corev1.LastAppliedConfigAnnotation)
			// The binder's own marks: left on a re-created claim they make it Lost (it
			// claims a completed bind the new volume object does not confirm); without
			// them volumeName and claimRef are a plain pre-binding.
			delete(ann, "pv.kubernetes.io/bind-completed")
			delete(ann, "pv.kubernetes.io/bound-by-controller")
			if len(ann) == 0 {
				delete(md, "annotations")
			}
		}
	}
	if spec, ok := u["spec"].(map[string]any); ok {
		if ref, ok := spec["claimRef"].(map[string]any); ok {
			delete(ref, "uid")
			delete(ref, "resourceVersion")
		}
	}
}

// ReadBackup loads the index of a backup Backup wrote, so a later step (a restore, or a
// migration resuming after a failure) works from the same files. A directory without
// index.json is not a complete backup (backup.IncompleteError).
func ReadBackup(dir string) (*BackupResult, error) {
	var res BackupResult
	if err := backup.Read(dir, backup.KindRelease, &res); err != nil {
		return nil, err
	}
	res.Dir = dir
	return &res, nil
}
