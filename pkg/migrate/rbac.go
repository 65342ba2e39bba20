package migrate

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Permissions are the least privileges a migration of some CRDs needs: a ClusterRole for
// the CRDs and their objects, and a Role for the Leases in the lease namespace.
type Permissions struct {
	ClusterRole *rbacv1.ClusterRole `json:"clusterRole"`
	Role        *rbacv1.Role        `json:"role"`
}

// RBACFor is RBAC for the CRDs named, looked up in live (the cluster's CRDs by name), for
// the engine: BuiltinRBAC for EngineBuiltin, RBAC otherwise (auto with patch rights runs
// the client engine).
func RBACFor(engine Engine, name, leaseNamespace string, names []string, live map[string]*apiextv1.CustomResourceDefinition, storageSwitch bool) (Permissions, error) {
	crds := make([]*apiextv1.CustomResourceDefinition, 0, len(names))
	for _, n := range names {
		c, ok := live[n]
		if !ok {
			return Permissions{}, &CRDNotFoundError{Name: n}
		}
		crds = append(crds, c)
	}
	if engine == EngineBuiltin {
		return BuiltinRBAC(name, leaseNamespace, crds, storageSwitch), nil
	}
	return RBAC(name, leaseNamespace, crds, storageSwitch), nil
}

// RBAC returns the minimal permissions to migrate the given CRDs. With storageSwitch, the
// role may also change the CRDs' storage version (reverse migrations).
func RBAC(name, leaseNamespace string, crds []*apiextv1.CustomResourceDefinition, storageSwitch bool) Permissions {
	names := make([]string, 0, len(crds))
	leases := make([]string, 0, len(crds))
	var rules []rbacv1.PolicyRule
	for _, c := range crds {
		names = append(names, c.Name)
		leases = append(leases, leaseName(c.Name))
		rules = append(rules, rbacv1.PolicyRule{
			APIGroups: []string{c.Spec.Group}, Resources: []string{c.Spec.Names.Plural}, Verbs: []string{"get", "list", "patch"},
		})
	}
	return permissions(name, leaseNamespace, append(crdRules(names, storageSwitch), rules...), leases)
}

// BuiltinRBAC returns the minimal permissions to migrate the given CRDs with the builtin
// engine: StorageVersionMigrations instead of patch on every object, and the CRDs and
// their status for the prune. The custom resources are only listed, never written: a run
// reads the objects stored at other versions to judge which fields the migration would
// drop (Options.AllowFieldLoss).
func BuiltinRBAC(name, leaseNamespace string, crds []*apiextv1.CustomResourceDefinition, storageSwitch bool) Permissions {
	names := make([]string, 0, len(crds))
	leases := make([]string, 0, len(crds))
	var read []rbacv1.PolicyRule
	for _, c := range crds {
		names = append(names, c.Name)
		leases = append(leases, leaseName(c.Name))
		read = append(read, rbacv1.PolicyRule{APIGroups: []string{c.Spec.Group}, Resources: []string{c.Spec.Names.Plural}, Verbs: []string{"list"}})
	}
	// StorageVersionMigrations get generated names, so no rule can name them; list and
	// watch also show migrations in progress.
	rules := append(crdRules(names, storageSwitch), rbacv1.PolicyRule{APIGroups: []string{StorageMigrationGroup},
		Resources: []string{"storageversionmigrations"}, Verbs: []string{"create", "get", "list", "watch", "delete"}})
	return permissions(name, leaseNamespace, append(rules, read...), leases)
}

// crdRules read the CRDs and update their status (the prune), by name; with
// storageSwitch also change their storage version.
func crdRules(names []string, storageSwitch bool) []rbacv1.PolicyRule {
	names = slices.Clone(names)
	slices.Sort(names)
	crdVerbs := []string{"get"}
	if storageSwitch {
		crdVerbs = []string{"get", "patch", "update"}
	}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{apiextv1.GroupName}, Resources: []string{"customresourcedefinitions"}, ResourceNames: names, Verbs: crdVerbs},
		{APIGroups: []string{apiextv1.GroupName}, Resources: []string{"customresourcedefinitions/status"}, ResourceNames: names, Verbs: []string{"get", "update"}},
	}
}

// permissions are the ClusterRole with rules and the Role for the migration Leases.
func permissions(name, leaseNamespace string, rules []rbacv1.PolicyRule, leases []string) Permissions {
	slices.Sort(leases)
	labels := map[string]string{"app.kubernetes.io/managed-by": "upgradeguard"}
	return Permissions{
		ClusterRole: &rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Rules:      rules,
		},
		Role: &rbacv1.Role{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "Role"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: leaseNamespace, Labels: labels},
			Rules: []rbacv1.PolicyRule{
				// create cannot be limited by name: the API server does not know it yet.
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: leases, Verbs: []string{"get", "update"}},
			},
		},
	}
}
