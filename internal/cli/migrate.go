package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/apf"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

type migrateOptions struct {
	predictOpts checkOptions
	crds        []string
	all         bool
	storage     string
	qps         float32
	burst       int
	opts        migrate.Options
	resultCM    string
}

func newMigrateCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &migrateOptions{}
	cmd := command("migrate (--crd NAME... | --chart REF | --manifests FILE|DIR|- | --rollback --release NAME | --all)", "Re-persist custom resources at the storage version and prune storedVersions", migrateLong, migrateExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	o.predictOpts.addPredictFlags(cmd)
	o.predictOpts.addManifestsFlag(cmd, streams)
	o.addFlags(cmd.Flags())
	cliflag.AddEngine(cmd, cliflag.RunEngine, &o.opts.Engine)
	return cmd
}

// addFlags are the selection, the output and the run's tuning.
func (o *migrateOptions) addFlags(f *pflag.FlagSet) {
	f.StringArrayVar(&o.crds, "crd", nil, "CRD to migrate, e.g. helmrepositories.source.toolkit.fluxcd.io (can repeat)")
	f.BoolVar(&o.all, "all", false, "migrate every CRD whose storedVersions is not exactly [storageVersion]")
	f.StringVar(&o.storage, "storage-version", "", "switch the live storage version to this one first (one --crd only; needs --allow-storage-switch)")
	f.BoolVar(&o.opts.AllowStorageSwitch, "allow-storage-switch", false, "confirm that migrate may change a live CRD's storage version (reverse migrations)")
	f.BoolVar(&o.opts.AllowFieldLoss, "allow-field-loss", false, "migrate even though objects stored at an older version hold fields the storage version's schema does not declare, "+
		"which the rewrite deletes for good (without it migrate refuses, lists the fields and writes nothing; see "+migrate.FieldLossRunbook+")")
	f.StringVar(&o.opts.BackupFields, "backup-fields", "", "with --allow-field-loss: first save the values of the fields the migration drops to DIR/<crd>/ "+
		"(one YAML per object holding only those fields, and index.json; the files hold field values, so keep them private)")
	output.AddFlag(f, &o.predictOpts.output)
	f.StringVar(&o.resultCM, "result-configmap", "", "also write the JSON result into this ConfigMap (key "+migrate.ResultKey+") in --lease-namespace: how a Job-mode migration reports to the controller")
	o.addRunFlags(f)
}

func (o *migrateOptions) addRunFlags(f *pflag.FlagSet) {
	f.Int64Var(&o.opts.PageSize, "page-size", migrate.DefaultPageSize, "objects listed per page")
	f.IntVar(&o.opts.Concurrency, "concurrency", migrate.DefaultConcurrency, "objects patched in parallel: the bound on the load this run puts on the API server")
	f.Float32Var(&o.qps, "qps", migrate.DefaultQPS, "opt-in client-side request rate limit; 0 means none (the API server's Priority and Fairness paces the run)")
	f.IntVar(&o.burst, "burst", migrate.DefaultBurst, "client-side request burst, with --qps; 0 means twice --qps")
	f.DurationVar(&o.opts.Deadline, "deadline", migrate.DefaultDeadline, "stop after this long, leaving storedVersions untouched; a re-run resumes where this one stopped")
	f.BoolVar(&o.opts.NoResume, "no-resume", false, "start from the first object even if an interrupted run left its place in the migration Lease")
	f.StringVar(&o.opts.LeaseNamespace, "lease-namespace", "kube-system", "namespace of the per-CRD migration Leases")
	f.BoolVar(&o.opts.Wait, "wait", false, "wait for another run's Lease instead of exiting")
	f.BoolVar(&o.opts.SkipManagedFields, "skip-managed-fields", false, "do not clean managedFields entries that name unserved versions")
	f.BoolVar(&o.opts.DryRun, "dry-run", false, "report what would be migrated, with object counts and an estimated duration; write nothing")
	f.DurationVar(&o.opts.BuiltinStartTimeout, "builtin-start-timeout", migrate.DefaultBuiltinStartTimeout, "builtin engine: stop if the built-in migrator has not acted on the StorageVersionMigration within this long")
}

func (o *migrateOptions) validate() error {
	switch {
	case count(len(o.crds) > 0, o.predictOpts.chart.Ref != "", o.predictOpts.manifests != "", o.predictOpts.rollback, o.all) != 1:
		return couldNot("choose the CRDs with exactly one of --crd, --chart, --manifests, --rollback --release or --all")
	case o.storage != "" && len(o.crds) != 1:
		return couldNot("--storage-version applies to exactly one --crd")
	case o.qps < 0 || o.burst < 0 || o.opts.Concurrency < 1 || o.opts.PageSize < 1:
		return couldNot("--qps and --burst must be 0 or more, --concurrency and --page-size at least 1")
	case o.opts.BackupFields != "" && !o.opts.AllowFieldLoss:
		return couldNot("--backup-fields saves what --allow-field-loss lets a migration drop: pass both")
	case o.predictOpts.chart.Ref != "" || o.predictOpts.manifests != "" || o.predictOpts.rollback:
		return o.predictOpts.validate()
	}
	return nil
}

func (o *migrateOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, m, seen, err := o.connect(ctx, kube)
	if err != nil {
		return err
	}
	targets, blocked, err := o.targets(ctx, conn, m)
	if err != nil {
		return err
	}
	results, err := m.Run(ctx, targets, o.runOptions(streams))
	if err != nil {
		return classifyAs(cmdMigrate, err, conn)
	}
	out := &migrateOutput{CRDs: results, Blocked: blocked, PriorityAndFairness: seen.Placement(ctx, conn.clientset, apf.Name)}
	if err := o.writeResult(ctx, conn, out); err != nil {
		return err
	}
	return finish(streams, o.predictOpts.output, out, out.text, migrate.AnyIncomplete(results) || len(blocked) > 0)
}

// writeResult writes the JSON result into --result-configmap, when set: how a Job-mode
// migration tells the controller its outcome.
func (o *migrateOptions) writeResult(ctx context.Context, conn *connection, out *migrateOutput) error {
	if o.resultCM == "" {
		return nil
	}
	var buf bytes.Buffer
	if err := output.WriteJSON(&buf, out); err != nil {
		return couldNot("write the result: %w", err)
	}
	ns := o.opts.LeaseNamespace
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: o.resultCM, Namespace: ns}, Data: map[string]string{migrate.ResultKey: buf.String()}}
	if _, err := conn.clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return couldNot("write the result into ConfigMap %s/%s: %w", ns, o.resultCM, err)
	}
	return nil
}

// count is how many of set are true.
func count(set ...bool) int {
	n := 0
	for _, b := range set {
		if b {
			n++
		}
	}
	return n
}

// connect checks the cluster, then builds the migration's own client set: the same
// cluster, with the rate limit of --qps when one is set, and an observer of the API
// Priority and Fairness placement its writes get.
func (o *migrateOptions) connect(ctx context.Context, kube *genericclioptions.ConfigFlags) (*connection, *migrate.Migrator, *apf.Observer, error) {
	conn, err := connect(ctx, kube)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg, seen := apf.Observe(migrate.RateLimit(conn.config, o.qps, o.burst))
	m, err := migrate.New(cfg)
	if err != nil {
		return nil, nil, nil, couldNot("build client: %w", err)
	}
	return conn, m, seen, nil
}

// runOptions are the flags' options, with the progress display and restart notices on
// stderr.
func (o *migrateOptions) runOptions(streams Streams) migrate.Options {
	opts := o.opts
	opts.QPS, opts.Holder = float64(o.qps), holder()
	progress := newProgress(streams.ErrOut)
	opts.Progress = progress.update
	opts.Restarting = func(res *migrate.Result, attempt int) {
		progress.finish()
		fmt.Fprintf(streams.ErrOut, "%s\n  -> starting over from the first object (restart %d of %d)\n", res.Message, attempt, migrate.MaxRestarts)
	}
	return opts
}

// targets maps the selection flags to the library's selections: named CRDs, every CRD
// that needs it, or what check says the chart or rollback needs.
func (o *migrateOptions) targets(ctx context.Context, conn *connection, m *migrate.Migrator) ([]migrate.Target, []check.CRDReport, error) {
	switch {
	case len(o.crds) > 0:
		out := make([]migrate.Target, 0, len(o.crds))
		for _, c := range o.crds {
			out = append(out, migrate.Target{Name: c, StorageVersion: o.storage})
		}
		return out, nil, nil
	case o.all:
		out, err := m.AllTargets(ctx)
		return out, nil, classifyErr(cmdMigrate, err, conn)
	}
	rep, err := o.predictOpts.predict(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	targets, blocked, err := migrate.TargetsFor(rep, o.opts)
	if err != nil {
		return nil, nil, classifyAs(cmdMigrate, err, conn)
	}
	return targets, blocked, nil
}

func holder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("upgradeguard-cli@%s/%d", host, os.Getpid())
}

// migrateOutput is migrate's result: -o json writes it as is.
type migrateOutput struct {
	CRDs    []*migrate.Result `json:"crds"`
	Blocked []check.CRDReport `json:"blocked,omitempty"`
	// PriorityAndFairness is where the API server put the migration's writes (absent
	// when none was sent, or they were exempt).
	PriorityAndFairness *apf.Placement `json:"priorityAndFairness,omitempty"`
}

func (out *migrateOutput) text(w io.Writer) error {
	if len(out.CRDs) == 0 && len(out.Blocked) == 0 {
		fmt.Fprintln(w, "Nothing to migrate: every selected CRD's storedVersions is already its storage version.")
		return nil
	}
	if err := migrateTable(w, out.CRDs); err != nil {
		return err
	}
	for _, r := range out.CRDs {
		migrateNotes(w, r)
	}
	dryRunNote(w, out.CRDs)
	apfNote(w, out.PriorityAndFairness)
	for _, b := range out.Blocked {
		fmt.Fprintf(w, "\n%s: not migrated: %s\n  next: %s\n", b.Name, b.Reason, b.Action)
	}
	return nil
}

// apfNote says at which API priority level the writes ran, and how to give migrations a
// level of their own when they shared one with other clients.
func apfNote(w io.Writer, p *apf.Placement) {
	switch {
	case p == nil:
	case p.Ours:
		fmt.Fprintf(w, "\nWrites ran at API priority level %s (FlowSchema %s): the API server made them wait rather than other clients.\n", p.PriorityLevel, p.FlowSchema)
	case p.FlowSchema == "":
		fmt.Fprintf(w, "\nWrites ran under FlowSchema UID %s, not upgradeguard's (%s): `%s` shows how to give migrations a priority level of their own.\n", p.FlowSchemaUID, apf.Name, cmdline.APF{})
	default:
		fmt.Fprintf(w, "\nWrites ran at API priority level %s (FlowSchema %s), shared with other clients: `%s` gives migrations a level of their own, so that the API server makes them wait rather than others.\n", p.PriorityLevel, p.FlowSchema, cmdline.APF{Apply: true})
	}
}

func migrateTable(w io.Writer, results []*migrate.Result) error {
	if len(results) == 0 {
		return nil
	}
	t := output.NewTable(w, "CRD", "STATUS", "OBJECTS", "REWRITTEN", "CURRENT", "DELETED", "FAILED", "STORED VERSIONS", "TIME")
	for _, r := range results {
		t.Row(r.Name, r.Status, r.Objects, r.Rewritten, r.AlreadyCurrent, r.Deleted, r.FailedCount,
			strings.Join(r.StoredVersionsBefore, ",")+" -> "+strings.Join(r.StoredVersionsAfter, ","),
			seconds(r.DurationSeconds).Round(time.Millisecond))
	}
	return t.Flush()
}

// migrateNotes are what the table cannot say about one CRD.
func migrateNotes(w io.Writer, r *migrate.Result) {
	if r.StorageSwitchedFrom != "" {
		fmt.Fprintf(w, "\n%s: storage version switched from %s to %s\n", r.Name, r.StorageSwitchedFrom, r.StorageVersion)
	}
	if r.Resumed {
		fmt.Fprintf(w, "\n%s: resumed where an interrupted run stopped (the counts cover the rest; --no-resume starts over)\n", r.Name)
	}
	if r.ConversionRetries > 0 || r.ConversionChanges > 0 {
		fmt.Fprintf(w, "\n%s: %d requests retried because the conversion webhook did not answer; %d changes of spec.conversion waited for\n",
			r.Name, r.ConversionRetries, r.ConversionChanges)
	}
	engineNote(w, r)
	fieldLossNote(w, r)
	if r.Status == migrate.Incomplete && !r.FieldLossRefused {
		fmt.Fprintf(w, "\n%s: %s\n", r.Name, r.Message)
	}
	if r.Forbidden {
		fmt.Fprintf(w, "  the least-privilege role for it: `%s`\n", cmdline.RBAC{CRDs: []string{r.Name}})
	}
	migrateFailures(w, r)
}

// fieldLossNote lists the fields a migration would drop (refused) or dropped (allowed):
// paths, object counts and up to three objects each, never values.
func fieldLossNote(w io.Writer, r *migrate.Result) {
	if !r.FieldLoss.DataLoss() {
		return
	}
	from := make([]string, 0, len(r.FieldLoss.Reads))
	for _, rd := range r.FieldLoss.Reads {
		if !slices.Contains(from, rd.ReadAt) {
			from = append(from, rd.ReadAt)
		}
	}
	if r.FieldLossRefused {
		fmt.Fprintf(w, "\n%s: refused: migrating to %s would permanently drop these fields from objects stored at %s (the %s schema does not declare them); nothing was written:\n",
			r.Name, r.StorageVersion, strings.Join(from, ", "), r.StorageVersion)
	} else {
		fmt.Fprintf(w, "\n%s: allowed to lose fields: the migration to %s dropped these fields from objects stored at %s (the %s schema does not declare them):\n",
			r.Name, r.StorageVersion, strings.Join(from, ", "), r.StorageVersion)
	}
	t := output.NewTable(w, "  FIELD", "OBJECTS", "EXAMPLES")
	for _, p := range r.FieldLoss.Pruned {
		t.Row("  "+p.Path, p.Objects, strings.Join(p.Examples, ", "))
	}
	_ = t.Flush()
	if r.FieldLossRefused {
		fmt.Fprintf(w, "  next: to keep them, add them to the %s schema of the CRD (or x-kubernetes-preserve-unknown-fields) and migrate again;\n"+
			"        if losing them is intended, migrate again with --allow-field-loss (add --backup-fields DIR to save their values first),\n"+
			"        or annotate the CRD %s=true (%s)\n",
			r.StorageVersion, predict.AllowFieldLossAnnotation, migrate.FieldLossRunbook)
	}
	if r.FieldBackup != "" {
		fmt.Fprintf(w, "  the values were saved first to %s (index.json lists the objects)\n", r.FieldBackup)
	}
}

// migrateFailures lists the objects that failed, up to the ones the result keeps.
func migrateFailures(w io.Writer, r *migrate.Result) {
	for _, f := range r.Failed {
		fmt.Fprintf(w, "  failed %s: %s\n", f.Object, f.Error)
	}
	if int64(len(r.Failed)) < r.FailedCount {
		fmt.Fprintf(w, "  ... and %d more failed objects (-o json lists the first %d)\n", r.FailedCount-int64(len(r.Failed)), len(r.Failed))
	}
}

func dryRunNote(w io.Writer, results []*migrate.Result) {
	var estimate float64
	dryRun := false
	for _, r := range results {
		if r.Status == migrate.WouldMigrate {
			dryRun, estimate = true, estimate+r.EstimatedSeconds
		}
	}
	switch {
	case !dryRun:
	case estimate > 0:
		fmt.Fprintf(w, "\nDry run: nothing was written. Estimated duration at the configured --qps: %s.\n", seconds(estimate).Round(time.Second))
	default:
		fmt.Fprintln(w, "\nDry run: nothing was written. No client-side rate limit (no --qps): the API server's Priority and Fairness sets the pace, so there is no estimate.")
	}
}

// engineNote says which engine ran and why, and what the builtin engine adds.
func engineNote(w io.Writer, r *migrate.Result) {
	if r.Engine == "" {
		return
	}
	fmt.Fprintf(w, "\n%s: %s engine (%s)\n", r.Name, r.Engine, r.EngineReason)
	if r.StorageVersionMigration == "" {
		return
	}
	for _, re := range r.BuiltinReruns {
		fmt.Fprintf(w, "  StorageVersionMigration %s succeeded, but the built-in migrator skipped the prune: %s changed during it (generation %d -> %d); re-ran under a new name\n",
			re.StorageVersionMigration, r.Name, re.GenerationBefore, re.GenerationAfter)
	}
	fmt.Fprintf(w, "  StorageVersionMigration %s (the built-in migrator counts objects, not rewritten or current ones)\n", r.StorageVersionMigration)
	switch r.PrunedBy {
	case migrate.PrunedByServer:
		fmt.Fprintln(w, "  storedVersions pruned by the API server")
	case migrate.PrunedByUpgradeguard:
		fmt.Fprintln(w, "  storedVersions pruned by upgradeguard (the API server did not)")
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

const migrateLong = `migrate re-persists every object of the selected CRDs at the live storage version
with a merge patch that changes nothing, then sets status.storedVersions to
[storageVersion], so that an upgrade (or rollback) that drops old versions is accepted by
the API server.

Such a patch writes an object only when it is stored at an older version: a re-run on a
migrated cluster writes nothing. storedVersions is pruned only after every object was
processed without failure, and only if the CRD's storage version and generation did not
change during the run; if they did (a chart upgrade applied meanwhile), the CRD is started
over, up to twice. A Lease per CRD keeps two runs (two operators, or the CLI and the
controller) from migrating the same CRD at once.

Engines (--engine): client patches the objects from this process (fastest; needs patch on
them); builtin creates a StorageVersionMigration and lets kube-controller-manager's
storage-version-migrator-controller patch them (Kubernetes 1.37, or 1.35/1.36 with the
beta API on; needs only the role 'upgradeguard rbac --engine builtin' prints); auto, the
default, picks client when you may patch the objects, else builtin. Either way the same
Lease, guards and report; the report says which engine ran and why. If nothing acts on the
StorageVersionMigration within --builtin-start-timeout, the run stops and says so. The
built-in migrator skips pruning storedVersions when the CRD's generation changed while it
ran; builtin then runs a new StorageVersionMigration for the CRD as it is now (up to
twice) and the report names the one whose prune was skipped.

Selecting CRDs:
  --crd NAME               these CRDs (repeat the flag)
  --chart REF ...          the CRDs 'upgradeguard check' says need migrating for that chart
  --manifests FILE|DIR|-   the same for rendered manifests (every CRD in them applied)
  --rollback --release R   the CRDs a rollback needs migrated; reverse migrations (storage
                           switches) need --allow-storage-switch
  --all                    every CRD whose storedVersions is not exactly [storageVersion]

Field loss: before it writes anything, migrate reads the objects stored at other versions
and judges them with the API server's own pruning against the storage version's schema.
Fields that schema does not declare are hidden already and deleted for good by the
migration's rewrite, so migrate refuses: it lists the fields with object counts and a few
objects (never values), writes nothing and exits 1. Keep the fields by adding them to the
CRD's storage version schema (or x-kubernetes-preserve-unknown-fields) and run again; pass
--allow-field-loss only when losing them is intended (the report still lists them). The
CRD annotation upgradeguard.io/allow-field-loss=true accepts the loss for every migration
of that CRD, as it does for check and the gates. Stored versions that share the storage
version's schema are not read.

Load: at most --concurrency patches are in flight (default 8), with no client-side rate
limit: the API server's Priority and Fairness queues the requests or answers 429 with
Retry-After when it is busy, and migrate waits as told and backs off. --qps sets an
opt-in client-side limit for clusters that want one.

Exit codes: 0 every selected CRD is migrated and pruned, 1 some are not (see the report;
a re-run finishes the job, unless it was refused for field loss), 2 could not run.`

const migrateExample = `  # What the Flux 2.18 upgrade needs, first as a dry run
  upgradeguard migrate --crd helmrepositories.source.toolkit.fluxcd.io --dry-run
  upgradeguard migrate --chart flux2 --repo https://fluxcd-community.github.io/helm-charts --version 2.18.2 \
    --release flux -n flux-system

  # Objects stored at an older version hold fields the new schema drops: migrate refuses and
  # lists them; once you have decided the loss is intended
  upgradeguard migrate --crd helmreleases.helm.toolkit.fluxcd.io --allow-field-loss

  # Unblock a rollback with a reverse migration
  upgradeguard migrate --rollback --release flux -n flux-system --to-revision 1 --allow-storage-switch

  # Without patch rights on the objects: Kubernetes' built-in migrator does the writes
  upgradeguard rbac --crd helmrepositories.source.toolkit.fluxcd.io --engine builtin | kubectl apply -f -
  upgradeguard migrate --crd helmrepositories.source.toolkit.fluxcd.io --engine builtin

  # A big cluster: more time, more concurrency
  upgradeguard migrate --all --concurrency 16 --deadline 30m

  # Gentler: an opt-in client-side limit of 50 requests per second
  upgradeguard migrate --all --qps 50`
