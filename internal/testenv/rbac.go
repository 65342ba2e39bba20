package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Grant gives user the rules, cluster-wide, through a ClusterRole and a ClusterRoleBinding
// both named user, removed when the test ends, and returns once the API server authorizes
// them (WaitAuthorized). A test acts as user with AddUser's config.
func (c *ControlPlane) Grant(t testing.TB, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	c.bind(t, user, user, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}, rules)
	c.WaitAuthorized(t, user, nil, "", rules...)
}

// GrantClusterAdmin binds user to the cluster-admin ClusterRole until the test ends and
// returns once the API server authorizes it: a user outside system:masters with every
// right, whose requests Priority and Fairness classifies as anyone's.
func (c *ControlPlane) GrantClusterAdmin(t testing.TB, user string, groups ...string) {
	t.Helper()
	c.bind(t, "cluster-admin-"+user, "cluster-admin", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}, nil)
	c.WaitAuthorized(t, user, groups, "", rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}})
}

// bind creates a ClusterRoleBinding name of role to subject, and the ClusterRole role with
// rules when rules are given; both are removed when the test ends.
func (c *ControlPlane) bind(t testing.TB, name, role string, subject rbacv1.Subject, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := t.Context()
	kc := kubernetes.NewForConfigOrDie(c.Config)
	if rules != nil {
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}
		if _, err := kc.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kc.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{subject}}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// WaitAuthorized returns once the API server's authorizer lets user, in groups, do the
// first verb of each rule on the rule's first group and resource, in namespace ("" for
// every namespace). A new binding reaches the RBAC authorizer through its informer a
// moment after the create returns, and a request in that moment is forbidden; on a loaded
// machine the moment is long enough for a test's next request to fall into it.
func (c *ControlPlane) WaitAuthorized(t testing.TB, user string, groups []string, namespace string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	WaitAuthorized(t, kubernetes.NewForConfigOrDie(c.Config), user, groups, namespace, rules...)
}

// WaitAuthorized is ControlPlane.WaitAuthorized on the API server kc talks to.
func WaitAuthorized(t testing.TB, kc kubernetes.Interface, user string, groups []string, namespace string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			continue // the tests' bindings grant resources; a URL rule is not waited for
		}
		attrs := RuleAttributes(r, namespace)
		var last string
		err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: attrs}}
			got, err := kc.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			last = got.Status.Reason
			return got.Status.Allowed, nil
		})
		if err != nil {
			t.Fatalf("%s (groups %s) is still not allowed to %s %s/%s.%s in %q a minute after its binding: %v (%s)",
				user, strings.Join(groups, ","), attrs.Verb, attrs.Resource, attrs.Subresource, attrs.Group, namespace, err, last)
		}
	}
}

// BindRoles creates clusterRole and role (a namespaced Role, or nil) and binds each to user
// under its own name, until the test ends; it returns once the API server authorizes both
// roles' rules (WaitAuthorized).
func (c *ControlPlane) BindRoles(t testing.TB, user string, clusterRole *rbacv1.ClusterRole, role *rbacv1.Role) {
	t.Helper()
	subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}
	c.bind(t, clusterRole.Name, clusterRole.Name, subject, clusterRole.Rules)
	c.WaitAuthorized(t, user, nil, "", clusterRole.Rules...)
	if role == nil {
		return
	}
	ctx := t.Context()
	kc := kubernetes.NewForConfigOrDie(c.Config)
	if _, err := kc.RbacV1().Roles(role.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: role.Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{subject}}
	if _, err := kc.RbacV1().RoleBindings(role.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.RbacV1().RoleBindings(role.Namespace).Delete(context.Background(), role.Name, metav1.DeleteOptions{})
		_ = kc.RbacV1().Roles(role.Namespace).Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	c.WaitAuthorized(t, user, nil, role.Namespace, role.Rules...)
}

// RuleAttributes are what a SubjectAccessReview asks of rule: its first verb on its first
// group, resource (and subresource, "pods/log") and resource name, in namespace.
func RuleAttributes(rule rbacv1.PolicyRule, namespace string) *authorizationv1.ResourceAttributes {
	first := func(s []string) string {
		if len(s) == 0 {
			return ""
		}
		return s[0]
	}
	resource, sub, _ := strings.Cut(first(rule.Resources), "/")
	return &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: first(rule.Verbs), Group: first(rule.APIGroups),
		Resource: resource, Subresource: sub, Name: first(rule.ResourceNames)}
}
