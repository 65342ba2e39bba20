package review

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5"
	yamlv3 "go.yaml.in/yaml/v3"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/provenance"
	"helm.sh/helm/v4/pkg/registry"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
)

// Umbrella charts: a chart in the repository that a HelmRelease renders from a
// GitRepository source naming this repository. A change to the chart's folder (a
// dependency moved in Chart.yaml or Chart.lock, a subchart vendored in charts/, or any
// other file) changes what Flux deploys although the HelmRelease's own file did not
// change: each such HelmRelease is judged with the head's chart, built as
// source-controller builds it.

// WhatDependencies is Change.What of a HelmRelease whose chart, a folder of this
// repository, has dependencies the change moves (Change.Dependencies).
const WhatDependencies = "dependencies"

// WhatChartFiles is Change.What of a HelmRelease whose chart, a folder of this
// repository, has other files the change touches (templates, values.yaml).
const WhatChartFiles = "chart files"

// CheckStaleLock is the check ID of a chart whose Chart.lock does not match its
// Chart.yaml at the head.
const CheckStaleLock = "stale-lock"

// DependencyMove is one dependency of a chart that the change moves.
type DependencyMove struct {
	// Name is the dependency's alias, else its chart name.
	Name string `json:"name"`
	// From and To are its version at the base and the head ("" where it is absent): the
	// version Chart.yaml asks, or Chart.lock pins, or the vendored chart has, whichever
	// the change touched.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// File and Line are where the head says it (the base, for a dependency the change
	// removes).
	File string `json:"file"`
	Line int    `json:"line"`
}

// gitChartPath is the repository folder of a HelmRelease's chart when its source is a
// GitRepository ("./charts/platform" is "charts/platform"), "" otherwise.
func gitChartPath(o Object) string {
	kind, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "sourceRef", "kind")
	p, ok, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "chart")
	if kind != sourcev1.GitRepositoryKind || !ok {
		return ""
	}
	return cleanChartPath(p)
}

func cleanChartPath(p string) string { return path.Clean(strings.TrimLeft(p, "/")) }

// umbrellaChanges finds the HelmReleases of the head whose chart is a folder of this
// repository that the change touches, other than those already in seen (their own file
// changed too) and those in a file a kustomize build reads. deployed are the chart
// folders every such HelmRelease renders, touched or not.
func umbrellaChanges(base, head *Tree, built map[string]bool, seen []Change) ([]Change, []string, error) {
	var changes []Change
	var deployed []string
	byDir := map[string]*chartChange{}
	for _, obj := range head.Objects {
		if obj.GroupVersionKind().GroupKind() == applicationKind {
			c, dir, err := umbrellaApplication(base, head, obj, byDir, seen)
			if err != nil {
				return nil, nil, err
			}
			if dir != "" && !slices.Contains(deployed, dir) {
				deployed = append(deployed, dir)
			}
			if c != nil {
				changes = append(changes, *c)
			}
			continue
		}
		if obj.GroupVersionKind().GroupKind() != helmReleaseKind || built[obj.File] {
			continue
		}
		dir := gitChartPath(obj)
		if dir == "" {
			continue
		}
		ours, missing := head.git.rendersOurs(head, obj)
		if !ours {
			continue
		}
		if !slices.Contains(deployed, dir) {
			deployed = append(deployed, dir)
		}
		cc, ok := byDir[dir]
		if !ok {
			var err error
			if cc, err = diffChart(base, head, dir); err != nil {
				return nil, nil, err
			}
			byDir[dir] = cc
		}
		if cc == nil {
			continue
		}
		hr, err := toHelmRelease(obj)
		if err != nil {
			return nil, nil, err
		}
		subject := "HelmRelease/" + hr.Namespace + "/" + hr.Name
		if slices.ContainsFunc(seen, func(c Change) bool { return c.Subject == subject && c.File == obj.File }) {
			continue // judged as its own change, with the same head chart
		}
		c := Change{Subject: subject, File: cc.file, Line: cc.line, From: cc.from, To: cc.to, What: cc.what,
			Dependencies: cc.moves, StaleLock: cc.stale, Acknowledge: acknowledged(hr.Annotations), HelmRelease: hr, place: obj.File, chart: dir}
		if missing != "" {
			c.notJudged = fmt.Sprintf("its GitRepository %s is not in the repository, so review cannot tell whether it fetches this repository's %s: "+
				"commit the GitRepository (flux bootstrap writes it to clusters/NAME/flux-system/gotk-sync.yaml) to have the change judged", missing, dir)
		}
		changes = append(changes, c)
	}
	slices.Sort(deployed)
	return changes, deployed, nil
}

// umbrellaApplication is the change to the Argo CD Application obj when its Helm source
// is a chart folder of this repository (a path of a repoURL naming it) that the change
// touches, judged as the Application's own changes are (judgeApplication), with the
// head's chart; dir is that folder when the Application renders one.
func umbrellaApplication(base, head *Tree, obj Object, byDir map[string]*chartChange, seen []Change) (*Change, string, error) {
	app, err := application(obj)
	if err != nil {
		return nil, "", err
	}
	src := pathSource(app)
	if src == nil || head.git == nil || !head.git.ours(src.RepoURL) {
		return nil, "", nil
	}
	dir := cleanChartPath(src.Path)
	cc, ok := byDir[dir]
	if !ok {
		if cc, err = diffChart(base, head, dir); err != nil {
			return nil, "", err
		}
		byDir[dir] = cc
	}
	if cc == nil || slices.ContainsFunc(seen, func(c Change) bool { return c.Subject == app.Subject() && c.File == obj.File }) {
		return nil, dir, nil
	}
	return &Change{Subject: app.Subject(), File: cc.file, Line: cc.line, From: cc.from, To: cc.to, What: cc.what, Dependencies: cc.moves,
		Acknowledge: acknowledged(app.Annotations), place: obj.File, chart: dir, judge: judgeApplication(app, head)}, dir, nil
}

// pathSource is the Application's Helm source when it is a path in a Git repository,
// nil otherwise.
func pathSource(app *argoapp.Application) *argoapp.Source {
	src, err := app.HelmSource()
	if err != nil || src.Chart != "" || src.Path == "" {
		return nil
	}
	return src
}

// argoCharts serves an Argo CD git source's chart folder from the head revision when
// its repoURL names this repository (argoapp.Options.GitCharts), its dependencies built
// as for a Flux GitRepository; a Chart.lock that does not match Chart.yaml is an error,
// as Argo CD's repo-server meets it in helm dependency build.
func (g *gitCharts) argoCharts(t *Tree, settings *cli.EnvSettings) func(context.Context, string, string) (string, bool, error) {
	if g == nil {
		return nil
	}
	return func(ctx context.Context, url, chartPath string) (string, bool, error) {
		if !g.ours(url) {
			return "", false, nil
		}
		dir := cleanChartPath(chartPath)
		files, err := t.filesUnder(dir)
		if err != nil {
			return "", false, err
		}
		if d, err := readDependencies(dir, files); err == nil && d.staleLock() != "" {
			return "", false, fmt.Errorf("%s does not match %s: Argo CD's repo-server runs `%s`, which refuses the chart, so the sync fails: run `%s` and commit Chart.lock",
				repoPath(dir, "Chart.lock"), repoPath(dir, "Chart.yaml"), cmdline.HelmDependencyBuild{Path: dir}, cmdline.HelmDependencyUpdate{Path: dir})
		}
		out, err := g.chart(ctx, t, chartPath, settings)
		return out, err == nil, err
	}
}

// chartChange is what the change does to one chart folder.
type chartChange struct {
	what, from, to string
	file           string
	line           int
	moves          []DependencyMove
	stale          string
}

// diffChart compares the chart folder dir at both revisions; nil when the head holds no
// chart there or the change leaves its files as they were.
func diffChart(base, head *Tree, dir string) (*chartChange, error) {
	hf, err := head.filesUnder(dir)
	if err != nil {
		return nil, err
	}
	if _, ok := hf["Chart.yaml"]; !ok {
		return nil, nil
	}
	bf, err := base.filesUnder(dir)
	if err != nil {
		return nil, err
	}
	if sameFiles(hf, bf) {
		return nil, nil
	}
	cc := &chartChange{what: WhatChartFiles}
	bd, err := readDependencies(dir, bf)
	if err != nil {
		return nil, fmt.Errorf("%s at the base: %w", repoPath(dir, "Chart.yaml"), err)
	}
	hd, err := readDependencies(dir, hf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", repoPath(dir, "Chart.yaml"), err)
	}
	cc.moves = moves(bd, hd)
	cc.stale = hd.staleLock()
	if len(cc.moves) > 0 {
		cc.what, cc.file, cc.line = WhatDependencies, cc.moves[0].File, cc.moves[0].Line
		var from, to []string
		for _, m := range cc.moves {
			from, to = append(from, m.Name+" "+orNone(m.From)), append(to, m.Name+" "+orNone(m.To))
		}
		cc.from, cc.to = strings.Join(from, ", "), strings.Join(to, ", ")
		return cc, nil
	}
	cc.from, cc.to = bd.version, hd.version
	for _, f := range slices.Sorted(maps.Keys(hf)) {
		if b, ok := bf[f]; !ok || !bytes.Equal(b, hf[f]) {
			cc.file, cc.line = repoPath(dir, f), 1
			break
		}
	}
	if cc.file == "" { // only removals
		for _, f := range slices.Sorted(maps.Keys(bf)) {
			if _, ok := hf[f]; !ok {
				cc.file, cc.line = repoPath(dir, f), 1
				break
			}
		}
	}
	return cc, nil
}

func orNone(v string) string {
	if v == "" {
		return "(none)"
	}
	return v
}

// dependencies are what a chart folder says of its dependencies.
type dependencies struct {
	dir, version string
	// declared are Chart.yaml's, lock Chart.lock's (nil without one).
	declared []*chart.Dependency
	lock     *chart.Lock
	// vendored are the charts in charts/: name -> version, and the file.
	vendored map[string]vendored
	// chartYAML and lockData are the files, for their lines.
	chartYAML, lockData []byte
}

type vendored struct{ version, file string }

// readDependencies reads Chart.yaml, Chart.lock and the charts in charts/ (archives and
// folders) of a chart's files, as Helm's loader reads them.
func readDependencies(dir string, files map[string][]byte) (*dependencies, error) {
	d := &dependencies{dir: dir, vendored: map[string]vendored{}, chartYAML: files["Chart.yaml"], lockData: files["Chart.lock"]}
	if d.chartYAML != nil {
		var meta chart.Metadata
		if err := yaml.Unmarshal(d.chartYAML, &meta); err != nil {
			return nil, fmt.Errorf("read Chart.yaml: %w (run `%s`)", err, cmdline.HelmLint{Path: dir})
		}
		d.declared, d.version = meta.Dependencies, meta.Version
	}
	if d.lockData != nil {
		d.lock = &chart.Lock{}
		if err := yaml.Unmarshal(d.lockData, d.lock); err != nil {
			return nil, fmt.Errorf("read Chart.lock: %w (run `%s`)", err, cmdline.HelmDependencyUpdate{Path: dir})
		}
	}
	for _, f := range slices.Sorted(maps.Keys(files)) {
		rest, ok := strings.CutPrefix(f, "charts/")
		if !ok {
			continue
		}
		switch {
		case !strings.Contains(rest, "/") && strings.HasSuffix(rest, ".tgz"):
			ch, err := loader.LoadArchive(bytes.NewReader(files[f]))
			if err != nil {
				return nil, fmt.Errorf("read the vendored chart %s: %w", f, err)
			}
			d.vendored[ch.Name()] = vendored{version: ch.Metadata.Version, file: f}
		case strings.Count(rest, "/") == 1 && strings.HasSuffix(rest, "/Chart.yaml"):
			var meta chart.Metadata
			if yaml.Unmarshal(files[f], &meta) == nil && meta.Name != "" {
				d.vendored[meta.Name] = vendored{version: meta.Version, file: f}
			}
		}
	}
	return d, nil
}

// staleLock says why Chart.lock does not match Chart.yaml, "" when it does or there is
// none. The digest is Helm's own: helm dependency build refuses the chart when it
// differs; source-controller builds from the lock regardless.
func (d *dependencies) staleLock() string {
	if d.lock == nil || len(d.declared) == 0 {
		return ""
	}
	data, err := json.Marshal([2][]*chart.Dependency{d.declared, d.lock.Dependencies})
	if err != nil {
		return ""
	}
	sum, err := provenance.Digest(bytes.NewReader(data))
	if err != nil || "sha256:"+sum == d.lock.Digest {
		return ""
	}
	var diffs []string
	for _, dep := range d.declared {
		i := slices.IndexFunc(d.lock.Dependencies, func(l *chart.Dependency) bool { return l.Name == dep.Name })
		switch {
		case i < 0:
			diffs = append(diffs, fmt.Sprintf("%s: Chart.yaml asks %s, the lock has none", dep.Name, dep.Version))
		case d.lock.Dependencies[i].Version != dep.Version:
			diffs = append(diffs, fmt.Sprintf("%s: Chart.yaml asks %s, the lock pins %s", dep.Name, dep.Version, d.lock.Dependencies[i].Version))
		}
	}
	why := ""
	if len(diffs) > 0 {
		why = " (" + strings.Join(diffs, "; ") + ")"
	}
	return fmt.Sprintf("%s does not match %s%s: source-controller builds the chart from the lock, so Flux deploys what the lock pins (judged here), and helm dependency build refuses the chart: run `%s` and commit Chart.lock",
		repoPath(d.dir, "Chart.lock"), repoPath(d.dir, "Chart.yaml"), why, cmdline.HelmDependencyUpdate{Path: d.dir})
}

// depKey names a dependency as Helm does in a release: its alias, else its name.
func depKey(dep *chart.Dependency) string {
	if dep.Alias != "" {
		return dep.Alias
	}
	return dep.Name
}

// moves are the dependencies whose version the change moves: in Chart.yaml first, else
// in Chart.lock, else a vendored chart.
func moves(base, head *dependencies) []DependencyMove {
	var out []DependencyMove
	moved := map[string]bool{}
	add := func(m DependencyMove) {
		if m.From != m.To && !moved[m.Name] {
			moved[m.Name] = true
			out = append(out, m)
		}
	}
	declared := func(d *dependencies) map[string]string {
		m := map[string]string{}
		for _, dep := range d.declared {
			m[depKey(dep)] = dep.Version
		}
		return m
	}
	bDecl, hDecl := declared(base), declared(head)
	for _, name := range unionKeys(bDecl, hDecl) {
		m := DependencyMove{Name: name, From: bDecl[name], To: hDecl[name], File: repoPath(head.dir, "Chart.yaml")}
		m.Line = dependencyLine(head.chartYAML, name)
		if m.To == "" {
			m.Line = dependencyLine(base.chartYAML, name)
		}
		add(m)
	}
	locked := func(d *dependencies) map[string]string {
		m := map[string]string{}
		if d.lock != nil {
			for _, dep := range d.lock.Dependencies {
				m[dep.Name] = dep.Version
			}
		}
		return m
	}
	bLock, hLock := locked(base), locked(head)
	for _, name := range unionKeys(bLock, hLock) {
		m := DependencyMove{Name: name, From: bLock[name], To: hLock[name], File: repoPath(head.dir, "Chart.lock"), Line: dependencyLine(head.lockData, name)}
		if m.To == "" {
			m.Line = dependencyLine(base.lockData, name)
		}
		add(m)
	}
	for _, name := range unionKeys(base.vendored, head.vendored) {
		b, h := base.vendored[name], head.vendored[name]
		file := h.file
		if file == "" {
			file = b.file
		}
		add(DependencyMove{Name: name, From: b.version, To: h.version, File: repoPath(head.dir, file), Line: 1})
	}
	return out
}

func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// dependencyLine is the line of the version of the dependency named name (or aliased)
// in a Chart.yaml or Chart.lock; the line of its entry when it has no version, 1 when
// there is none.
func dependencyLine(data []byte, name string) int {
	var doc yamlv3.Node
	if yamlv3.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yamlv3.MappingNode {
		return 1
	}
	top := doc.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "dependencies" || top.Content[i+1].Kind != yamlv3.SequenceNode {
			continue
		}
		for _, e := range top.Content[i+1].Content {
			fields := map[string]*yamlv3.Node{}
			for j := 0; j+1 < len(e.Content); j += 2 {
				fields[e.Content[j].Value] = e.Content[j+1]
			}
			alias, n := fields["alias"], fields["name"]
			if (alias == nil || alias.Value != name) && (n == nil || n.Value != name || alias != nil) {
				continue
			}
			if v := fields["version"]; v != nil {
				return v.Line
			}
			return e.Line
		}
	}
	return 1
}

// filesUnder reads the files in the folder dir of the revision: path from dir ->
// content.
func (t *Tree) filesUnder(dir string) (map[string][]byte, error) {
	prefix := ""
	if dir != "." && dir != "" {
		prefix = dir + "/"
	}
	out := map[string][]byte{}
	for f, data := range t.Files {
		if rest, ok := strings.CutPrefix(f, prefix); ok {
			out[rest] = data
		}
	}
	for f, read := range t.other {
		rest, ok := strings.CutPrefix(f, prefix)
		if !ok {
			continue
		}
		data, err := read()
		if err != nil {
			return nil, fmt.Errorf("read %s at %s: %w", f, t.Revision, err)
		}
		out[rest] = data
	}
	return out, nil
}

// gitCharts builds the charts that HelmReleases read from GitRepository sources naming
// this repository, from the head revision's files, once each, in a temporary folder
// that Diff.Close removes.
type gitCharts struct {
	// remotes are the repository's remote URLs, normalised (repoID): a GitRepository
	// names this repository when its URL is one of them, or when it has none (a clone
	// without remotes).
	remotes []string
	mu      sync.Mutex
	root    string
	built   map[string]builtChart
}

type builtChart struct {
	dir string
	err error
}

func newGitCharts(repo *git.Repository) (*gitCharts, error) {
	rs, err := repo.Remotes()
	if err != nil {
		return nil, fmt.Errorf("read the repository's remotes: %w", err)
	}
	g := &gitCharts{built: map[string]builtChart{}}
	for _, r := range rs {
		for _, u := range r.Config().URLs {
			g.remotes = append(g.remotes, repoID(u))
		}
	}
	return g, nil
}

// ours says whether a GitRepository's URL names this repository.
func (g *gitCharts) ours(url string) bool {
	return len(g.remotes) == 0 || slices.Contains(g.remotes, repoID(url))
}

// rendersOurs says whether the HelmRelease obj's GitRepository, as the tree holds it
// nearest to obj, names this repository. One the tree lacks may (missing names it): the
// change is then reported, not judged.
func (g *gitCharts) rendersOurs(t *Tree, obj Object) (ours bool, missing string) {
	if g == nil {
		return false, ""
	}
	name, _, _ := unstructured.NestedString(obj.Object, "spec", "chart", "spec", "sourceRef", "name")
	ns, _, _ := unstructured.NestedString(obj.Object, "spec", "chart", "spec", "sourceRef", "namespace")
	if ns == "" {
		ns = obj.GetNamespace()
	}
	gr, ok := t.Find(Key{GroupKind: gitRepositoryKind, Namespace: ns, Name: name}, obj.File)
	if !ok {
		// A manifest without a namespace takes the one its Kustomization gives it.
		if gr, ok = t.Find(Key{GroupKind: gitRepositoryKind, Name: name}, obj.File); !ok {
			return true, ns + "/" + name
		}
	}
	url, _, _ := unstructured.NestedString(gr.Object, "spec", "url")
	return g.ours(url), ""
}

var gitRepositoryKind = sourcev1.GroupVersion.WithKind(sourcev1.GitRepositoryKind).GroupKind()

// repoID is a Git URL without its scheme, user, port, trailing slash and .git:
// "https://github.com/org/fleet.git" and "git@github.com:org/fleet" are both
// "github.com/org/fleet".
func repoID(u string) string {
	u = strings.ToLower(strings.TrimSpace(u))
	if _, rest, ok := strings.Cut(u, "://"); ok {
		u = rest
	} else if host, p, ok := strings.Cut(u, ":"); ok && !strings.Contains(host, "/") {
		u = host + "/" + p // scp-like: git@host:org/repo
	}
	host, p, _ := strings.Cut(u, "/")
	if _, h, ok := strings.Cut(host, "@"); ok {
		host = h
	}
	if h, port, ok := strings.Cut(host, ":"); ok && strings.Trim(port, "0123456789") == "" {
		host = h
	}
	return host + "/" + strings.TrimSuffix(strings.TrimSuffix(p, "/"), ".git")
}

// chart builds the chart at chartPath of the tree (the head revision) into a folder,
// with its dependencies (buildDependencies), once.
func (g *gitCharts) chart(ctx context.Context, t *Tree, chartPath string, settings *cli.EnvSettings) (string, error) {
	dir := cleanChartPath(chartPath)
	g.mu.Lock()
	defer g.mu.Unlock()
	if b, ok := g.built[dir]; ok {
		return b.dir, b.err
	}
	out, err := g.build(ctx, t, dir, settings)
	if err != nil {
		err = fmt.Errorf("chart %s: %w", dir, err)
	}
	g.built[dir] = builtChart{dir: out, err: err}
	return out, err
}

func (g *gitCharts) build(ctx context.Context, t *Tree, dir string, settings *cli.EnvSettings) (string, error) {
	files, err := t.filesUnder(dir)
	if err != nil {
		return "", err
	}
	if _, ok := files["Chart.yaml"]; !ok {
		return "", &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("the repository holds no chart at %s at %s (no %s): fix spec.chart.spec.chart", dir, t.Revision, repoPath(dir, "Chart.yaml"))}
	}
	if g.root == "" {
		if g.root, err = os.MkdirTemp("", "upgradeguard-gitcharts-"); err != nil {
			return "", err
		}
	}
	out := filepath.Join(g.root, fmt.Sprint(len(g.built)), filepath.FromSlash(path.Base(dir)))
	if err := writeFiles(out, files); err != nil {
		return "", err
	}
	return out, buildDependencies(ctx, out, files, settings, func(p string) (map[string][]byte, error) { return t.filesUnder(path.Join(dir, p)) })
}

// close removes the charts built.
func (g *gitCharts) close() error {
	if g == nil || g.root == "" {
		return nil
	}
	return os.RemoveAll(g.root)
}

// writeFiles writes files (path from dir -> content) under dir.
func writeFiles(dir string, files map[string][]byte) error {
	for _, p := range slices.Sorted(maps.Keys(files)) {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, files[p], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// buildDependencies puts into dir/charts/ the dependencies of the chart written at dir
// (files) that it does not vendor, as source-controller builds a chart from a Git
// source: a dependency already in charts/ stays as it is; the others are those Chart.lock
// pins when there is one (source-controller does not compare it with Chart.yaml; review
// says when they differ, staleLock), else Chart.yaml's, each fetched with the Helm SDK's
// downloader (chartsource.Options.Locate, as helm pull and helm dependency build fetch).
// A file:// dependency is read from the same revision through local, relative to the
// chart's folder. A dependency's repository is read with the credentials `helm repo add`
// stored for its URL (as helm dependency build reads them), an OCI registry with Docker's
// (helm registry login).
func buildDependencies(ctx context.Context, dir string, files map[string][]byte, settings *cli.EnvSettings, local func(string) (map[string][]byte, error)) error {
	d, err := readDependencies(dir, files)
	if err != nil {
		return err
	}
	reqs := d.declared
	if d.lock != nil {
		reqs = d.lock.Dependencies
	}
	if len(reqs) == 0 {
		return nil
	}
	present := map[string]bool{}
	for name := range d.vendored {
		present[name] = true
	}
	for _, dep := range reqs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if present[dep.Name] || dep.Alias != "" && present[dep.Alias] {
			continue
		}
		switch {
		case dep.Repository == "":
			return fmt.Errorf("dependency %s names no repository and is not in charts/: vendor it there or give its repository", dep.Name)
		case strings.HasPrefix(dep.Repository, "file://"):
			if local == nil {
				return fmt.Errorf("dependency %s is a local folder (%s), which review does not read here: vendor it in charts/", dep.Name, dep.Repository)
			}
			sub, err := local(strings.TrimPrefix(dep.Repository, "file://"))
			if err != nil {
				return err
			}
			if _, ok := sub["Chart.yaml"]; !ok {
				return fmt.Errorf("dependency %s: no chart at %s in the repository", dep.Name, dep.Repository)
			}
			if err := writeFiles(filepath.Join(dir, "charts", dep.Name), sub); err != nil {
				return err
			}
		case strings.HasPrefix(dep.Repository, "@") || strings.HasPrefix(dep.Repository, "alias:"):
			return fmt.Errorf("dependency %s: repository %s names a repository of helm repo add, which source-controller does not read: give its URL", dep.Name, dep.Repository)
		default:
			o := chartsource.Options{Ref: dep.Name, RepoURL: dep.Repository, Version: dep.Version, Settings: settings}
			if registry.IsOCI(dep.Repository) {
				// The registry's credentials are Docker's (helm registry login).
				o.Ref, o.RepoURL = strings.TrimSuffix(dep.Repository, "/")+"/"+dep.Name, ""
			} else {
				o = o.WithStoredCredentials()
			}
			p, err := o.Locate(nil)
			if err != nil {
				how := cmdline.HelmRepoAdd{Name: dep.Name, URL: dep.Repository}.String()
				if o.RepoURL == "" {
					how = cmdline.HelmRegistryLogin{Host: registryHost(dep.Repository)}.String()
				}
				return fmt.Errorf("dependency %s %s from %s: %w; for a private repository, store its credentials where review runs, as helm dependency build reads them: %s",
					dep.Name, dep.Version, dep.Repository, err, how)
			}
			// The download is named by its digest in Helm's content cache.
			if err := copyFile(p, filepath.Join(dir, "charts", depKey(dep)+".tgz")); err != nil {
				return err
			}
		}
	}
	return nil
}

// registryHost is the host of an oci:// repository.
func registryHost(repository string) string {
	host, _, _ := strings.Cut(strings.TrimPrefix(repository, "oci://"), "/")
	return host
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// GitChart serves the chart of a GitRepository that names this repository from the
// head revision (fluxrelease.GitChartReader).
func (r treeReader) GitChart(ctx context.Context, repo *sourcev1.GitRepository, chartPath string) (string, error) {
	if r.tree.git == nil {
		return "", &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("GitRepository %s/%s: the repository's files are not at hand", repo.Namespace, repo.Name)}
	}
	if !r.tree.git.ours(repo.Spec.URL) {
		return "", &fluxrelease.UnsupportedError{Reason: fmt.Sprintf("GitRepository %s/%s fetches %s, not this repository: review reads charts from this repository only",
			repo.Namespace, repo.Name, repo.Spec.URL)}
	}
	dir, err := r.tree.git.chart(ctx, r.tree, chartPath, r.settings)
	if err != nil {
		return "", fmt.Errorf("GitRepository %s/%s: %w", repo.Namespace, repo.Name, err)
	}
	return dir, nil
}

var _ fluxrelease.GitChartReader = treeReader{}

// Close removes what reviewing the change built: the charts of GitRepository sources.
func (d *Diff) Close() error {
	if d.head == nil {
		return nil
	}
	return d.head.git.close()
}

// DeployedCharts are the chart folders of the repository that a HelmRelease at the head
// renders through a GitRepository: judged on the clusters they land on, so Charts leaves
// them out (ChartOptions.Deployed).
func (d *Diff) DeployedCharts() []string { return d.deployed }
