// Package chartcrds owns the answer to "which CRDs does this chart bring, and from where":
// the CRDs rendered into a release manifest from templates/, and the files in the crds/
// folders of the chart and its subcharts. Rendered charts and stored release revisions
// both go through it, so an upgrade and a rollback are judged from the same inputs.
package chartcrds

import (
	"maps"
	"slices"
	"sort"
	"strings"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
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
