// Package review judges a Git change before it is merged: it reads the repository at the
// change's base and head, finds the Flux HelmReleases whose chart or values the change
// touches, and predicts each one's upgrade against the clusters it lands on, with the
// sources and values the head revision gives it, exactly as the HelmRelease gate would
// once Flux applies the change. Only the touched deployments are rendered and judged.
package review

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"helm.sh/helm/v4/pkg/cli"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

// Options say which change to review.
type Options struct {
	// Repo is a path in the repository: a work tree, or a bare clone when Head is set.
	Repo string
	// Base is the revision the change starts from; "" is the merge base of Head with the
	// default branch (origin/HEAD, else main, else master).
	Base string
	// Head is the revision the change ends at; "" is the work tree, uncommitted changes
	// included.
	Head string
}

// Change is one HelmRelease the change touches.
type Change struct {
	// Subject is HelmRelease/NAMESPACE/NAME.
	Subject string `json:"subject"`
	// File and Line are where the head revision holds it: the line of its chart version
	// (or chartRef), what a pull request's reviewer sees changed.
	File string `json:"file"`
	Line int    `json:"line"`
	// From and To are spec.chart.spec.version at the base and the head ("" for a
	// HelmRelease the change adds, or one with a chartRef).
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// What says what changed: "chart", "values" or "new"; for a HelmRelease whose chart
	// is a folder of this repository, WhatDependencies or WhatChartFiles (umbrella.go),
	// with File and Line in that folder and From and To its dependencies' versions (or
	// the chart's versions).
	What string `json:"what"`
	// Dependencies are the chart's dependencies the change moves (WhatDependencies).
	Dependencies []DependencyMove `json:"dependencies,omitempty"`
	// StaleLock says that the head's Chart.lock of that chart does not match its
	// Chart.yaml, and what Flux deploys then.
	StaleLock string `json:"staleLock,omitempty"`
	// Acknowledge are the findings the HelmRelease acknowledges (AcknowledgeAnnotation).
	Acknowledge []string            `json:"acknowledge,omitempty"`
	HelmRelease *helmv2.HelmRelease `json:"-"`

	// judge, when set, judges a change that is not a HelmRelease's chart (an Argo CD
	// Application, CRD manifests) on a cluster: its report, or why it was not judged.
	judge func(ctx context.Context, cl Cluster, settings *cli.EnvSettings) (*check.Report, string, error)
	// reader, when set, reads the HelmRelease's sources and values in place of the head
	// tree: a kustomize build's objects first (kustomize.go).
	reader client.Reader
	// notJudged says why a HelmRelease the change touches cannot be judged at all.
	notJudged string
	// chart is the folder of the HelmRelease's chart in this repository, for a change to
	// that folder (umbrella.go).
	chart string
	// place, when set, is the file that says where the change lands (Cluster.Paths) when
	// File, where the change was made, does not: a kustomize overlay's or a Flux
	// Kustomization's file, for a change to a base that overlay builds.
	place string
}

// Diff is the change: its two revisions and the HelmReleases it touches.
type Diff struct {
	Base, Head string
	Changes    []Change
	head       *Tree
	// deployed are the chart folders HelmReleases render from this repository.
	deployed []string
}

// AcknowledgeAnnotation on a HelmRelease accepts findings of its upgrade on purpose: a
// list of CHECK/SUBJECT (finding.AckKey), separated by commas or spaces, for example
// "delete/leaderworkersets.leaderworkerset.x-k8s.io". An acknowledged finding is still
// reported, marked, and does not fail the review.
const AcknowledgeAnnotation = "upgradeguard.io/acknowledge"

// acknowledged are the findings an object's AcknowledgeAnnotation acknowledges.
func acknowledged(annotations map[string]string) []string {
	return strings.FieldsFunc(annotations[AcknowledgeAnnotation], func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
}

var helmReleaseKind = schema.GroupKind{Group: helmv2.GroupVersion.Group, Kind: helmv2.HelmReleaseKind}

// Changes reads the repository at both revisions and finds the HelmReleases whose chart
// or values differ (fluxrelease.ChartChanged, ValuesChanged), or that the change adds.
func Changes(ctx context.Context, o Options) (*Diff, error) {
	repo, err := slots.OpenRepository(o.Repo)
	if err != nil {
		return nil, err
	}
	head, headTree, err := readHead(repo, o.Head)
	if err != nil {
		return nil, err
	}
	base, err := baseCommit(repo, head, o.Base)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	baseTree, err := readCommit(base)
	if err != nil {
		return nil, err
	}
	if headTree.git, err = newGitCharts(repo); err != nil {
		return nil, err
	}
	d := &Diff{Base: base.Hash.String(), Head: headTree.Revision, head: headTree}
	// Kustomize builds, Argo CD Applications and CRD manifests (inputs.go); a HelmRelease
	// in a file a build reads is judged as built.
	more, err := inputChanges(ctx, baseTree, headTree)
	if err != nil {
		return nil, err
	}
	for _, obj := range headTree.Objects {
		if obj.GroupVersionKind().GroupKind() != helmReleaseKind || more.built[obj.File] {
			continue
		}
		c, ok, err := touched(obj, baseTree)
		if err != nil {
			return nil, err
		}
		if ok {
			d.Changes = append(d.Changes, c)
		}
	}
	// HelmReleases whose chart is a folder of this repository that the change touches
	// (umbrella.go).
	umbrellas, deployed, err := umbrellaChanges(baseTree, headTree, more.built, append(slices.Clone(d.Changes), more.changes...))
	if err != nil {
		return nil, err
	}
	d.Changes = append(d.Changes, umbrellas...)
	d.deployed = deployed
	d.Changes = append(d.Changes, more.changes...)
	return d, nil
}

// touched compares a head HelmRelease with its base: the same object in the same file,
// else the nearest one.
func touched(obj Object, base *Tree) (Change, bool, error) {
	hr, err := toHelmRelease(obj)
	if err != nil {
		return Change{}, false, err
	}
	c := Change{Subject: "HelmRelease/" + hr.Namespace + "/" + hr.Name, File: obj.File, HelmRelease: hr, To: version(hr),
		Acknowledge: acknowledged(hr.Annotations)}
	c.Line = obj.Line("spec", "chart", "spec", "version")
	if hr.Spec.ChartRef != nil {
		c.Line = obj.Line("spec", "chartRef")
	}
	before, ok := base.Find(keyOf(obj.Unstructured), obj.File)
	if !ok {
		c.What = "new"
		return c, true, nil
	}
	old, err := toHelmRelease(before)
	if err != nil {
		return Change{}, false, err
	}
	c.From = version(old)
	switch {
	case fluxrelease.ChartChanged(old, hr):
		c.What = "chart"
	case fluxrelease.ValuesChanged(old, hr):
		c.What = "values"
		c.Line = obj.Line("spec", "values")
	default:
		return c, false, nil
	}
	return c, true, nil
}

func version(hr *helmv2.HelmRelease) string {
	if hr.Spec.Chart == nil {
		return ""
	}
	return hr.Spec.Chart.Spec.Version
}

func toHelmRelease(o Object) (*helmv2.HelmRelease, error) {
	if v := o.GroupVersionKind().Version; v != helmv2.GroupVersion.Version {
		return nil, fmt.Errorf("%s: HelmRelease %s is %s: review reads %s (helm-controller converts older versions on the cluster; update the file to %s)",
			o.File, o.GetName(), o.GetAPIVersion(), helmv2.GroupVersion, helmv2.GroupVersion)
	}
	hr := &helmv2.HelmRelease{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, hr); err != nil {
		return nil, fmt.Errorf("%s: HelmRelease %s: %w", o.File, o.GetName(), err)
	}
	if hr.Namespace == "" {
		hr.Namespace = "default"
	}
	return hr, nil
}

func readHead(repo *git.Repository, rev string) (*object.Commit, *Tree, error) {
	name := rev
	if name == "" {
		name = "HEAD"
	}
	c, err := commit(repo, name)
	if err != nil {
		return nil, nil, err
	}
	if rev != "" {
		t, err := readCommit(c)
		return c, t, err
	}
	t, err := readWorkTree(repo, c)
	return c, t, err
}

// baseCommit is rev, or the merge base of head with the default branch.
func baseCommit(repo *git.Repository, head *object.Commit, rev string) (*object.Commit, error) {
	if rev != "" {
		return commit(repo, rev)
	}
	for _, name := range []string{"refs/remotes/origin/HEAD", "main", "master", "origin/main", "origin/master"} {
		def, err := commit(repo, name)
		if err != nil {
			continue
		}
		bases, err := head.MergeBase(def)
		if err != nil || len(bases) == 0 {
			return nil, fmt.Errorf("%s and HEAD share no history: give --base REF", name)
		}
		return bases[0], nil
	}
	return nil, errors.New("no default branch (origin/HEAD, main or master) to take the merge base with: give --base REF")
}

func commit(repo *git.Repository, rev string) (*object.Commit, error) {
	h, err := repo.ResolveRevision(plumbing.Revision(rev))
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", rev, err)
	}
	c, err := repo.CommitObject(*h)
	if err != nil {
		return nil, fmt.Errorf("read commit %s: %w", rev, err)
	}
	return c, nil
}

// Cluster is a cluster the change may land on.
type Cluster struct {
	// Name names it in the report: a kubeconfig context, say.
	Name   string
	Config *rest.Config
	// Paths are the repository folders whose HelmReleases land on it (the Flux layout's
	// clusters/NAME/); none means every HelmRelease.
	Paths []string
	// Snapshot, when set, is the cluster's state as a snapshot recorded it: read instead
	// of Config, through the same prediction (fluxrelease.Request.Recorded).
	Snapshot *snapshot.Snapshot

	// conns are the cluster's connections for one review (Judge): every change judged on
	// it shares one set of clients, its discovery and the API server's answers to dry
	// runs.
	conns *livecluster.Connections
}

// connect is the cluster's live target, connected once per review.
func (c Cluster) connect(ctx context.Context) (*livecluster.Target, error) {
	return c.conns.Get(ctx, livecluster.LocalKey(c.Config), c.Config, true)
}

// lands says whether a HelmRelease in file lands on the cluster.
func (c Cluster) lands(file string) bool {
	if len(c.Paths) == 0 {
		return true
	}
	for _, p := range c.Paths {
		if strings.HasPrefix(file, strings.TrimSuffix(p, "/")+"/") || file == p {
			return true
		}
	}
	return false
}

// Row is one touched HelmRelease judged against one cluster.
type Row struct {
	Cluster string `json:"cluster"`
	Change
	// Report is the prediction of the upgrade on the cluster, as check reports it; nil
	// when it could not be made (NotJudged says why).
	Report *check.Report `json:"report,omitempty"`
	// NotJudged says why the HelmRelease was not judged: a source review does not resolve,
	// or values from a ConfigMap or Secret that is not in the repository.
	NotJudged string `json:"notJudged,omitempty"`
}

// Report is the review: every touched HelmRelease on every cluster it lands on.
type Report struct {
	Base string `json:"base"`
	Head string `json:"head"`
	Rows []Row  `json:"rows"`
	// Acknowledge are the findings acknowledged for every HelmRelease (CHECK/SUBJECT), as a
	// CI maps a pull request's label to; each HelmRelease's own are in its Change.
	Acknowledge []string `json:"acknowledge,omitempty"`
	// Unplaced are the touched HelmReleases that land on none of the clusters given.
	Unplaced []Change `json:"unplaced,omitempty"`
	// Snapshots are the clusters judged from a snapshot, with its age.
	Snapshots []SnapshotState `json:"snapshots,omitempty"`
	// Charts are the charts of the repository the change touches, each judged against
	// its supported releases (Charts).
	Charts []ChartReview `json:"charts,omitempty"`
}

// Safe says whether every judged HelmRelease is safe to merge, acknowledged findings
// aside.
func (r *Report) Safe() bool { return !r.FindingReport().Failed() }

// Judge predicts each change on each cluster it lands on, with what the head revision
// holds for its sources and values. Each cluster is connected to once for the whole
// review (livecluster.Connections), however many changes land on it. A cluster that
// cannot be read is an error.
func Judge(ctx context.Context, d *Diff, clusters []Cluster, settings *cli.EnvSettings) (*Report, error) {
	rep := &Report{Base: d.Base, Head: d.Head, Rows: []Row{}, Snapshots: snapshotStates(clusters, time.Now())}
	conns := make([]livecluster.Connections, len(clusters))
	for _, c := range d.Changes {
		placed := false
		for i, cl := range clusters {
			if !cl.lands(c.placeFile()) {
				continue
			}
			cl.conns = &conns[i]
			placed = true
			row := Row{Cluster: cl.Name, Change: c}
			if c.judge != nil || c.notJudged != "" {
				if err := c.judgeOther(ctx, cl, settings, &row); err != nil {
					return nil, fmt.Errorf("%s on %s: %w", c.Subject, cl.Name, err)
				}
				rep.Rows = append(rep.Rows, row)
				continue
			}
			var reader client.Reader = treeReader{tree: d.head, near: c.placeFile(), settings: settings}
			if c.reader != nil {
				reader = c.reader
			}
			req := fluxrelease.Request{HelmRelease: c.HelmRelease, Reader: reader, Local: cl.Config, Settings: settings, Clusters: cl.conns}
			if r := cl.recorded(); r != nil {
				req.Recorded = r
			}
			res, err := fluxrelease.Check(ctx, req)
			var unsupported *fluxrelease.UnsupportedError
			var values *fluxrelease.ValuesError
			switch {
			case errors.As(err, &unsupported) || errors.As(err, &values):
				row.NotJudged = err.Error()
			case err != nil:
				return nil, fmt.Errorf("%s on %s: %w", c.Subject, cl.Name, err)
			}
			if res != nil {
				row.Report = res.Report
			}
			rep.Rows = append(rep.Rows, row)
		}
		if !placed {
			rep.Unplaced = append(rep.Unplaced, c)
		}
	}
	return rep, nil
}

// CheckNotJudged is the check ID of a touched HelmRelease that could not be judged.
const CheckNotJudged = "not-judged"

// FindingReport is the review as CI reads it: a group per cluster, a case per touched
// HelmRelease, and each CRD verdict other than ok as a finding at the line the change
// touched.
func (r *Report) FindingReport() finding.Report {
	rep := finding.Report{Tool: "review", Cases: []finding.Case{}}
	for _, s := range r.Snapshots {
		rep.Notes = append(rep.Notes, s.Note())
	}
	for _, row := range r.Rows {
		c := finding.Case{Group: row.Cluster, Name: row.Subject + " " + row.fromTo()}
		loc := &finding.Location{File: row.File, Line: row.Line}
		if row.NotJudged != "" {
			c.Findings = append(c.Findings, finding.Finding{Check: CheckNotJudged, Subject: row.Subject, Severity: finding.Warning, Message: row.NotJudged, Location: loc})
		}
		if row.StaleLock != "" {
			c.Findings = append(c.Findings, finding.Finding{Check: CheckStaleLock, Subject: row.chart, Severity: finding.Warning, Message: row.StaleLock,
				Location: &finding.Location{File: repoPath(row.chart, "Chart.lock"), Line: 1}})
		}
		if row.Report != nil {
			for _, cc := range row.Report.FindingReport().Cases {
				for _, f := range cc.Findings {
					f.Location = loc
					f.Acknowledged = slices.Contains(r.Acknowledge, f.AckKey()) || slices.Contains(row.Acknowledge, f.AckKey())
					c.Findings = append(c.Findings, f)
				}
			}
		}
		rep.Cases = append(rep.Cases, c)
	}
	rep.Cases = append(rep.Cases, chartCases(r.Charts, r.Acknowledge)...)
	return rep
}

// fromTo says the version change: "(2.17.2 → 2.18.2)", "(new, 2.18.2)", "(values, 2.18.2)".
func (c Change) fromTo() string {
	switch c.What {
	case "new", "values":
		return "(" + c.What + ", " + orChartRef(c.To) + ")"
	case WhatCRDs:
		return "(CRD manifests)"
	case WhatDependencies, WhatChartFiles:
		return "(" + c.What + ": " + c.From + " → " + c.To + ")"
	}
	return "(" + orChartRef(c.From) + " → " + orChartRef(c.To) + ")"
}

// orChartRef is a HelmRelease's version, or "chartRef" for one whose chart is a chartRef.
func orChartRef(v string) string {
	if v == "" {
		return "chartRef"
	}
	return v
}
