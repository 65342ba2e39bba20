// Package backup owns the one on-disk format of every upgradeguard backup, and its writer
// and reader. The release backup of `release uninstall-check --backup` (package
// uninstall, and with it the StatefulSet claims of `release migrate`, package
// chartmigrate), the field-loss backup of `migrate --backup-fields` (package crdschema) and
// the CRD backup of `crd backup` (package crdbackup) are all written here.
//
// A backup is a directory, mode 0700, of files, mode 0600, since objects may hold
// credentials: the objects as YAML (one object per file, or a stream of documents), and
// IndexFile, the JSON index that says what the directory holds. Every file is written to a
// temporary file beside it, synced, and renamed into place, so no file is ever seen half
// written under its name. The index is written last, after the directories holding the
// other files are synced: a directory without an index is a backup that did not finish,
// and Read refuses it. A directory that holds an index is never written into again.
//
// The index opens with a Header (format and kind), so a reader knows which backup it is
// looking at. It lists what was saved (names, files, counts, Secret key names) and never a
// value.
package backup

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// The layout every backup shares.
const (
	// IndexFile is the index, written last.
	IndexFile = "index.json"
	// ObjectsDir holds the saved objects.
	ObjectsDir = "objects"
	// Format names this layout in every index's Header.
	Format = "upgradeguard.io/backup/v1"
)

// Kind says what a backup holds, and so which reader understands its index.
type Kind string

const (
	// KindRelease is a Helm release's Secrets, PVCs and PVs (package uninstall).
	KindRelease Kind = "release"
	// KindFieldLoss is the values of the fields a schema change drops (package crdschema).
	KindFieldLoss Kind = "field-loss"
	// KindCRD is CRDs and every object of theirs (package crdbackup).
	KindCRD Kind = "crd"
)

// writtenBeforeHeader are the kinds whose indexes were written, by earlier releases,
// without a Header: such an index is read as that kind.
var writtenBeforeHeader = []Kind{KindRelease, KindFieldLoss}

// Header opens every index. Writer.Commit fills it.
type Header struct {
	Format string `json:"format"`
	Kind   Kind   `json:"kind"`
}

func (h *Header) header() *Header { return h }

// Index is the content of IndexFile: a struct that embeds Header and lists what its kind
// of backup saved.
type Index interface{ header() *Header }

// ExistsError says the directory already holds a backup. Nothing writes into it: a second
// run (say, after the uninstall the first one prepared) would replace a good backup.
type ExistsError struct{ Dir string }

func (e *ExistsError) Error() string {
	return fmt.Sprintf("%s already holds a backup (%s): choose a new directory, or move the old one away if you really mean to replace it", e.Dir, IndexFile)
}

// IncompleteError says a directory holds no complete backup: the index is written last,
// so without it the backup did not finish (or the directory is not a backup).
type IncompleteError struct{ Dir string }

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("%s holds no complete backup (no %s: the backup did not finish, or this is not a backup directory)", e.Dir, IndexFile)
}

// KindError says a backup is of another kind than the reader's.
type KindError struct {
	Dir       string
	Want, Got Kind
}

func (e *KindError) Error() string {
	if e.Got == "" {
		return fmt.Sprintf("%s holds a backup whose index names no kind (a release or field-loss backup of an earlier upgradeguard), not a %s backup", e.Dir, e.Want)
	}
	return fmt.Sprintf("%s holds a %s backup, not a %s backup", e.Dir, e.Got, e.Want)
}

// Writer writes one backup. Create it with Create, write the files, and Commit the index;
// until Commit, the directory is an incomplete backup.
type Writer struct {
	dir  string
	kind Kind
	// dirs are the directories files were renamed into, synced before the index.
	dirs map[string]bool
}

// Create starts a backup of kind in dir. The directory, and any parent missing, is
// created (0700) with the first file, so a caller that fails before writing leaves
// nothing. A directory left by a backup that did not finish is written over; one that
// holds an index is refused (ExistsError).
func Create(dir string, kind Kind) (*Writer, error) {
	if dir == "" {
		return nil, errors.New("no backup directory given")
	}
	if _, err := os.Stat(filepath.Join(dir, IndexFile)); err == nil {
		return nil, &ExistsError{Dir: dir}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("backup directory %s: %w", dir, err)
	}
	return &Writer{dir: dir, kind: kind, dirs: map[string]bool{}}, nil
}

// Dir is the backup's directory.
func (w *Writer) Dir() string { return w.dir }

// WriteYAML writes v as YAML to rel, a path inside the backup (see WriteFile).
func (w *Writer) WriteYAML(rel string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("write backup %s: %w", rel, err)
	}
	return w.WriteFile(rel, data)
}

// WriteFile writes data to rel, a path inside the backup, mode 0600, through a temporary
// file that is synced and renamed into place.
func (w *Writer) WriteFile(rel string, data []byte) error {
	f, err := w.Create(rel)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return err
	}
	return f.Close()
}

// Create opens rel, a path inside the backup, for a file written in pieces (a stream of
// objects). Nothing appears under rel until Close; Abort drops it.
func (w *Writer) Create(rel string) (*File, error) {
	if !filepath.IsLocal(rel) {
		return nil, fmt.Errorf("write backup %s: not a path inside the backup directory", rel)
	}
	path := filepath.Join(w.dir, rel)
	parent := filepath.Dir(path)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("write backup %s: %w", path, err)
	}
	// CreateTemp opens the file 0600.
	tmp, err := os.CreateTemp(parent, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return nil, fmt.Errorf("write backup %s: %w", path, err)
	}
	w.dirs[parent] = true
	h := sha256.New()
	return &File{tmp: tmp, path: path, hash: h, buf: bufio.NewWriterSize(io.MultiWriter(tmp, h), 64<<10)}, nil
}

// Commit writes the index last: the directories written into are synced first, so every
// file the index lists is on disk before the index is. It fills the index's Header.
func (w *Writer) Commit(index Index) error {
	*index.header() = Header{Format: Format, Kind: w.kind}
	for _, d := range slices.Sorted(maps.Keys(w.dirs)) {
		if err := syncDir(d); err != nil {
			return fmt.Errorf("write backup %s: %w", d, err)
		}
	}
	data, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return fmt.Errorf("write backup index: %w", err)
	}
	if err := w.WriteFile(IndexFile, append(data, '\n')); err != nil {
		return err
	}
	return syncDir(w.dir)
}

// syncDir makes the renames into dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// File is a backup file being written: its content goes to a temporary file until Close.
type File struct {
	tmp  *os.File
	path string
	hash hash.Hash
	buf  *bufio.Writer
	size int64
	docs int64
}

// Write appends p.
func (f *File) Write(p []byte) (int, error) {
	n, err := f.buf.Write(p)
	f.size += int64(n)
	if err != nil {
		return n, fmt.Errorf("write backup %s: %w", f.path, err)
	}
	return n, nil
}

// WriteObject appends obj as one YAML document of a stream (ReadObjects reads them back).
func (f *File) WriteObject(obj map[string]any) error {
	data, err := yaml.Marshal(obj)
	if err != nil {
		return fmt.Errorf("write backup %s: %w", f.path, err)
	}
	if _, err := f.Write(append([]byte("---\n"), data...)); err != nil {
		return err
	}
	f.docs++
	return nil
}

// Objects is how many objects WriteObject has written.
func (f *File) Objects() int64 { return f.docs }

// SHA256 is the hex SHA-256 of what was written so far (all of it, after Close).
func (f *File) SHA256() string { return hex.EncodeToString(f.hash.Sum(nil)) }

// Close syncs the file and renames it into place.
func (f *File) Close() error {
	if err := errors.Join(f.buf.Flush(), f.tmp.Sync(), f.tmp.Close()); err != nil {
		_ = os.Remove(f.tmp.Name())
		return fmt.Errorf("write backup %s: %w", f.path, err)
	}
	if err := os.Rename(f.tmp.Name(), f.path); err != nil {
		_ = os.Remove(f.tmp.Name())
		return fmt.Errorf("write backup %s: %w", f.path, err)
	}
	return nil
}

// Abort drops the file: nothing is left under its name.
func (f *File) Abort() {
	_ = f.tmp.Close()
	_ = os.Remove(f.tmp.Name())
}

// Read reads the index of the backup in dir into index, refusing a directory without
// one (IncompleteError) and a backup of another kind (KindError). An index written
// without a Header, by an earlier release, is read as kind when kind wrote such indexes.
func Read(dir string, kind Kind, index Index) error {
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("backup directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, IndexFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &IncompleteError{Dir: dir}
	}
	if err != nil {
		return fmt.Errorf("read backup index %s: %w", path, err)
	}
	if err := json.Unmarshal(data, index); err != nil {
		return fmt.Errorf("backup index %s: %w", path, err)
	}
	h := index.header()
	switch {
	case h.Format == "" && h.Kind == "" && slices.Contains(writtenBeforeHeader, kind):
		return nil
	case h.Kind != kind:
		return &KindError{Dir: dir, Want: kind, Got: h.Kind}
	case h.Format != Format:
		return fmt.Errorf("backup index %s is format %q, which this upgradeguard does not read (it reads %s): use the upgradeguard that wrote it", path, h.Format, Format)
	}
	return nil
}

// Open opens rel, a file of the backup in dir, for reading.
func Open(dir, rel string) (*os.File, error) {
	if !filepath.IsLocal(rel) {
		return nil, fmt.Errorf("backup %s: %s is not a path inside the backup directory", dir, rel)
	}
	return os.Open(filepath.Join(dir, rel))
}

// ReadYAML reads rel, one YAML object of the backup in dir.
func ReadYAML(dir, rel string) (map[string]any, error) {
	f, err := Open(dir, rel)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	var obj map[string]any
	err = ReadObjects(f, func(o map[string]any) error {
		if obj != nil {
			return errors.New("holds more than one object")
		}
		obj = o
		return nil
	})
	if err == nil && obj == nil {
		err = errors.New("holds no object")
	}
	if err != nil {
		return nil, fmt.Errorf("backup file %s: %w", filepath.Join(dir, rel), err)
	}
	return obj, nil
}

// ReadObjects reads a YAML stream WriteObject wrote and calls fn with each object in
// order. Integers stay int64, as the API server sent them.
func ReadObjects(r io.Reader, fn func(map[string]any) error) error {
	docs := manifest.NewYAMLReader(r, 64<<10)
	for n := 1; ; n++ {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(js); err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
		if err := fn(u.Object); err != nil {
			return err
		}
	}
}

// ServerFields are the metadata fields the API server sets on every object: an object
// re-created from a backup must not carry them.
var ServerFields = []string{"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
	"deletionGracePeriodSeconds", "managedFields", "selfLink"}

// StripServerFields removes ServerFields from an object (unstructured content).
func StripServerFields(obj map[string]any) {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		return
	}
	for _, k := range ServerFields {
		delete(md, k)
	}
}
