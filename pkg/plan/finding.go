package plan

import (
	"fmt"
	"slices"
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
//
// What --latest, --rollback and --upgrade-keeps-rollback add follows the path's cases,
// without changing whether the plan fails (the exit code does not depend on them):
//
//   - --latest: a case for the newest version, with an info finding (check "latest")
//     naming the newest version safe in one step now when it is not the newest;
//   - each rollback target: a case "rollback to revision N (chart V)", passing when
//     reachable now; otherwise a warning whose check is its reach (rollback-reachable-
//     after-steps with the steps as remediation, rollback-unreachable with what blocks
//     each CRD, rollback-denied-by-policy with each policy's way on);
//   - the running revision after the plan: the same, as "after the plan, rollback to
//     revision N".
func (p *Plan) FindingReport() finding.Report {
	rep := finding.Report{Tool: "plan", Cases: p.pathCases()}
	group := p.subject()
	if l := p.Latest; l != nil {
		c := finding.Case{Group: group, Name: "newest version " + l.Newest}
		if l.DirectlySafe != l.Newest {
			msg := fmt.Sprintf("no version newer than %s is safe in one step now", orInstall(p.From))
			if l.DirectlySafe != "" {
				msg = fmt.Sprintf("the newest version safe in one step now is %s", l.DirectlySafe)
			}
			var blocked []string
			for _, b := range l.Blocked {
				if !slices.Contains(blocked, b.Version) {
					blocked = append(blocked, b.Version)
				}
			}
			if len(blocked) > 0 {
				msg += fmt.Sprintf("; a direct upgrade to %s is blocked", strings.Join(blocked, ", "))
			}
			c.Findings = append(c.Findings, finding.Finding{Check: "latest", Subject: "chart version " + l.Newest, Severity: finding.Info, Message: msg})
		}
		rep.Cases = append(rep.Cases, c)
	}
	for _, rb := range p.Rollbacks {
		rep.Cases = append(rep.Cases, rb.findingCase(group, fmt.Sprintf("rollback to revision %d (chart %s)", rb.Revision, rb.ChartVersion)))
	}
	if rb := p.KeepsRollback; rb != nil {
		rep.Cases = append(rep.Cases, rb.findingCase(group, fmt.Sprintf("after the plan, rollback to revision %d (chart %s)", rb.Revision, rb.ChartVersion)))
	}
	return rep
}

// findingCase is the rollback target as a case named name: passing when reachable now,
// else a warning whose check is its reach.
func (rb Rollback) findingCase(group, name string) finding.Case {
	c := finding.Case{Group: group, Name: name}
	check := "rollback-" + string(rb.Reach)
	switch rb.Reach {
	case ReachableAfterSteps:
		c.Findings = append(c.Findings, finding.Finding{Check: check, Subject: group, Severity: finding.Warning,
			Message:     fmt.Sprintf("a rollback to revision %d needs steps first", rb.Revision),
			Remediation: joinCommands(rb.Steps)})
	case Unreachable:
		for _, why := range rb.Why {
			crd, reason, _ := strings.Cut(why, ": ") // rollbackFrom's "CRD: reason"
			c.Findings = append(c.Findings, finding.Finding{Check: check, Subject: crd, Severity: finding.Warning,
				Message:     fmt.Sprintf("no step makes a rollback to revision %d succeed: %s", rb.Revision, reason),
				Remediation: "fix forward with an upgrade: no migration makes this rollback succeed"})
		}
	case DeniedByPolicy:
		for _, d := range rb.Policies {
			c.Findings = append(c.Findings, finding.Finding{Check: check, Subject: group, Severity: finding.Warning,
				Message: fmt.Sprintf("ValidatingAdmissionPolicy %s denies the CRD writes of a rollback to revision %d (%s): %s",
					d.Policy, rb.Revision, strings.Join(rb.Denied, ", "), d.Message),
				Remediation: d.WayOn.String()})
		}
	}
	return c
}

// pathCases are the cases of the path to the target.
func (p *Plan) pathCases() []finding.Case {
	cases := []finding.Case{}
	group := p.subject()
	hop := func(from, to string) string { return orInstall(from) + " → " + to }
	if !p.Reachable {
		c := finding.Case{Group: group, Name: hop(p.From, p.Target)}
		for _, b := range p.Blocking {
			c.Findings = append(c.Findings, b.finding(finding.Blocking, b.Action))
		}
		return append(cases, c)
	}
	if len(p.Steps) == 0 {
		return append(cases, finding.Case{Group: group, Name: fmt.Sprintf("%s (already running)", p.Target)})
	}
	if len(p.Blocking) > 0 {
		c := finding.Case{Group: group, Name: hop(p.From, p.Target) + " directly"}
		path := fmt.Sprintf("take the plan's path: %s, with the steps it names before each upgrade", strings.Join(append([]string{orInstall(p.From)}, p.upgradeVersions()...), " → "))
		for _, b := range p.Blocking {
			c.Findings = append(c.Findings, b.finding(finding.Warning, path))
		}
		cases = append(cases, c)
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
		cases = append(cases, c)
		from, first = s.ChartVersion, i+1
	}
	return cases
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
