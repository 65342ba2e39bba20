package migrate_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// TestLeastPrivilege runs the migration as a token-authenticated user bound to exactly
// the role RBAC prints, then removes each rule in turn: every removal must make the run
// fail with a 403 that names the verb and resource, and must leave storedVersions alone.
func TestLeastPrivilege(t *testing.T) {
	e := fluxState(t, []string{"a"}, 5)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, helmrepos, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := migrate.RBAC("ug-min", "default", []*apiextv1.CustomResourceDefinition{crd}, false)
	cp.BindRoles(t, "migrator", p.ClusterRole, p.Role)
	m := newMigrator(t, cp.TokenConfig("migrator"))
	run := func() (*migrate.Result, error) {
		// Each run starts unmigrated and without a Lease, so every rule is exercised.
		if err := testenv.SetStoredVersions(e.ctx, e.crds, helmrepos, "v1beta2", "v1"); err != nil {
			t.Fatal(err)
		}
		_ = cs.CoordinationV1().Leases("default").Delete(e.ctx, "upgradeguard-migrate-"+helmrepos, metav1.DeleteOptions{})
		return m.Migrate(e.ctx, migrate.Target{Name: helmrepos}, opts())
	}
	if res, err := run(); err != nil || res.Status != migrate.Migrated {
		t.Fatalf("with exactly the printed role: %v %+v", err, res)
	}

	type ruleRef struct {
		role  string
		index int
	}
	var refs []ruleRef
	for i := range p.ClusterRole.Rules {
		refs = append(refs, ruleRef{"ClusterRole", i})
	}
	for i := range p.Role.Rules {
		refs = append(refs, ruleRef{"Role", i})
	}
	for _, ref := range refs {
		rules := p.ClusterRole.Rules
		if ref.role == "Role" {
			rules = p.Role.Rules
		}
		rule := rules[ref.index]
		t.Run(fmt.Sprintf("without %s %v %v", ref.role, rule.Resources, rule.Verbs), func(t *testing.T) {
			setRules(t, cs, ref.role, slices.Delete(slices.Clone(rules), ref.index, ref.index+1))
			defer func() {
				setRules(t, cs, ref.role, rules)
				cp.WaitAuthorized(t, "migrator", nil, p.Role.Namespace, p.Role.Rules...)
				cp.WaitAuthorized(t, "migrator", nil, "", p.ClusterRole.Rules...)
			}()
			waitDenied(t, cs, rule, ref.role)
			res, err := run()
			msg := ""
			switch {
			case err != nil:
				msg = err.Error()
			case res.Status == migrate.Migrated:
				t.Fatalf("migrated without %v %v", rule.Resources, rule.Verbs)
			default:
				msg = res.Message
			}
			resource := strings.Split(rule.Resources[0], "/")[0]
			if !strings.Contains(msg, "forbidden") || !strings.Contains(msg, resource) || !strings.Contains(msg, "cannot") {
				t.Errorf("message %q does not name the 403, the verb and %s", msg, resource)
			}
			if got := storedVersions(t, e, helmrepos); strings.Join(got, ",") != "v1beta2,v1" {
				t.Errorf("storedVersions %v, want untouched", got)
			}
		})
	}
}

func setRules(t *testing.T, cs kubernetes.Interface, kind string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	if kind == "ClusterRole" {
		r, err := cs.RbacV1().ClusterRoles().Get(ctx, "ug-min", metav1.GetOptions{})
		if err == nil {
			r.Rules = rules
			_, err = cs.RbacV1().ClusterRoles().Update(ctx, r, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	r, err := cs.RbacV1().Roles("default").Get(ctx, "ug-min", metav1.GetOptions{})
	if err == nil {
		r.Rules = rules
		_, err = cs.RbacV1().Roles("default").Update(ctx, r, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// waitDenied waits until the authorizer has seen the removal (RBAC is read from a cache).
func waitDenied(t *testing.T, cs kubernetes.Interface, rule rbacv1.PolicyRule, kind string) {
	t.Helper()
	namespace := ""
	if kind == "Role" {
		namespace = "default"
	}
	attrs := testenv.RuleAttributes(rule, namespace)
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: "migrator", ResourceAttributes: attrs}}, metav1.CreateOptions{})
		return err == nil && !sar.Status.Allowed, err
	})
	if err != nil {
		t.Fatalf("the authorizer still allows %+v: %v", attrs, err)
	}
}
