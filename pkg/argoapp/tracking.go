package argoapp

import "strings"

// TrackingAnnotation is the annotation Argo CD puts on every object an Application syncs
// (its default resource tracking since v3, and with tracking method annotation+label):
// <app>:<group>/<kind>:<namespace>/<name>. <app> is the Application's name when it lives
// in Argo CD's own namespace, else <namespace>_<name>.
const TrackingAnnotation = "argocd.argoproj.io/tracking-id"

// TrackedBy returns the Application (namespace and name) that annotations' tracking id
// names, and whether there is one. An Application in Argo CD's own namespace is named
// without it, and is returned in DefaultNamespace: Argo CD's namespace is not in the
// object.
func TrackedBy(annotations map[string]string) (namespace, name string, ok bool) {
	app, rest, found := strings.Cut(annotations[TrackingAnnotation], ":")
	if !found || app == "" || strings.Count(rest, ":") != 1 {
		return "", "", false
	}
	// Application names are DNS subdomains: no underscore, so the first one parts the
	// namespace from the name.
	if ns, n, namespaced := strings.Cut(app, "_"); namespaced {
		if ns == "" || n == "" {
			return "", "", false
		}
		return ns, n, true
	}
	return DefaultNamespace, app, true
}
