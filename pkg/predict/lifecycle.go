package predict

import (
	"fmt"
	"slices"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// Policy says which CRDs an upgrade or rollback writes when they already exist.
type Policy string

const (
	// PolicyHelm is plain Helm: CRDs in crds/ are created when missing and never upgraded.
	PolicyHelm Policy = "helm"
	// PolicyCreateReplace is Flux's upgrade.crds=CreateReplace: crds/ files are applied too.
	PolicyCreateReplace Policy = "create-replace"
)

// ParsePolicy validates a policy name; empty is PolicyHelm.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyHelm, PolicyCreateReplace:
		return p, nil
	case "":
		return PolicyHelm, nil
	}
	return "", fmt.Errorf("unknown CRD policy %q: use %s (plain Helm) or %s (Flux upgrade.crds=CreateReplace)", s, PolicyHelm, PolicyCreateReplace)
}

// Applies reports whether an operation under p writes an existing CRD that sits at
// source in its chart: templates/ always, crds/ only under PolicyCreateReplace. A missing
// CRD is created whatever its source.
func (p Policy) Applies(source Source) bool {
	return source == Templates || p == PolicyCreateReplace
}

// ChartCRD is one CRD a chart version or a release revision brings, with where it sits in
// the chart (package chartcrds reads them from charts and release manifests).
type ChartCRD struct {
	CRD    *apiextv1.CustomResourceDefinition
	Source Source
	// File is the chart file it came from, for messages.
	File string
}

// Apply returns the cluster's CRDs after Helm applies a chart to them: the incoming CRDs
// the policy applies take the incoming spec, keep the live annotations the incoming ones
// do not set, and add the incoming storage version to status.storedVersions (the API
// server's rule); missing ones are created with only their storage version stored; those
// it does not apply stay as they are; and a CRD that current (what the release deploys
// today) renders from templates/ and incoming no longer brings is deleted, unless the
// live CRD carries helm.sh/resource-policy: keep. It is the same for an upgrade and a
// rollback. live is not changed: the result shares the CRDs Apply leaves alone and holds
// copies of the others.
func Apply(live map[string]*apiextv1.CustomResourceDefinition, incoming, current []ChartCRD, p Policy) map[string]*apiextv1.CustomResourceDefinition {
	after := make(map[string]*apiextv1.CustomResourceDefinition, len(live)+len(incoming))
	for name, c := range live {
		after[name] = c
	}
	brought := map[string]bool{}
	for _, in := range incoming {
		brought[in.CRD.Name] = true
		l := after[in.CRD.Name]
		switch {
		case l == nil:
			c := in.CRD.DeepCopy()
			c.Status.StoredVersions = []string{crdversions.StorageVersion(c)}
			after[c.Name] = c
		case p.Applies(in.Source):
			c := in.CRD.DeepCopy()
			c.Annotations = mergeAnnotations(l.Annotations, c.Annotations)
			c.Status.StoredVersions = slices.Clone(l.Status.StoredVersions)
			if sv := crdversions.StorageVersion(c); !slices.Contains(c.Status.StoredVersions, sv) {
				c.Status.StoredVersions = append(c.Status.StoredVersions, sv)
			}
			after[c.Name] = c
		}
	}
	for _, cur := range current {
		if l := after[cur.CRD.Name]; l != nil && Dropped(cur, brought[cur.CRD.Name]) && !Kept(l) {
			delete(after, cur.CRD.Name)
		}
	}
	return after
}

// Dropped reports whether an upgrade or rollback drops a CRD the release deploys today
// (cur), given whether the incoming side brings a CRD of that name: Helm deletes what the
// old manifest (templates/) lists and the new one does not, unless the live CRD carries
// helm.sh/resource-policy: keep (DecideRemoved judges it).
func Dropped(cur ChartCRD, brought bool) bool {
	return cur.Source == Templates && !brought
}

// Kept reports whether crd carries Helm's helm.sh/resource-policy: keep.
func Kept(crd *apiextv1.CustomResourceDefinition) bool {
	return crd.Annotations[KeepAnnotation] == KeepValue
}

// Uninstalls lists the live CRDs that helm uninstall of a revision whose CRDs are
// deployed deletes, with every object of their types: the ones its manifest renders from
// templates/ (crds/ files are never deleted), unless the manifest itself marks them
// helm.sh/resource-policy: keep (helm uninstall reads the policy from the manifest, not
// from the live object).
func Uninstalls(live map[string]*apiextv1.CustomResourceDefinition, deployed []ChartCRD) []string {
	var out []string
	for _, d := range deployed {
		if d.Source != Templates || live[d.CRD.Name] == nil || Kept(d.CRD) {
			continue
		}
		out = append(out, d.CRD.Name)
	}
	return out
}

func mergeAnnotations(live, incoming map[string]string) map[string]string {
	if len(live) == 0 {
		return incoming
	}
	out := make(map[string]string, len(live)+len(incoming))
	for k, v := range live {
		out[k] = v
	}
	for k, v := range incoming {
		out[k] = v
	}
	return out
}
