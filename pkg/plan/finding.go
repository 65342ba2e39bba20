package plan

import (
	"fmt"
	"strings"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// FindingReport is the plan as CI reads it. The group is the release (or the Argo CD
// Application); a case is one chart upgrade of the path ("2.12.0 → 2.17.2"). Every
// finding's check is the check verdict it stems from (package check's IDs), its subject
// the CRD:
//
//   - a finding a step before the upgrade answers (a migration, a keep annotation, a
//     storage switch, a CRD adoption) is a warning, its remediation that step's commands:
//     the plan has a way, and following it is safe;
//   - the upgrade's own findings that block nothing (a later prune) are warnings, with
//     check's action;
//   - what blocks a direct upgrade to the target, when the path goes through stepping
//     stones, is a warning on a case of its own whose remediation is the path;
//   - what blocks the target when no path exists is blocking, with check's action: the
//     plan fails.
//
// A plan that already runs its target has one case and no finding.
func (p *Plan) FindingReport() finding.Report {
	rep := finding.Report{Tool: "plan", Cases: []finding.Case{}}
	group := p.subject()
	hop := func(from, to string) string { return orInstall(from) + " → " + to }
	if !p.Reachable {
		c := finding.Case{Group: group, Name: hop(p.From, p.Target)}
		for _, b := range p.Blocking {
			c.Findings = append(c.Findings, b.finding(finding.Blocking, b.Action))
		}
		rep.Cases = append(rep.Cases, c)
		return rep
	}
	if len(p.Steps) == 0 {
		rep.Cases = append(rep.Cases, finding.Case{Group: group, Name: fmt.Sprintf("%s (already running)", p.Target)})
		return rep
	}
	if len(p.Blocking) > 0 {
		c := finding.Case{Group: group, Name: hop(p.From, p.Target) + " directly"}
		path := fmt.Sprintf("take the plan's path: %s, with the steps it names before each upgrade", strings.Join(append([]string{orInstall(p.From)}, p.upgradeVersions()...), " → "))
		for _, b := range p.Blocking {
			c.Findings = append(c.Findings, b.finding(finding.Warning, path))
		}
		rep.Cases = append(rep.Cases, c)
	}
	from, first := p.From, 0
	for i, s := range p.Steps {
		if s.Kind != Upgrade {
			continue
		}
		c := finding.Case{Group: group, Name: hop(from, s.ChartVersion)}
		for n := first; n < i; n++ {
			before := p.Steps[n]
			fix := fmt.Sprintf("step %d of the plan, before the upgrade to %s: %s", n+1, s.ChartVersion, joinCommands(before.Commands))
			for _, why := range before.Because {
				c.Findings = append(c.Findings, finding.Finding{Check: why.Verdict, Subject: why.CRD, Severity: finding.Warning,
					Message: why.Reason, Remediation: fix})
			}
		}
		if s.Check != nil {
			for _, f := range s.Check.FindingReport().Findings() {
				f.Severity = finding.Warning // the step is safe: nothing of it blocks
				c.Findings = append(c.Findings, f)
			}
		}
		rep.Cases = append(rep.Cases, c)
		from, first = s.ChartVersion, i+1
	}
	return rep
}

// finding is the blocker as a finding of severity sev with remediation fix.
func (b Blocker) finding(sev finding.Severity, fix string) finding.Finding {
	subject := b.CRD
	if subject == "" {
		subject = "chart version " + b.Version
	}
	return finding.Finding{Check: b.Verdict, Subject: subject, Severity: sev, Message: b.Reason, Remediation: fix}
}

// subject names what the plan is for: the Argo CD Application, or the Helm release.
func (p *Plan) subject() string {
	if p.Application != "" {
		return "Application/" + p.Application
	}
	return manifest.SubjectOf("Release", p.Namespace, p.Release)
}

// upgradeVersions are the chart versions the plan's upgrades move to, in order.
func (p *Plan) upgradeVersions() []string {
	var out []string
	for _, s := range p.Steps {
		if s.Kind == Upgrade {
			out = append(out, s.ChartVersion)
		}
	}
	return out
}

func joinCommands(cmds []string) string { return strings.Join(cmds, "; then ") }

func orInstall(from string) string {
	if from == "" {
		return "(not installed)"
	}
	return from
}
