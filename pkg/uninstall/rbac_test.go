package uninstall_test

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// TestUnverifiableOwnership: run by a user who may not read Secrets, Helm 4.3 cannot verify
// the release's Secret and skips it. The check says so (and, for Helm 4.2, which would
// delete it blind, says it could not run); the real Helm 4.3.1 uninstall as that user
// agrees.
func TestUnverifiableOwnership(t *testing.T) {
	needCluster(t)
	ns := "no-secrets"
	env := []string{"HELM_DRIVER=configmap"}
	mustHelm(t, env, "install", "db", dbChart(t, "1.0.0", nil), "-n", ns, "--create-namespace", "--set-json", `configMaps={"cfg":null}`)
	ctx := t.Context()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "uninstall-no-secrets"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "delete", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "persistentvolumes", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "list", "watch"}},
	}}
	if _, err := kube(t).RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "uninstall-no-secrets"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "no-secrets"}}}
	if _, err := kube(t).RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.WaitAuthorized(t, "no-secrets", nil, ns, role.Rules...)
	cfg, err := cp.AddUser("no-secrets")
	if err != nil {
		t.Fatal(err)
	}
	c, err := uninstall.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := uninstall.Options{Release: "db", Namespace: ns, Driver: helmrelease.DriverConfigMap}
	rep, err := uninstall.Check(ctx, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if s := objectByKind(rep, "Secret", "creds"); s.Action != uninstall.SkipUnverifiable {
		t.Errorf("Secret/creds: %s, want skip-unverifiable", s.Action)
	}
	if f := findings(rep, uninstall.CheckUnverifiable); len(f) != 1 || f[0].Subject != "Secret/no-secrets/creds" {
		t.Errorf("findings: %+v", rep.Findings)
	}
	opts.HelmVersion = "4.2"
	if _, err := uninstall.Check(ctx, c, opts); err == nil || !strings.Contains(err.Error(), "Secret/no-secrets/creds") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("Helm 4.2 as a user who cannot read the Secret: err %v, want could-not-run naming it", err)
	}

	kc, err := cp.UserKubeconfig("no-secrets")
	if err != nil {
		t.Fatal(err)
	}
	out := mustHelm(t, env, "uninstall", "db", "-n", ns, "--kubeconfig", kc)
	if _, err := kube(t).CoreV1().Secrets(ns).Get(ctx, "creds", metav1.GetOptions{}); err != nil {
		t.Errorf("the real uninstall deleted the Secret it could not verify: %v\n%s", err, out)
	}
	waitGoneConfigMap(t, ns, "cfg")
}
