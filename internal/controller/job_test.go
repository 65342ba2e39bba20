package controller_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// saKubeconfig writes a kubeconfig that authenticates as ServiceAccount ns/name with a
// token the API server issues for it (TokenRequest), as the kubelet would mount it.
func saKubeconfig(t *testing.T, cp *testenv.ControlPlane, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptrInt64(600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["target"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "target", AuthInfo: "sa", Namespace: ns}
	cfg.CurrentContext = "sa"
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func ptrInt64(v int64) *int64 { return &v }

// runAs runs upgradeguard with args, as the kubeconfig's identity.
func runAs(t *testing.T, kubeconfig string, args []string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := cli.Execute(t.Context(), append(slices.Clone(args), "--kubeconfig", kubeconfig), cli.Streams{Out: &out, ErrOut: &out})
	return code, out.String()
}

// grant creates ServiceAccount ns/name bound to a ClusterRole and a Role with the rules.
func grant(t *testing.T, cs kubernetes.Interface, ns, name string, cluster, local []rbacv1.PolicyRule) {
	t.Helper()
	ctx := t.Context()
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}
	om := metav1.ObjectMeta{Name: name, Namespace: ns}
	for _, err := range []error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: om}, metav1.CreateOptions{})
			return err
		}(),
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: cluster}, metav1.CreateOptions{})
			return err
		}(),
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}, metav1.CreateOptions{})
			return err
		}(),
		func() error {
			_, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: om, Rules: local}, metav1.CreateOptions{})
			return err
		}(),
		func() error {
			_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: om, Subjects: subject,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}}, metav1.CreateOptions{})
			return err
		}(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	user := "system:serviceaccount:" + ns + ":" + name
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}
	testenv.WaitAuthorized(t, cs, user, groups, "", cluster...)
	testenv.WaitAuthorized(t, cs, user, groups, ns, local...)
}

func without(rules []rbacv1.PolicyRule, i int) []rbacv1.PolicyRule {
	return slices.Delete(slices.Clone(rules), i, i+1)
}

// withResultConfigMap replaces the --result-configmap argument, so that a probe's result
// is never taken for the Job's.
func withResultConfigMap(args []string, name string) []string {
	out := slices.Clone(args)
	for i := range out {
		if out[i] == "--result-configmap" && i+1 < len(out) {
			out[i+1] = name
		}
	}
	return out
}

// jobMode is a mode Job StorageMigration on a target cluster in the Flux incident's
// state, with the controller running and the migration's Job created on the target.
type jobMode struct {
	tgt   *testenv.ControlPlane
	cs    kubernetes.Interface
	sm    *v1alpha1.StorageMigration
	job   *batchv1.Job
	ns    string
	name  string
	image string
}

// startJobMode starts a target with n HelmRepositories stored at v1beta2, a kubeconfig
// Secret for it, the StorageMigration name in mode Job and the controller, and waits
// for the controller to create the Job on the target. No kubelet runs it.
func startJobMode(t *testing.T, e env, name string, n int) *jobMode {
	t.Helper()
	tgt := testenv.FleetForTest(t, 1).Clusters[0]
	if err := fluxIncident(e.ctx, tgt, n); err != nil {
		t.Fatal(err)
	}
	jm := &jobMode{tgt: tgt, cs: kubernetes.NewForConfigOrDie(tgt.Config), ns: controller.DefaultJobNamespace, image: "registry.example.com/upgradeguard:test"}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-target", Namespace: "default"},
		Data: map[string][]byte{"value": readFile(t, tgt.Kubeconfig)}}
	if err := e.c.Create(e.ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), secret) })
	jm.sm = &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Mode: v1alpha1.ModeJob, Rate: v1alpha1.RateSettings{PageSize: 10},
			KubeConfig: &v1alpha1.KubeConfigReference{SecretRef: v1alpha1.SecretKeyReference{Namespace: "default", Name: secret.Name}}}}
	if err := e.c.Create(e.ctx, jm.sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(e.ctx), jm.sm) })
	startController(t, "ug-"+name, controller.Options{JobImage: jm.image})
	waitFor(t, 60*time.Second, "the migration Job on the target", func() (bool, error) {
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, jm.sm); err != nil {
			return false, err
		}
		jm.name = controller.JobName(jm.sm)
		var err error
		jm.job, err = jm.cs.BatchV1().Jobs(jm.ns).Get(e.ctx, jm.name, metav1.GetOptions{})
		return err == nil, client.IgnoreNotFound(err)
	})
	return jm
}

// TestJobMode: a StorageMigration with mode Job on a target cluster in the Flux incident's
// state. The controller creates the namespace, ServiceAccount, the generated ClusterRole
// and Role with their bindings, and the Job. There is no kubelet here, so the test plays
// its part: it runs the Job's command and arguments in-process, authenticated with a
// token issued for the Job's ServiceAccount (TokenRequest). The controller reads the
// result the Job wrote into the StorageMigration's status and cleans up. Before that,
// each rule of the generated roles is removed in turn (from a copy bound to another
// ServiceAccount) and the same arguments fail with a 403 that names the rule's resource.
func TestJobMode(t *testing.T) {
	e := setup(t)
	const n = 30
	jm := startJobMode(t, e, "job-mode", n)
	tgt, cs, ns, name, image := jm.tgt, jm.cs, jm.ns, jm.name, jm.image
	sm := jm.sm
	pod := jm.job.Spec.Template.Spec
	if len(pod.Containers) != 1 || pod.Containers[0].Image != image || pod.ServiceAccountName != name || len(pod.Containers[0].Command) != 0 {
		t.Fatalf("Job %s: %+v; want one container of %s (its entrypoint) as ServiceAccount %s", name, pod, image, name)
	}
	args := pod.Containers[0].Args
	cr, err := cs.RbacV1().ClusterRoles().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role, err := cs.RbacV1().Roles(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Every rule is needed: without it the Job's command fails with a 403 naming it.
	probe := func(k int, cluster, local []rbacv1.PolicyRule, removed rbacv1.PolicyRule) {
		t.Helper()
		sa := fmt.Sprintf("probe-%d", k)
		grant(t, cs, ns, sa, cluster, local)
		// Each probe starts without migration Leases, as the Job does.
		if err := cs.CoordinationV1().Leases(ns).DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		code, out := runAs(t, saKubeconfig(t, tgt, cs, ns, sa), withResultConfigMap(args, sa))
		// The API server's message names the resource; -o json quotes it once more.
		want := fmt.Sprintf("resource %q", removed.Resources[0])
		named := strings.Contains(out, want) || strings.Contains(out, `resource \"`+removed.Resources[0]+`\"`)
		if code == 0 || !strings.Contains(out, "forbidden") || !named {
			t.Errorf("without the rule %v: exit %d, output:\n%s\nwant a failure with a 403 naming %s", removed, code, out, want)
		}
	}
	k := 0
	for i, rule := range cr.Rules {
		probe(k, without(cr.Rules, i), role.Rules, rule)
		k++
	}
	var resultRule = -1
	for i, rule := range role.Rules {
		if rule.Resources[0] == "configmaps" {
			resultRule = i // checked once the migration is done: the result is written last
			continue
		}
		probe(k, cr.Rules, without(role.Rules, i), rule)
		k++
	}
	if got, err := storedVersionsOn(e.ctx, tgt); err != nil || !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions %v (%v) after the failing runs, want untouched", got, err)
	}

	// Play the kubelet: the Job's exact arguments, as its ServiceAccount.
	if code, out := runAs(t, saKubeconfig(t, tgt, cs, ns, name), args); code != 0 {
		t.Fatalf("the Job's command: exit %d\n%s", code, out)
	}
	waitFor(t, 60*time.Second, "the StorageMigration Succeeded from the Job's result", func() (bool, error) {
		got := &v1alpha1.StorageMigration{}
		err := e.c.Get(e.ctx, client.ObjectKey{Name: sm.Name}, got)
		sm = got
		return err == nil && terminalPhase(got.Status.Phase), err
	})
	// The probe without the CRD status rule re-persisted the objects before its prune was
	// refused, so the Job finds them current: what matters is the prune.
	rp := sm.Status.Resources[0]
	if sm.Status.Phase != v1alpha1.PhaseSucceeded || sm.Status.Job != ns+"/"+name || rp.Objects != n || rp.Rewritten+rp.AlreadyCurrent != n ||
		!slices.Equal(rp.StoredVersionsBefore, []string{"v1beta2", "v1"}) || !slices.Equal(rp.StoredVersionsAfter, []string{"v1"}) {
		t.Errorf("StorageMigration: phase %s, job %s, progress %+v; want Succeeded with the Job's %d objects and [v1beta2 v1] -> [v1]", sm.Status.Phase, sm.Status.Job, rp, n)
	}
	if got, err := storedVersionsOn(e.ctx, tgt); err != nil || !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions on the target %v (%v), want [v1]", got, err)
	}
	// Cleaned up after success.
	for what, err := range map[string]error{
		"Job": func() error { _, err := cs.BatchV1().Jobs(ns).Get(e.ctx, name, metav1.GetOptions{}); return err }(),
		"ServiceAccount": func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Get(e.ctx, name, metav1.GetOptions{})
			return err
		}(),
		"ClusterRole": func() error { _, err := cs.RbacV1().ClusterRoles().Get(e.ctx, name, metav1.GetOptions{}); return err }(),
		"ClusterRoleBinding": func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Get(e.ctx, name, metav1.GetOptions{})
			return err
		}(),
		"Role":             func() error { _, err := cs.RbacV1().Roles(ns).Get(e.ctx, name, metav1.GetOptions{}); return err }(),
		"RoleBinding":      func() error { _, err := cs.RbacV1().RoleBindings(ns).Get(e.ctx, name, metav1.GetOptions{}); return err }(),
		"result ConfigMap": func() error { _, err := cs.CoreV1().ConfigMaps(ns).Get(e.ctx, name, metav1.GetOptions{}); return err }(),
	} {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s %s after success: %v, want it deleted", what, name, err)
		}
	}
	// The result rule: without it, the command cannot report (after migrating).
	if resultRule < 0 {
		t.Fatalf("the Role %v has no rule for the result ConfigMap", role.Rules)
	}
	probe(k, cr.Rules, without(role.Rules, resultRule), role.Rules[resultRule])
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestJobModeResultFailed: the Job (played as in TestJobMode) runs without the rule that
// lets it prune storedVersions. It re-persists every object, is refused the prune and
// writes a result that says so: the StorageMigration fails with that CRD's message (the
// API server's 403, naming the Job's ServiceAccount and the resource) and the kubectl
// command for the Job's log, storedVersions stays, and the Job's objects are kept.
func TestJobModeResultFailed(t *testing.T) {
	e := setup(t)
	const n = 10
	jm := startJobMode(t, e, "job-mode-failed", n)
	cr, err := jm.cs.RbacV1().ClusterRoles().Get(e.ctx, jm.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(cr.Rules, func(r rbacv1.PolicyRule) bool { return r.Resources[0] == "customresourcedefinitions/status" })
	if i < 0 {
		t.Fatalf("the generated ClusterRole has no prune rule: %v", cr.Rules)
	}
	cr.Rules = without(cr.Rules, i)
	if _, err := jm.cs.RbacV1().ClusterRoles().Update(e.ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := jm.job.Spec.Template.Spec.Containers[0].Args
	if code, out := runAs(t, saKubeconfig(t, jm.tgt, jm.cs, jm.ns, jm.name), args); code != 1 {
		t.Fatalf("the Job's command without the prune rule: exit %d, want 1 (incomplete)\n%s", code, out)
	}
	sm := &v1alpha1.StorageMigration{}
	waitFor(t, 60*time.Second, "the StorageMigration Failed from the Job's result", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKey{Name: jm.sm.Name}, sm)
		return err == nil && terminalPhase(sm.Status.Phase), err
	})
	c := meta.FindStatusCondition(sm.Status.Conditions, v1alpha1.ConditionFailed)
	if sm.Status.Phase != v1alpha1.PhaseFailed || c == nil {
		t.Fatalf("StorageMigration: phase %s, conditions %+v; want Failed", sm.Status.Phase, sm.Status.Conditions)
	}
	for _, want := range []string{helmrepos + ": ", "forbidden", "system:serviceaccount:" + jm.ns + ":" + jm.name,
		`"customresourcedefinitions/status"`, "kubectl -n " + jm.ns + " logs job/" + jm.name} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the Failed condition's message lacks %q:\n%s", want, c.Message)
		}
	}
	if got, err := storedVersionsOn(e.ctx, jm.tgt); err != nil || !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Errorf("storedVersions %v (%v) after the failure, want [v1beta2 v1] untouched", got, err)
	}
	if _, err := jm.cs.BatchV1().Jobs(jm.ns).Get(e.ctx, jm.name, metav1.GetOptions{}); err != nil {
		t.Errorf("the Job after the failure: %v, want it kept", err)
	}
}

// TestJobModeFailedWithoutResult: the Job's command cannot write its result (the Role
// lost its ConfigMap rule) and exits 2, and the Job fails for good. No kubelet or Job
// controller runs here, so the test plays both: the Pod the Job ran, terminated with the
// command's exit code and its last output as the termination message (what
// FallbackToLogsOnError gives), then the Job's FailureTarget and Failed conditions. The
// StorageMigration fails naming the Pod's exit code and message, not only `kubectl logs`.
func TestJobModeFailedWithoutResult(t *testing.T) {
	e := setup(t)
	jm := startJobMode(t, e, "job-mode-noresult", 5)
	spec := jm.job.Spec.Template.Spec
	if p := spec.Containers[0].TerminationMessagePolicy; p != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("the Job's container has termination message policy %q, want %q", p, corev1.TerminationMessageFallbackToLogsOnError)
	}
	role, err := jm.cs.RbacV1().Roles(jm.ns).Get(e.ctx, jm.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return r.Resources[0] == "configmaps" })
	if i < 0 {
		t.Fatalf("the generated Role has no rule for the result ConfigMap: %v", role.Rules)
	}
	role.Rules = without(role.Rules, i)
	if _, err := jm.cs.RbacV1().Roles(jm.ns).Update(e.ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out := runAs(t, saKubeconfig(t, jm.tgt, jm.cs, jm.ns, jm.name), spec.Containers[0].Args)
	if code != 2 || !strings.Contains(out, "configmaps") {
		t.Fatalf("the Job's command without the result rule: exit %d, want 2 naming configmaps\n%s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]

	// The kubelet's part: the Job's Pod, terminated with the command's exit.
	now := metav1.Now()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: jm.name + "-x1", Namespace: jm.ns,
		Labels: map[string]string{batchv1.JobNameLabel: jm.name}}, Spec: spec}
	pod, err = jm.cs.CoreV1().Pods(jm.ns).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: spec.Containers[0].Name, Image: spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: int32(code), Reason: "Error", Message: out, StartedAt: now, FinishedAt: now}}}}}
	if _, err := jm.cs.CoreV1().Pods(jm.ns).UpdateStatus(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The Job controller's part: the Job failed for good.
	job := jm.job.DeepCopy()
	job.Status.StartTime, job.Status.Failed = &now, 1
	for _, c := range []batchv1.JobConditionType{batchv1.JobFailureTarget, batchv1.JobFailed} {
		job.Status.Conditions = append(job.Status.Conditions, batchv1.JobCondition{Type: c, Status: corev1.ConditionTrue,
			Reason: batchv1.JobReasonBackoffLimitExceeded, Message: "Job has reached the specified backoff limit", LastTransitionTime: now, LastProbeTime: now})
	}
	if _, err := jm.cs.BatchV1().Jobs(jm.ns).UpdateStatus(e.ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	sm := &v1alpha1.StorageMigration{}
	waitFor(t, 60*time.Second, "the StorageMigration Failed from the failed Job", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKey{Name: jm.sm.Name}, sm)
		return err == nil && terminalPhase(sm.Status.Phase), err
	})
	c := meta.FindStatusCondition(sm.Status.Conditions, v1alpha1.ConditionFailed)
	if sm.Status.Phase != v1alpha1.PhaseFailed || c == nil {
		t.Fatalf("StorageMigration: phase %s, conditions %+v; want Failed", sm.Status.Phase, sm.Status.Conditions)
	}
	for _, want := range []string{"failed without a result", batchv1.JobReasonBackoffLimitExceeded, "its last Pod exited with code 2: ", last,
		"kubectl -n " + jm.ns + " logs job/" + jm.name} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the Failed condition's message lacks %q:\n%s", want, c.Message)
		}
	}
	if _, err := jm.cs.BatchV1().Jobs(jm.ns).Get(e.ctx, jm.name, metav1.GetOptions{}); err != nil {
		t.Errorf("the Job after the failure: %v, want it kept for its logs", err)
	}
}
