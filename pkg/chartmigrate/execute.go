package chartmigrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// FieldManager is the field manager of the objects the migration writes.
const FieldManager = "upgradeguard-migrate"

// Helm's ownership metadata (helm.sh/helm/v4 pkg/action/validate.go): with it, helm
// install adopts an existing object instead of failing on it.
const (
	managedByLabel   = "app.kubernetes.io/managed-by"
	releaseNameAnno  = "meta.helm.sh/release-name"
	releaseNSAnno    = "meta.helm.sh/release-namespace"
	managedByHelmVal = "Helm"
	// migratedForAnno marks a StatefulSet claim the migration pre-created: Helm does not
	// own it (the new StatefulSet's controller takes it by name), so the release-name
	// annotation cannot say whom it was made for.
	migratedForAnno = "upgradeguard.io/migrated-for-release"
)

// Env is what Execute works with.
type Env struct {
	Kube kubernetes.Interface
	// Helm returns the Helm SDK configuration for the release namespace.
	Helm func() (*action.Configuration, error)
	// Uninstall is the uninstall pre-flight's clients and options for the old release:
	// the backup (step 1) and the re-check before the uninstall use them.
	Uninstall        *uninstall.Clients
	UninstallOptions uninstall.Options
	// Confirm asks the operator before a change the plan cannot make on its own
	// (patching PVs to Retain). It returns false to refuse.
	Confirm func(question string) (bool, error)
	// Progress reports each step as it goes (for stderr).
	Progress func(step, message string)
}

// ExecOptions say where the record lives and what to install.
type ExecOptions struct {
	// Dir holds the backup and the migration record (StateFile).
	Dir string
	// Chart and Values are the new chart, loaded, and the values to install it with.
	Chart  *chart.Chart
	Values map[string]any
	// Override runs a plan with blocking findings.
	Override bool
	// Timeout bounds each wait (claims gone, claims bound). Default 5 minutes.
	Timeout time.Duration
}

// StepResult is what one step did in this run.
type StepResult struct {
	Step   string `json:"step"`
	Status string `json:"status"` // done, skipped (done in an earlier run), failed
	Detail string `json:"detail,omitempty"`
	Error  string `json:"error,omitempty"`
}

// VolumeCheck is the proof that a new claim holds the old volume.
type VolumeCheck struct {
	PVC      string `json:"pvc"`
	PV       string `json:"pv"`
	PVUID    string `json:"pvUID"`
	Source   string `json:"source"`
	Bound    bool   `json:"bound"`
	SameUID  bool   `json:"sameUID"`
	SameData bool   `json:"sameSource"`
	// StatefulSet is the new StatefulSet that takes the claim, for a StatefulSet
	// claim; StatefulSetUses says it has the claim's template and ordinal.
	StatefulSet     string `json:"statefulSet,omitempty"`
	StatefulSetUses bool   `json:"statefulSetUses,omitempty"`
}

// SecretCheck says whether a restored Secret holds the backed-up data (never the data).
type SecretCheck struct {
	Secret   string `json:"secret"`
	SameData bool   `json:"sameData"`
}

// Result is the outcome of Execute.
type Result struct {
	Plan    *Plan         `json:"plan"`
	Steps   []StepResult  `json:"steps"`
	Volumes []VolumeCheck `json:"volumes"`
	Secrets []SecretCheck `json:"secrets"`
	// Done is true when every step is done and verified.
	Done bool `json:"done"`
}

// StepError says which step failed; a re-run with the same directory resumes there.
type StepError struct {
	Step string
	Dir  string
	Err  error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("step %s failed: %v (fix the cause and run the same command again: it resumes at this step from the record in %s)", e.Step, e.Err, e.Dir)
}

func (e *StepError) Unwrap() error { return e.Err }

type executor struct {
	env Env
	o   ExecOptions
	st  *State
	p   *Plan
}

// Execute carries out the plan in st, step by step, saving the record after each one.
// Steps done in an earlier run are skipped; every step is also safe to repeat, and checks
// what is on the cluster before it changes anything. A plan with blocking findings is
// refused before the first step, unless o.Override: the error is ErrBlocked.
func Execute(ctx context.Context, env Env, st *State, o ExecOptions) (*Result, error) {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	p := st.Plan
	res := &Result{Plan: p, Steps: []StepResult{}, Volumes: []VolumeCheck{}, Secrets: []SecretCheck{}}
	if !p.Safe && !o.Override {
		return res, fmt.Errorf("nothing was changed: %w (%d)", ErrBlocked, len(p.Blocking()))
	}
	x := &executor{env: env, o: o, st: st, p: p}
	run := map[string]func(context.Context) (string, error){
		StepBackup: x.backup, StepRetain: x.retain, StepUninstall: x.uninstall, StepClaimRefs: x.claimRefs,
		StepPVCs: x.pvcs, StepSecrets: x.secrets, StepInstall: x.install,
		StepVerify: func(ctx context.Context) (string, error) { return x.verify(ctx, res) },
	}
	for i, step := range Steps {
		if st.Done(step) && step != StepVerify {
			res.Steps = append(res.Steps, StepResult{Step: step, Status: "skipped", Detail: "done in an earlier run"})
			x.progress(step, fmt.Sprintf("%d/%d %s: done in an earlier run, skipped", i+1, len(Steps), step))
			continue
		}
		x.progress(step, fmt.Sprintf("%d/%d %s ...", i+1, len(Steps), step))
		st.Steps[step] = StepRecord{Status: StatusRunning, At: time.Now().UTC()}
		if err := st.Save(o.Dir); err != nil {
			return res, err
		}
		detail, err := run[step](ctx)
		if err != nil {
			st.Steps[step] = StepRecord{Status: StatusFailed, At: time.Now().UTC(), Error: err.Error()}
			res.Steps = append(res.Steps, StepResult{Step: step, Status: StatusFailed, Error: err.Error()})
			x.progress(step, fmt.Sprintf("%d/%d %s: FAILED: %v", i+1, len(Steps), step, err))
			return res, errors.Join(&StepError{Step: step, Dir: o.Dir, Err: err}, st.Save(o.Dir))
		}
		st.Steps[step] = StepRecord{Status: StatusDone, At: time.Now().UTC(), Detail: detail}
		res.Steps = append(res.Steps, StepResult{Step: step, Status: StatusDone, Detail: detail})
		x.progress(step, fmt.Sprintf("%d/%d %s: done (%s)", i+1, len(Steps), step, detail))
		if err := st.Save(o.Dir); err != nil {
			return res, err
		}
	}
	res.Done = true
	return res, nil
}

func (x *executor) progress(step, msg string) {
	if x.env.Progress != nil {
		x.env.Progress(step, msg)
	}
}

// backup: pkg/uninstall's release backup, with the old StatefulSet claims written by the
// same writer, so that they are on disk before its index. A backup already in the
// directory for the same release (a crash after it was written) counts as done; one for
// another release is refused.
func (x *executor) backup(ctx context.Context) (string, error) {
	var idx uninstall.BackupResult
	if data, err := os.ReadFile(filepath.Join(x.o.Dir, uninstall.IndexFile)); err == nil {
		if err := json.Unmarshal(data, &idx); err != nil || idx.Release != x.p.Release || idx.Namespace != x.p.Namespace {
			return "", fmt.Errorf("%s holds a backup of another release: use a new directory", x.o.Dir)
		}
		return fmt.Sprintf("backup of %d object(s) already in %s", len(idx.Files), x.o.Dir), nil
	}
	w, err := backup.Create(x.o.Dir, backup.KindRelease)
	if err != nil {
		return "", err
	}
	stsFiles, err := x.backupSTSClaims(ctx, w)
	if err != nil {
		return "", err
	}
	b, err := uninstall.WriteBackup(ctx, x.env.Uninstall, x.env.UninstallOptions, w)
	if err != nil {
		return "", err
	}
	for _, s := range x.p.Secrets {
		if _, err := backupSecret(x.o.Dir, x.p.Namespace, s.Old); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d object(s) written to %s", len(b.Files)+stsFiles, x.o.Dir), nil
}

// STSBackupDir is the backup directory's folder for the old StatefulSet claims and
// their PVs: they are not in the stored manifest, so the uninstall backup has no copy.
const STSBackupDir = "statefulset-claims"

// backupSTSClaims writes each old StatefulSet claim the plan moves, and its PV, sanitised
// as the uninstall backup writes objects, into DIR/statefulset-claims with w. It runs
// before the uninstall, while they are all still there.
func (x *executor) backupSTSClaims(ctx context.Context, w *backup.Writer) (int, error) {
	n := 0
	for _, v := range x.p.Volumes {
		if v.OldStatefulSet == nil || v.PV == "" {
			continue
		}
		c, err := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace).Get(ctx, v.OldPVC, metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("PersistentVolumeClaim/%s/%s: back up: %w", x.p.Namespace, v.OldPVC, err)
		}
		pv, err := x.env.Kube.CoreV1().PersistentVolumes().Get(ctx, v.PV, metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("PersistentVolume/%s: back up: %w", v.PV, err)
		}
		c.APIVersion, c.Kind, pv.APIVersion, pv.Kind = "v1", "PersistentVolumeClaim", "v1", "PersistentVolume"
		for file, obj := range map[string]runtime.Object{"pvc-" + v.OldPVC + ".yaml": c, "pv-" + v.PV + ".yaml": pv} {
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
			if err != nil {
				return 0, err
			}
			uninstall.Sanitize(u)
			if err := w.WriteYAML(filepath.Join(STSBackupDir, file), u); err != nil {
				return 0, err
			}
			n++
		}
	}
	return n, nil
}

// backupSecret reads a Secret back from the backup.
func backupSecret(dir, ns, name string) (*corev1.Secret, error) {
	data, err := os.ReadFile(filepath.Join(dir, uninstall.IndexFile))
	if err != nil {
		return nil, fmt.Errorf("read the backup index: %w", err)
	}
	var idx uninstall.BackupResult
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("read the backup index: %w", err)
	}
	for _, f := range idx.Files {
		if f.Kind != "Secret" || f.Name != name || f.Namespace != ns {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, f.File))
		if err != nil {
			return nil, fmt.Errorf("Secret %s/%s: read the backup: %w", ns, name, err)
		}
		var s corev1.Secret
		if err := yaml.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("Secret %s/%s: read the backup: %w", ns, name, err)
		}
		return &s, nil
	}
	return nil, fmt.Errorf("Secret %s/%s is not in the backup in %s", ns, name, dir)
}

// retain patches every PV behind a claim the uninstall deletes to Retain, after asking.
func (x *executor) retain(ctx context.Context) (string, error) {
	var todo []string
	for _, v := range x.p.Volumes {
		if v.PV == "" || v.Kept {
			continue
		}
		pv, err := x.plannedPV(ctx, v)
		if err != nil {
			return "", err
		}
		if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
			todo = append(todo, v.PV)
			if x.st.OriginalReclaimPolicy == nil {
				x.st.OriginalReclaimPolicy = map[string]string{}
			}
			x.st.OriginalReclaimPolicy[v.PV] = string(pv.Spec.PersistentVolumeReclaimPolicy)
		}
	}
	if len(todo) == 0 {
		return "every PV is already Retain", nil
	}
	q := fmt.Sprintf("Patch reclaimPolicy to Retain on PersistentVolume %s (otherwise the uninstall deletes the data)?", strings.Join(todo, ", "))
	if x.env.Confirm == nil {
		return "", &ConfirmationError{Question: q}
	}
	ok, err := x.env.Confirm(q)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("patching %s to Retain was refused: nothing was changed", strings.Join(todo, ", "))
	}
	for _, n := range todo {
		patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
		if _, err := x.env.Kube.CoreV1().PersistentVolumes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return "", fmt.Errorf("PersistentVolume/%s: patch to Retain: %w", n, err)
		}
	}
	return "patched to Retain: " + strings.Join(todo, ", "), nil
}

// uninstall re-runs the pre-flight and refuses when the uninstall would now delete
// anything the plan did not show, then uninstalls with the Helm SDK and waits until the
// deleted claims are gone.
func (x *executor) uninstall(ctx context.Context) (string, error) {
	rep, err := uninstall.Check(ctx, x.env.Uninstall, x.env.UninstallOptions)
	gone := err != nil && isReleaseNotFound(err)
	if err != nil && !gone {
		return "", fmt.Errorf("re-check the uninstall: %w", err)
	}
	if !gone {
		var extra []string
		for _, o := range rep.Objects {
			if o.Action == uninstall.Delete && !slices.Contains(x.p.Deletes, o.Subject) {
				extra = append(extra, o.Subject)
			}
		}
		if len(extra) > 0 {
			return "", fmt.Errorf("the uninstall would now also delete %s, which the plan did not show: nothing was deleted; start over with a new plan", strings.Join(extra, ", "))
		}
		cfg, err := x.env.Helm()
		if err != nil {
			return "", err
		}
		u := action.NewUninstall(cfg)
		u.WaitStrategy = kube.HookOnlyStrategy
		u.DeletionPropagation = "background"
		u.Timeout = x.o.Timeout
		u.Description = "chart migration to " + x.p.NewRelease
		if _, err := u.Run(x.p.Release); err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
			return "", fmt.Errorf("%s: %w", cmdline.HelmUninstall{Release: x.p.Release}, err)
		}
	}
	stsDeleted, err := x.deleteSTSClaims(ctx)
	if err != nil {
		return "", err
	}
	// The retained PVs are released only once their claims are gone. A claim held by a
	// pod stays Terminating (kubernetes.io/pvc-protection): wait, with a deadline.
	for _, v := range x.p.Volumes {
		if v.Kept || v.PV == "" {
			continue
		}
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, x.o.Timeout, true, func(ctx context.Context) (bool, error) {
			c, err := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace).Get(ctx, v.OldPVC, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			// A claim of the same name made for the new release by an earlier run.
			return err == nil && c.DeletionTimestamp == nil && (c.Annotations[releaseNameAnno] == x.p.NewRelease || c.Annotations[migratedForAnno] == x.p.NewRelease), err
		})
		if err != nil {
			return "", fmt.Errorf("PersistentVolumeClaim/%s/%s is still there after the uninstall (a pod mounting it holds it in Terminating?): %w", x.p.Namespace, v.OldPVC, err)
		}
	}
	if len(stsDeleted) > 0 {
		stsDeleted = "; StatefulSet claims deleted: " + stsDeleted
	}
	if gone {
		return "release already uninstalled" + stsDeleted, nil
	}
	return fmt.Sprintf("release %s uninstalled (%d object(s) deleted)%s", x.p.Release, len(x.p.Deletes), stsDeleted), nil
}

// deleteSTSClaims deletes the old StatefulSet claims the plan lists (DeleteOld), which
// helm uninstall leaves behind. It first waits until their StatefulSets are gone (else
// the controller would make the claims again), and deletes each claim only with the
// uid the plan recorded as a precondition: a claim made since under that name is
// never touched. Gone already counts as done.
func (x *executor) deleteSTSClaims(ctx context.Context) (string, error) {
	var deleted []string
	waited := map[string]bool{}
	for _, v := range x.p.Volumes {
		if !v.DeleteOld || v.OldStatefulSet == nil {
			continue
		}
		if sts := v.OldStatefulSet.Name; !waited[sts] {
			err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, x.o.Timeout, true, func(ctx context.Context) (bool, error) {
				_, err := x.env.Kube.AppsV1().StatefulSets(x.p.Namespace).Get(ctx, sts, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return true, nil
				}
				return false, err
			})
			if err != nil {
				return "", fmt.Errorf("StatefulSet/%s/%s is still there after the uninstall, so its claims cannot go yet: %w", x.p.Namespace, sts, err)
			}
			waited[sts] = true
		}
		uid := types.UID(v.OldPVCUID)
		err := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace).Delete(ctx, v.OldPVC, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case err == nil:
			deleted = append(deleted, v.OldPVC)
		case apierrors.IsNotFound(err):
			deleted = append(deleted, v.OldPVC+" (already gone)")
		case apierrors.IsConflict(err):
			c, gerr := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace).Get(ctx, v.OldPVC, metav1.GetOptions{})
			if gerr == nil && c.Annotations[migratedForAnno] == x.p.NewRelease {
				continue // made for the new release by an earlier run
			}
			return "", fmt.Errorf("PersistentVolumeClaim/%s/%s is not the claim the plan recorded (uid %s): it was left alone; move it away and re-run", x.p.Namespace, v.OldPVC, v.OldPVCUID)
		default:
			return "", fmt.Errorf("PersistentVolumeClaim/%s/%s: delete the StatefulSet claim helm uninstall leaves: %w", x.p.Namespace, v.OldPVC, err)
		}
	}
	return strings.Join(deleted, ", "), nil
}

func isReleaseNotFound(err error) bool {
	var nf *helmrelease.NotFoundError
	return errors.Is(err, driver.ErrReleaseNotFound) || errors.As(err, &nf)
}

// claimRefs frees each retained PV of its old claim and reserves it for the new one: a
// claimRef with the new claim's name and no uid. The PV then binds only to that claim.
func (x *executor) claimRefs(ctx context.Context) (string, error) {
	var done []string
	for _, v := range x.p.Volumes {
		if v.Kept || v.PV == "" {
			continue
		}
		pv, err := x.plannedPV(ctx, v)
		if err != nil {
			return "", err
		}
		if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == x.p.Namespace && ref.Name == v.NewPVC && (ref.UID == "" || x.claimUID(ctx, v.NewPVC) == ref.UID) {
			done = append(done, v.PV+" (already)")
			continue
		}
		if ref := pv.Spec.ClaimRef; ref != nil && (ref.Namespace != x.p.Namespace || ref.Name != v.OldPVC) {
			return "", fmt.Errorf("PersistentVolume/%s is claimed by %s/%s, neither the old nor the new claim: it will not be taken", v.PV, ref.Namespace, ref.Name)
		}
		patch := fmt.Sprintf(`{"spec":{"claimRef":{"apiVersion":"v1","kind":"PersistentVolumeClaim","namespace":%q,"name":%q,"uid":null,"resourceVersion":null}}}`, x.p.Namespace, v.NewPVC)
		if _, err := x.env.Kube.CoreV1().PersistentVolumes().Patch(ctx, v.PV, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return "", fmt.Errorf("PersistentVolume/%s: clear the claimRef: %w", v.PV, err)
		}
		done = append(done, v.PV+" -> "+v.NewPVC)
	}
	return "reserved " + orNone(done), nil
}

// plannedPV reads the volume behind v and proves it is the one the plan recorded: a PV of
// the same name with another uid is another volume, and nothing is done to it.
func (x *executor) plannedPV(ctx context.Context, v Volume) (*corev1.PersistentVolume, error) {
	pv, err := x.env.Kube.CoreV1().PersistentVolumes().Get(ctx, v.PV, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("PersistentVolume/%s: %w", v.PV, err)
	}
	if string(pv.UID) != v.PVUID {
		return nil, fmt.Errorf("PersistentVolume/%s has uid %s, the plan recorded %s: it is another volume now; stop and check", v.PV, pv.UID, v.PVUID)
	}
	return pv, nil
}

func (x *executor) claimUID(ctx context.Context, name string) types.UID {
	c, err := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return c.UID
}

func (x *executor) own(m *metav1.ObjectMeta) {
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Labels[managedByLabel] = managedByHelmVal
	m.Annotations[releaseNameAnno] = x.p.NewRelease
	m.Annotations[releaseNSAnno] = x.p.Namespace
}

func (x *executor) ownershipPatch() []byte {
	return fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q},"annotations":{%q:%q,%q:%q}}}`,
		managedByLabel, managedByHelmVal, releaseNameAnno, x.p.NewRelease, releaseNSAnno, x.p.Namespace)
}

// pvcs pre-creates the new claims from the new chart's rendered ones, bound to the
// retained PVs (spec.volumeName) and owned by the new release, so helm install adopts them.
func (x *executor) pvcs(ctx context.Context) (string, error) {
	var done []string
	claims := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace)
	for _, v := range x.p.Volumes {
		if v.PV == "" {
			continue
		}
		if v.Kept && v.NewStatefulSet != nil {
			done = append(done, v.NewPVC+" (kept as it is, for its StatefulSet)")
			continue
		}
		if v.Kept {
			if _, err := claims.Patch(ctx, v.NewPVC, types.MergePatchType, x.ownershipPatch(), metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
				return "", fmt.Errorf("PersistentVolumeClaim/%s/%s: re-stamp for release %s: %w", x.p.Namespace, v.NewPVC, x.p.NewRelease, err)
			}
			done = append(done, v.NewPVC+" (kept, re-stamped)")
			continue
		}
		if c, err := claims.Get(ctx, v.NewPVC, metav1.GetOptions{}); err == nil {
			if c.Spec.VolumeName != v.PV {
				return "", fmt.Errorf("PersistentVolumeClaim/%s/%s already exists and names volume %q, not %s: it was not made by this migration; move it away and re-run", x.p.Namespace, v.NewPVC, c.Spec.VolumeName, v.PV)
			}
			done = append(done, v.NewPVC+" (already)")
			continue
		} else if !apierrors.IsNotFound(err) {
			return "", err
		}
		var pvc corev1.PersistentVolumeClaim
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(v.NewObject, &pvc); err != nil {
			return "", fmt.Errorf("the new chart's claim %s: %w", v.NewPVC, err)
		}
		pvc.ObjectMeta = metav1.ObjectMeta{Name: v.NewPVC, Namespace: x.p.Namespace, Labels: pvc.Labels, Annotations: pvc.Annotations}
		pvc.Status = corev1.PersistentVolumeClaimStatus{}
		if v.NewStatefulSet != nil {
			// Not in the new release's manifest: Helm does not adopt it, the new
			// StatefulSet's controller finds it by name.
			if pvc.Annotations == nil {
				pvc.Annotations = map[string]string{}
			}
			pvc.Annotations[migratedForAnno] = x.p.NewRelease
		} else {
			x.own(&pvc.ObjectMeta)
		}
		pvc.Spec.VolumeName = v.PV
		class := v.StorageClass
		pvc.Spec.StorageClassName = &class
		if _, err := claims.Create(ctx, &pvc, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
			return "", fmt.Errorf("PersistentVolumeClaim/%s/%s: create bound to %s: %w", x.p.Namespace, v.NewPVC, v.PV, err)
		}
		done = append(done, v.NewPVC+" on "+v.PV)
	}
	return "created " + orNone(done), nil
}

// secrets restores each Secret from the backup under its new name, owned by the new
// release. It never overwrites a Secret that holds other data.
func (x *executor) secrets(ctx context.Context) (string, error) {
	var done []string
	api := x.env.Kube.CoreV1().Secrets(x.p.Namespace)
	for _, s := range x.p.Secrets {
		subject := manifest.SubjectOf("Secret", x.p.Namespace, s.New)
		saved, err := backupSecret(x.o.Dir, x.p.Namespace, s.Old)
		if err != nil {
			return "", err
		}
		live, err := api.Get(ctx, s.New, metav1.GetOptions{})
		switch {
		case err == nil:
			if !sameData(live.Data, saved.Data) {
				return "", fmt.Errorf("%s already exists with other data: it is left as it is; move it away (or restore the backup into it) and re-run", subject)
			}
			if _, err := api.Patch(ctx, s.New, types.MergePatchType, x.ownershipPatch(), metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
				return "", fmt.Errorf("%s: stamp for release %s: %w", subject, x.p.NewRelease, err)
			}
			done = append(done, s.New+" (already)")
			continue
		case !apierrors.IsNotFound(err):
			return "", err
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.New, Namespace: x.p.Namespace}, Type: saved.Type, Data: saved.Data}
		x.own(&sec.ObjectMeta)
		if _, err := api.Create(ctx, sec, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
			return "", fmt.Errorf("%s: restore: %w", subject, err)
		}
		done = append(done, s.Old+" -> "+s.New)
	}
	return "restored " + orNone(done), nil
}

func sameData(a, b map[string][]byte) bool {
	if !slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))) {
		return false
	}
	for k := range a {
		if !bytes.Equal(a[k], b[k]) {
			return false
		}
	}
	return true
}

// install installs the new chart with the Helm SDK. A release of that name already
// deployed (an earlier run) is done; a failed one is replaced.
func (x *executor) install(ctx context.Context) (string, error) {
	cfg, err := x.env.Helm()
	if err != nil {
		return "", err
	}
	if last, err := cfg.Releases.Last(x.p.NewRelease); err == nil {
		if rel, ok := last.(*release.Release); ok && rel.Info != nil && rel.Info.Status == common.StatusDeployed {
			return "release " + x.p.NewRelease + " is already deployed", nil
		}
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = x.p.NewRelease, x.p.Namespace
	in.Replace = true
	in.WaitStrategy = kube.HookOnlyStrategy
	in.Timeout = x.o.Timeout
	in.Description = "chart migration from " + x.p.Release
	if _, err := in.RunWithContext(ctx, x.o.Chart, x.o.Values); err != nil {
		return "", fmt.Errorf("%s: %w", cmdline.HelmInstall{Release: x.p.NewRelease}, err)
	}
	return fmt.Sprintf("release %s installed from %s-%s", x.p.NewRelease, x.p.NewChart, x.p.NewChartVersion), nil
}

// verify proves each new claim is Bound to its old volume (same PV name, uid and
// source, claimRef naming the claim's uid) and each restored Secret holds the backed-up
// bytes.
func (x *executor) verify(ctx context.Context, res *Result) (string, error) {
	res.Volumes, res.Secrets = []VolumeCheck{}, []SecretCheck{}
	var problems []string
	for _, v := range x.p.Volumes {
		if v.PV == "" {
			continue
		}
		vc := VolumeCheck{PVC: v.NewPVC, PV: v.PV}
		var pvc *corev1.PersistentVolumeClaim
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, x.o.Timeout, true, func(ctx context.Context) (bool, error) {
			c, err := x.env.Kube.CoreV1().PersistentVolumeClaims(x.p.Namespace).Get(ctx, v.NewPVC, metav1.GetOptions{})
			if err != nil {
				return false, client(err)
			}
			pvc = c
			return c.Status.Phase == corev1.ClaimBound, nil
		})
		pv, perr := x.env.Kube.CoreV1().PersistentVolumes().Get(ctx, v.PV, metav1.GetOptions{})
		if err == nil && perr == nil {
			vc.PVUID, vc.Source = string(pv.UID), VolumeSource(pv)
			vc.Bound = pvc.Spec.VolumeName == v.PV && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == pvc.UID
			vc.SameUID, vc.SameData = vc.PVUID == v.PVUID, vc.Source == v.Source
		}
		if !vc.Bound || !vc.SameUID || !vc.SameData {
			problems = append(problems, fmt.Sprintf("PersistentVolumeClaim/%s/%s is not bound to the old volume %s (bound=%v sameUID=%v sameSource=%v %v)",
				x.p.Namespace, v.NewPVC, v.PV, vc.Bound, vc.SameUID, vc.SameData, errors.Join(err, perr)))
		}
		if v.NewStatefulSet != nil {
			vc.StatefulSet = v.NewStatefulSet.Name
			if err := x.usesClaim(ctx, v.NewStatefulSet); err != nil {
				problems = append(problems, err.Error())
			} else {
				vc.StatefulSetUses = true
			}
		}
		res.Volumes = append(res.Volumes, vc)
	}
	for _, s := range x.p.Secrets {
		sc := SecretCheck{Secret: s.New}
		saved, err := backupSecret(x.o.Dir, x.p.Namespace, s.Old)
		if err != nil {
			return "", err
		}
		live, err := x.env.Kube.CoreV1().Secrets(x.p.Namespace).Get(ctx, s.New, metav1.GetOptions{})
		sc.SameData = err == nil && sameData(live.Data, saved.Data)
		if !sc.SameData {
			problems = append(problems, fmt.Sprintf("Secret/%s/%s does not hold the backed-up data (the new chart rendered its own? restore it from %s)", x.p.Namespace, s.New, x.o.Dir))
		}
		res.Secrets = append(res.Secrets, sc)
	}
	if len(problems) > 0 {
		return "", errors.New(strings.Join(problems, "; "))
	}
	return fmt.Sprintf("%d claim(s) on their old volumes, %d Secret(s) with the same data", len(res.Volumes), len(res.Secrets)), nil
}

// usesClaim checks that the installed StatefulSet has the template and runs the ordinal
// the claim was pre-created for, so its controller takes that claim.
func (x *executor) usesClaim(ctx context.Context, ref *STSRef) error {
	sts, err := x.env.Kube.AppsV1().StatefulSets(x.p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("StatefulSet/%s/%s of the new release: %w", x.p.Namespace, ref.Name, err)
	}
	if !slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(t corev1.PersistentVolumeClaim) bool { return t.Name == ref.Template }) ||
		!slices.Contains(ordinals(sts), ref.Ordinal) {
		return fmt.Errorf("StatefulSet/%s/%s has no volumeClaimTemplate %s at ordinal %d: it does not use the pre-created claim %s (scale it, or check its values)",
			x.p.Namespace, ref.Name, ref.Template, ref.Ordinal, StatefulSetClaimName(ref.Template, ref.Name, ref.Ordinal))
	}
	return nil
}

func client(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
