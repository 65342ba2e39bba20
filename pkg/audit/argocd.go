package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/strvals"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionclient "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

// CRDGateWebhook is the name of upgradeguard's CRD gate in its
// MutatingWebhookConfiguration (config/webhook/manifests.yaml, the Helm chart).
const CRDGateWebhook = "crd.upgradeguard.io"

// Who protects an Argo CD Application's sync, besides an upstream hook.
const (
	ByCRDGate          = "upgradeguard CRD gate"
	byBundledMigration = "bundled StorageVersionMigration "
)

// Finding codes of Argo CD Applications.
const (
	CodeBundledMigrationOnly = "bundled-migration-only"
	CodeValuesFilesUnread    = "values-files-unread"
)

// CRDGate is what the audit saw of upgradeguard's CRD gate: a webhook that sees every
// CRD update (from Argo CD, kubectl, any client) and holds one that drops a stored
// version until the migration is done. It protects only while the controller serving it
// runs (it fails open).
type CRDGate struct {
	// Installed says whether a MutatingWebhookConfiguration holds CRDGateWebhook for
	// CRD updates.
	Installed bool `json:"installed"`
	// Configuration is the MutatingWebhookConfiguration that holds it.
	Configuration string `json:"configuration,omitempty"`
	// Running is Installed with the controller running.
	Running bool   `json:"running"`
	Reason  string `json:"reason"`
}

// Application is one Argo CD Application that deploys CRDs, and who protects its sync.
// Argo CD applies every CRD it renders on each sync, runs pre-upgrade hooks as PreSync
// hooks, and never runs rollback hooks: a rollback re-syncs the old manifests.
type Application struct {
	// Subject is Application/<namespace>/<name>.
	Subject string `json:"subject"`
	// Source is the repository, chart or path, and target revision.
	Source string `json:"source"`
	// Chart and Version are the chart and the synced revision (a chart source's
	// status.sync.revision, else its targetRevision).
	Chart   string `json:"chart,omitempty"`
	Version string `json:"version,omitempty"`
	Known   bool   `json:"known"`
	// CRDs are the CRDs in the Application's resource tree.
	CRDs []string `json:"crds"`
	// Migrations are the StorageVersionMigrations in its resource tree.
	Migrations []string    `json:"storageVersionMigrations,omitempty"`
	Mechanisms []Mechanism `json:"mechanisms,omitempty"`
	// Sync says whether a sync that drops a stored version is protected, and by whom.
	Sync      Protection `json:"sync"`
	Protected bool       `json:"protected"`
	Findings  []Finding  `json:"findings,omitempty"`
	Notes     []string   `json:"notes,omitempty"`
}

var crdGroupKind = [2]string{"apiextensions.k8s.io", "CustomResourceDefinition"}

const svmGroup = "storagemigration.k8s.io"

// crdGate reads whether the CRD gate is installed, and counts it as running with the
// controller. Without a client, or without the right to list, it is not counted.
func crdGate(ctx context.Context, hooks admissionclient.MutatingWebhookConfigurationsGetter, controller Controller) (CRDGate, error) {
	if hooks == nil {
		return CRDGate{Reason: "webhook configurations not read"}, nil
	}
	list, err := hooks.MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		return CRDGate{Reason: "cannot list mutatingwebhookconfigurations (forbidden): the CRD gate is not counted; grant list on them"}, nil
	}
	if err != nil {
		return CRDGate{}, fmt.Errorf("list MutatingWebhookConfigurations (to find upgradeguard's CRD gate): %w", err)
	}
	for _, c := range list.Items {
		if coversCRDUpdates(c.Webhooks) {
			g := CRDGate{Installed: true, Configuration: c.Name, Running: controller.Running}
			g.Reason = fmt.Sprintf("webhook %s in %s; controller: %s", CRDGateWebhook, c.Name, controller.Reason)
			return g, nil
		}
	}
	return CRDGate{Reason: "no MutatingWebhookConfiguration holds " + CRDGateWebhook + " for CRD updates"}, nil
}

func coversCRDUpdates(hooks []admissionv1.MutatingWebhook) bool {
	for _, h := range hooks {
		if h.Name != CRDGateWebhook {
			continue
		}
		for _, r := range h.Rules {
			if slices.Contains(r.APIGroups, "apiextensions.k8s.io") && slices.Contains(r.Resources, "customresourcedefinitions") &&
				(slices.Contains(r.Operations, admissionv1.Update) || slices.Contains(r.Operations, admissionv1.OperationAll)) {
				return true
			}
		}
	}
	return false
}

// applications judges Applications that deploy CRDs.
func (j *judge) applications(apps []*argoapp.Application, gate CRDGate) []Application {
	out := make([]Application, 0, len(apps))
	for _, app := range apps {
		out = append(out, j.application(app, gate))
	}
	slices.SortFunc(out, func(a, b Application) int { return strings.Compare(a.Subject, b.Subject) })
	return out
}

// resourcesOf lists the CRDs and StorageVersionMigrations of the Application's
// resource tree, sorted.
func resourcesOf(app *argoapp.Application) (crds, migrations []string) {
	for _, r := range app.Status.Resources {
		switch {
		case [2]string{r.Group, r.Kind} == crdGroupKind:
			crds = append(crds, r.Name)
		case r.Group == svmGroup && r.Kind == "StorageVersionMigration":
			migrations = append(migrations, r.Name)
		}
	}
	slices.Sort(crds)
	slices.Sort(migrations)
	return crds, migrations
}

func (j *judge) application(app *argoapp.Application, gate CRDGate) Application {
	out := Application{Subject: app.Subject()}
	out.CRDs, out.Migrations = resourcesOf(app)
	by := j.appHooks(app, &out)
	for _, m := range out.Migrations {
		by = append(by, byBundledMigration+m)
	}
	if gate.Running {
		by = append(by, ByCRDGate)
	}
	out.Sync = Protection{Protected: len(by) > 0, By: by}
	out.Protected = out.Sync.Protected
	out.Findings = append(out.Findings, appFindings(out, checkCommand(app), gate)...)
	for i := range out.Findings {
		out.Findings[i].Subject = out.Subject
	}
	return out
}

// appHooks evaluates the registry's mechanisms of the Application's chart against its
// inline values and parameters: a migrating pre-upgrade hook runs as a PreSync hook;
// rollback hooks never run under Argo CD.
func (j *judge) appHooks(app *argoapp.Application, out *Application) []string {
	src, err := app.HelmSource()
	if err != nil {
		out.Notes = append(out.Notes, "upstream hooks are not evaluated: "+err.Error())
		return nil
	}
	helm := src.Helm
	out.Source = src.String()
	out.Chart, out.Version = src.Chart, src.TargetRevision
	if src.Chart != "" && app.Status.Sync.Revision != "" {
		out.Version = app.Status.Sync.Revision
	}
	entry, known := j.reg.Lookup(out.Chart)
	out.Known = known
	if !known {
		out.Notes = append(out.Notes, notRegistered(out.Chart))
		return nil
	}
	user, err := appValues(helm)
	if err != nil {
		out.Notes = append(out.Notes, "its inline values could not be read ("+err.Error()+"): chart defaults are assumed")
	}
	if helm != nil && len(helm.ValueFiles) > 0 {
		out.Findings = append(out.Findings, Finding{Check: CodeValuesFilesUnread, Severity: Info,
			Message: "helm.valueFiles are not read by the audit: keys set there are missed (check the Application with `" + checkCommand(app) + "`)"})
	}
	var hooks protectors
	off := map[registry.Hook]bool{registry.PreRollback: true, registry.PostRollback: true}
	for i := range entry.Mechanisms {
		m := &entry.Mechanisms[i]
		st := mechanismState(m, out.Version, user, nil, nil)
		out.Mechanisms = append(out.Mechanisms, st)
		hooks.add(m, st, off)
	}
	return hooks.upgrade
}

// appValues are the values the Application sets inline: valuesObject (else values),
// then its parameters as --set.
func appValues(h *argoapp.Helm) (map[string]any, error) {
	vals := map[string]any{}
	if h == nil {
		return vals, nil
	}
	raw := []byte(h.Values)
	if h.ValuesObject != nil && len(h.ValuesObject.Raw) > 0 {
		raw = h.ValuesObject.Raw
	}
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		return map[string]any{}, err
	}
	if vals == nil {
		vals = map[string]any{}
	}
	for _, p := range h.Parameters {
		parse := strvals.ParseInto
		if p.ForceString {
			parse = strvals.ParseIntoString
		}
		if err := parse(p.Name+"="+p.Value, vals); err != nil {
			return vals, fmt.Errorf("parameter %s: %w", p.Name, err)
		}
	}
	return vals, nil
}

// checkCommand is the check of the Application's Helm source that the findings name.
func checkCommand(app *argoapp.Application) string {
	return cmdline.CheckApplication{Namespace: app.Namespace, Name: app.Name}.String()
}

// appFindings are what weakens the Application's protection; check is its checkCommand.
func appFindings(a Application, check string, gate CRDGate) []Finding {
	var out []Finding
	if len(a.Migrations) > 0 && len(a.Sync.By) == len(a.Migrations) {
		out = append(out, Finding{Check: CodeBundledMigrationOnly, Severity: Warning,
			Message: "only bundled StorageVersionMigrations protect it: one with a fixed name runs once, and none helps the sync that drops " +
				"the old version (that CRD write is rejected first); run `" + check + "` before each sync, or install the CRD gate"})
	}
	if !a.Protected {
		msg := "nothing protects a sync that drops a stored version: Argo CD applies every CRD on each sync and retries the rejected write; " +
			"install upgradeguard's CRD gate (webhook.enabled in its chart) or check each sync with `" + check + "`"
		if gate.Installed && !gate.Running {
			msg = "the CRD gate is installed but its controller is not running (it fails open): " + msg
		}
		out = append(out, Finding{Check: CodeNoProtection, Severity: Danger, Message: msg})
	}
	return out
}
