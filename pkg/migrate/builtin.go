package migrate

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// Who pruned storedVersions after a builtin migration (Result.PrunedBy).
const (
	PrunedByServer       = "server"
	PrunedByUpgradeguard = "upgradeguard"
)

// The annotations on our StorageVersionMigrations: the CRD it migrates, and the CRD
// generation it was created for (a later run follows it only while the CRD is unchanged).
const (
	annotationCRD           = svm.AnnotationCRD
	annotationCRDGeneration = svm.AnnotationGeneration
)

// builtinCleanupWait bounds how long a run waits, after the built-in migrator finished,
// for the server to record the outcome on the CRD (and prune storedVersions) before the
// run checks and cleans up itself.
const builtinCleanupWait = 15 * time.Second

// svmPrefix starts the generated name of the StorageVersionMigrations a run creates;
// each gets a new name, so the built-in migrator's work queue treats it as new.
func svmPrefix(crd string) string {
	name := "upgradeguard-" + crd
	if len(name) > 200 {
		name = name[:200]
	}
	return name + "-"
}

// follower creates, follows and deletes the StorageVersionMigration of one CRD.
type follower struct {
	m    *Migrator
	api  dynamic.ResourceInterface
	name string
	// apiVersion is the served StorageVersionMigration version (v1, else v1beta1).
	apiVersion string
	crd        *apiextv1.CustomResourceDefinition
	o          Options
	res        *Result
	start      time.Time
	// total is the object count the migrator last reported (-1 while unknown).
	total, done int64
}

// builtin migrates crd with a StorageVersionMigration run by the built-in migrator, and
// prunes storedVersions where the server did not, with the client engine's guards. It
// returns an error when the run could not start (the API is not served, nobody runs the
// migrator, RBAC); what the migrator did is in res.
func (m *Migrator) builtin(ctx context.Context, crd *apiextv1.CustomResourceDefinition, o Options, res *Result, start time.Time) error {
	gvr, err := m.svmResource(ctx)
	if err != nil {
		return err
	}
	if gvr.Empty() {
		return &BuiltinNotServedError{CRD: crd.Name}
	}
	f := &follower{m: m, api: m.dynamic.Resource(gvr), apiVersion: gvr.GroupVersion().String(), crd: crd, o: o, res: res, start: start, total: -1}
	for reruns := 0; ; reruns++ {
		again, err := f.once(ctx, reruns < MaxBuiltinReruns)
		if err != nil || !again {
			return err
		}
	}
}

// MaxBuiltinReruns bounds how often one builtin run creates a new StorageVersionMigration
// because the built-in migrator skipped the prune for a generation change. Past it the
// run is incomplete and asks for a restart (Result.Restart).
const MaxBuiltinReruns = 2

// BuiltinRerun is one StorageVersionMigration that succeeded while the built-in migrator
// skipped pruning storedVersions: kube-controller-manager's migrator prunes only when the
// CRD's metadata.generation is the one it saw when the migration started, and a chart
// upgrade (or anyone) changed the CRD while it ran. The objects were re-written, but
// nobody pruned, so the engine ran a new StorageVersionMigration (a new name: the
// migrator acts on each once) for the CRD as it is now, and the server pruned after it.
type BuiltinRerun struct {
	// StorageVersionMigration is the one whose prune was skipped.
	StorageVersionMigration string `json:"storageVersionMigration"`
	// GenerationBefore and GenerationAfter are the CRD's generation when it started and
	// when it ended.
	GenerationBefore int64 `json:"generationBefore"`
	GenerationAfter  int64 `json:"generationAfter"`
	// ServerCondition is the CRD's StorageMigrating condition message then.
	ServerCondition string `json:"serverCondition,omitempty"`
}

// once runs one StorageVersionMigration to its end; again says that the built-in
// migrator skipped the prune for a generation change and that a new one is to run.
func (f *follower) once(ctx context.Context, mayRerun bool) (again bool, err error) {
	res := f.res
	svm, err := f.create(ctx)
	if err != nil {
		return false, err
	}
	res.StorageVersionMigration = f.name
	svm, err = f.follow(ctx, svm)
	var notRunning *BuiltinNotRunningError
	switch {
	case errors.As(err, &notRunning):
		f.delete(ctx)
		return false, err
	case ctx.Err() != nil:
		// Cut short (deadline, cancellation, a lost Lease): the migrator goes on, and the
		// next run follows the same StorageVersionMigration.
		res.Status, res.Interrupted, res.Objects = Incomplete, true, max(f.done, 0)
		res.Message = fmt.Sprintf("%s while StorageVersionMigration %s runs: the built-in migrator goes on, and the next run follows it; storedVersions untouched",
			stopWord(ctx), f.name)
		return false, nil
	case err != nil:
		return false, err
	}
	f.waitServerCleanup(ctx)
	f.delete(ctx)
	if c := meta.FindStatusCondition(svm.Status.Conditions, string(svmv1.MigrationFailed)); c != nil && c.Status == metav1.ConditionTrue {
		f.failed(ctx, c)
		return false, nil
	}
	return f.succeeded(ctx, mayRerun), nil
}

func stopWord(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "deadline passed"
	}
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return "stopped (" + c.Error() + ")"
	}
	return "interrupted"
}

func (f *follower) get(ctx context.Context) (*svmv1.StorageVersionMigration, error) {
	u, err := f.api.Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return toSVM(u)
}

func toSVM(u *unstructured.Unstructured) (*svmv1.StorageVersionMigration, error) {
	return svm.Convert(u.Object)
}

// create creates the StorageVersionMigration, or follows the one an interrupted run left
// for the same CRD generation. Finished or outdated ones of ours are deleted.
func (f *follower) create(ctx context.Context) (*svmv1.StorageVersionMigration, error) {
	gen := strconv.FormatInt(f.crd.Generation, 10)
	list, err := f.api.List(ctx, metav1.ListOptions{LabelSelector: svm.LabelManagedBy + "=" + svm.ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("list StorageVersionMigrations: %w", err)
	}
	for i := range list.Items {
		svm, err := toSVM(&list.Items[i])
		if err != nil || svm.Annotations[annotationCRD] != f.crd.Name {
			continue
		}
		if !terminal(svm) && svm.Annotations[annotationCRDGeneration] == gen {
			f.name, f.res.Resumed = svm.Name, true
			return svm, nil
		}
		if err := f.api.Delete(ctx, svm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("delete the earlier StorageVersionMigration %s: %w", svm.Name, err)
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": f.apiVersion,
		"kind":       "StorageVersionMigration",
		"metadata": map[string]any{
			"generateName": svmPrefix(f.crd.Name),
			"labels":       map[string]any{svm.LabelManagedBy: svm.ManagedBy},
			"annotations":  map[string]any{annotationCRDGeneration: gen, annotationCRD: f.crd.Name},
		},
		"spec": map[string]any{"resource": map[string]any{"group": f.crd.Spec.Group, "resource": f.crd.Spec.Names.Plural}},
	}}
	created, err := f.api.Create(ctx, obj, metav1.CreateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, fmt.Errorf("create a StorageVersionMigration for %s: %w", f.crd.Name, err)
	}
	f.name = created.GetName()
	return toSVM(created)
}

func terminal(s *svmv1.StorageVersionMigration) bool { return svm.Terminal(s) }

// follow watches the StorageVersionMigration until it succeeds or fails, reporting
// progress. One that gets no condition within Options.BuiltinStartTimeout means that no
// migrator runs: *BuiltinNotRunningError.
func (f *follower) follow(ctx context.Context, svm *svmv1.StorageVersionMigration) (*svmv1.StorageVersionMigration, error) {
	window := f.o.BuiltinStartTimeout
	if window <= 0 {
		window = DefaultBuiltinStartTimeout
	}
	startTimer := time.NewTimer(window)
	defer startTimer.Stop()
	f.progress(svm)
	if terminal(svm) {
		return svm, nil
	}
	w, err := f.watch(ctx, svm.ResourceVersion)
	if err != nil {
		return nil, err
	}
	defer func() { w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-startTimer.C:
			if len(svm.Status.Conditions) == 0 {
				return nil, &BuiltinNotRunningError{CRD: f.crd.Name, StorageVersionMigration: f.name, Waited: window}
			}
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				// The watch ended (an expired resourceVersion): read again and go on.
				w.Stop()
				if svm, err = f.get(ctx); err != nil {
					return nil, f.lost(err)
				}
				if w, err = f.watch(ctx, svm.ResourceVersion); err != nil {
					return nil, err
				}
				continue
			}
			if ev.Type == watch.Deleted {
				return nil, f.lost(apierrors.NewNotFound(schema.GroupResource{Group: StorageMigrationGroup, Resource: "storageversionmigrations"}, f.name))
			}
			u, isU := ev.Object.(*unstructured.Unstructured)
			if !isU {
				continue
			}
			if svm, err = toSVM(u); err != nil {
				return nil, err
			}
			f.progress(svm)
			if terminal(svm) {
				return svm, nil
			}
		}
	}
}

// watch watches this run's StorageVersionMigration from resourceVersion on, re-connecting
// as needed.
func (f *follower) watch(ctx context.Context, resourceVersion string) (watch.Interface, error) {
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = "metadata.name=" + f.name
		return f.api.Watch(ctx, o)
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, resourceVersion, lw)
	if err != nil {
		return nil, fmt.Errorf("watch StorageVersionMigration %s: %w", f.name, err)
	}
	return w, nil
}

// lost says why following the StorageVersionMigration stopped.
func (f *follower) lost(err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("StorageVersionMigration %s for %s was deleted by someone else during the run: storedVersions untouched; run again", f.name, f.crd.Name)
	}
	return fmt.Errorf("follow StorageVersionMigration %s: %w", f.name, err)
}

// The migrator's Running message: "The migration is running, 3/10 objects not yet
// migrated", then "..., 10 objects verified migrated".
var (
	pendingRE  = regexp.MustCompile(`(\d+)/(\d+) objects not yet migrated`)
	verifiedRE = regexp.MustCompile(`(\d+) objects verified migrated`)
)

func (f *follower) progress(svm *svmv1.StorageVersionMigration) {
	c := meta.FindStatusCondition(svm.Status.Conditions, string(svmv1.MigrationRunning))
	if c == nil {
		return
	}
	done, total := f.done, f.total
	if m := pendingRE.FindStringSubmatch(c.Message); m != nil {
		pending, _ := strconv.ParseInt(m[1], 10, 64)
		total, _ = strconv.ParseInt(m[2], 10, 64)
		done = total - pending
	} else if m := verifiedRE.FindStringSubmatch(c.Message); m != nil {
		total, _ = strconv.ParseInt(m[1], 10, 64)
		done = total
	}
	if done == f.done && total == f.total {
		return
	}
	f.done, f.total = done, total
	if f.o.Progress != nil {
		f.o.Progress(Progress{CRD: f.crd.Name, Done: done, Total: total, Elapsed: time.Since(f.start)})
	}
}

// waitServerCleanup waits, briefly, until the server has recorded the outcome on the CRD
// (the StorageVersionMigration's Running condition turns False): deleting it earlier
// would leave the CRD's StorageMigrating condition True.
func (f *follower) waitServerCleanup(ctx context.Context) {
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, builtinCleanupWait, true, func(ctx context.Context) (bool, error) {
		svm, err := f.get(ctx)
		if err != nil {
			return apierrors.IsNotFound(err), nil
		}
		return !meta.IsStatusConditionTrue(svm.Status.Conditions, string(svmv1.MigrationRunning)), nil
	})
}

// delete removes the StorageVersionMigration this run created, even after a cancellation.
func (f *follower) delete(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = f.api.Delete(ctx, f.name, metav1.DeleteOptions{})
}

// failed records the migrator's failure; storedVersions stays as it is.
func (f *follower) failed(ctx context.Context, c *metav1.Condition) {
	f.res.Status, f.res.Objects = Incomplete, max(f.done, 0)
	f.res.BuiltinFailure = fmt.Sprintf("Failed=True, reason %s: %s", c.Reason, c.Message)
	restored := f.restore(ctx)
	f.res.Message = fmt.Sprintf("the built-in migrator failed: StorageVersionMigration %s condition %s%s: storedVersions left as they were%s; fix the cause and run again",
		f.name, f.res.BuiltinFailure, f.diagnose(ctx), restored)
}

// restore puts back the stored versions the server pruned after a failed migration:
// kube-controller-manager 1.37 prunes storedVersions when a migration ends, whatever its
// outcome, while objects may still be stored at the versions it drops.
func (f *follower) restore(ctx context.Context) string {
	api := f.m.crds.ApiextensionsV1().CustomResourceDefinitions()
	before := f.res.StoredVersionsBefore
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := api.Get(ctx, f.crd.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Sprintf(" (could not re-read %s to check that the server kept them: %v)", f.crd.Name, err)
		}
		pruned := slices.Clone(cur.Status.StoredVersions)
		var want []string // the versions before the run, in their order, then any new one
		for _, v := range before {
			if hasVersion(cur, v) {
				want = append(want, v)
			}
		}
		for _, v := range pruned {
			if !slices.Contains(want, v) {
				want = append(want, v)
			}
		}
		f.res.StoredVersionsAfter = pruned
		if !slices.ContainsFunc(want, func(v string) bool { return !slices.Contains(pruned, v) }) {
			return ""
		}
		cur.Status.StoredVersions = want
		updated, err := api.UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: FieldManager})
		switch {
		case err == nil:
			f.res.StoredVersionsAfter = slices.Clone(updated.Status.StoredVersions)
			return fmt.Sprintf(" (the server had pruned them to [%s] although the migration failed; upgradeguard restored [%s])",
				strings.Join(pruned, " "), strings.Join(want, " "))
		case !apierrors.IsConflict(err):
			return fmt.Sprintf(" (NO: the server pruned them to [%s] although the migration failed, and restoring [%s] failed: %v; restore them with kubectl before removing any version)",
				strings.Join(pruned, " "), strings.Join(want, " "), err)
		}
	}
	return " (the CRD kept changing while upgradeguard checked that the server kept them: check status.storedVersions)"
}

func hasVersion(crd *apiextv1.CustomResourceDefinition, v string) bool {
	return slices.ContainsFunc(crd.Spec.Versions, func(cv apiextv1.CustomResourceDefinitionVersion) bool { return cv.Name == v })
}

// diagnose adds what explains a failure best: a conversion webhook the objects go
// through, and what a LIST of the resource answers now.
func (f *follower) diagnose(ctx context.Context) string {
	out := ""
	if conv := f.crd.Spec.Conversion; conv != nil && conv.Strategy == apiextv1.WebhookConverter {
		out += "; " + f.crd.Name + " converts between versions with a conversion webhook"
		if conv.Webhook != nil && conv.Webhook.ClientConfig != nil {
			if s := conv.Webhook.ClientConfig.Service; s != nil {
				out += " (service " + s.Namespace + "/" + s.Name + ")"
			} else if u := conv.Webhook.ClientConfig.URL; u != nil {
				out += " (" + *u + ")"
			}
		}
		out += ", which every object stored at another version goes through: check that it answers"
	}
	gvr := schema.GroupVersionResource{Group: f.crd.Spec.Group, Version: crdversions.ServedVersion(f.crd), Resource: f.crd.Spec.Names.Plural}
	if _, err := f.m.metadata.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil && !apierrors.IsForbidden(err) {
		out += "; listing " + gvr.GroupResource().String() + " fails: " + err.Error()
	}
	return out
}

// succeeded checks that the server pruned storedVersions. Where the built-in migrator
// skipped the prune because the CRD's generation changed during the migration, and the
// CRD still stores at the same version and gained no stored version, it asks for a new
// StorageVersionMigration (again; mayRerun bounds it). Otherwise it prunes under the
// client engine's guards where the server did not.
func (f *follower) succeeded(ctx context.Context, mayRerun bool) (again bool) {
	res := f.res
	res.Objects = max(f.done, 0)
	storage := crdversions.StorageVersion(f.crd)
	cur, err := f.m.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, f.crd.Name, metav1.GetOptions{})
	if err != nil {
		res.Status, res.Message = Incomplete, fmt.Sprintf("the built-in migrator succeeded, but %s could not be read again: %v: run again to prune storedVersions", f.crd.Name, err)
		return false
	}
	if slices.Equal(cur.Status.StoredVersions, []string{storage}) {
		res.Status, res.PrunedBy, res.StoredVersionsAfter = Migrated, PrunedByServer, slices.Clone(cur.Status.StoredVersions)
		res.Message = "the built-in migrator re-persisted every object; the server pruned storedVersions" + rerunNote(res.BuiltinReruns, f.name)
		return false
	}
	if mayRerun && cur.Generation != f.crd.Generation && crdversions.StorageVersion(cur) == storage && !gained(f.crd, cur) {
		res.BuiltinReruns = append(res.BuiltinReruns, BuiltinRerun{StorageVersionMigration: f.name,
			GenerationBefore: f.crd.Generation, GenerationAfter: cur.Generation, ServerCondition: storageMigrating(cur)})
		f.crd, f.done, f.total = cur, -1, -1
		return true
	}
	if err := f.m.prune(ctx, f.crd, res); err != nil {
		var changed *crdChangedError
		res.Status, res.Restart = Incomplete, errors.As(err, &changed)
		res.Message = "the built-in migrator succeeded, but " + err.Error() + serverNote(cur) + rerunNote(res.BuiltinReruns, "")
		return false
	}
	res.Status, res.PrunedBy = Migrated, PrunedByUpgradeguard
	res.Message = "the built-in migrator re-persisted every object; upgradeguard pruned storedVersions (the server did not)" + rerunNote(res.BuiltinReruns, f.name)
	return false
}

// gained says whether cur stores a version that started did not.
func gained(started, cur *apiextv1.CustomResourceDefinition) bool {
	return slices.ContainsFunc(cur.Status.StoredVersions, func(v string) bool { return !slices.Contains(started.Status.StoredVersions, v) })
}

// rerunNote words the re-runs of a builtin run for its message: which migrations the
// built-in migrator did not prune after, and the one that ran last.
func rerunNote(reruns []BuiltinRerun, last string) string {
	if len(reruns) == 0 {
		return ""
	}
	parts := make([]string, 0, len(reruns))
	for _, r := range reruns {
		parts = append(parts, fmt.Sprintf("%s (generation %d -> %d)", r.StorageVersionMigration, r.GenerationBefore, r.GenerationAfter))
	}
	out := fmt.Sprintf(", after re-running: the built-in migrator skipped the prune after StorageVersionMigration %s because the CRD changed while it ran",
		strings.Join(parts, ", "))
	if last != "" {
		out += "; upgradeguard ran " + last + " for the CRD as it is now"
	}
	return out
}

func storageMigrating(crd *apiextv1.CustomResourceDefinition) string {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextv1.StorageMigrating {
			return c.Message
		}
	}
	return ""
}

// serverNote is the CRD's StorageMigrating condition, which says why the server did not
// prune (for example a generation mismatch).
func serverNote(crd *apiextv1.CustomResourceDefinition) string {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextv1.StorageMigrating && c.Message != "" {
			return fmt.Sprintf(" (the CRD's %s condition: %s)", c.Type, c.Message)
		}
	}
	return ""
}
