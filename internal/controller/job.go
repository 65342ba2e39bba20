package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

const (
	// DefaultJobNamespace is where Job-mode migrations run on their target cluster.
	DefaultJobNamespace = "upgradeguard-migrate"
	// LabelStorageMigration names, on a Job-mode migration's objects on the target, the
	// StorageMigration they belong to.
	LabelStorageMigration = "upgradeguard.io/storagemigration"
	// jobPoll is how often a Job-mode migration's result is looked for.
	jobPoll = 2 * time.Second
	// jobContainer is the name of the Job's one container.
	jobContainer = "migrate"
	// maxExitMessage bounds how much of a Pod's termination message a failure quotes.
	maxExitMessage = 1024
)

// JobName is the name of the Job (and of its ServiceAccount, roles and result ConfigMap)
// that runs a StorageMigration in Job mode.
func JobName(sm *v1alpha1.StorageMigration) string {
	sum := sha256.Sum256([]byte(sm.Name + "/" + string(sm.UID) + "/" + strconv.FormatInt(sm.Generation, 10)))
	return "upgradeguard-migrate-" + hex.EncodeToString(sum[:])[:12]
}

// JobResult is what a Job-mode migration writes into its result ConfigMap: the JSON of
// `upgradeguard migrate -o json`.
type JobResult struct {
	CRDs []*migrate.Result `json:"crds"`
}

// runJob runs a StorageMigration in Job mode: it makes sure the target has the Job and
// its least-privilege RBAC, waits for the result ConfigMap the Job writes, copies the
// outcome into status, and cleans up after success.
func (r *StorageMigrationReconciler) runJob(ctx context.Context, sm *v1alpha1.StorageMigration, cfg *rest.Config) (ctrl.Result, error) {
	if r.JobImage == "" {
		return r.fail(ctx, sm, "", "mode Job needs the migration image: start the controller with --job-image (the chart sets it from its image values)")
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return r.fail(ctx, sm, "", err.Error())
	}
	name, ns := JobName(sm), r.JobNamespace
	sm.Status.Job = ns + "/" + name
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return r.jobDone(ctx, sm, cs, cm)
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, fmt.Errorf("read the result of Job %s/%s: %w", ns, name, err)
	}
	// Follow the Job: one that failed for good (its pods' retries spent) without writing a
	// result fails the StorageMigration, and stays on the target for its logs.
	if job, err := cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				return r.fail(ctx, sm, "", fmt.Sprintf("the migration Job %s/%s failed without a result (%s: %s)%s: see %s on the target",
					ns, name, c.Reason, c.Message, lastExit(ctx, cs, ns, name), cmdline.JobLogs{Namespace: ns, Job: name}))
			}
		}
	}
	c, err := kubeclient.New(cfg)
	if err != nil {
		return r.fail(ctx, sm, "", err.Error())
	}
	crds := make([]*apiextv1.CustomResourceDefinition, 0, len(sm.Spec.Resources))
	for _, n := range sm.Spec.Resources {
		crd, err := c.CRDs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, n, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return r.fail(ctx, sm, n, "CRD not found on the target cluster: fix spec.resources")
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("read CRD %s: %w", n, err)
		}
		crds = append(crds, crd)
	}
	objs := JobObjects(sm, name, ns, r.JobImage, crds)
	if err := createAll(ctx, cs, objs); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: jobPoll}, r.saveStatus(ctx, sm)
}

// JobObjectSet is what a Job-mode migration creates on the target: its namespace, a
// ServiceAccount, the ClusterRole and Role of `upgradeguard rbac` for exactly these CRDs
// (plus creating its result ConfigMap) with their bindings, and the Job.
type JobObjectSet struct {
	Namespace          *corev1.Namespace
	ServiceAccount     *corev1.ServiceAccount
	ClusterRole        *rbacv1.ClusterRole
	ClusterRoleBinding *rbacv1.ClusterRoleBinding
	Role               *rbacv1.Role
	RoleBinding        *rbacv1.RoleBinding
	Job                *batchv1.Job
}

// JobObjects builds the JobObjectSet of a StorageMigration.
func JobObjects(sm *v1alpha1.StorageMigration, name, ns, image string, crds []*apiextv1.CustomResourceDefinition) JobObjectSet {
	labels := map[string]string{"app.kubernetes.io/managed-by": "upgradeguard", LabelStorageMigration: kubename.Shorten(sm.Name, kubename.MaxLabelValue, sm.Name)}
	om := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
	perms := migrate.RBAC(name, ns, crds, false)
	if sm.Spec.Engine == v1alpha1.EngineBuiltin {
		perms = migrate.BuiltinRBAC(name, ns, crds, false)
	}
	perms.ClusterRole.Labels, perms.Role.Labels = labels, labels
	// The Job writes its result into a ConfigMap (create cannot be limited by name).
	perms.Role.Rules = append(perms.Role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}})
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}
	args := []string{"migrate", "--lease-namespace", ns, "--wait", "-o", "json", "--result-configmap", name}
	for _, c := range sm.Spec.Resources {
		args = append(args, "--crd", c)
	}
	if q := sm.Spec.Rate.QPS; q > 0 {
		args = append(args, "--qps", strconv.Itoa(int(q)))
	}
	if b := sm.Spec.Rate.Burst; b > 0 {
		args = append(args, "--burst", strconv.Itoa(int(b)))
	}
	if c := sm.Spec.Rate.Concurrency; c > 0 {
		args = append(args, "--concurrency", strconv.Itoa(int(c)))
	}
	if p := sm.Spec.Rate.PageSize; p > 0 {
		args = append(args, "--page-size", strconv.FormatInt(p, 10))
	}
	if sm.Spec.Deadline != nil {
		args = append(args, "--deadline", sm.Spec.Deadline.Duration.String())
	}
	if e := sm.Spec.Engine; e != "" {
		args = append(args, "--engine", string(e))
	}
	if sm.Spec.AllowFieldLoss {
		args = append(args, "--allow-field-loss")
	}
	return JobObjectSet{
		Namespace:          &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "upgradeguard"}}},
		ServiceAccount:     &corev1.ServiceAccount{ObjectMeta: om},
		ClusterRole:        perms.ClusterRole,
		ClusterRoleBinding: &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Subjects: subject, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
		Role:               perms.Role,
		RoleBinding:        &rbacv1.RoleBinding{ObjectMeta: om, Subjects: subject, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}},
		Job: &batchv1.Job{ObjectMeta: om, Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](2),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				ServiceAccountName: name, RestartPolicy: corev1.RestartPolicyNever,
				SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
				Containers: []corev1.Container{{Name: jobContainer, Image: image, Args: args,
					// A migrate that exits before writing its result leaves its last
					// log lines (its error) as the termination message, for lastExit.
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
			}},
		}},
	}
}

// lastExit words how the newest terminated migrate container of Job ns/name ended:
// ", its last Pod exited with code N: MESSAGE", where MESSAGE is the container's
// termination message (its last log lines, by FallbackToLogsOnError). It is empty when
// no Pod can be read (the Pods were deleted, or the controller may not list Pods in
// the Job's namespace): the failure then names `kubectl logs` only.
func lastExit(ctx context.Context, cs kubernetes.Interface, ns, name string) string {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
	if err != nil {
		return ""
	}
	var last *corev1.ContainerStateTerminated
	for _, p := range pods.Items {
		for _, st := range p.Status.ContainerStatuses {
			if t := st.State.Terminated; st.Name == jobContainer && t != nil && (last == nil || t.FinishedAt.After(last.FinishedAt.Time)) {
				last = t
			}
		}
	}
	if last == nil {
		return ""
	}
	msg := strings.TrimSpace(last.Message)
	if len(msg) > maxExitMessage {
		msg = "..." + strings.ToValidUTF8(msg[len(msg)-maxExitMessage:], "")
	}
	if msg == "" {
		return fmt.Sprintf(", its last Pod exited with code %d", last.ExitCode)
	}
	return fmt.Sprintf(", its last Pod exited with code %d: %s", last.ExitCode, msg)
}

func createAll(ctx context.Context, cs kubernetes.Interface, o JobObjectSet) error {
	ns := o.Namespace.Name
	steps := []func() error{
		func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, o.Namespace, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, o.ServiceAccount, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, o.ClusterRole, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, o.ClusterRoleBinding, metav1.CreateOptions{})
			return err
		},
		func() error { _, err := cs.RbacV1().Roles(ns).Create(ctx, o.Role, metav1.CreateOptions{}); return err },
		func() error {
			_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, o.RoleBinding, metav1.CreateOptions{})
			return err
		},
		func() error { _, err := cs.BatchV1().Jobs(ns).Create(ctx, o.Job, metav1.CreateOptions{}); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create the migration Job's objects on the target: %w", err)
		}
	}
	return nil
}

// jobDone copies the Job's result into status; after success it removes the Job, its
// ServiceAccount, roles, bindings and result.
func (r *StorageMigrationReconciler) jobDone(ctx context.Context, sm *v1alpha1.StorageMigration, cs kubernetes.Interface, cm *corev1.ConfigMap) (ctrl.Result, error) {
	var res JobResult
	if err := json.Unmarshal([]byte(cm.Data[migrate.ResultKey]), &res); err != nil {
		return r.fail(ctx, sm, "", fmt.Sprintf("the Job's result ConfigMap %s/%s is not a migrate result: %v", cm.Namespace, cm.Name, err))
	}
	byName := map[string]*migrate.Result{}
	for _, c := range res.CRDs {
		byName[c.Name] = c
	}
	ok, refused := true, ""
	for i := range sm.Status.Resources {
		rp := &sm.Status.Resources[i]
		c := byName[rp.Name]
		if c == nil {
			rp.Phase, rp.Message, ok = v1alpha1.PhaseFailed, "the Job's result does not mention this CRD", false
			continue
		}
		rp.StorageVersion, rp.StoredVersionsBefore, rp.StoredVersionsAfter = c.StorageVersion, c.StoredVersionsBefore, c.StoredVersionsAfter
		rp.Objects, rp.Rewritten, rp.AlreadyCurrent, rp.Deleted, rp.FailedCount = c.Objects, c.Rewritten, c.AlreadyCurrent, c.Deleted, c.FailedCount
		rp.Message, rp.Attempts, rp.FieldLoss = c.Message, rp.Attempts+1, DroppedFields(c.FieldLoss)
		r.reruns(sm, c)
		switch {
		case c.Status == migrate.Migrated || c.Status == migrate.AlreadyMigrated:
			rp.Phase, rp.CompletionTime = v1alpha1.PhaseSucceeded, ptrTime(metav1.Now())
		case c.FieldLossRefused && refused == "":
			rp.Phase, ok, refused = v1alpha1.PhaseFailed, false, rp.Name
		default:
			rp.Phase, ok = v1alpha1.PhaseFailed, false
		}
	}
	if refused != "" {
		// Keep the Job and its objects, as for any failure: the result names the fields.
		return r.refuse(ctx, sm, refused, resourceMessage(sm, refused))
	}
	if !ok {
		// Keep the Job and its objects for the operator to look at. The message says why
		// (a 403 names the missing permission), so the platform shows it without a visit
		// to the target.
		return r.fail(ctx, sm, "", fmt.Sprintf("the migration Job %s did not migrate every CRD: %s (its result is in ConfigMap %s; see %s on the target)",
			sm.Status.Job, failedMessages(sm), sm.Status.Job, cmdline.JobLogs{Namespace: cm.Namespace, Job: cm.Name}))
	}
	if err := cleanup(ctx, cs, cm.Namespace, cm.Name); err != nil {
		return ctrl.Result{}, err
	}
	return r.succeed(ctx, sm, "the migration Job finished", "the migration Job migrated every CRD and pruned its storedVersions", "the migration Job migrated %v")
}

func cleanup(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	bg := metav1.DeletePropagationBackground
	del := metav1.DeleteOptions{PropagationPolicy: &bg}
	errs := []error{
		cs.BatchV1().Jobs(ns).Delete(ctx, name, del),
		cs.RbacV1().RoleBindings(ns).Delete(ctx, name, del),
		cs.RbacV1().Roles(ns).Delete(ctx, name, del),
		cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, del),
		cs.RbacV1().ClusterRoles().Delete(ctx, name, del),
		cs.CoreV1().ServiceAccounts(ns).Delete(ctx, name, del),
		cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, del),
	}
	var out []error
	for _, err := range errs {
		if err != nil && !apierrors.IsNotFound(err) {
			out = append(out, err)
		}
	}
	if err := errors.Join(out...); err != nil {
		return fmt.Errorf("clean up the migration Job %s/%s: %w", ns, name, err)
	}
	return nil
}

// failedMessages are the failed CRDs of sm with their messages, "; "-separated.
func failedMessages(sm *v1alpha1.StorageMigration) string {
	var out []string
	for _, rp := range sm.Status.Resources {
		if rp.Phase == v1alpha1.PhaseFailed {
			out = append(out, rp.Name+": "+rp.Message)
		}
	}
	return strings.Join(out, "; ")
}

// resourceMessage is the status message of the CRD named in sm.
func resourceMessage(sm *v1alpha1.StorageMigration, name string) string {
	for _, rp := range sm.Status.Resources {
		if rp.Name == name {
			return rp.Message
		}
	}
	return ""
}
