package uninstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Backup layout: DIR/index.json lists what was saved; DIR/objects/*.yaml hold the
// objects, ready for `kubectl apply -f DIR/objects`.
const (
	IndexFile  = "index.json"
	ObjectsDir = "objects"
)

// BackupResult is what Backup wrote. It is also the content of DIR/index.json; it holds
// Secret key names but never their values.
type BackupResult struct {
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

// ExistingBackupError says the directory already holds a backup. Backup never overwrites
// one: a second run after the uninstall would replace a good backup with an empty one.
type ExistingBackupError struct{ Dir string }

func (e *ExistingBackupError) Error() string {
	return fmt.Sprintf("%s already holds a backup (%s): choose a new directory, or move the old one away if you really mean to replace it", e.Dir, IndexFile)
}

// Backup saves what a restore after `helm uninstall` needs: every Secret and PVC the
// release's last stored manifest lists, and the PersistentVolumes bound to those PVCs
// (or listed themselves). Objects are sanitised for re-apply: no uid, resourceVersion,
// generation, creationTimestamp, managedFields, ownerReferences, status,
// last-applied-configuration or binder annotations; a PV's claimRef keeps the claim's
// namespace and name but not its uid and resourceVersion, so a re-created claim of that
// name binds to it again (see Sanitize).
// Files are written 0600 (the directory 0700), each one atomically, and the index last:
// a directory without index.json is an incomplete backup.
func Backup(ctx context.Context, c *Clients, o Options, dir string) (*BackupResult, error) {
	if dir == "" {
		return nil, errors.New("no backup directory given")
	}
	if _, err := os.Stat(filepath.Join(dir, IndexFile)); err == nil {
		return nil, &ExistingBackupError{Dir: dir}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("backup directory %s: %w", dir, err)
	}
	l, err := load(ctx, c, o)
	if err != nil {
		return nil, err
	}
	objs, err := parseManifest(l.last.Manifest, o.Namespace, c.Mapper)
	if err != nil {
		return nil, fmt.Errorf("release %s revision %d: %w", o.Release, l.last.Version, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ObjectsDir), 0o700); err != nil {
		return nil, fmt.Errorf("create backup directory: %w", err)
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
			if err := writeObject(dir, &f, s, "v1"); err != nil {
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
			if err := writeObject(dir, &f, p, "v1"); err != nil {
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
		if err := writeObject(dir, &f, pv, "v1"); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, f)
	}
	idx, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFile(dir, IndexFile, append(idx, '\n')); err != nil {
		return nil, err
	}
	return res, nil
}

// writeObject writes one sanitised object to DIR/objects and records its file name.
func writeObject(dir string, f *BackupFile, obj runtime.Object, apiVersion string) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Subject, err)
	}
	u["apiVersion"], u["kind"] = apiVersion, f.Kind
	Sanitize(u)
	data, err := yaml.Marshal(u)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Subject, err)
	}
	name := strings.ToLower(f.Kind)
	if f.Namespace != "" {
		name += "-" + f.Namespace
	}
	f.File = filepath.Join(ObjectsDir, name+"-"+f.Name+".yaml")
	return writeFile(dir, f.File, data)
}

// Sanitize removes from an object (as unstructured content) what the API server owns or
// what would stop it from being applied again elsewhere: uid, resourceVersion,
// generation, creationTimestamp, deletion fields, managedFields, ownerReferences, status,
// the kubectl last-applied-configuration annotation and the PV binder's bind-completed and
// bound-by-controller annotations; and a PersistentVolume claimRef's uid and
// resourceVersion. A claim keeps spec.volumeName and a volume keeps its claimRef's
// namespace and name, so the two pre-bind to each other when re-created.
func Sanitize(u map[string]any) {
	delete(u, "status")
	if md, ok := u["metadata"].(map[string]any); ok {
		for _, k := range []string{"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
			"deletionGracePeriodSeconds", "managedFields", "ownerReferences", "selfLink"} {
			delete(md, k)
		}
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

// writeFile writes DIR/rel with mode 0600 through a temporary file and a rename, so a
// crash never leaves a half-written file under the final name.
func writeFile(dir, rel string, data []byte) error {
	path := filepath.Join(dir, rel)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write backup %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr, os.Chmod(tmp.Name(), 0o600)); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write backup %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write backup %s: %w", path, err)
	}
	return nil
}

// IncompleteBackupError says a directory holds no complete backup: Backup writes the
// index last, so without it the backup did not finish.
type IncompleteBackupError struct{ Dir string }

func (e *IncompleteBackupError) Error() string {
	return fmt.Sprintf("%s holds no complete backup (no %s)", e.Dir, IndexFile)
}

// ReadBackup loads the index of a backup Backup wrote, so a later step (a restore, or a
// migration resuming after a failure) works from the same files. A directory without
// index.json is not a complete backup.
func ReadBackup(dir string) (*BackupResult, error) {
	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &IncompleteBackupError{Dir: dir}
	}
	if err != nil {
		return nil, fmt.Errorf("read backup index: %w", err)
	}
	var res BackupResult
	if err := json.Unmarshal(data, &res); err != nil {
		return nil, fmt.Errorf("backup index %s: %w", filepath.Join(dir, IndexFile), err)
	}
	res.Dir = dir
	return &res, nil
}
