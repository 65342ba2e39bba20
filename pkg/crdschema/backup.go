package crdschema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// Backup layout: DIR/index.json lists the objects saved and the paths each loses;
// DIR/objects/*.yaml hold, per object, its identity and only the fields the change drops,
// at the version they were read at.
const (
	BackupIndex      = "index.json"
	BackupObjectsDir = "objects"
)

// BackupResult is what Backup wrote; it is also DIR/index.json. It holds paths, not values.
type BackupResult struct {
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
// lose, one file per object, into dir, which must not exist yet (it is created 0700, the
// files 0600: they hold the values). Lists that lose fields are saved whole. Nothing is
// written for objects that lose nothing.
func (j *Judge) Backup(ctx context.Context, l Lister, dir string) (*BackupResult, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("backup directory %s already exists: name a new one, so no earlier backup is overwritten", dir)
		}
		return nil, fmt.Errorf("create the backup directory: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, BackupObjectsDir), 0o700); err != nil {
		return nil, fmt.Errorf("create the backup directory: %w", err)
	}
	res := &BackupResult{Dir: dir, CRD: j.live.Name, Objects: []BackupEntry{}}
	err := j.each(ctx, l, DefaultPageSize, "back up the fields the new schema drops", func(r Read, o *unstructured.Unstructured) error {
		return j.backupOne(ctx, r, o, res)
	})
	if err != nil {
		return nil, err
	}
	index, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, BackupIndex), index, 0o600); err != nil {
		return nil, fmt.Errorf("write the backup index: %w", err)
	}
	return res, nil
}

func (j *Judge) backupOne(ctx context.Context, r Read, o *unstructured.Unstructured, res *BackupResult) error {
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
	data, err := yaml.Marshal(lost)
	if err != nil {
		return err
	}
	name := objectName(o)
	file := filepath.Join(BackupObjectsDir, strings.ReplaceAll(name, "/", "_")+"."+r.ReadAt+".yaml")
	if err := os.WriteFile(filepath.Join(res.Dir, file), data, 0o600); err != nil {
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
