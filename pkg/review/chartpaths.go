package review

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

// pathState is a cluster on an upgrade path: its CRDs (with what status.storedVersions
// holds), the release's CRDs, the StorageVersionMigration names applied so far, and the
// releases it went through.
type pathState struct {
	live    map[string]*apiextv1.CustomResourceDefinition
	current []predict.ChartCRD
	applied map[string]bool
	path    []string
}

// install is a cluster that installed r. Installed fresh, storedVersions holds r's
// storage version. The oldest supported release stands for every release before it too:
// its users may have come from any of them, so every version its CRD lists may be stored
// (the worst case of a long-lived cluster).
func install(r *chartRelease, oldest bool) pathState {
	s := pathState{live: map[string]*apiextv1.CustomResourceDefinition{}, current: r.crds, applied: map[string]bool{}, path: []string{r.label}}
	for _, c := range r.crds {
		crd := c.CRD.DeepCopy()
		crd.Status.StoredVersions = []string{crdversions.StorageVersion(crd)}
		if oldest {
			crd.Status.StoredVersions = nil
			for _, v := range crd.Spec.Versions {
				crd.Status.StoredVersions = append(crd.Status.StoredVersions, v.Name)
			}
		}
		s.live[crd.Name] = crd
	}
	for _, m := range r.migrations {
		s.applied[m.Name] = true
	}
	return s
}

// prune leaves storedVersions of the named live CRD at its storage version: what a
// migration that ran to completion leaves.
func (s pathState) prune(name string) {
	if l := s.live[name]; l != nil {
		c := l.DeepCopy()
		c.Status.StoredVersions = []string{crdversions.StorageVersion(c)}
		s.live[name] = c
	}
}

// upgrade is s upgraded to r by plain Helm: the chart's pre-upgrade migration first,
// then each CRD's verdict (predict.Decide); when none blocks, the CRDs after the upgrade
// (predict.Apply), then the post-upgrade migration and the StorageVersionMigrations r
// bundles (each new name runs once the release applied it). blocked are the CRDs whose
// update the API server rejects.
func upgrade(s pathState, r *chartRelease) (next pathState, blocked []predict.Decision) {
	live := make(map[string]*apiextv1.CustomResourceDefinition, len(s.live))
	for k, v := range s.live {
		live[k] = v
	}
	next = pathState{live: live, current: r.crds, applied: map[string]bool{}, path: append(slices.Clone(s.path), r.label)}
	for k := range s.applied {
		next.applied[k] = true
	}
	if len(r.before) > 0 {
		for _, c := range r.crds {
			next.prune(c.CRD.Name)
		}
	}
	for _, c := range r.crds {
		d := predict.Decide(next.live[c.CRD.Name], predict.Incoming{CRD: c.CRD, Source: c.Source, Applied: predict.PolicyHelm.Applies(c.Source)})
		if d.Verdict.Blocks() {
			blocked = append(blocked, d)
		}
	}
	if len(blocked) > 0 {
		return next, blocked
	}
	next.live = predict.Apply(predict.Helm4, predict.Upgrade, next.live, r.crds, s.current, predict.PolicyHelm)
	if len(r.after) > 0 {
		for _, c := range r.crds {
			next.prune(c.CRD.Name)
		}
	}
	for _, m := range r.migrations {
		if m.Name != "" && next.applied[m.Name] {
			continue // the built-in migrator acts on a StorageVersionMigration once
		}
		next.applied[m.Name] = true
		next.prune(m.CRD())
	}
	return next, nil
}

// heldVersions is what reaching the head holds for one CRD: the versions it drops that
// storedVersions still holds, from which releases, and by which path (the first found
// from each release: through every later release first).
type heldVersions struct {
	versions []string
	// bridge says that no path holding them keeps its storage version in the head.
	bridge bool
	// liveStorage is the storage version on the first path found.
	liveStorage string
	starts      []string
	paths       map[string][]string
}

// judge walks every upgrade path and compares each release with the head.
func (j *chartJudge) judge() {
	j.held = map[string]*heldVersions{}
	for i, r := range j.releases {
		j.walk(r.label, install(r, i == 0), i)
	}
	j.storageFindings()
	for _, r := range j.releases {
		j.lifecycle(r)
	}
	j.schema()
	j.review.Findings = dedupe(j.review.Findings)
}

// walk follows every path from s (at release i) through later releases to the head.
func (j *chartJudge) walk(start string, s pathState, i int) {
	for k := i + 1; k < len(j.releases); k++ {
		next, blocked := upgrade(s, j.releases[k])
		if len(blocked) == 0 {
			j.walk(start, next, k)
		}
	}
	_, blocked := upgrade(s, j.head)
	for _, d := range blocked {
		h := j.held[d.Name]
		if h == nil {
			h = &heldVersions{paths: map[string][]string{}, liveStorage: d.LiveStorageVersion, bridge: true}
			j.held[d.Name] = h
		}
		for _, v := range d.MissingStoredVersions {
			if !slices.Contains(h.versions, v) {
				h.versions = append(h.versions, v)
			}
		}
		h.bridge = h.bridge && d.Verdict == predict.Bridge
		if _, ok := h.paths[start]; !ok {
			h.starts = append(h.starts, start)
			h.paths[start] = append(slices.Clone(s.path), j.head.label)
		}
	}
}

// storageFindings are the CRDs whose update the head brings the API server rejects on
// some supported path.
func (j *chartJudge) storageFindings() {
	for _, name := range slices.Sorted(maps.Keys(j.held)) {
		h := j.held[name]
		in := j.head.byName[name]
		vs := strings.Join(h.versions, ",")
		var paths []string
		for _, s := range h.starts {
			paths = append(paths, strings.Join(h.paths[s], " → "))
		}
		msg := fmt.Sprintf("%s drops %s from spec.versions, but status.storedVersions can still hold %s after installing %s and upgrading to the head without a manual migration (%s): the API server rejects the CRD update",
			name, vs, vs, strings.Join(h.starts, " or "), strings.Join(paths, "; "))
		fix := fmt.Sprintf("keep %s served in spec.versions of %s for one more release, or ship a migration that runs before the CRD update", vs, name)
		f := finding.Finding{Check: CheckStoredVersionDropped, Subject: name, Severity: finding.Blocking, Message: msg}
		if h.bridge {
			f.Message += fmt.Sprintf("; the head does not serve the storage version %s either, so a migration alone cannot help", h.liveStorage)
			fix = fmt.Sprintf("keep %s in spec.versions of %s for one more release, and store at a version both releases serve, so that a migration can move the objects", vs, name)
		} else if set, mech := j.migrationValues(); len(set) > 0 {
			fix += fmt.Sprintf(": set %s in the chart's values.yaml (the chart's pre-upgrade hook %s then migrates stored objects to %s first)",
				strings.Join(set, ","), mech, h.liveStorage)
			f.Input = &finding.Input{Option: OptionValues, Value: strings.Join(set, ",")}
		} else {
			fix += fmt.Sprintf(": a pre-upgrade hook Job that rewrites every %s object at %s and removes %s from status.storedVersions (a StorageVersionMigration bundled with the CRD runs after the CRD update: too late)",
				in.CRD.Spec.Names.Kind, h.liveStorage, vs)
		}
		f.Remediation = fix
		f.Location = j.location(in, "versions:")
		j.review.Findings = append(j.review.Findings, f)
	}
}

// migrationValues are the values that switch on the head chart's own pre-upgrade
// migration (a registry mechanism that exists in its version and is off under the values
// given), and the mechanism's name.
func (j *chartJudge) migrationValues() ([]string, string) {
	entry, ok := j.o.Registry.Lookup(j.review.Chart)
	if !ok {
		return nil, ""
	}
	for i := range entry.Mechanisms {
		m := &entry.Mechanisms[i]
		if m.Action != registry.MigratesObjects || !m.Has(registry.PreUpgrade) || slices.Contains(j.head.before, m.Name) {
			continue
		}
		if exists, _ := m.ExistsIn(j.review.Version); !exists {
			continue
		}
		var set []string
		for _, k := range m.EnabledBy {
			set = append(set, k.Key+"=true")
		}
		for _, k := range m.DisabledBy {
			set = append(set, k.Key+"=false")
		}
		return set, m.Name
	}
	return nil, ""
}

// lifecycle is what Helm (3 and 4) does with each CRD on the upgrade from r to the head:
// deletes a CRD that leaves the release manifest, never upgrades one in crds/, and
// drops a keep annotation the head stops rendering.
func (j *chartJudge) lifecycle(r *chartRelease) {
	s := install(r, false)
	for _, rm := range predict.Removals(predict.ReleaseChange{Deployer: predict.Helm4, Operation: predict.Upgrade, Live: s.live, Current: r.crds, Incoming: j.head.crds}) {
		if !rm.Deletes() {
			continue
		}
		how := "the head no longer renders it"
		loc := &finding.Location{File: j.review.File(), Line: lineOf(j.headFiles["Chart.yaml"], "version:", "")}
		if rm.Shipped != nil {
			how = fmt.Sprintf("the head moves it from templates/ to crds/ (%s), which is not part of the release manifest, and Helm never creates a crds/ file on upgrade", chartFile(rm.Shipped.File))
			loc = j.location(*rm.Shipped, "")
		}
		j.review.Findings = append(j.review.Findings, finding.Finding{
			Check: string(predict.Delete), Subject: rm.Name(), Severity: finding.Blocking, Location: loc,
			Message: fmt.Sprintf("upgrading from %s, %s: Helm 3 and 4 delete the CRD %s and every %s object with it", r.label, how, rm.Name(), rm.Live.Spec.Names.Kind),
			Remediation: fmt.Sprintf("keep rendering %s from templates/ and add %s: %s to it for one release before it leaves the manifest (Helm reads the annotation from the live CRD), or keep it in the manifest",
				rm.Name(), predict.KeepAnnotation, predict.KeepValue),
		})
	}
	for _, in := range j.head.crds {
		old, ok := r.byName[in.CRD.Name]
		if !ok {
			continue
		}
		if in.Source == predict.CRDsDir && old.Source == predict.CRDsDir && !equality.Semantic.DeepEqual(old.CRD.Spec, in.CRD.Spec) {
			j.review.Findings = append(j.review.Findings, finding.Finding{
				Check: CheckCRDNotUpgraded, Subject: in.CRD.Name, Severity: finding.Warning, Location: j.location(in, ""),
				Message: fmt.Sprintf("the head changes %s in crds/, but Helm (3 and 4) never upgrades a crds/ file: clusters that installed %s keep its CRD", in.CRD.Name, r.label),
				Remediation: fmt.Sprintf("tell users to apply %s before upgrading, or render the CRD from templates/ (with %s: %s) so that upgrades apply it",
					chartFile(in.File), predict.KeepAnnotation, predict.KeepValue),
			})
		}
		if old.Source == predict.Templates && in.Source == predict.Templates &&
			predict.KeepPolicy(old.CRD.Annotations[predict.KeepAnnotation]) && !predict.KeepPolicy(in.CRD.Annotations[predict.KeepAnnotation]) {
			j.review.Findings = append(j.review.Findings, finding.Finding{
				Check: CheckKeepRemoved, Subject: in.CRD.Name, Severity: finding.Warning, Location: j.location(in, "annotations:"),
				Message: fmt.Sprintf("%s renders %s: %s on %s and the head does not: the upgrade removes it from the live CRD, and a later release that stops rendering the CRD deletes it with every %s object",
					r.label, predict.KeepAnnotation, predict.KeepValue, in.CRD.Name, in.CRD.Spec.Names.Kind),
				Remediation: fmt.Sprintf("keep %s: %s in the CRD's metadata.annotations", predict.KeepAnnotation, predict.KeepValue),
			})
		}
	}
}

// schema adds the schema incompatibilities from each release's CRD to the head's
// (crdschema.Compare), one finding each, at the head's CRD file. A served version the
// head removes is the storage history's to judge: where it found the version still
// stored, that finding says it, and Compare's note on it is left out.
func (j *chartJudge) schema() {
	for _, r := range j.releases {
		for _, in := range j.head.crds {
			old, ok := r.byName[in.CRD.Name]
			if !ok {
				continue
			}
			for _, c := range crdschema.Compare(old.CRD, in.CRD) {
				if h := j.held[in.CRD.Name]; c.Check == crdschema.CheckVersionRemoved && h != nil && slices.Contains(h.versions, c.Version) {
					continue
				}
				f := finding.Finding{Check: c.Check, Subject: in.CRD.Name, Severity: c.Severity, Location: j.location(in, "versions:"),
					Message: fmt.Sprintf("%s, from %s: %s", in.CRD.Name, r.label, c.Message)}
				if where := strings.TrimSpace(c.Version + " " + c.Path); where != "" {
					f.Message += " (" + where + ")"
				}
				if l := versionLine(j.headFiles[chartFile(in.File)], in.CRD.Name, c.Version); c.Version != "" && l > 0 {
					f.Location.Line = l
				}
				j.review.Findings = append(j.review.Findings, f)
			}
		}
	}
}

// dedupe keeps the first finding of each check, subject and message start: the same
// lifecycle finding from several releases is one.
func dedupe(fs []finding.Finding) []finding.Finding {
	seen := map[string]int{}
	out := []finding.Finding{}
	for _, f := range fs {
		key := f.Check + "/" + f.Subject
		if f.Check != string(predict.Delete) && f.Check != CheckStoredVersionDropped {
			key += "/" + f.Message
		}
		if _, ok := seen[key]; ok {
			continue
		}
		seen[key] = len(out)
		out = append(out, f)
	}
	return out
}

// location is the head's file of a CRD, at the line of key in its document ("" for the
// CRD's name).
func (j *chartJudge) location(c predict.ChartCRD, key string) *finding.Location {
	file := chartFile(c.File)
	data, ok := j.headFiles[file]
	if !ok {
		return &finding.Location{File: j.review.File()}
	}
	line := lineOf(data, "name: "+c.CRD.Name, "")
	if key != "" {
		line = max(line, lineOf(data, key, c.CRD.Name))
	}
	return &finding.Location{File: repoPath(j.review.Dir, file), Line: line}
}

// chartFile is a chart file's path inside the chart: Helm names it from the chart's
// own name ("flux2/templates/x.yaml", "kyverno/charts/crds/templates/x.yaml").
func chartFile(helmPath string) string {
	_, rest, ok := strings.Cut(helmPath, "/")
	if !ok {
		return helmPath
	}
	return rest
}

// repoPath joins a chart's folder and a path inside it.
func repoPath(dir, file string) string {
	if dir == "" || dir == "." {
		return file
	}
	return dir + "/" + file
}

// lineOf is the 1-based line of the first line that, trimmed, starts with prefix, after
// the line naming the CRD after (any line when after is ""); 0 when there is none.
func lineOf(data []byte, prefix, after string) int {
	started := after == ""
	for i, l := range strings.Split(string(data), "\n") {
		t := strings.TrimSpace(l)
		if !started {
			started = strings.TrimSpace(strings.Trim(strings.TrimPrefix(t, "name:"), ` "'`)) == after && strings.HasPrefix(t, "name:")
			continue
		}
		if strings.HasPrefix(t, prefix) {
			return i + 1
		}
	}
	return 0
}

// versionLine is the line of the entry of spec.versions named version in the CRD's
// document, 0 when there is none.
func versionLine(data []byte, crd, version string) int {
	from := lineOf(data, "versions:", crd)
	if from == 0 {
		return 0
	}
	lines := strings.Split(string(data), "\n")
	for i := from; i < len(lines); i++ {
		if t := strings.TrimPrefix(strings.TrimSpace(lines[i]), "- "); t == "name: "+version || t == `name: "`+version+`"` {
			return i + 1
		}
	}
	return 0
}

// chartCases are the touched charts as CI reads them: a case per chart, its findings
// marked where acknowledged.
func chartCases(charts []ChartReview, acknowledge []string) []finding.Case {
	var out []finding.Case
	for _, c := range charts {
		name := fmt.Sprintf("chart %s %s", c.Chart, c.Version)
		if len(c.Baselines) > 0 {
			var from []string
			for _, b := range c.Baselines {
				from = append(from, b.Label())
			}
			name = fmt.Sprintf("chart %s (%s → %s)", c.Chart, strings.Join(from, ", "), c.Version)
		}
		fc := finding.Case{Group: "charts", Name: name}
		if c.NotJudged != "" {
			fc.Findings = append(fc.Findings, finding.Finding{Check: CheckNotJudged, Subject: "chart " + c.Chart, Severity: finding.Warning, Message: c.NotJudged,
				Location: &finding.Location{File: c.File(), Line: 1}})
		}
		for _, f := range c.Findings {
			f.Acknowledged = slices.Contains(acknowledge, f.AckKey()) || slices.Contains(c.Acknowledge, f.AckKey())
			fc.Findings = append(fc.Findings, f)
		}
		out = append(out, fc)
	}
	return out
}
