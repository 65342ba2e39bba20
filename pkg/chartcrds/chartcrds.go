// Package chartcrds owns the answer to "which CRDs does this chart bring, and from where":
// the CRDs rendered into a release manifest from templates/, the files in the crds/
// folders of the chart and its subcharts, and the CRDs of rendered manifests applied
// whole (Rendered). Rendered charts, stored release revisions and rendered manifests all
// go through it, so an upgrade and a rollback are judged from the same inputs. It also
// reads the StorageVersionMigrations a chart bundles with its CRDs.
package chartcrds

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// CRD is one CustomResourceDefinition a chart brings, with the file it came from. It is
// predict's type, so that the Helm lifecycle (predict.Apply) takes what this package reads.
type CRD = predict.ChartCRD

// FromManifest returns the CRDs in a rendered release manifest (templates/), naming each
// by its "# Source:" file. The documents are decoded side by side (a chart's CRDs are
// most of a large manifest's bytes); the CRDs and the first error keep the manifest's
// order.
func FromManifest(manifest string) ([]CRD, error) {
	docs, err := documents(manifest, "CustomResourceDefinition")
	if err != nil {
		return nil, err
	}
	found, errs := make([][]CRD, len(docs)), make([]error, len(docs))
	var wg sync.WaitGroup
	limit := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, d := range docs {
		wg.Go(func() {
			limit <- struct{}{}
			defer func() { <-limit }()
			crds, err := crdversions.FromManifest(d.file, []byte(d.content))
			for _, c := range crds {
				found[i] = append(found[i], CRD{CRD: c, Source: predict.Templates, File: d.file})
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return slices.Concat(found...), nil
}

// document is one document of a rendered manifest and the file its "# Source:" line names.
type document struct{ file, content string }

// documents are, in Helm's install order (the manifest's document order), the documents
// of a rendered manifest that name kind (a manifest that never names it is not split).
func documents(text, kind string) ([]document, error) {
	if !strings.Contains(text, kind) {
		return nil, nil
	}
	docs, err := manifest.Documents(text)
	if err != nil {
		return nil, err
	}
	var out []document
	for _, d := range docs {
		if strings.Contains(d.Text, kind) {
			out = append(out, document{file: cmp.Or(d.Source, fmt.Sprintf("document %d", d.Index)), content: d.Text})
		}
	}
	return out, nil
}

// FromCRDsDir returns the CRDs in the crds/ folders of a chart and its subcharts.
func FromCRDsDir(ch *chart.Chart) ([]CRD, error) {
	var out []CRD
	for _, obj := range ch.CRDObjects() {
		if obj.File == nil {
			continue
		}
		crds, err := crdversions.FromManifest(obj.Filename, obj.File.Data)
		if err != nil {
			return nil, err
		}
		for _, c := range crds {
			out = append(out, CRD{CRD: c, Source: predict.CRDsDir, File: obj.Filename})
		}
	}
	return out, nil
}

// All returns the CRDs of a chart: crds/ first, then templates/, with a CRD that appears
// in both reported once, from templates/ (the copy Helm keeps applying).
func All(ch *chart.Chart, manifest string) ([]CRD, error) {
	fromDir, err := FromCRDsDir(ch)
	if err != nil {
		return nil, err
	}
	fromTemplates, err := FromManifest(manifest)
	if err != nil {
		return nil, err
	}
	seen := map[string]int{}
	var out []CRD
	for _, c := range append(fromDir, fromTemplates...) {
		if i, ok := seen[c.CRD.Name]; ok {
			out[i] = c
			continue
		}
		seen[c.CRD.Name] = len(out)
		out = append(out, c)
	}
	return out, nil
}

// Rendered is what rendered manifests bring (helm template --include-crds, kustomize
// build, argocd app manifests): their CRDs, and the kinds of their other objects.
type Rendered struct {
	// Files are the files read, in order ("-" is standard input).
	Files []string
	// Documents counts the documents that hold objects.
	Documents int
	// CRDs are the CustomResourceDefinitions, each once: a CRD that appears twice is
	// the later copy, the one an apply leaves.
	CRDs []CRD
	// Objects counts the other objects by API group and kind (List items each count).
	Objects map[schema.GroupKind]int
	// Migrations are the StorageVersionMigrations among them (MigrationsFromManifest).
	Migrations []Migration
}

// Stdin is the name ReadRendered gives standard input.
const Stdin = "-"

// ReadRendered reads rendered manifests from path: a file, a directory (its *.yaml,
// *.yml and *.json files, in lexical order, not its subdirectories) or Stdin (read from
// stdin). Manifests without a single object are an error (*EmptyError): in a pipeline
// they mean that the command rendering them failed, not that there is nothing to apply.
func ReadRendered(path string, stdin io.Reader) (*Rendered, error) {
	r, err := readRendered(path, stdin)
	if err == nil && r.Documents == 0 {
		name := path
		if path == Stdin {
			name = "standard input"
		}
		return nil, &EmptyError{Name: name}
	}
	return r, err
}

// EmptyError says that rendered manifests hold no object at all.
type EmptyError struct{ Name string }

func (e *EmptyError) Error() string {
	return e.Name + " holds no Kubernetes object: if a command renders it, check that it succeeded (in a shell pipeline, set -o pipefail)"
}

func readRendered(path string, stdin io.Reader) (*Rendered, error) {
	r := &Rendered{Objects: map[schema.GroupKind]int{}}
	if path == Stdin {
		data, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("read manifests from standard input: %w", err)
		}
		return r, r.Add(Stdin, data)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if info.IsDir() {
		entries, err := os.ReadDir(path) // sorted by name
		if err != nil {
			return nil, err
		}
		files = files[:0]
		for _, e := range entries {
			if e.Type().IsRegular() && slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(e.Name())) {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s holds no *.yaml, *.yml or *.json file", path)
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := r.Add(f, data); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Add reads one file of rendered manifests. A CRD's source is read from the "# Source:"
// line Helm writes above each document (a crds/ file's later documents, and the
// document after a Source line that stands alone, carry the last line seen): crds/ or
// templates/ of the chart or a subchart, and templates/ when there is none. Its file is that source, else the file and document index.
func (r *Rendered) Add(file string, data []byte) error {
	name := file
	if file == Stdin {
		name = "standard input"
	}
	docs, err := crdversions.Documents(name, data)
	if err != nil {
		return err
	}
	if r.Objects == nil {
		r.Objects = map[schema.GroupKind]int{}
	}
	r.Files = append(r.Files, file)
	source := ""
	for _, d := range docs {
		if s := manifest.Source(string(d.Raw)); s != "" {
			source = s
		}
		if len(d.CRDs) > 0 || len(d.Objects) > 0 {
			r.Documents++
		}
		for _, o := range d.Objects {
			r.Objects[schema.GroupKind{Group: o.Group(), Kind: o.Kind}]++
		}
		if bytes.Contains(d.Raw, []byte("StorageVersionMigration")) {
			ms, err := MigrationsFromManifest(string(d.Raw))
			if err != nil {
				return fmt.Errorf("%s (document %d): %w", name, d.Index, err)
			}
			for i := range ms {
				if ms[i].File = source; source == "" {
					ms[i].File = fmt.Sprintf("%s (document %d)", name, d.Index)
				}
			}
			r.Migrations = append(r.Migrations, ms...)
		}
		for _, c := range d.CRDs {
			in := CRD{CRD: c, Source: predict.Templates, File: source}
			if source == "" {
				in.File = fmt.Sprintf("%s (document %d)", name, d.Index)
			} else if inCRDsDir(source) {
				in.Source = predict.CRDsDir
			}
			if i := slices.IndexFunc(r.CRDs, func(x CRD) bool { return x.CRD.Name == c.Name }); i >= 0 {
				r.CRDs = slices.Delete(r.CRDs, i, i+1)
			}
			r.CRDs = append(r.CRDs, in)
		}
	}
	return nil
}

// ObjectsOf counts the objects of crd's kind (any version) the manifests hold.
func (r *Rendered) ObjectsOf(crd *apiextv1.CustomResourceDefinition) int {
	return r.Objects[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}]
}

// inCRDsDir reports whether a Helm source path (chart/crds/x.yaml,
// chart/charts/sub/crds/x.yaml) is a file of a crds/ folder rather than templates/.
func inCRDsDir(source string) bool {
	parts := strings.Split(source, "/")
	i := 1
	for i+1 < len(parts) && parts[i] == "charts" {
		i += 2
	}
	return i < len(parts)-1 && parts[i] == "crds"
}

// Migration is one StorageVersionMigration a chart renders (predict's type, which judges it).
type Migration = predict.ChartMigration

// MigrationsFromManifest returns the StorageVersionMigrations (storagemigration.k8s.io,
// any version) in a rendered manifest, naming each by its "# Source:" file. It takes the
// manifest text alone, so a release manifest, a chart render and rendered manifests from
// elsewhere are read the same way.
func MigrationsFromManifest(manifest string) ([]Migration, error) {
	docs, err := documents(manifest, "StorageVersionMigration")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, d := range docs {
		file, content := d.file, d.content
		var obj struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name         string `json:"name"`
				GenerateName string `json:"generateName"`
			} `json:"metadata"`
			Spec struct {
				Resource struct {
					Group    string `json:"group"`
					Resource string `json:"resource"`
				} `json:"resource"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(content), &obj); err != nil {
			return nil, fmt.Errorf("%s: read the StorageVersionMigration: %w", file, err)
		}
		if obj.Kind != "StorageVersionMigration" || !strings.HasPrefix(obj.APIVersion, svm.Group+"/") {
			continue
		}
		if obj.Spec.Resource.Resource == "" {
			return nil, fmt.Errorf("%s: StorageVersionMigration %s has no spec.resource.resource: the API server refuses it", file, obj.Metadata.Name)
		}
		out = append(out, Migration{Name: obj.Metadata.Name, APIVersion: obj.APIVersion, File: file,
			Group: obj.Spec.Resource.Group, Resource: obj.Spec.Resource.Resource})
	}
	return out, nil
}
