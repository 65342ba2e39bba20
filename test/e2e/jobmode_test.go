//go:build e2e

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authzv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/node"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// jobTarget is Job mode as a platform team runs it: a platform control plane (no node)
// whose controller runs in this process and holds the StorageMigrations, and the
// package's control plane as the target cluster, with the node that runs the Job. Only
// one node may run on a machine (one kube-proxy owns the host's Service rules), so the
// platform has none: it needs none.
type jobTarget struct {
	platform client.Client
	cs       *kubernetes.Clientset // the target, as its administrator
	node     *node.Node
	image    string
	ns       string // the Job namespace on the target
}

// startJobTarget puts the target in the Flux incident (fluxIncident: n HelmRepositories
// in namespace ns, returned as there), builds the image, starts the node on the target
// with it, cordoned, and a platform control plane with upgradeguard's CRDs, the
// kubeconfig Secret of the target there and the controller's manager (with --job-image
// set to the image). When the test ends, whatever Job mode left on the target (a failed
// migration keeps its Job) is deleted before the node stops.
func startJobTarget(t *testing.T, ns string, n int) (jt *jobTarget, crds apiextclient.Interface, next *apiextv1.CustomResourceDefinition) {
	t.Helper()
	ctx := t.Context()
	crds, next = fluxIncident(t, ns, n)
	ref, _, archive := buildImage(t, e2eVersion)
	node := node.Start(t, cp, node.Options{Images: []string{archive}})
	cs, err := kubernetes.NewForConfig(cp.Config)
	must(t, err, "clientset")
	jt = &jobTarget{cs: cs, node: node, image: ref, ns: controller.DefaultJobNamespace}
	t.Cleanup(func() { jt.cleanTarget(t) })

	platform := testenv.ForTest(t)
	must(t, testenv.ApplyUpgradeguardCRDs(ctx, platform.Config), "install upgradeguard's CRDs on the platform")
	jt.platform, err = client.New(platform.Config, client.Options{Scheme: controller.NewScheme()})
	must(t, err, "platform client")
	kubeconfig, err := os.ReadFile(cp.Kubeconfig)
	must(t, err, "read the target's kubeconfig")
	must(t, jt.platform.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: "default"},
		Data: map[string][]byte{"value": kubeconfig}}), "create the target's kubeconfig Secret")

	mgr, err := controller.NewManager(platform.Config, controller.Options{LeaderElectionNamespace: "default",
		MetricsAddr: "0", ProbeAddr: "0", SkipNameValidation: true, JobImage: ref})
	must(t, err, "controller manager")
	testenv.RunManager(t, mgr)
	// Cordoned until the test has read the generated RBAC: no Job runs before.
	kubectl(t, "cordon", node.Name)
	return jt, crds, next
}

// cleanTarget deletes the Job namespace and the migration's cluster roles on the target
// and waits until the namespace is gone (its Pods stopped by the kubelet).
func (jt *jobTarget) cleanTarget(t *testing.T) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	if t.Failed() {
		t.Logf("Job namespace:\n%s\nkubelet:\n%s", kubectlOut("describe", "jobs,pods", "-n", jt.ns), jt.node.Log("kubelet", 40))
	}
	sel := metav1.ListOptions{LabelSelector: controller.LabelStorageMigration}
	if err := jt.cs.RbacV1().ClusterRoleBindings().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Errorf("cleanup: delete the migration's ClusterRoleBindings: %v", err)
	}
	if err := jt.cs.RbacV1().ClusterRoles().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Errorf("cleanup: delete the migration's ClusterRoles: %v", err)
	}
	if err := jt.cs.CoreV1().Namespaces().Delete(ctx, jt.ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("cleanup: delete namespace %s: %v", jt.ns, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := jt.cs.CoreV1().Namespaces().Get(ctx, jt.ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("cleanup: namespace %s not gone: %v", jt.ns, err)
	}
}

// migrate creates a mode Job StorageMigration of helmrepositories on the target.
func (jt *jobTarget) migrate(t *testing.T, name string) *v1alpha1.StorageMigration {
	t.Helper()
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.StorageMigrationSpec{
		Resources: []string{helmrepos}, Mode: v1alpha1.ModeJob, Rate: v1alpha1.RateSettings{PageSize: 100},
		KubeConfig: &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: "default", Name: "target"}}}}
	must(t, jt.platform.Create(t.Context(), sm), "create StorageMigration %s", name)
	return sm
}

// waitJob waits for the migration's Job on the target and returns it with the
// StorageMigration as the controller last wrote it.
func (jt *jobTarget) waitJob(t *testing.T, sm *v1alpha1.StorageMigration) (*batchv1.Job, *v1alpha1.StorageMigration) {
	t.Helper()
	var job *batchv1.Job
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := jt.platform.Get(ctx, client.ObjectKeyFromObject(sm), sm); err != nil {
			return false, err
		}
		var err error
		job, err = jt.cs.BatchV1().Jobs(jt.ns).Get(ctx, controller.JobName(sm), metav1.GetOptions{})
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("waiting for the migration Job of %s on the target: %v; status %+v", sm.Name, err, sm.Status)
	}
	return job, sm
}

// generatedRBAC reads the migration's ClusterRole and Role on the target and checks they
// are exactly what the controller generates for the CRD (JobObjects: `upgradeguard rbac`'s
// roles plus creating the result ConfigMap), and that its ServiceAccount is bound to
// nothing else.
func (jt *jobTarget) generatedRBAC(t *testing.T, crds apiextclient.Interface, sm *v1alpha1.StorageMigration) *rbacv1.ClusterRole {
	t.Helper()
	ctx, name := t.Context(), controller.JobName(sm)
	crd, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, helmrepos, metav1.GetOptions{})
	must(t, err, "read CRD %s", helmrepos)
	want := controller.JobObjects(sm, name, jt.ns, jt.image, []*apiextv1.CustomResourceDefinition{crd})
	cr, err := jt.cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	must(t, err, "read the migration's ClusterRole")
	role, err := jt.cs.RbacV1().Roles(jt.ns).Get(ctx, name, metav1.GetOptions{})
	must(t, err, "read the migration's Role")
	if d := cmp.Diff(want.ClusterRole.Rules, cr.Rules); d != "" {
		t.Errorf("ClusterRole %s rules (-generated +on the target):\n%s", name, d)
	}
	if d := cmp.Diff(want.Role.Rules, role.Rules); d != "" {
		t.Errorf("Role %s/%s rules (-generated +on the target):\n%s", jt.ns, name, d)
	}
	var bound []string
	crbs, err := jt.cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	must(t, err, "list ClusterRoleBindings")
	for _, b := range crbs.Items {
		if bindsSA(b.Subjects, jt.ns, name) {
			bound = append(bound, "ClusterRole/"+b.RoleRef.Name)
		}
	}
	rbs, err := jt.cs.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	must(t, err, "list RoleBindings")
	for _, b := range rbs.Items {
		if bindsSA(b.Subjects, jt.ns, name) {
			bound = append(bound, b.RoleRef.Kind+"/"+b.Namespace+"/"+b.RoleRef.Name)
		}
	}
	slices.Sort(bound)
	if w := []string{"ClusterRole/" + name, "Role/" + jt.ns + "/" + name}; !slices.Equal(bound, w) {
		t.Errorf("ServiceAccount %s/%s is bound to %v, want exactly %v", jt.ns, name, bound, w)
	}
	return cr
}

func bindsSA(subjects []rbacv1.Subject, ns, name string) bool {
	return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
		return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == ns && s.Name == name
	})
}

// jobWatch records, from before a migration starts, what happens in the Job namespace
// on the target: every state of the Job's Pods and the result ConfigMap as the Job
// wrote it (the controller deletes both after success).
type jobWatch struct {
	mu     sync.Mutex
	pods   map[string][]corev1.Pod // by name, every state seen
	result map[string]string       // ConfigMap name -> result.json
	stops  []func()
	done   sync.WaitGroup
}

func (jt *jobTarget) watch(t *testing.T) *jobWatch {
	t.Helper()
	ctx := t.Context()
	jw := &jobWatch{pods: map[string][]corev1.Pod{}, result: map[string]string{}}
	pw, err := jt.cs.CoreV1().Pods(jt.ns).Watch(ctx, metav1.ListOptions{})
	must(t, err, "watch Pods in %s", jt.ns)
	cw, err := jt.cs.CoreV1().ConfigMaps(jt.ns).Watch(ctx, metav1.ListOptions{})
	must(t, err, "watch ConfigMaps in %s", jt.ns)
	for _, w := range []watch.Interface{pw, cw} {
		jw.stops = append(jw.stops, w.Stop)
		jw.done.Add(1)
		go func() {
			defer jw.done.Done()
			for ev := range w.ResultChan() {
				jw.mu.Lock()
				switch o := ev.Object.(type) {
				case *corev1.Pod:
					jw.pods[o.Name] = append(jw.pods[o.Name], *o)
				case *corev1.ConfigMap:
					if r, ok := o.Data[migrate.ResultKey]; ok {
						jw.result[o.Name] = r
					}
				}
				jw.mu.Unlock()
			}
		}()
	}
	t.Cleanup(jw.stop)
	return jw
}

func (jw *jobWatch) stop() {
	for _, s := range jw.stops {
		s()
	}
	jw.done.Wait()
}

// ran says whether a Pod of the Job ran its container on the node with the image, as
// the Job's ServiceAccount, and what the watch saw of it.
func (jw *jobWatch) ran(job, node, image, sa string) (bool, string) {
	jw.mu.Lock()
	defer jw.mu.Unlock()
	var seen []string
	for name, states := range jw.pods {
		for _, p := range states {
			if p.Labels["job-name"] != job || len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			c := p.Status.ContainerStatuses[0]
			started := c.State.Running != nil || c.State.Terminated != nil
			seen = append(seen, fmt.Sprintf("%s on %q, image %s, started %v", name, p.Spec.NodeName, c.Image, started))
			if started && p.Spec.NodeName == node && c.Image == image && p.Spec.ServiceAccountName == sa && c.ImageID != "" {
				return true, ""
			}
		}
	}
	return false, strings.Join(seen, "; ")
}

// TestJobMode runs a `mode: Job` StorageMigration as a platform team does: the platform's controller creates the Job and its generated RBAC on the target, the
// target's kubelet runs it with the image `make image` builds, the Job migrates 300
// HelmRepositories (the Flux incident: stored at v1beta2 under flux2 2.17.2's CRDs) with
// exactly the generated permissions and writes its result ConfigMap; the controller
// copies the result into the StorageMigration's status and deletes what it created.
// Every object reads back intact and is stored at v1 in etcd, storedVersions is pruned,
// and flux2 2.18.2's CRD then applies.
func TestJobMode(t *testing.T) {
	const n, ns = 300, "job-mode"
	started := time.Now()
	jt, crds, next := startJobTarget(t, ns, n)
	jw := jt.watch(t)
	sm := jt.migrate(t, "job-mode")
	job, sm := jt.waitJob(t, sm)
	name := job.Name
	jt.generatedRBAC(t, crds, sm)
	kubectl(t, "uncordon", jt.node.Name)
	running := time.Now()

	sm = waitMigrationIn(t, jt.platform, sm.Name, 5*time.Minute, "to finish", terminal)
	t.Logf("the Job ran and the controller read its result %v after the node was uncordoned", time.Since(running).Round(time.Second))
	rp := assertSucceeded(t, sm, n)
	if rp.Rewritten != n || rp.Attempts != 1 || sm.Status.Job != jt.ns+"/"+name {
		t.Errorf("StorageMigration %s: job %q, progress %+v; want %s/%s with all %d rewritten in one attempt", sm.Name, sm.Status.Job, rp, jt.ns, name, n)
	}
	if ok, seen := jw.ran(name, jt.node.Name, jt.image, name); !ok {
		t.Errorf("no Pod of Job %s seen running on %s with image %s as ServiceAccount %s; seen: %s", name, jt.node.Name, jt.image, name, seen)
	}
	jt.resultMatches(t, jw, name, sm)
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v after the migration, want [v1]", got)
	}
	assertIntact(t, ns, n)
	must(t, testenv.ApplyCRD(t.Context(), crds, next), "apply flux2 2.18.2's %s after the migration", helmrepos)
	jt.cleanedUp(t, name)
	t.Logf("TestJobMode took %v", time.Since(started).Round(time.Second))
}

// resultMatches reads back the result ConfigMap the Job wrote (seen by the watch: the
// controller deletes it after success) and checks the status holds its counts.
func (jt *jobTarget) resultMatches(t *testing.T, jw *jobWatch, name string, sm *v1alpha1.StorageMigration) {
	t.Helper()
	jw.mu.Lock()
	raw, ok := jw.result[name]
	jw.mu.Unlock()
	if !ok {
		t.Fatalf("no result ConfigMap %s/%s with %s was seen", jt.ns, name, migrate.ResultKey)
	}
	var res controller.JobResult
	must(t, json.Unmarshal([]byte(raw), &res), "parse the Job's result")
	rp := sm.Status.Resources[0]
	if len(res.CRDs) != 1 {
		t.Fatalf("the Job's result has %d CRDs, want 1:\n%s", len(res.CRDs), raw)
	}
	c := res.CRDs[0]
	if c.Name != helmrepos || c.Status != migrate.Migrated || c.Objects != rp.Objects || c.Rewritten != rp.Rewritten ||
		c.AlreadyCurrent != rp.AlreadyCurrent || !slices.Equal(c.StoredVersionsAfter, rp.StoredVersionsAfter) {
		t.Errorf("the Job's result %+v; the StorageMigration's status %+v: want the same counts, Migrated", c, rp)
	}
}

// cleanedUp checks what the operator guide says a successful Job-mode migration deletes
// on the target: the Job (and so its Pods), ServiceAccount, roles, bindings and result
// ConfigMap. What stays is the Job namespace with what every namespace holds, and the
// migration Lease of the CRD (its holder released).
func (jt *jobTarget) cleanedUp(t *testing.T, name string) {
	t.Helper()
	ctx := t.Context()
	for what, get := range map[string]func() error{
		"ClusterRole": func() error { _, err := jt.cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{}); return err },
		"ClusterRoleBinding": func() error {
			_, err := jt.cs.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("%s %s after success: %v, want it deleted", what, name, err)
		}
	}
	var left []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		left = nil
		for _, o := range strings.Fields(kubectlOut("get", "all,secrets,configmaps,serviceaccounts,roles,rolebindings,leases", "-n", jt.ns, "-o", "name")) {
			if o != "serviceaccount/default" && o != "configmap/kube-root-ca.crt" && !strings.HasPrefix(o, "lease.coordination.k8s.io/") {
				left = append(left, o)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("after success, %s still holds %v", jt.ns, left)
	}
	leases, err := jt.cs.CoordinationV1().Leases(jt.ns).List(ctx, metav1.ListOptions{})
	must(t, err, "list Leases in %s", jt.ns)
	for _, l := range leases.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			t.Errorf("Lease %s/%s still held by %q after success", jt.ns, l.Name, *l.Spec.HolderIdentity)
		}
	}
	t.Logf("left in %s after success: the namespace's defaults and %d migration Lease(s)", jt.ns, len(leases.Items))
}

// waitDenied waits until the API server's authorizer denies user what (RBAC is read
// from a cache that follows the roles).
func (jt *jobTarget) waitDenied(t *testing.T, user string, what *authzv1.ResourceAttributes) {
	t.Helper()
	review := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: what}}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := jt.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && !got.Status.Allowed, err
	})
	must(t, err, "waiting for the API server to deny %s %s %s", user, what.Verb, what.Resource)
}

// waitFailed waits until StorageMigration name has finished and fails the test unless it
// failed (phase Failed, condition Failed True) with reason, when reason is set. It returns
// the migration and its Failed condition.
func (jt *jobTarget) waitFailed(t *testing.T, name, reason string) (*v1alpha1.StorageMigration, *metav1.Condition) {
	t.Helper()
	sm := waitMigrationIn(t, jt.platform, name, 5*time.Minute, "to finish", terminal)
	failed := findCondition(sm.Status.Conditions, v1alpha1.ConditionFailed)
	if sm.Status.Phase != v1alpha1.PhaseFailed || failed == nil || failed.Status != metav1.ConditionTrue || reason != "" && failed.Reason != reason {
		t.Fatalf("StorageMigration %s: phase %s, Failed condition %+v; want Failed (reason %q)", sm.Name, sm.Status.Phase, failed, reason)
	}
	t.Logf("the StorageMigration failed with: %s", failed.Message)
	return sm, failed
}

// TestJobModeMissingRule is TestJobMode with the generated ClusterRole lacking one rule,
// `update` on customresourcedefinitions/status (the prune), removed on the target before
// the node runs the Job. The Job re-persists every object and is refused the prune: the
// StorageMigration fails with the API server's 403 in its message, storedVersions stays
// [v1beta2 v1], and the Job and its objects are kept, with the 403 in `kubectl logs`.
func TestJobModeMissingRule(t *testing.T) {
	const n, ns = 200, "job-mode-403"
	started := time.Now()
	jt, crds, _ := startJobTarget(t, ns, n)
	sm := jt.migrate(t, "job-mode-403")
	job, sm := jt.waitJob(t, sm)
	name := job.Name
	cr := jt.generatedRBAC(t, crds, sm)
	i := slices.IndexFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Equal(r.Resources, []string{"customresourcedefinitions/status"})
	})
	if i < 0 {
		t.Fatalf("the generated ClusterRole has no rule for customresourcedefinitions/status: %v", cr.Rules)
	}
	cr.Rules = slices.Delete(cr.Rules, i, i+1)
	_, err := jt.cs.RbacV1().ClusterRoles().Update(t.Context(), cr, metav1.UpdateOptions{})
	must(t, err, "remove the prune rule from ClusterRole %s", name)
	sa := "system:serviceaccount:" + jt.ns + ":" + name
	jt.waitDenied(t, sa, &authzv1.ResourceAttributes{Group: apiextv1.GroupName, Resource: "customresourcedefinitions",
		Subresource: "status", Name: helmrepos, Verb: "update"})
	kubectl(t, "uncordon", jt.node.Name)

	sm, failed := jt.waitFailed(t, sm.Name, "")
	for _, want := range []string{"forbidden", sa, `"customresourcedefinitions/status"`, "kubectl -n " + jt.ns + " logs job/" + name} {
		if !strings.Contains(failed.Message, want) {
			t.Errorf("the Failed condition's message lacks %q:\n%s", want, failed.Message)
		}
	}
	if rp := sm.Status.Resources[0]; rp.Phase != v1alpha1.PhaseFailed || !strings.Contains(rp.Message, "forbidden") || rp.Rewritten+rp.AlreadyCurrent != n {
		t.Errorf("progress %+v; want Failed with the 403, all %d objects re-persisted", rp, n)
	}
	// Never a prune after a failure: the objects are at v1, storedVersions is untouched.
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Errorf("storedVersions %v after the failed migration, want [v1beta2 v1] untouched", got)
	}
	assertIntact(t, ns, n)

	// Kept for the operator: the Job, its ServiceAccount, roles, bindings and result, and
	// the first Pod's log has the 403.
	for _, o := range []string{"job/" + name, "serviceaccount/" + name, "role/" + name, "rolebinding/" + name, "configmap/" + name} {
		if out := kubectlOut("get", o, "-n", jt.ns, "-o", "name"); !strings.Contains(out, name) {
			t.Errorf("after the failure, %s on the target: %s; want it kept", o, strings.TrimSpace(out))
		}
	}
	logs := kubectlOut("-n", jt.ns, "logs", "job/"+name)
	if !strings.Contains(logs, "forbidden") || !strings.Contains(logs, "customresourcedefinitions/status") {
		t.Errorf("kubectl -n %s logs job/%s lacks the 403:\n%s", jt.ns, name, logs)
	}
	t.Logf("TestJobModeMissingRule took %v", time.Since(started).Round(time.Second))
}
