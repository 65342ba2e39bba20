package check

import (
	"cmp"
	"context"
	"slices"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
)

// ManifestsPolicy is the CRD policy of rendered manifests applied whole (kubectl apply of
// helm template --include-crds or kustomize build, Argo CD's sync): every CRD in them is
// created or replaced, whether the chart kept it in crds/ or templates/. It is
// PolicyCreateReplace, the policy of Flux's upgrade.crds=CreateReplace.
const ManifestsPolicy = PolicyCreateReplace

// ManifestSummary says what rendered manifests hold besides the CRDs the report judges.
type ManifestSummary struct {
	// Files are the files read ("-" is standard input).
	Files []string `json:"files"`
	// Documents counts the documents that hold objects; CRDs the CRDs among the objects.
	Documents int `json:"documents"`
	CRDs      int `json:"crds"`
	// Objects counts the other objects. Their storage is not judged: only the objects of
	// a CRD's kind are counted, on that CRD's row (CRDReport.ManifestObjects) or, for a
	// CRD the manifests do not bring, in LiveCRDObjects.
	Objects int `json:"objects"`
	// LiveCRDObjects counts the objects whose kind a live CRD serves that the manifests
	// do not bring, per CRD.
	LiveCRDObjects []CustomResourceCount `json:"liveCRDObjects,omitempty"`
}

// CustomResourceCount is how many objects of one CRD's kind rendered manifests carry.
type CustomResourceCount struct {
	CRD     string `json:"crd"`
	Kind    string `json:"kind"`
	Objects int    `json:"objects"`
}

// PredictManifests predicts applying rendered manifests whole, with Predict: an upgrade
// in which every CRD the manifests carry is applied (ManifestsPolicy) and no release is
// read, so no CRD is found deleted (applying manifests deletes nothing). s's Chart,
// Policy, Releases, Record, Rollback and Current are set for that. The report's
// Manifests, and each CRD's ManifestObjects, count the objects the manifests carry.
func PredictManifests(ctx context.Context, s Sources, r *chartcrds.Rendered) (*Prediction, error) {
	s.Chart = func(context.Context, bool) (*Chart, error) {
		return &Chart{CRDs: r.CRDs, Migrations: r.Migrations}, nil
	}
	s.Policy, s.Releases, s.Record, s.Rollback, s.ToRevision, s.Current = ManifestsPolicy, nil, nil, false, 0, nil
	p, err := Predict(ctx, s)
	if err != nil {
		return nil, err
	}
	p.Report.Manifests = summarize(r, p.Live, p.Report.CRDs)
	return p, nil
}

// summarize counts the manifests' objects: per CRD of the report, per live CRD the
// manifests do not bring, and in all.
func summarize(r *chartcrds.Rendered, live map[string]*apiextv1.CustomResourceDefinition, rows []CRDReport) *ManifestSummary {
	sum := &ManifestSummary{Files: slices.Clone(r.Files), Documents: r.Documents, CRDs: len(r.CRDs)}
	counted := map[schema.GroupKind]bool{}
	byName := map[string]*apiextv1.CustomResourceDefinition{}
	for _, c := range r.CRDs {
		byName[c.CRD.Name] = c.CRD
	}
	for i := range rows {
		crd := byName[rows[i].Name]
		if crd == nil {
			continue
		}
		n := r.ObjectsOf(crd)
		rows[i].ManifestObjects = &n
		counted[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}] = true
	}
	for gk, n := range r.Objects {
		sum.Objects += n
		if counted[gk] {
			continue
		}
		for _, l := range live {
			if l.Spec.Group == gk.Group && l.Spec.Names.Kind == gk.Kind {
				sum.LiveCRDObjects = append(sum.LiveCRDObjects, CustomResourceCount{CRD: l.Name, Kind: gk.Kind, Objects: n})
				break
			}
		}
	}
	slices.SortFunc(sum.LiveCRDObjects, func(a, b CustomResourceCount) int { return cmp.Compare(a.CRD, b.CRD) })
	return sum
}
