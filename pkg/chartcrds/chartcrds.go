// Package chartcrds owns the answer to "which CRDs does this chart bring, and from where":
// the CRDs rendered into a release manifest from templates/, and the files in the crds/
// folders of the chart and its subcharts. Rendered charts and stored release revisions
// both go through it, so an upgrade and a rollback are judged from the same inputs. It
// also reads the StorageVersionMigrations a chart bundles with its CRDs.
package chartcrds

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// CRD is one CustomResourceDefinition a chart brings, with the file it came from. It is
// predict's type, so that the Helm lifecycle (predict.Apply) takes what this package reads.
type CRD = predict.ChartCRD

// FromManifest returns the CRDs in a rendered release manifest (templates/), naming each
// by its "# Source:" file.
func FromManifest(manifest string) ([]CRD, error) {
	if manifest == "" {
		return nil, nil
	}
	docs := releaseutil.SplitManifests(manifest)
	keys := slices.Collect(maps.Keys(docs))
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	var out []CRD
	for _, k := range keys {
		content := docs[k]
		// Only a document that names the kind can be a CRD: the others are not parsed.
		if !strings.Contains(content, "CustomResourceDefinition") {
			continue
		}
		file := sourceFile(content, k)
		crds, err := crdversions.FromManifest(file, []byte(content))
		if err != nil {
			return nil, err
		}
		for _, c := range crds {
			out = append(out, CRD{CRD: c, Source: predict.Templates, File: file})
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

// sourceFile reads the "# Source: chart/templates/x.yaml" line Helm puts above every
// rendered document.
func sourceFile(content, fallback string) string {
	for _, line := range strings.SplitN(content, "\n", 3) {
		if f, ok := strings.CutPrefix(strings.TrimSpace(line), "# Source: "); ok {
			return f
		}
	}
	return fallback
}

// Migration is one StorageVersionMigration a chart renders (predict's type, which judges it).
type Migration = predict.ChartMigration

// MigrationsFromManifest returns the StorageVersionMigrations (storagemigration.k8s.io,
// any version) in a rendered manifest, naming each by its "# Source:" file. It takes the
// manifest text alone, so a release manifest, a chart render and rendered manifests from
// elsewhere are read the same way.
func MigrationsFromManifest(manifest string) ([]Migration, error) {
	if manifest == "" {
		return nil, nil
	}
	docs := releaseutil.SplitManifests(manifest)
	keys := slices.Collect(maps.Keys(docs))
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	var out []Migration
	for _, k := range keys {
		content := docs[k]
		// Only a document that names the kind can be one: the others are not parsed.
		if !strings.Contains(content, "StorageVersionMigration") {
			continue
		}
		file := sourceFile(content, k)
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
