package audit

import (
	"fmt"
	"slices"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	release "helm.sh/helm/v4/pkg/release/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

// input is one release to judge: a Flux HelmRelease, its stored Helm release, or both.
type input struct {
	hr  *helmv2.HelmRelease
	rel *release.Release
	// note says why rel is missing for a HelmRelease.
	note string
	// composed are the values composed from spec.valuesFrom and spec.values (nil: not
	// resolved); valuesErr says why they could not be.
	composed  map[string]any
	valuesErr string
}

// judge holds what every release is judged against.
type judge struct {
	reg        *registry.Registry
	policies   []*v1alpha1.StorageMigrationPolicy // proactive only
	crds       map[string]*apiextv1.CustomResourceDefinition
	controller Controller
	warnings   []string
}

func (j *judge) evaluate(in input) (Release, error) {
	out := Release{Subject: subjectOf(in)}
	if in.note != "" {
		out.Notes = append(out.Notes, in.note)
	}
	crds, err := chartAndCRDs(in, &out)
	if err != nil {
		return out, err
	}
	entry, known := j.reg.Lookup(out.Chart)
	out.Known = known
	if in.rel == nil && known {
		out.ShipsCRDs = true
		out.Notes = append(out.Notes, "no stored release: counted as shipping CRDs because the registry knows the chart")
	}
	hooks := j.mechanisms(in, &out, entry, known)
	if in.hr != nil {
		out.Findings = append(out.Findings, hrFindings(in.hr, crds, out.ShipsCRDs, hooks.silenced)...)
	}
	// upgradeguard's proactive controller.
	if out.ShipsCRDs && j.controller.Running && in.rel != nil && j.coversAll(crds) {
		hooks.upgrade = append(hooks.upgrade, ByUpgradeguard)
		hooks.rollback = append(hooks.rollback, ByUpgradeguard)
	}
	out.Upgrade = Protection{Protected: len(hooks.upgrade) > 0, By: hooks.upgrade}
	out.Rollback = Protection{Protected: len(hooks.rollback) > 0, By: hooks.rollback}
	out.Protected = out.ShipsCRDs && out.Upgrade.Protected && out.Rollback.Protected
	for i := range out.Findings {
		out.Findings[i].Subject = out.Subject
	}
	return out, nil
}

func subjectOf(in input) string {
	if in.hr != nil {
		return manifest.SubjectOf("HelmRelease", in.hr.Namespace, in.hr.Name)
	}
	return fmt.Sprintf("Release/%s/%s", in.rel.Namespace, in.rel.Name)
}

// chartAndCRDs fills in the chart, its version and the CRDs the stored revision ships.
func chartAndCRDs(in input, out *Release) ([]chartcrds.CRD, error) {
	if in.rel == nil {
		out.Chart, out.Version = hrChart(in.hr)
		return nil, nil
	}
	out.Revision = in.rel.Version
	if in.hr != nil {
		out.HelmRelease = in.rel.Namespace + "/" + in.rel.Name
	}
	if in.rel.Chart != nil && in.rel.Chart.Metadata != nil {
		out.Chart, out.Version = in.rel.Chart.Metadata.Name, in.rel.Chart.Metadata.Version
	}
	crds, err := chartcrds.All(in.rel.Chart, in.rel.Manifest)
	if err != nil {
		return nil, fmt.Errorf("%s: revision %d: read its CRDs: %w", out.Subject, in.rel.Version, err)
	}
	for _, c := range crds {
		out.CRDs = append(out.CRDs, c.CRD.Name)
	}
	slices.Sort(out.CRDs)
	out.ShipsCRDs = len(out.CRDs) > 0
	return crds, nil
}

// protectors are the hooks that protect an upgrade and a rollback, and the mechanisms
// disableHooks switched off (upgrade, rollback).
type protectors struct {
	upgrade, rollback []string
	silenced          [2][]string
}

// mechanisms evaluates the registry's migration mechanisms of the chart against the
// release's values (only the registry's keys are ever looked up).
func (j *judge) mechanisms(in input, out *Release, entry *registry.Chart, known bool) protectors {
	var hooks protectors
	user, chartDefaults, source := values(in)
	out.ValuesSource = source
	if in.valuesErr != "" {
		out.Notes = append(out.Notes, "spec.valuesFrom could not be resolved, so the values may differ from what helm-controller installs: "+in.valuesErr)
	}
	if !known {
		if out.ShipsCRDs {
			out.Notes = append(out.Notes, notRegistered(out.Chart))
		}
		return hooks
	}
	off := hooksOff(in.hr)
	for i := range entry.Mechanisms {
		m := &entry.Mechanisms[i]
		st := mechanismState(m, out.Version, user, chartDefaults, in.rel)
		out.Mechanisms = append(out.Mechanisms, st)
		out.Findings = append(out.Findings, mechanismFindings(m, st, out.Chart, out.Version)...)
		hooks.add(m, st, off)
	}
	if len(entry.Mechanisms) == 0 && out.ShipsCRDs {
		out.Findings = append(out.Findings, Finding{Check: CodeNoProtection, Severity: Info,
			Message: fmt.Sprintf("chart %s has no upstream migration hook (registry, confidence %s)", out.Chart, entry.Confidence)})
	}
	return hooks
}

// hooksOff are the hooks a HelmRelease's disableHooks switches off.
func hooksOff(hr *helmv2.HelmRelease) map[registry.Hook]bool {
	off := map[registry.Hook]bool{}
	if hr == nil {
		return off
	}
	if hr.Spec.Upgrade != nil && hr.Spec.Upgrade.DisableHooks {
		off[registry.PreUpgrade], off[registry.PostUpgrade] = true, true
	}
	if hr.Spec.Rollback != nil && hr.Spec.Rollback.DisableHooks {
		off[registry.PreRollback], off[registry.PostRollback] = true, true
	}
	return off
}

// add counts one mechanism: silenced by disableHooks, or protecting when it is on,
// migrates objects and runs before the operation.
func (h *protectors) add(m *registry.Mechanism, st Mechanism, off map[registry.Hook]bool) {
	if st.On && (m.Has(registry.PreUpgrade) || m.Has(registry.PostUpgrade)) && off[registry.PreUpgrade] {
		h.silenced[0] = append(h.silenced[0], m.Name)
	}
	if st.On && (m.Has(registry.PreRollback) || m.Has(registry.PostRollback)) && off[registry.PreRollback] {
		h.silenced[1] = append(h.silenced[1], m.Name)
	}
	if !st.On || m.Action != registry.MigratesObjects {
		return
	}
	if m.Has(registry.PreUpgrade) && !off[registry.PreUpgrade] {
		h.upgrade = append(h.upgrade, byHookPrefix+m.Name)
	}
	if m.Has(registry.PreRollback) && !off[registry.PreRollback] {
		h.rollback = append(h.rollback, byHookPrefix+m.Name)
	}
}

// coversAll reports whether every CRD is selected by a proactive policy
// (v1alpha1.Select). A policy with an invalid selector is a warning, and the CRDs are not
// counted as covered until it is corrected.
func (j *judge) coversAll(crds []chartcrds.CRD) bool {
	if len(crds) == 0 || len(j.policies) == 0 {
		return false
	}
	judged := make([]*apiextv1.CustomResourceDefinition, 0, len(crds))
	for _, c := range crds {
		crd := c.CRD
		if live, ok := j.crds[crd.Name]; ok {
			crd = live
		}
		judged = append(judged, crd)
	}
	selected, err := v1alpha1.Select(j.policies, judged, nil)
	if err != nil {
		j.warn(err.Error())
		return false
	}
	for _, crd := range judged {
		if selected[crd.Name] == nil {
			return false
		}
	}
	return true
}

func (j *judge) warn(msg string) {
	if !slices.Contains(j.warnings, msg) {
		j.warnings = append(j.warnings, msg)
	}
}

// notRegistered is the note on a release or Application whose chart the registry does not
// know (Release.Known, Application.Known false): a front end adds how its user extends
// the registry.
func notRegistered(chart string) string {
	return fmt.Sprintf("chart %q is not in the registry: no upstream hook is assumed until the registry has an entry for it", chart)
}

// values returns the values set for the release, the stored chart's defaults, and where
// the set values came from.
func values(in input) (user, chartDefaults map[string]any, source string) {
	if in.rel != nil && in.rel.Chart != nil {
		chartDefaults = in.rel.Chart.Values
	}
	from := in.hr != nil && len(in.hr.Spec.ValuesFrom) > 0
	switch {
	case from && in.composed != nil:
		return in.composed, chartDefaults, "HelmRelease values composed as helm-controller does from " + fluxrelease.ValuesSources(in.hr)
	case from && in.valuesErr != "" && in.rel != nil:
		return in.rel.Config, chartDefaults, fmt.Sprintf("stored revision %d (spec.valuesFrom could not be resolved: %s)", in.rel.Version, in.valuesErr)
	case from && in.valuesErr != "":
		return in.hr.GetValues(), chartDefaults, fmt.Sprintf("HelmRelease spec.values only (spec.valuesFrom could not be resolved: %s)", in.valuesErr)
	case from && in.rel != nil:
		return in.rel.Config, chartDefaults, fmt.Sprintf("stored revision %d (spec.valuesFrom is not resolved; Flux composed these values at the last release)", in.rel.Version)
	case from:
		return in.hr.GetValues(), chartDefaults, "HelmRelease spec.values (spec.valuesFrom is not resolved: keys set there are missed)"
	case in.hr != nil:
		return in.hr.GetValues(), chartDefaults, "HelmRelease spec.values"
	default:
		return in.rel.Config, chartDefaults, fmt.Sprintf("stored revision %d", in.rel.Version)
	}
}

func mechanismState(m *registry.Mechanism, version string, user, chartDefaults map[string]any, rel *release.Release) Mechanism {
	st := Mechanism{Name: m.Name, Action: string(m.Action)}
	for _, h := range m.Hooks {
		st.Hooks = append(st.Hooks, string(h))
	}
	st.Exists, _ = m.ExistsIn(version)
	lookup := func(k registry.Key) Value {
		if v, ok := registry.ValueAt(user, k.Key); ok {
			return Value{Key: k.Key, Value: scalar(v), Source: "values"}
		}
		if v, ok := registry.ValueAt(chartDefaults, k.Key); ok {
			return Value{Key: k.Key, Value: scalar(v), Source: "chart default"}
		}
		return Value{Key: k.Key, Value: k.Default, Source: "registry default"}
	}
	on := st.Exists
	for _, k := range m.EnabledBy {
		v := lookup(k)
		st.Keys = append(st.Keys, v)
		on = on && registry.Truthy(v.Value)
	}
	for _, k := range m.DisabledBy {
		v := lookup(k)
		st.Keys = append(st.Keys, v)
		on = on && !registry.Truthy(v.Value)
	}
	st.On = on
	if rel != nil && m.Template != "" {
		rendered := false
		for _, h := range rel.Hooks {
			if h != nil && (h.Path == m.Template || strings.HasSuffix(h.Path, "/"+m.Template)) {
				rendered = true
			}
		}
		st.Rendered = &rendered
	}
	return st
}

// scalar keeps a value printable without leaking a structure: maps and lists (which a
// mechanism key should never hold) are reported by kind only.
func scalar(v any) any {
	switch v.(type) {
	case map[string]any:
		return "<map>"
	case []any:
		return "<list>"
	}
	return v
}

func keysText(st Mechanism) string {
	parts := make([]string, len(st.Keys))
	for i, k := range st.Keys {
		parts[i] = fmt.Sprintf("%s=%v", k.Key, k.Value)
	}
	return strings.Join(parts, ", ")
}

func mechanismFindings(m *registry.Mechanism, st Mechanism, chart, version string) []Finding {
	var out []Finding
	hookList := strings.Join(st.Hooks, ",")
	if !st.Exists {
		if v := st.Keys[0]; v.Source == "values" && registry.Truthy(v.Value) {
			out = append(out, Finding{Check: CodeMechanismMissing, Severity: Warning,
				Message: fmt.Sprintf("%s=%v has no effect in %s %s: %s exists in versions %s", v.Key, v.Value, chart, version, m.Name, m.Versions)})
		}
		return out
	}
	switch {
	case m.Action == registry.DeletesCRDs && st.On:
		out = append(out, Finding{Check: CodeDestructive, Severity: Danger,
			Message: fmt.Sprintf("%s: the %s %s hook deletes the chart's CRDs, and every object of their types; set %s=false", keysText(st), m.Name, hookList, m.EnabledBy[0].Key)})
	case m.Action == registry.AppliesCRDs && st.On:
		out = append(out, Finding{Check: CodeAppliesCRDsOnly, Severity: Info,
			Message: fmt.Sprintf("%s applies CRDs only (%s): it never migrates stored objects or status.storedVersions", m.Name, hookList)})
	case m.Action == registry.MigratesObjects && !st.On:
		out = append(out, Finding{Check: CodeMechanismOff, Severity: Warning,
			Message: fmt.Sprintf("%s: the %s %s hook is off; set %s=%v", keysText(st), m.Name, hookList, m.EnabledBy[0].Key, true)})
	case m.Action == registry.MigratesObjects && m.Has(registry.PostUpgrade) && !m.Has(registry.PreUpgrade):
		out = append(out, Finding{Check: CodePostUpgradeHook, Severity: Warning,
			Message: fmt.Sprintf("post-upgrade: too late when a minor release is skipped (%s runs after the API server has judged the new CRDs; an upgrade that drops a stored version fails before it)", m.Name)})
	}
	return out
}

// hrFindings are the Flux settings that switch protection off or leave CRDs stale.
// silenced names the switched-on mechanisms that disableHooks stops, for upgrade and
// rollback.
func hrFindings(hr *helmv2.HelmRelease, crds []chartcrds.CRD, shipsCRDs bool, silenced [2][]string) []Finding {
	var out []Finding
	if !shipsCRDs {
		return out
	}
	what := func(names []string) string {
		if len(names) == 0 {
			return "so no upstream migration hook can protect it"
		}
		return "so " + strings.Join(names, ", ") + " never runs"
	}
	if hr.Spec.Upgrade != nil && hr.Spec.Upgrade.DisableHooks {
		out = append(out, Finding{Check: CodeUpgradeHooksDisabled, Severity: Warning,
			Message: "spec.upgrade.disableHooks=true: Flux runs no chart hook on upgrade, " + what(silenced[0])})
	}
	if hr.Spec.Rollback != nil && hr.Spec.Rollback.DisableHooks {
		out = append(out, Finding{Check: CodeRollbackHooksDisabled, Severity: Warning,
			Message: "spec.rollback.disableHooks=true: Flux runs no chart hook on rollback, " + what(silenced[1])})
	}
	inDir := 0
	for _, c := range crds {
		if c.Source == predict.CRDsDir {
			inDir++
		}
	}
	if inDir == 0 {
		return out
	}
	if hr.Spec.Install != nil && hr.Spec.Install.CRDs == helmv2.Skip {
		out = append(out, Finding{Check: CodeCRDsSkip, Severity: Warning,
			Message: fmt.Sprintf("spec.install.crds=Skip: Flux never installs the %d CRD(s) in the chart's crds/ folder", inDir)})
	}
	if why := staleCRDs(hr); why != "" {
		out = append(out, Finding{Check: CodeCRDsSkip, Severity: Warning,
			Message: fmt.Sprintf("%s: upgrades never update the %d CRD(s) in the chart's crds/ folder, which go stale; set CreateReplace and keep them protected", why, inDir)})
	}
	return out
}

// staleCRDs says why the HelmRelease's upgrades leave the CRDs of crds/ that exist as
// they are, "" when they update them. helm-controller v1.6 (internal/action/crds.go)
// takes an unset spec.upgrade.crds as Create, which creates the missing ones and, for
// those that exist, is an update under server-side apply (a forced apply) and nothing
// under client-side apply; upgrades apply server-side unless spec.upgrade.serverSideApply
// is disabled (auto, the default, follows the release, which v1.6 installs server-side).
func staleCRDs(hr *helmv2.HelmRelease) string {
	up := hr.GetUpgrade()
	switch {
	case up.CRDs == helmv2.Skip:
		return "spec.upgrade.crds=Skip"
	case up.CRDs != helmv2.CreateReplace && up.ServerSideApply == helmv2.ServerSideApplyDisabled:
		how := "spec.upgrade.crds=Create"
		if up.CRDs == "" {
			how = "spec.upgrade.crds unset (Create)"
		}
		return how + " with spec.upgrade.serverSideApply=disabled (Create skips the CRDs that exist under client-side apply)"
	}
	return ""
}

// hrChart is the chart name and version of a HelmRelease without a stored release: the
// last release Flux recorded, else spec.chart.spec (whose version may be a range).
func hrChart(hr *helmv2.HelmRelease) (name, version string) {
	if s := hr.Status.History.Latest(); s != nil {
		return s.ChartName, s.ChartVersion
	}
	if hr.Spec.Chart != nil {
		return hr.Spec.Chart.Spec.Chart, hr.Spec.Chart.Spec.Version
	}
	return "", ""
}
