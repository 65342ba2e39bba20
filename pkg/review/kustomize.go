package review

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	fluxkustomize "github.com/fluxcd/pkg/kustomize"
	securefs "github.com/fluxcd/pkg/kustomize/filesys"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// fluxKustomizationKind is a Flux Kustomization (kustomize.toolkit.fluxcd.io): the folder
// kustomize-controller builds and applies, with its own patches, target namespace and
// post-build substitutions.
var fluxKustomizationKind = schema.GroupKind{Group: "kustomize.toolkit.fluxcd.io", Kind: "Kustomization"}

// buildRoot is a folder of the repository that is built with kustomize and applied: the
// path of a Flux Kustomization, or a folder with a kustomization file that no other build
// reads (an overlay, not a base).
type buildRoot struct {
	// key names the root at both revisions.
	key string
	// dir is the folder, from the repository's root ("." for the root).
	dir string
	// place is the file that says where the build lands: the Flux Kustomization's file,
	// or the kustomization file.
	place string
	// ks is the Flux Kustomization; nil for a kustomization file alone.
	ks *unstructured.Unstructured
}

// built is one root built at one revision.
type built struct {
	root buildRoot
	// out holds the objects the build gives, each in the root's place file.
	out *Tree
	// reads are the repository's files the build read.
	reads map[string]bool
	// err is why the build failed; why is why its HelmReleases cannot be judged (a
	// substitution whose variables are not in the repository).
	err error
	why string
}

// kustomizeChanges builds every kustomize root of both revisions as kustomize-controller
// does (Flux's own generator, build and substitution, fluxcd/pkg/kustomize) and adds a
// Change for each built HelmRelease whose chart or values differ, located in the file the
// change touched (an overlay's patch, a base, the Flux Kustomization's substitution).
// The files a build reads at head go into in.built.
func kustomizeChanges(ctx context.Context, base, head *Tree, in *inputs) error {
	heads, err := buildTree(ctx, head, nil)
	if err != nil {
		return err
	}
	if len(heads) == 0 {
		return nil
	}
	bases, err := buildTree(ctx, base, heads)
	if err != nil {
		return err
	}
	for _, key := range slices.Sorted(maps.Keys(heads)) {
		h, b := heads[key], bases[key]
		for f := range h.reads {
			in.built[f] = true
		}
		if h.err != nil {
			if b == nil || b.err == nil && changedFiles(base, head, b.reads, h.reads, h.root.dir) != nil {
				in.changes = append(in.changes, Change{Subject: "kustomize build " + h.root.dir, File: h.root.place, Line: 1, What: "values",
					notJudged: fmt.Sprintf("the kustomize build of %s fails at %s: %v", h.root.dir, head.Revision, h.err)})
			}
			continue
		}
		before := newTree(base.Revision)
		if b != nil && b.err == nil {
			before = b.out
		}
		for _, obj := range h.out.Objects {
			if obj.GroupVersionKind().GroupKind() != helmReleaseKind {
				continue
			}
			c, ok, err := touched(obj, before)
			if err != nil {
				return fmt.Errorf("the kustomize build of %s: %w", h.root.dir, err)
			}
			if !ok {
				continue
			}
			c.place, c.notJudged = h.root.place, h.why
			c.File, c.Line = h.location(b, base, head, obj, c.What)
			c.reader = readers{treeReader{tree: h.out, near: h.root.place}, treeReader{tree: head, near: h.root.place}}
			in.changes = append(in.changes, c)
		}
	}
	return nil
}

// location is the file and line of the change to a built HelmRelease: of the files the
// build reads that differ between the revisions (the Flux Kustomization's own file when
// it changed), the one that names the HelmRelease, at its version or values; else the
// first such file at its first changed line.
func (h *built) location(b *built, base, head *Tree, hr Object, what string) (string, int) {
	var reads map[string]bool
	if b != nil {
		reads = b.reads
	}
	files := changedFiles(base, head, reads, h.reads, "")
	if h.root.ks != nil {
		if old, ok := base.Find(keyOf(h.root.ks), h.root.place); !ok || !apiequality.Semantic.DeepEqual(old.Object, h.root.ks.Object) {
			files = append(files, h.root.place)
		}
	}
	if len(files) == 0 {
		return h.root.place, 1
	}
	for _, f := range files {
		for _, o := range head.Objects {
			if o.File == f && o.GroupVersionKind().GroupKind() == helmReleaseKind && o.GetName() == hr.GetName() {
				if what == "values" {
					return f, o.Line("spec", "values")
				}
				return f, o.Line("spec", "chart", "spec", "version")
			}
		}
	}
	before, _ := fileBytes(base, files[0])
	after, _ := fileBytes(head, files[0])
	return files[0], firstChangedLine(before, after)
}

// changedFiles are the files of either read set, or under dir when it is given, whose
// content differs between the revisions, in order.
func changedFiles(base, head *Tree, baseReads, headReads map[string]bool, dir string) []string {
	seen := map[string]bool{}
	for f := range baseReads {
		seen[f] = true
	}
	for f := range headReads {
		seen[f] = true
	}
	if dir != "" {
		for _, t := range []*Tree{base, head} {
			for f := range t.Files {
				if under(f, dir) {
					seen[f] = true
				}
			}
		}
	}
	var out []string
	for f := range seen {
		a, aok := fileBytes(base, f)
		b, bok := fileBytes(head, f)
		if aok != bok || !bytes.Equal(a, b) {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// fileBytes is a file of the tree, YAML or not.
func fileBytes(t *Tree, f string) ([]byte, bool) {
	if data, ok := t.Files[f]; ok {
		return data, true
	}
	if read, ok := t.other[f]; ok {
		data, err := read()
		return data, err == nil
	}
	return nil, false
}

func under(file, dir string) bool {
	return dir == "." || strings.HasPrefix(file, strings.TrimSuffix(dir, "/")+"/")
}

// roots are the tree's Flux Kustomizations whose path is in it, and its folders with a
// kustomization file.
func roots(t *Tree) []buildRoot {
	var out []buildRoot
	fluxPaths := map[string]bool{}
	for _, o := range t.Objects {
		if o.GroupVersionKind().GroupKind() != fluxKustomizationKind {
			continue
		}
		p, _, _ := unstructured.NestedString(o.Object, "spec", "path")
		dir := path.Clean(strings.TrimPrefix(p, "/"))
		if !t.hasDir(dir) {
			continue // the path of another source than this repository
		}
		fluxPaths[dir] = true
		out = append(out, buildRoot{key: fmt.Sprintf("%s/%s/%s in %s", o.GetKind(), o.GetNamespace(), o.GetName(), o.File), dir: dir, place: o.File, ks: o.Unstructured})
	}
	for _, f := range kustomizationFiles(t) {
		if dir := path.Dir(f); !fluxPaths[dir] {
			out = append(out, buildRoot{key: f, dir: dir, place: f})
		}
	}
	return out
}

// kustomizationFiles are the tree's kustomization files, in order.
func kustomizationFiles(t *Tree) []string {
	var out []string
	for f := range t.Files {
		if slices.Contains(konfig.RecognizedKustomizationFileNames(), path.Base(f)) {
			out = append(out, f)
		}
	}
	for f := range t.other {
		if path.Base(f) == "Kustomization" {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

func (t *Tree) hasDir(dir string) bool {
	for f := range t.Files {
		if under(f, dir) {
			return true
		}
	}
	return false
}

// buildTree builds the tree's roots in a copy of its files on disk, where Flux's
// generator writes a kustomization file as kustomize-controller does in its copy of the
// source. With only set, it builds the roots of those keys alone (the base of the roots
// the head revision has). A folder with a kustomization file that another build reads is
// a base, not a root.
func buildTree(ctx context.Context, t *Tree, only map[string]*built) (map[string]*built, error) {
	rs := roots(t)
	if only != nil {
		rs = slices.DeleteFunc(rs, func(r buildRoot) bool { return only[r.key] == nil })
	}
	if len(rs) == 0 {
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "upgradeguard-review-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := t.writeTo(dir, rs); err != nil {
		return nil, err
	}
	out := map[string]*built{}
	for _, r := range rs {
		out[r.key] = buildOne(ctx, t, dir, r)
	}
	if only != nil {
		return out, nil
	}
	for key, b := range out {
		if b.root.ks != nil {
			continue
		}
		for other, o := range out {
			if other != key && o.reads[b.root.place] {
				delete(out, key) // a base of another build
				break
			}
		}
	}
	return out, nil
}

// buildOne builds one root: Flux's generator (for a Flux Kustomization: its kustomization
// file, generated when the folder has none, with the Kustomization's patches, images,
// namespace and name prefix), Flux's build (kustomize's krusty, plugins off, loads
// outside the folder allowed, within the repository), then each object's post-build
// substitution from the Kustomization's spec.postBuild (substituteFrom read from the
// repository).
func buildOne(ctx context.Context, t *Tree, dir string, r buildRoot) *built {
	b := &built{root: r, reads: map[string]bool{}}
	abs := filepath.Join(dir, filepath.FromSlash(r.dir))
	if r.ks != nil {
		action, err := fluxkustomize.NewGenerator(dir, *r.ks).WriteFile(abs, fluxkustomize.WithSaveOriginalKustomization())
		if err != nil {
			b.err = err
			return b
		}
		defer func() { _ = fluxkustomize.CleanDirectory(abs, action) }()
	}
	fs, err := securefs.MakeFsOnDiskSecure(dir)
	if err != nil {
		b.err = err
		return b
	}
	m, err := fluxkustomize.Build(recordingFS{FileSystem: fs, root: dir, reads: b.reads}, abs)
	if err != nil {
		b.err = err
		return b
	}
	if r.ks != nil {
		if _, ok, _ := unstructured.NestedMap(r.ks.Object, "spec", "postBuild"); ok {
			cl := repoClient{reader: treeReader{tree: t, near: r.place}}
			for _, res := range m.Resources() {
				if _, err := fluxkustomize.SubstituteVariables(ctx, cl, *r.ks, res); err != nil {
					b.why = fmt.Sprintf("Kustomization %s/%s (%s): post-build substitution: %v", r.ks.GetNamespace(), r.ks.GetName(), r.place, err)
					break
				}
			}
		}
	}
	data, err := m.AsYaml()
	if err != nil {
		b.err = err
		return b
	}
	b.out = newTree(t.Revision)
	b.out.add(r.place, data)
	return b
}

// writeTo writes the tree's YAML files into dir, and the other files that are in or
// under a folder a root builds or that holds a kustomization file (a generator's files).
func (t *Tree) writeTo(dir string, rs []buildRoot) error {
	var dirs []string
	for _, r := range rs {
		dirs = append(dirs, r.dir)
	}
	for _, f := range kustomizationFiles(t) {
		dirs = append(dirs, path.Dir(f))
	}
	write := func(name string, data []byte) error {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, data, 0o644)
	}
	for name, data := range t.Files {
		if err := write(name, data); err != nil {
			return err
		}
	}
	for name, read := range t.other {
		if !slices.ContainsFunc(dirs, func(d string) bool { return under(name, d) }) {
			continue
		}
		data, err := read()
		if err != nil {
			return fmt.Errorf("read %s at %s: %w", name, t.Revision, err)
		}
		if err := write(name, data); err != nil {
			return err
		}
	}
	return nil
}

// recordingFS is a build's file system that notes each file read, as a path from the
// repository's root.
type recordingFS struct {
	filesys.FileSystem
	root  string
	reads map[string]bool
}

func (r recordingFS) ReadFile(p string) ([]byte, error) {
	if rel, err := filepath.Rel(r.root, p); err == nil && !strings.HasPrefix(rel, "..") {
		r.reads[filepath.ToSlash(rel)] = true
	}
	return r.FileSystem.ReadFile(p)
}

// repoClient reads the ConfigMaps and Secrets of a Kustomization's
// spec.postBuild.substituteFrom from the repository. Flux's substitution takes a
// client.Client and calls only its Get.
type repoClient struct {
	client.Client
	reader client.Reader
}

func (c repoClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.reader.Get(ctx, key, obj, opts...)
}

// readers read from each reader in turn: the first that holds the object answers.
type readers []client.Reader

func (rs readers) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	var err error
	for _, r := range rs {
		if err = r.Get(ctx, key, obj, opts...); !apierrors.IsNotFound(err) {
			return err
		}
	}
	return err
}

func (rs readers) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return rs[len(rs)-1].List(ctx, list, opts...)
}
