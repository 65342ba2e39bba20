package migrate

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// FieldLossRunbook is the runbook a refusal for field loss points to.
const FieldLossRunbook = "docs/runbooks/migration-refused-field-loss.md"

// judgeFieldLoss asks what re-writing crd's objects at storage would drop: the API server
// prunes what storage's schema does not declare when it decodes an object stored at
// another version, and the migration's write makes that permanent. It records the loss in
// res.FieldLoss and reports whether the run must stop before writing anything (there is a
// loss and nothing accepts it: see FieldLossAllowed). A CRD whose stored versions share the
// storage schema, or that converts through a webhook, is not read at all.
func (m *Migrator) judgeFieldLoss(ctx context.Context, crd *apiextv1.CustomResourceDefinition, storage string, o Options, res *Result) (bool, error) {
	rep, judge, err := fieldLoss(ctx, retryingLister{client: m.dynamic}, crd, storage, o.PageSize)
	if err != nil || rep == nil {
		return false, err
	}
	res.FieldLoss = rep
	if FieldLossAllowed(crd, o) {
		if o.BackupFields == "" || o.DryRun {
			return false, nil
		}
		// Save the values before the run drops them: one directory per CRD.
		b, err := judge.Backup(ctx, retryingLister{client: m.dynamic}, filepath.Join(o.BackupFields, crd.Name))
		if err != nil {
			return false, fmt.Errorf("%s: back up the fields the migration drops (nothing was migrated; the backup is incomplete, without an index): %w", crd.Name, err)
		}
		res.FieldBackup = b.Dir
		return false, nil
	}
	res.Status, res.FieldLossRefused = Incomplete, true
	res.Message = FieldLossRefusal(storage, rep)
	return true, nil
}

// FieldLoss judges what re-writing crd's objects at storage ("" for its storage version)
// would drop, reading through l only the objects stored at versions whose schema differs:
// the loss, or nil when there is none. A migration refuses such a loss unless
// FieldLossAllowed; a gate asks before it starts a migration that would be refused.
func FieldLoss(ctx context.Context, l crdschema.Lister, crd *apiextv1.CustomResourceDefinition, storage string, pageSize int64) (*crdschema.Report, error) {
	rep, _, err := fieldLoss(ctx, l, crd, storage, pageSize)
	return rep, err
}

func fieldLoss(ctx context.Context, l crdschema.Lister, crd *apiextv1.CustomResourceDefinition, storage string, pageSize int64) (*crdschema.Report, *crdschema.Judge, error) {
	judge, err := crdschema.ForMigration(crd, storage)
	if err != nil {
		return nil, nil, fmt.Errorf("judge which fields a migration of %s to %s would drop: %w", crd.Name, storage, err)
	}
	if len(judge.Reads()) == 0 {
		return nil, nil, nil
	}
	rep, err := judge.Scan(ctx, l, crdschema.ScanOptions{PageSize: pageSize})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: read the objects stored at older versions to judge which fields the migration would drop: %w", crd.Name, err)
	}
	if !rep.DataLoss() {
		return nil, nil, nil
	}
	return rep, judge, nil
}

// FieldLossAllowed says whether a migration of crd may drop fields its objects hold:
// Options.AllowFieldLoss, or the live CRD's acceptance (predict.AcceptsFieldLoss), the
// same acceptance that check, plan and the gates honour for an upgrade's loss.
func FieldLossAllowed(crd *apiextv1.CustomResourceDefinition, o Options) bool {
	return o.AllowFieldLoss || predict.AcceptsFieldLoss(crd)
}

// FieldLossRefusal says what a refused migration would have dropped (paths, counts and a
// few object names, never a value), that nothing was written, and the two ways on.
func FieldLossRefusal(storage string, rep *crdschema.Report) string {
	var from []string
	for _, r := range rep.Reads {
		from = append(from, r.ReadAt)
	}
	slices.Sort(from)
	from = slices.Compact(from)
	paths := make([]string, 0, len(rep.Pruned))
	for _, p := range rep.Pruned {
		paths = append(paths, fmt.Sprintf("%s (%d objects, e.g. %s)", p.Path, p.Objects, strings.Join(p.Examples, ", ")))
	}
	return fmt.Sprintf("refused: re-writing the objects stored at %s as %s would permanently drop fields the %s schema does not declare: %s. "+
		"Nothing was written and storedVersions is untouched. To keep the fields, add them to the %s schema of the CRD "+
		"(or mark their parent x-kubernetes-preserve-unknown-fields) and migrate again; if losing them is intended, "+
		"migrate again allowing the loss, or annotate the CRD %s=true. See %s",
		strings.Join(from, ", "), storage, storage, strings.Join(paths, "; "), storage, predict.AllowFieldLossAnnotation, FieldLossRunbook)
}

// retryingLister lists through the dynamic client, retrying what a migration's own LIST
// retries (429 with Retry-After, 5xx, timeouts, a restarting API server).
type retryingLister struct{ client dynamic.Interface }

func (l retryingLister) List(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	var list *unstructured.UnstructuredList
	err := retry(ctx, func() error {
		var err error
		list, err = l.client.Resource(gvr).List(ctx, opts)
		return err
	})
	return list, err
}
