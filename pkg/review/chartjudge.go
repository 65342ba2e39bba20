package review

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	release "helm.sh/helm/v4/pkg/release/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

// Check IDs of a chart review's own findings. A CRD the upgrade deletes is check's
// "delete" (predict.Delete), so one acknowledgement names it on both sides.
const (
	// CheckStoredVersionDropped: the head's CRD drops a version that status.storedVersions
	// can still hold on some supported upgrade path; the API server rejects the CRD update.
	CheckStoredVersionDropped = "stored-version-dropped"
	// CheckCRDNotUpgraded: the head changes a CRD in crds/, which Helm never upgrades.
	CheckCRDNotUpgraded = "crd-not-upgraded"
	// CheckKeepRemoved: the head stops rendering helm.sh/resource-policy: keep on a CRD.
	CheckKeepRemoved = "keep-removed"
)

// OptionValues is the chart values a finding's Input advises (key=value, as --set takes it).
const OptionValues = "review.Values"

// ChartReview is one chart the change touches, judged against its supported releases.
type ChartReview struct {
	// Chart is its name, Dir its folder in the repository ("." for the root) and Version
	// the head's Chart.yaml version.
	Chart   string `json:"chart"`
	Dir     string `json:"dir"`
	Version string `json:"version"`
	// Baselines are the supported releases, oldest first.
	Baselines []Baseline        `json:"baselines"`
	Findings  []finding.Finding `json:"findings"`
	// Acknowledge are the findings the head's Chart.yaml acknowledges (its
	// upgradeguard.io/acknowledge annotation).
	Acknowledge []string `json:"acknowledge,omitempty"`
	// NotJudged says why the chart was not judged: no supported release was found.
	NotJudged string `json:"notJudged,omitempty"`
}

// File is the chart's Chart.yaml in the repository.
func (c ChartReview) File() string { return repoPath(c.Dir, "Chart.yaml") }

// Charts finds the charts the change touches (the repository's root chart, or
// each charts/NAME/; any file of the chart: Chart.yaml, crds/, templates, values) and
// judges each one's head against its supported releases: which stored versions the
// upgrade paths can hold when they reach the head, and what Helm does with each CRD on
// the upgrade from each release. Only touched charts are rendered.
func Charts(ctx context.Context, o Options, co ChartOptions) ([]ChartReview, error) {
	repo, err := slots.OpenRepository(o.Repo)
	if err != nil {
		return nil, err
	}
	name := o.Head
	if name == "" {
		name = "HEAD"
	}
	headCommit, err := commit(repo, name)
	if err != nil {
		return nil, err
	}
	head := revision{commit: headCommit}
	if o.Head == "" {
		wt, err := repo.Worktree()
		if err != nil {
			return nil, fmt.Errorf("the repository has no work tree (a bare clone or a mirror): give --head REF: %w", err)
		}
		head.root = wt.Filesystem.Root()
	}
	base, err := baseCommit(repo, headCommit, o.Base)
	if err != nil {
		return nil, err
	}
	if co.Registry == nil {
		co.Registry = registry.Default()
	}
	dirs, err := chartDirs(head)
	if err != nil {
		return nil, err
	}
	out := []ChartReview{}
	for _, dir := range dirs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hf, err := head.files(dir)
		if err != nil {
			return nil, err
		}
		bf, err := revision{commit: base}.files(dir)
		if err != nil {
			return nil, err
		}
		if slices.Contains(co.Deployed, dir) || sameFiles(hf, bf) {
			continue
		}
		meta, ok := readMeta(hf)
		if !ok {
			return nil, fmt.Errorf("%s: no chart name: fix the Chart.yaml (%s)", repoPath(dir, "Chart.yaml"), cmdline.HelmLint{Path: dir})
		}
		cr := ChartReview{Chart: meta.Name, Dir: dir, Version: meta.Version, Baselines: []Baseline{}, Findings: []finding.Finding{},
			Acknowledge: acknowledged(meta.Annotations)}
		cr.Baselines, err = co.baselines(repo, base, dir, meta.Name)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", meta.Name, err)
		}
		if len(cr.Baselines) == 0 {
			cr.NotJudged = fmt.Sprintf("no supported release of %s: no release tag reachable from the base matches %s; name them with --baseline REF, --baseline-tags GLOB or --tag-pattern",
				meta.Name, strings.Join(tagPatternsShown(co, meta.Name), ", "))
			out = append(out, cr)
			continue
		}
		if deps, err := readDependencies(dir, hf); err != nil {
			return nil, fmt.Errorf("chart %s: %w", meta.Name, err)
		} else if why := deps.staleLock(); why != "" {
			cr.Findings = append(cr.Findings, finding.Finding{Check: CheckStaleLock, Subject: dir, Severity: finding.Warning, Message: why,
				Location: &finding.Location{File: repoPath(dir, "Chart.lock"), Line: 1}})
		}
		j := &chartJudge{o: co, review: &cr, headFiles: hf, headRev: head}
		if err := j.load(ctx, repo, hf); err != nil {
			return nil, fmt.Errorf("chart %s: %w", meta.Name, err)
		}
		j.judge()
		out = append(out, cr)
	}
	return out, nil
}

func tagPatternsShown(o ChartOptions, name string) []string {
	raw := DefaultTagPatterns
	if o.TagPattern != "" {
		raw = []string{o.TagPattern}
	}
	out := make([]string, len(raw))
	for i, p := range raw {
		out[i] = "'" + strings.ReplaceAll(p, "{name}", name) + "'"
	}
	return out
}

// chartRelease is one release of the chart as rendered: its CRDs, the migration hooks it
// runs on an upgrade to it (registry mechanisms that migrate objects, before or after
// the CRD update), and the StorageVersionMigrations it bundles.
type chartRelease struct {
	label, version string
	crds           []predict.ChartCRD
	byName         map[string]predict.ChartCRD
	before, after  []string
	migrations     []chartcrds.Migration
}

func (j *chartJudge) release(label string, c *chartsource.Chart) *chartRelease {
	r := &chartRelease{label: label, version: c.Version, crds: c.CRDs, byName: map[string]predict.ChartCRD{}, migrations: c.Migrations}
	for _, crd := range c.CRDs {
		r.byName[crd.CRD.Name] = crd
	}
	entry, ok := j.o.Registry.Lookup(c.Name)
	if !ok {
		return r
	}
	for _, h := range c.Hooks {
		for i := range entry.Mechanisms {
			m := &entry.Mechanisms[i]
			if m.Action != registry.MigratesObjects || m.Template == "" || h.Path != m.Template && !strings.HasSuffix(h.Path, "/"+m.Template) {
				continue
			}
			if slices.Contains(h.Events, release.HookPreUpgrade) {
				r.before = append(r.before, m.Name)
			}
			if slices.Contains(h.Events, release.HookPostUpgrade) {
				r.after = append(r.after, m.Name)
			}
		}
	}
	return r
}

// chartJudge judges one chart's head against its releases.
type chartJudge struct {
	o         ChartOptions
	review    *ChartReview
	headFiles map[string][]byte
	// headRev is the head revision, for the files a file:// dependency names.
	headRev  revision
	releases []*chartRelease
	head     *chartRelease
	// held collects, per CRD, what reaching the head from each release holds.
	held map[string]*heldVersions
}

// load renders each release (an install) and the head (an upgrade).
func (j *chartJudge) load(ctx context.Context, repo *git.Repository, hf map[string][]byte) error {
	for _, b := range j.review.Baselines {
		c, err := repo.CommitObject(plumbing.NewHash(b.Commit))
		if err != nil {
			return err
		}
		rev := revision{commit: c}
		files, err := rev.files(j.review.Dir)
		if err != nil {
			return err
		}
		rendered, err := j.o.render(ctx, rev, j.review.Dir, files, j.review.Chart, false)
		if err != nil {
			return fmt.Errorf("release %s: %w", b.Label(), err)
		}
		j.releases = append(j.releases, j.release(b.Label(), rendered))
	}
	rendered, err := j.o.render(ctx, j.headRev, j.review.Dir, hf, j.review.Chart, true)
	if err != nil {
		return fmt.Errorf("the head: %w", err)
	}
	j.head = j.release("the head ("+j.review.Version+")", rendered)
	return nil
}
