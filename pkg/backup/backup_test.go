package backup_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
)

type testIndex struct {
	backup.Header
	Files []string `json:"files"`
}

// TestWriteAndRead: files and directories are private, nothing is half written under
// its name, the index is last and opens with the header, and Read gives it back.
func TestWriteAndRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "backup")
	w, err := backup.Create(dir, backup.KindCRD)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Create made the directory before any file was written: %v", err)
	}
	rel := filepath.Join(backup.ObjectsDir, "one.yaml")
	if err := w.WriteYAML(rel, map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "one"}}); err != nil {
		t.Fatal(err)
	}
	stream, err := w.Create(filepath.Join(backup.ObjectsDir, "stream.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.WriteObject(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "two"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, backup.ObjectsDir, "stream.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a stream shows under its name before Close: %v", err)
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if err := backup.Read(dir, backup.KindCRD, &testIndex{}); !errors.As(err, new(*backup.IncompleteError)) {
		t.Errorf("Read before Commit: %v, want IncompleteError", err)
	}
	if err := w.Commit(&testIndex{Files: []string{rel}}); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(filepath.Dir(dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if p != filepath.Dir(dir) && info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, info.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, backup.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"format": "upgradeguard.io/backup/v1"`)) || !bytes.Contains(data, []byte(`"kind": "crd"`)) {
		t.Errorf("index without its header:\n%s", data)
	}
	var got testIndex
	if err := backup.Read(dir, backup.KindCRD, &got); err != nil {
		t.Fatal(err)
	}
	want := testIndex{Header: backup.Header{Format: backup.Format, Kind: backup.KindCRD}, Files: []string{rel}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("index (-want +got):\n%s", diff)
	}
	obj, err := backup.ReadYAML(dir, rel)
	if err != nil || obj["kind"] != "ConfigMap" {
		t.Errorf("ReadYAML: %v, %v", obj, err)
	}

	if _, err := backup.Create(dir, backup.KindCRD); !errors.As(err, new(*backup.ExistsError)) {
		t.Errorf("a second backup into the same directory: %v, want ExistsError", err)
	}
	if err := backup.Read(dir, backup.KindRelease, &testIndex{}); !errors.As(err, new(*backup.KindError)) {
		t.Errorf("a crd backup read as a release backup: %v, want KindError", err)
	}
}

// TestReadRefuses: each way a directory is not a backup the reader can use.
func TestReadRefuses(t *testing.T) {
	write := func(t *testing.T, index string) string {
		dir := t.TempDir()
		if index != "" {
			if err := os.WriteFile(filepath.Join(dir, backup.IndexFile), []byte(index), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	tests := []struct {
		name  string
		index string
		kind  backup.Kind
		want  string
	}{
		{name: "no index: the backup did not finish", kind: backup.KindCRD, want: "holds no complete backup"},
		{name: "another kind", index: `{"format":"upgradeguard.io/backup/v1","kind":"release"}`, kind: backup.KindCRD, want: "holds a release backup, not a crd backup"},
		{name: "an index without a header is not a crd backup", index: `{"release":"db","files":[]}`, kind: backup.KindCRD, want: "names no kind"},
		{name: "a format from elsewhere", index: `{"format":"upgradeguard.io/backup/v9","kind":"crd"}`, kind: backup.KindCRD, want: "format \"upgradeguard.io/backup/v9\""},
		{name: "not JSON", index: `crds: []`, kind: backup.KindCRD, want: "backup index"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := backup.Read(write(t, tc.index), tc.kind, &testIndex{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Read: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if err := backup.Read(filepath.Join(t.TempDir(), "missing"), backup.KindCRD, &testIndex{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of a missing directory: %v", err)
	}
	// A release backup written before indexes had a header still reads as one.
	var legacy testIndex
	if err := backup.Read(write(t, `{"release":"db","files":["objects/secret-db-creds.yaml"]}`), backup.KindRelease, &legacy); err != nil || len(legacy.Files) != 1 {
		t.Errorf("legacy release index: %+v, %v", legacy, err)
	}
}

// TestStreamKeepsIntegers: objects come back as the API server sent them, integers as
// int64 (a float64 would lose precision past 2^53), in order.
func TestStreamKeepsIntegers(t *testing.T) {
	dir := t.TempDir()
	w, err := backup.Create(dir, backup.KindCRD)
	if err != nil {
		t.Fatal(err)
	}
	f, err := w.Create("objects/big.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs := []map[string]any{
		{"apiVersion": "example.com/v1", "kind": "Big", "metadata": map[string]any{"name": "a"}, "spec": map[string]any{"n": int64(9007199254740993), "f": 1.5, "s": "007"}},
		{"apiVersion": "example.com/v1", "kind": "Big", "metadata": map[string]any{"name": "b"}, "spec": map[string]any{"list": []any{int64(1), "---", true}}},
	}
	for _, o := range objs {
		if err := f.WriteObject(o); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Objects() != 2 || len(f.SHA256()) != 64 {
		t.Errorf("count %d, sha256 %q", f.Objects(), f.SHA256())
	}
	r, err := backup.Open(dir, "objects/big.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []map[string]any
	if err := backup.ReadObjects(r, func(o map[string]any) error { got = append(got, o); return nil }); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(objs, got); diff != "" {
		t.Errorf("objects read back (-want +got):\n%s", diff)
	}
	if _, err := backup.Open(dir, "../outside.yaml"); err == nil {
		t.Error("Open of a path outside the backup: no error")
	}
	if _, err := w.Create("/etc/passwd"); err == nil {
		t.Error("Create of a path outside the backup: no error")
	}
}

// TestAbortLeavesNothing: a stream given up leaves no file, and no temporary one.
func TestAbortLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	w, err := backup.Create(dir, backup.KindCRD)
	if err != nil {
		t.Fatal(err)
	}
	f, err := w.Create("objects/x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("---\nkind: X\n")); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	entries, err := os.ReadDir(filepath.Join(dir, backup.ObjectsDir))
	if err != nil || len(entries) != 0 {
		t.Errorf("after Abort: %v, %v", entries, err)
	}
}

func TestStripServerFields(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"name": "a", "uid": "u", "resourceVersion": "1", "generation": int64(2),
		"creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": []any{}, "labels": map[string]any{"x": "y"}}, "spec": map[string]any{}}
	backup.StripServerFields(obj)
	want := map[string]any{"metadata": map[string]any{"name": "a", "labels": map[string]any{"x": "y"}}, "spec": map[string]any{}}
	if diff := cmp.Diff(want, obj); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestReadObjectsLastLineAtBufferBoundary: a backup file edited by hand whose last line
// has no newline and fills the reader's 64 KiB buffer keeps that line.
func TestReadObjectsLastLineAtBufferBoundary(t *testing.T) {
	prefix := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n"
	value := strings.Repeat("x", 64<<10-len("  v: "))
	var got []map[string]any
	if err := backup.ReadObjects(strings.NewReader(prefix+"  v: "+value), func(o map[string]any) error { got = append(got, o); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("read %d objects, want 1", len(got))
	}
	data, _ := got[0]["data"].(map[string]any)
	if v, _ := data["v"].(string); len(v) != len(value) {
		t.Errorf("data.v is %d bytes, want %d", len(v), len(value))
	}
}
