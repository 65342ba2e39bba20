package review

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/go-git/go-billy/v5/util"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/object"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Object is one Kubernetes object found in a repository file: the object, the file and
// the document's parsed YAML, which gives the line of any field.
type Object struct {
	*unstructured.Unstructured
	// File is the path from the repository's root.
	File string
	node *yaml.Node
}

// Line is the line of the field at path (spec, chart, spec, version) in the object's
// file, or of the nearest parent the object has; 1 for the document when it has none.
// A field of a list is its index ("0").
func (o Object) Line(fields ...string) int {
	n, line := o.node, 1
	for n != nil {
		if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
			n = n.Content[0]
		}
		line = n.Line
		if len(fields) == 0 {
			break
		}
		var next *yaml.Node
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == fields[0] {
					next = n.Content[i+1]
					if next.Kind != yaml.MappingNode {
						line = n.Content[i].Line
					}
					break
				}
			}
		case yaml.SequenceNode:
			if i, err := strconv.Atoi(fields[0]); err == nil && i >= 0 && i < len(n.Content) {
				next = n.Content[i]
			}
		}
		if next == nil {
			break
		}
		n, fields = next, fields[1:]
		if n.Kind == yaml.SequenceNode && len(fields) > 0 {
			continue
		}
		if n.Kind != yaml.MappingNode {
			break
		}
	}
	return line
}

// Key says which object it is: group, kind, namespace and name.
type Key struct {
	GroupKind       schema.GroupKind
	Namespace, Name string
}

func keyOf(u *unstructured.Unstructured) Key {
	return Key{GroupKind: u.GroupVersionKind().GroupKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
}

// Tree is every Kubernetes object in a revision's YAML files (.yaml and .yml). A file
// that is not YAML, or a document that is not an object (no apiVersion, kind and name),
// is not in it: a repository holds values files and docs beside its manifests. The same
// object may be in several files: one per cluster in the Flux layout (clusters/NAME/).
type Tree struct {
	// Revision is the commit read, or "work tree".
	Revision string
	Objects  []Object
	// Files are the YAML files read, for saying which a change touched.
	Files map[string][]byte
	// other reads each file that is not YAML, when a kustomize build needs it (a
	// configMapGenerator's files).
	other map[string]func() ([]byte, error)
	// git builds the charts of GitRepository sources naming this repository (the head
	// revision's only).
	git *gitCharts
}

func newTree(rev string) *Tree {
	return &Tree{Revision: rev, Files: map[string][]byte{}, other: map[string]func() ([]byte, error){}}
}

// Find returns the object with key that is nearest to the file near: of the files holding
// it, the one that shares the longest folder with near (a HelmRelease's HelmRepository in
// the same cluster's folder before another cluster's).
func (t *Tree) Find(key Key, near string) (Object, bool) {
	var best Object
	found, bestLen := false, -1
	for _, o := range t.Objects {
		if keyOf(o.Unstructured) != key {
			continue
		}
		if n := commonDir(o.File, near); n > bestLen {
			best, bestLen, found = o, n, true
		}
	}
	return best, found
}

// commonDir is how many leading folders two paths share.
func commonDir(a, b string) int {
	as, bs := strings.Split(path.Dir(a), "/"), strings.Split(path.Dir(b), "/")
	n := 0
	for n < len(as) && n < len(bs) && as[n] == bs[n] {
		n++
	}
	return n
}

// add reads the documents of one file into the tree.
func (t *Tree) add(file string, data []byte) {
	t.Files[file] = data
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			return // not YAML from here on: what was read stays
		}
		var m map[string]any
		if doc.Decode(&m) != nil || m == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: normalize(m).(map[string]any)}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			continue
		}
		t.Objects = append(t.Objects, Object{Unstructured: u, File: file, node: &doc})
	}
}

// normalize turns what yaml.v3 decodes into what unstructured holds: int64 for integers.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case int:
		return int64(x)
	}
	return v
}

func isYAML(name string) bool {
	ext := strings.ToLower(path.Ext(name))
	return ext == ".yaml" || ext == ".yml"
}

// readCommit reads a commit's YAML files.
func readCommit(c *object.Commit) (*Tree, error) {
	t := newTree(c.Hash.String())
	files, err := c.Files()
	if err != nil {
		return nil, fmt.Errorf("read the tree of %s: %w", c.Hash, err)
	}
	err = files.ForEach(func(f *object.File) error {
		if !f.Mode.IsFile() {
			return nil
		}
		if !isYAML(f.Name) {
			t.other[f.Name] = func() ([]byte, error) {
				s, err := f.Contents()
				return []byte(s), err
			}
			return nil
		}
		s, err := f.Contents()
		if err != nil {
			return fmt.Errorf("read %s at %s: %w", f.Name, c.Hash, err)
		}
		t.add(f.Name, []byte(s))
		return nil
	})
	return t, err
}

// readWorkTree reads what the next commit would hold: head's files with the work tree's
// changes over them (modified, added, and untracked files git does not ignore; deleted
// files left out).
func readWorkTree(repo *git.Repository, head *object.Commit) (*Tree, error) {
	wt, err := repo.Worktree()
	if err != nil {
		return nil, fmt.Errorf("the repository has no work tree (a bare clone or a mirror): give --head REF: %w", err)
	}
	t, err := readCommit(head)
	if err != nil {
		return nil, err
	}
	t.Revision = "work tree"
	st, err := wt.Status()
	if err != nil {
		return nil, fmt.Errorf("read the work tree's status: %w", err)
	}
	for name, fs := range st {
		if fs.Worktree == git.Unmodified && fs.Staging == git.Unmodified {
			continue
		}
		t.remove(name)
		if fs.Worktree == git.Deleted || fs.Staging == git.Deleted && fs.Worktree != git.Untracked {
			continue
		}
		if !isYAML(name) {
			t.other[name] = func() ([]byte, error) { return util.ReadFile(wt.Filesystem, name) }
			continue
		}
		data, err := util.ReadFile(wt.Filesystem, name)
		if err != nil {
			return nil, fmt.Errorf("read %s in the work tree: %w", name, err)
		}
		t.add(name, data)
	}
	return t, nil
}

// remove takes a file and its objects out of the tree.
func (t *Tree) remove(file string) {
	delete(t.Files, file)
	delete(t.other, file)
	t.Objects = slices.DeleteFunc(t.Objects, func(o Object) bool { return o.File == file })
}
