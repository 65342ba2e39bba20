package argoapp

import (
	"slices"
	"strings"
)

// Deploying returns the Applications whose resource tree (status.resources) holds the
// object of group and kind named name in namespace ("" for a cluster-scoped object),
// sorted by namespace and name. It is how to find the Application that syncs a CRD:
// Argo CD's repo-server puts no tracking annotation or label on the CRDs it renders
// (v3.6 skips them on purpose), so the CRD itself does not say.
func Deploying(apps []*Application, group, kind, namespace, name string) []*Application {
	var out []*Application
	for _, app := range apps {
		if slices.ContainsFunc(app.Status.Resources, func(r ResourceStatus) bool {
			return r.Group == group && r.Kind == kind && r.Namespace == namespace && r.Name == name
		}) {
			out = append(out, app)
		}
	}
	slices.SortFunc(out, func(a, b *Application) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}
