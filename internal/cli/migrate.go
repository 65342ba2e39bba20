package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/pkg/check"
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
	output      string
	resultCM    string
}

func newMigrateCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &migrateOptions{}
	cmd := &cobra.Command{
		Use:   "migrate (--crd NAME... | --chart REF | --rollback --release NAME | --all)",
		Short: "Re-persist custom resources at the storage version and prune storedVersions",
		Long: `migrate re-persists every object of the selected CRDs at the live storage version
with a merge patch that changes nothing, then sets status.storedVersions to
[storageVersion], so that an upgrade (or rollback) that drops old versions is accepted by
the API server.

Such a patch writes an object only when it is stored at an older version: a re-run on a
migrated cluster writes nothing. storedVersions is pruned only after every object was
processed without failure, and only if the CRD's storage version and generation did not
change during the run; if they did (a chart upgrade applied meanwhile), the CRD is started
over, up to twice. A Lease per CRD keeps two runs (two operators, or the CLI and the
controller) from migrating the same CRD at once.

Selecting CRDs:
  --crd NAME               these CRDs (repeat the flag)
  --chart REF ...          the CRDs 'upgradeguard check' says need migrating for that chart
  --rollback --release R   the CRDs a rollback needs migrated; reverse migrations (storage
                           switches) need --allow-storage-switch
  --all                    every CRD whose storedVersions is not exactly [storageVersion]

Exit codes: 0 every selected CRD is migrated and pruned, 1 some are not (see the report;
a re-run finishes the job), 2 could not run.`,
		Example: `  # What the Flux 2.18 upgrade needs, first as a dry run
  upgradeguard migrate --crd helmrepositories.source.toolkit.fluxcd.io --dry-run
  upgradeguard migrate --chart flux2 --repo https://fluxcd-community.github.io/helm-charts --version 2.18.2 \
    --release flux -n flux-system

  # Unblock a rollback with a reverse migration
  upgradeguard migrate --rollback --release flux -n flux-system --to-revision 1 --allow-storage-switch

  # Faster on a big cluster: more concurrency, no client-side rate limit
  upgradeguard migrate --all --concurrency 16 --qps 0 --deadline 30m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), streams, kube)
		},
	}
	f := cmd.Flags()
	o.predictOpts.addPredictFlags(f)
	f.StringArrayVar(&o.crds, "crd", nil, "CRD to migrate, e.g. helmrepositories.source.toolkit.fluxcd.io (can repeat)")
	f.BoolVar(&o.all, "all", false, "migrate every CRD whose storedVersions is not exactly [storageVersion]")
	f.StringVar(&o.storage, "storage-version", "", "switch the live storage version to this one first (one --crd only; needs --allow-storage-switch)")
	f.BoolVar(&o.opts.AllowStorageSwitch, "allow-storage-switch", false, "confirm that migrate may change a live CRD's storage version (reverse migrations)")
	f.Int64Var(&o.opts.PageSize, "page-size", migrate.DefaultPageSize, "objects listed per page")
	f.IntVar(&o.opts.Concurrency, "concurrency", migrate.DefaultConcurrency, "objects patched in parallel")
	f.Float32Var(&o.qps, "qps", migrate.DefaultQPS, "client-side request rate limit; 0 means none")
	f.IntVar(&o.burst, "burst", migrate.DefaultBurst, "client-side request burst")
	f.DurationVar(&o.opts.Deadline, "deadline", migrate.DefaultDeadline, "stop after this long, leaving storedVersions untouched; a re-run resumes where this one stopped")
	f.BoolVar(&o.opts.NoResume, "no-resume", false, "start from the first object even if an interrupted run left its place in the migration Lease")
	f.StringVar(&o.opts.LeaseNamespace, "lease-namespace", "kube-system", "namespace of the per-CRD migration Leases")
	f.BoolVar(&o.opts.Wait, "wait", false, "wait for another run's Lease instead of exiting")
	f.BoolVar(&o.opts.SkipManagedFields, "skip-managed-fields", false, "do not clean managedFields entries that name unserved versions")
	f.BoolVar(&o.opts.DryRun, "dry-run", false, "report what would be migrated, with object counts and an estimated duration; write nothing")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	f.StringVar(&o.resultCM, "result-configmap", "", "also write the JSON result into this ConfigMap (key result.json) in --lease-namespace: how a Job-mode migration reports to the controller")
	return cmd
}

func (o *migrateOptions) validate() error {
	selectors := 0
	for _, set := range []bool{len(o.crds) > 0, o.predictOpts.chart.Ref != "", o.predictOpts.rollback, o.all} {
		if set {
			selectors++
		}
	}
	switch {
	case selectors != 1:
		return couldNot("choose the CRDs with exactly one of --crd, --chart, --rollback --release or --all")
	case o.storage != "" && len(o.crds) != 1:
		return couldNot("--storage-version applies to exactly one --crd")
	case o.output != "text" && o.output != "json":
		return couldNot("unknown output format %q: use -o text or -o json", o.output)
	case o.qps < 0 || o.opts.Concurrency < 1 || o.opts.PageSize < 1:
		return couldNot("--qps must be 0 or more, --concurrency and --page-size at least 1")
	}
	if o.predictOpts.chart.Ref != "" || o.predictOpts.rollback {
		o.predictOpts.output = "text"
		return o.predictOpts.validate()
	}
	return nil
}

func (o *migrateOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if err := o.validate(); err != nil {
		return err
	}
	conn, err := connect(ctx, kube)
	if err != nil {
		return err
	}
	targets, blocked, err := o.targets(ctx, conn)
	if err != nil {
		return err
	}
	m, err := migrate.New(migrate.RateLimit(conn.config, o.qps, o.burst))
	if err != nil {
		return couldNot("build client: %v", err)
	}
	o.opts.QPS = float64(o.qps)
	o.opts.Holder = holder()
	progress := newProgress(streams.ErrOut)
	o.opts.Progress = progress.update

	results := []*migrate.Result{}
	for _, t := range targets {
		res, err := m.Migrate(ctx, t, o.opts)
		progress.finish()
		// A chart upgrade applied during the run: start over, a bounded number of times.
		for restarts := 0; err == nil && res.Restart && restarts < maxRestarts; restarts++ {
			fmt.Fprintf(streams.ErrOut, "%s\n  -> starting over from the first object (restart %d of %d)\n", res.Message, restarts+1, maxRestarts)
			res, err = m.Migrate(ctx, t, o.opts)
			progress.finish()
		}
		if err != nil {
			return classify(err, conn)
		}
		results = append(results, res)
	}
	if err := renderMigrate(streams.Out, o.output, results, blocked); err != nil {
		return couldNot("write output: %v", err)
	}
	if o.resultCM != "" {
		var buf bytes.Buffer
		if err := renderMigrate(&buf, "json", results, blocked); err != nil {
			return couldNot("write the result: %v", err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: o.resultCM, Namespace: o.opts.LeaseNamespace}, Data: map[string]string{"result.json": buf.String()}}
		if _, err := conn.clientset.CoreV1().ConfigMaps(o.opts.LeaseNamespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return couldNot("write the result into ConfigMap %s/%s: %w", o.opts.LeaseNamespace, o.resultCM, err)
		}
	}
	for _, r := range results {
		if r.Status == migrate.Incomplete {
			return &ExitError{Code: ExitFindings}
		}
	}
	if len(blocked) > 0 {
		return &ExitError{Code: ExitFindings}
	}
	return nil
}

// maxRestarts bounds how often migrate starts a CRD over because it changed during the run.
const maxRestarts = 2

// targets resolves the selection flags into CRDs to migrate, and the findings that no
// migration can fix (a bridge without a storage switch).
func (o *migrateOptions) targets(ctx context.Context, conn *connection) ([]migrate.Target, []check.CRDReport, error) {
	switch {
	case len(o.crds) > 0:
		out := make([]migrate.Target, 0, len(o.crds))
		for _, c := range o.crds {
			out = append(out, migrate.Target{Name: c, StorageVersion: o.storage})
		}
		return out, nil, nil
	case o.all:
		live, err := conn.cluster.CRDs(ctx)
		if err != nil {
			return nil, nil, classify(err, conn)
		}
		var out []migrate.Target
		for _, name := range sortedKeys(live) {
			if migrate.NeedsMigration(live[name]) {
				out = append(out, migrate.Target{Name: name})
			}
		}
		return out, nil, nil
	}
	rep, err := o.predictOpts.predict(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	var out []migrate.Target
	var blocked []check.CRDReport
	for _, c := range rep.CRDs {
		switch {
		case c.Verdict == predict.Migrate:
			out = append(out, migrate.Target{Name: c.Name})
		case c.Verdict == predict.Bridge && c.StorageSwitchTo != "":
			if !o.opts.AllowStorageSwitch && !o.opts.DryRun {
				return nil, nil, couldNot("%s needs its storage version switched from %s to %s (a reverse migration): confirm with --allow-storage-switch",
					c.Name, c.LiveStorageVersion, c.StorageSwitchTo)
			}
			out = append(out, migrate.Target{Name: c.Name, StorageVersion: c.StorageSwitchTo})
		case c.Verdict == predict.Bridge:
			blocked = append(blocked, c)
		}
	}
	return out, blocked, nil
}

func holder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("upgradeguard-cli@%s/%d", host, os.Getpid())
}

func renderMigrate(w io.Writer, format string, results []*migrate.Result, blocked []check.CRDReport) error {
	if format == "json" {
		return writeJSON(w, struct {
			CRDs    []*migrate.Result `json:"crds"`
			Blocked []check.CRDReport `json:"blocked,omitempty"`
		}{results, blocked})
	}
	if len(results) == 0 && len(blocked) == 0 {
		fmt.Fprintln(w, "Nothing to migrate: every selected CRD's storedVersions is already its storage version.")
		return nil
	}
	if len(results) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CRD\tSTATUS\tOBJECTS\tREWRITTEN\tCURRENT\tDELETED\tFAILED\tSTORED VERSIONS\tTIME")
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s -> %s\t%s\n", r.Name, r.Status, r.Objects, r.Rewritten, r.AlreadyCurrent,
				r.Deleted, r.FailedCount, strings.Join(r.StoredVersionsBefore, ","), strings.Join(r.StoredVersionsAfter, ","),
				seconds(r.DurationSeconds).Round(time.Millisecond))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	var estimate float64
	dryRun := false
	for _, r := range results {
		if r.StorageSwitchedFrom != "" {
			fmt.Fprintf(w, "\n%s: storage version switched from %s to %s\n", r.Name, r.StorageSwitchedFrom, r.StorageVersion)
		}
		if r.Status == migrate.WouldMigrate {
			dryRun, estimate = true, estimate+r.EstimatedSeconds
		}
		if r.Resumed {
			fmt.Fprintf(w, "\n%s: resumed where an interrupted run stopped (the counts cover the rest; --no-resume starts over)\n", r.Name)
		}
		if r.Status == migrate.Incomplete {
			fmt.Fprintf(w, "\n%s: %s\n", r.Name, r.Message)
		}
		for _, f := range r.Failed {
			fmt.Fprintf(w, "  failed %s: %s\n", f.Object, f.Error)
		}
		if int64(len(r.Failed)) < r.FailedCount {
			fmt.Fprintf(w, "  ... and %d more failed objects (-o json lists the first %d)\n", r.FailedCount-int64(len(r.Failed)), len(r.Failed))
		}
	}
	if dryRun {
		if estimate > 0 {
			fmt.Fprintf(w, "\nDry run: nothing was written. Estimated duration at the configured --qps: %s.\n", seconds(estimate).Round(time.Second))
		} else {
			fmt.Fprintln(w, "\nDry run: nothing was written. No client-side rate limit (--qps 0): the API server sets the pace.")
		}
	}
	for _, b := range blocked {
		fmt.Fprintf(w, "\n%s: not migrated: %s\n  next: %s\n", b.Name, b.Reason, b.Action)
	}
	return nil
}

// progress shows a bar on a terminal and a log line every few seconds otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	mu       sync.Mutex
	last     time.Time
	drawn    bool
	interval time.Duration
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && term.IsTerminal(int(f.Fd())), interval: 2 * time.Second}
}

func (p *progress) update(s migrate.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rate := float64(s.Done) / max(s.Elapsed.Seconds(), 0.001)
	eta := "?"
	if rate > 0 && s.Total >= s.Done {
		eta = time.Duration(float64(s.Total-s.Done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	pct := 100.0
	if s.Total > 0 {
		pct = 100 * float64(s.Done) / float64(s.Total)
	}
	if p.tty {
		const width = 30
		filled := int(pct / 100 * width)
		fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d %.0f obj/s ETA %s ", s.CRD, strings.Repeat("#", filled), strings.Repeat(".", width-filled), s.Done, s.Total, rate, eta)
		p.drawn = true
		return
	}
	if s.Total == 0 || (time.Since(p.last) < p.interval && s.Done < s.Total) {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "%s %s: %d/%d objects (%.0f%%), %.0f obj/s, ETA %s\n", metav1.Now().Format(time.TimeOnly), s.CRD, s.Done, s.Total, pct, rate, eta)
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
