package review

import (
	"context"
	"path"
	"slices"

	"helm.sh/helm/v4/pkg/cli"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
)

// WhatCRDs is Change.What of a file of CRD manifests the change touches.
const WhatCRDs = "crds"

var crdKind = schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}

// manifestChanges finds the files of CustomResourceDefinitions the change adds or
// changes, each judged as check --manifests judges the file: every CRD in it applied to
// the cluster (check.PredictManifests). A chart's own files (a folder with a Chart.yaml
// above them) are the chart's, judged with the chart.
func manifestChanges(base, head *Tree) []Change {
	var out []Change
	for _, file := range sortedFiles(head) {
		if inChart(head, file) {
			continue
		}
		var changed *Object
		for _, o := range head.Objects {
			if o.File != file || o.GroupVersionKind().GroupKind() != crdKind {
				continue
			}
			before, ok := base.Find(keyOf(o.Unstructured), file)
			if !ok || !apiequality.Semantic.DeepEqual(before.Object, o.Object) {
				changed = &o
				break
			}
		}
		if changed == nil {
			continue
		}
		data := head.Files[file]
		out = append(out, Change{Subject: file, File: file, Line: changed.Line("spec", "versions"), What: WhatCRDs,
			judge: func(ctx context.Context, cl Cluster, _ *cli.EnvSettings) (*check.Report, string, error) {
				r := &chartcrds.Rendered{}
				if err := r.Add(file, data); err != nil {
					return nil, err.Error(), nil
				}
				var cluster check.Cluster
				if rec := cl.recorded(); rec != nil {
					cluster = rec
				} else {
					t, err := cl.connect(ctx)
					if err != nil {
						return nil, "", err
					}
					cluster = t.Cluster
				}
				p, err := check.PredictManifests(ctx, check.Sources{Cluster: cluster}, r)
				if err != nil {
					return nil, "", err
				}
				return p.Report, "", nil
			}})
	}
	return out
}

// sortedFiles are the tree's YAML files in order.
func sortedFiles(t *Tree) []string {
	files := make([]string, 0, len(t.Files))
	for f := range t.Files {
		files = append(files, f)
	}
	slices.Sort(files)
	return files
}

// inChart says whether file is part of a chart in the tree: a Chart.yaml in its folder
// or one above.
func inChart(t *Tree, file string) bool {
	for dir := path.Dir(file); ; dir = path.Dir(dir) {
		name := "Chart.yaml"
		if dir != "." {
			name = dir + "/Chart.yaml"
		}
		if _, ok := t.Files[name]; ok {
			return true
		}
		if dir == "." || dir == "/" {
			return false
		}
	}
}
