package crdschema

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
)

// BackupResult is what Backup wrote; it is also DIR/index.json (package backup's format,
// kind backup.KindFieldLoss), and DIR/objects/*.yaml hold, per object, its identity and
// only the fields the change drops, at the version they were read at. It holds paths,
// not values.
type BackupResult struct {
	backup.Header
	Dir     string        `json:"-"`
	CRD     string        `json:"crd"`
	Objects []BackupEntry `json:"objects"`
}

// BackupEntry is one saved object.
type BackupEntry struct {
	Object  string   `json:"object"`
	Version string   `json:"version"`
	File    string   `json:"file"`
	Paths   []string `json:"paths"`
}

// Backup saves, before a change drops them, the values of the fields each object would
// lose, one file per object, into dir (files 0600, the directory 0700: they hold the
// values), through package backup's writer: each file atomically, the index last. A
// directory that already holds a backup is refused (backup.ExistsError). Lists that lose
// fields are saved whole. Nothing is written for objects that lose nothing.
func (j *Judge) Backup(ctx context.Context, l Lister, dir string) (*BackupResult, error) {
	w, err := backup.Create(dir, backup.KindFieldLoss)
	if err != nil {
		return nil, err
	}
	res := &BackupResult{Dir: dir, CRD: j.live.Name, Objects: []BackupEntry{}}
	err = j.each(ctx, l, DefaultPageSize, "back up the fields the new schema drops", func(r Read, o *unstructured.Unstructured) error {
		return j.backupOne(ctx, w, r, o, res)
	})
	if err != nil {
		return nil, err
	}
	if err := w.Commit(res); err != nil {
		return nil, err
	}
	return res, nil
}

func (j *Judge) backupOne(ctx context.Context, w *backup.Writer, r Read, o *unstructured.Unstructured, res *BackupResult) error {
	next := j.nextRules[r.Against]
	if next == nil {
		return nil
	}
	kept := runtime.DeepCopyJSON(o.Object)
	if r.ReadAt != r.Against {
		kept["apiVersion"] = schema.GroupVersion{Group: j.next.Spec.Group, Version: r.Against}.String()
	}
	paths := prune(kept, next.structural)
	if len(paths) == 0 {
		return ctx.Err()
	}
	lost, _ := removed(o.Object, kept).(map[string]any)
	if lost == nil {
		lost = map[string]any{}
	}
	delete(lost, "apiVersion")
	lost["apiVersion"], lost["kind"] = o.GetAPIVersion(), o.GetKind()
	meta := map[string]any{"name": o.GetName()}
	if ns := o.GetNamespace(); ns != "" {
		meta["namespace"] = ns
	}
	lost["metadata"] = meta
	name := objectName(o)
	file := filepath.Join(backup.ObjectsDir, strings.ReplaceAll(name, "/", "_")+"."+r.ReadAt+".yaml")
	if err := w.WriteYAML(file, lost); err != nil {
		return fmt.Errorf("back up %s: %w", name, err)
	}
	res.Objects = append(res.Objects, BackupEntry{Object: name, Version: r.ReadAt, File: file, Paths: paths})
	return nil
}

// removed is what orig holds and kept does not: maps keep only their removed or changed
// keys, and a list that changed is kept whole.
func removed(orig, kept any) any {
	om, ok := orig.(map[string]any)
	if !ok {
		if reflect.DeepEqual(orig, kept) {
			return nil
		}
		return orig
	}
	km, _ := kept.(map[string]any)
	out := map[string]any{}
	for k, v := range om {
		kv, present := km[k]
		if !present {
			out[k] = v
			continue
		}
		if d := removed(v, kv); d != nil {
			out[k] = d
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
