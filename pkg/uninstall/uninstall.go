// Package uninstall owns predicting what `helm uninstall` does to a release before anyone
// runs it: which objects of the stored manifest it deletes, keeps or leaves alone, and the
// traps behind lost data (keep only on the live object, stripped ownership that protects
// only with Helm 4.3 or newer, a failed last revision, PVCs on Delete volumes, cascading
// Namespace and CRD deletes, credentials Secrets, foreign pods holding PVCs). It also takes
// the backup a restore needs (Backup: the data objects of the release's manifest, read as
// the prediction reads it) and judges the deletes of an upgrade or rollback (Prune) with
// the prediction's per-object inspector; they share the release loading, the manifest
// reading and that inspector, so they stay in one package. It reads the release through
// the Helm SDK's storage drivers, never prints, and never returns Secret data or release
// values.
package uninstall

import (
	"context"
	"errors"
	"fmt"

	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// DefaultHelmVersion is the Helm version a verdict assumes when none is given: the
// newest, which checks live ownership before deleting.
const DefaultHelmVersion = "4.3"

// Helm's ownership metadata (predict.HelmOwnershipProblem reads it).
const (
	releaseNameAnno     = predict.ReleaseNameAnnotation
	releaseNamespaceAnn = predict.ReleaseNamespaceAnnotation
)

// Clients are the API clients Check and Backup use.
type Clients = kubeclient.Clients

// NewClients builds the clients from one REST config.
func NewClients(cfg *rest.Config) (*Clients, error) { return kubeclient.New(cfg) }

// Options name the release and the Helm that will uninstall it.
type Options struct {
	Release   string
	Namespace string
	// Driver is the Helm storage driver: secret (default) or configmap.
	Driver helmrelease.Driver
	// HelmVersion is the version of Helm that will run the uninstall, such as 4.3 or
	// 3.18; empty means DefaultHelmVersion.
	HelmVersion string
	// Policies, when set, evaluates the cluster's admission policies for the deletion of
	// each CRD the uninstall deletes (livecluster.KubeCluster is one): a denial is the
	// CheckCRDDeletionDenied finding. Nil does not ask.
	Policies PolicyEvaluator
}

// PolicyEvaluator evaluates the cluster's admission policies for a CRD write, a nil next
// being the deletion of live (check.PolicyEvaluator's port).
type PolicyEvaluator interface {
	PolicyDenials(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error)
}

// VerifiesOwnership reports whether a Helm version checks the live object's ownership
// before deleting it (4.3.0 and newer, predict.Deployer.VerifiesOwnership), and returns
// the version it parsed.
func VerifiesOwnership(helmVersion string) (bool, string, error) {
	if helmVersion == "" {
		helmVersion = DefaultHelmVersion
	}
	d, err := predict.Helm(helmVersion)
	if err != nil {
		return false, "", err
	}
	return d.VerifiesOwnership(), d.Version, nil
}

// manifestObject is one document of a stored manifest: what Helm's own parser sees, plus
// the apiVersion and namespace.
type manifestObject struct {
	apiVersion, kind, namespace, name string
	policy                            string // helm.sh/resource-policy in the stored manifest ("" when absent)
	hasPolicy                         bool
}

// loaded is the release revision the uninstall works from.
type loaded struct {
	last     *release.Release
	deployed *release.Release
	driver   helmrelease.Driver
}

func load(ctx context.Context, c *Clients, o Options) (*loaded, error) {
	if o.Release == "" {
		return nil, errors.New("no release name given")
	}
	reader, err := helmrelease.NewReader(c.Kube, o.Namespace, o.Driver)
	if err != nil {
		return nil, err
	}
	hist, err := reader.History(ctx, o.Release)
	if err != nil {
		return nil, err
	}
	l := &loaded{last: hist[len(hist)-1], driver: reader.Driver()}
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Info != nil && hist[i].Info.Status == common.StatusDeployed {
			l.deployed = hist[i]
			break
		}
	}
	return l, nil
}

// parseManifest splits a stored manifest the way helm uninstall does, in its uninstall
// order. It goes through Helm's own releaseutil.SortManifests, not pkg/manifest: the
// prediction is of helm uninstall, so it takes that order and refuses what it refuses.
func parseManifest(text, releaseNamespace string, mapper meta.RESTMapper) ([]manifestObject, error) {
	_, files, err := releaseutil.SortManifests(releaseutil.SplitManifests(text), nil, releaseutil.UninstallOrder)
	if err != nil {
		return nil, fmt.Errorf("the stored manifest does not parse (helm uninstall would refuse it as a corrupted release record): %w", err)
	}
	out := make([]manifestObject, 0, len(files))
	for _, f := range files {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(f.Content), &head); err != nil {
			return nil, fmt.Errorf("stored manifest %s: %w", f.Name, err)
		}
		obj := manifestObject{apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, namespace: head.Metadata.Namespace}
		if f.Head.Metadata != nil {
			obj.policy, obj.hasPolicy = f.Head.Metadata.Annotations[kube.ResourcePolicyAnno]
		}
		out = append(out, obj)
	}
	for i := range out {
		out[i].namespace = namespaceFor(out[i], releaseNamespace, mapper)
	}
	return out, nil
}

// namespaceFor applies Helm's rule: a namespaced object without a namespace lives in the
// release namespace; a cluster-scoped one has none.
func namespaceFor(o manifestObject, releaseNamespace string, mapper meta.RESTMapper) string {
	m, err := mapping(o, mapper)
	if err != nil {
		return o.namespace
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return ""
	}
	if o.namespace == "" {
		return releaseNamespace
	}
	return o.namespace
}

func mapping(o manifestObject, mapper meta.RESTMapper) (*meta.RESTMapping, error) {
	gv, err := schema.ParseGroupVersion(o.apiVersion)
	if err != nil {
		return nil, err
	}
	return mapper.RESTMapping(schema.GroupKind{Group: gv.Group, Kind: o.kind}, gv.Version)
}

// annotations are the annotations of the stored manifest that Helm's rules read: the
// resource policy, when it is there.
func (o manifestObject) annotations() map[string]string {
	if !o.hasPolicy {
		return nil
	}
	return map[string]string{predict.KeepAnnotation: o.policy}
}

func (o manifestObject) subject() string {
	return manifest.SubjectOf(o.kind, o.namespace, o.name)
}

// Check predicts what `helm uninstall` of the release does, with the Helm version in
// opts, and reports the traps. Errors mean it could not run (release not found, API
// unreachable, forbidden); findings are data in the Report.
func Check(ctx context.Context, c *Clients, o Options) (*Report, error) {
	verifies, version, err := VerifiesOwnership(o.HelmVersion)
	if err != nil {
		return nil, err
	}
	deployer, _ := predict.Helm(version)
	l, err := load(ctx, c, o)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Release: o.Release, Namespace: o.Namespace, Driver: l.driver,
		Revision: l.last.Version, HelmVersion: version, VerifiesOwnership: verifies,
		Objects: []Object{}, Hooks: []string{}, Findings: []Finding{}, LeftBehind: []string{},
	}
	if l.last.Info != nil {
		rep.Status = l.last.Info.Status.String()
	}
	if l.last.Chart != nil && l.last.Chart.Metadata != nil {
		rep.Chart, rep.ChartVersion = l.last.Chart.Metadata.Name, l.last.Chart.Metadata.Version
	}
	if l.deployed != nil {
		rep.LastDeployedRevision = l.deployed.Version
	}
	if rep.Status == common.StatusUninstalled.String() {
		// A release uninstalled with --keep-history: helm uninstall only purges its history.
		rep.Safe = true
		return rep, nil
	}
	for _, h := range l.last.Hooks {
		for _, ev := range h.Events {
			if ev == release.HookPreDelete || ev == release.HookPostDelete {
				rep.Hooks = append(rep.Hooks, fmt.Sprintf("%s/%s (%s)", h.Kind, h.Name, ev))
			}
		}
	}
	objs, err := parseManifest(l.last.Manifest, o.Namespace, c.Mapper)
	if err != nil {
		return nil, fmt.Errorf("release %s revision %d: %w", o.Release, l.last.Version, err)
	}
	if rep.Status != common.StatusDeployed.String() {
		rep.NotDeployed = true
		if err := notDeployed(rep, l, objs, c.Mapper); err != nil {
			return nil, err
		}
	}
	return inspect(ctx, c, rep, deployer, predict.Uninstall, o.Release, o.Namespace, objs, o.Policies, func(in *inspector, obj manifestObject) (Object, error) {
		return in.decide(ctx, obj)
	})
}

// inspect decides what happens to each object the operation (op, run by deployer)
// deletes, looks behind them (volumes, credentials, cascades) and completes the report.
func inspect(ctx context.Context, c *Clients, rep *Report, deployer predict.Deployer, op predict.Operation, release, namespace string, objs []manifestObject,
	policies PolicyEvaluator, decide func(*inspector, manifestObject) (Object, error)) (*Report, error) {
	in := &inspector{c: c, rep: rep, deployer: deployer, op: op, release: release, namespace: namespace, listed: map[string]bool{}, pods: map[string][]podRef{},
		policies: policies}
	for _, obj := range objs {
		in.listed[obj.subject()] = true
	}
	for _, obj := range objs {
		res, err := decide(in, obj)
		if err != nil {
			return nil, err
		}
		rep.Objects = append(rep.Objects, res)
	}
	if err := in.details(ctx); err != nil {
		return nil, err
	}
	rep.Safe = len(rep.Findings) == 0
	return rep, nil
}

// notDeployed records the finding for a last revision that is not deployed, and the
// objects of the deployed revision its manifest no longer lists.
func notDeployed(rep *Report, l *loaded, objs []manifestObject, mapper meta.RESTMapper) error {
	msg := fmt.Sprintf("the last revision %d is %s: helm uninstall deletes what ITS stored manifest lists, not the deployed revision's", l.last.Version, rep.Status)
	if l.deployed != nil {
		prev, err := parseManifest(l.deployed.Manifest, rep.Namespace, mapper)
		if err != nil {
			return fmt.Errorf("release %s revision %d: %w", rep.Release, l.deployed.Version, err)
		}
		listed := map[string]bool{}
		for _, o := range objs {
			listed[o.subject()] = true
		}
		for _, p := range prev {
			if !listed[p.subject()] {
				rep.LeftBehind = append(rep.LeftBehind, p.subject())
			}
		}
		msg += fmt.Sprintf(" (revision %d)", l.deployed.Version)
		if len(rep.LeftBehind) > 0 {
			msg += fmt.Sprintf("; %d object(s) only revision %d lists are left behind", len(rep.LeftBehind), l.deployed.Version)
		}
	}
	rep.Findings = append(rep.Findings, Finding{
		Check: CheckNotDeployed, Subject: fmt.Sprintf("release/%s/%s", rep.Namespace, rep.Release), Severity: finding.Danger, Message: msg,
		Remediation: "review the delete list below (it is the failed revision's); to uninstall from a known state, first roll back (`" + cmdline.HelmRollback{Release: rep.Release, Namespace: rep.Namespace}.String() + "`) or repair the upgrade, then re-run this check",
	})
	return nil
}

// decide applies Helm's uninstall rules (predict.Deployer.Fate) to one object: the
// stored resource policy, then (Helm 4.3 and newer) the live ownership.
func (in *inspector) decide(ctx context.Context, mo manifestObject) (Object, error) {
	obj := Object{Subject: mo.subject(), APIVersion: mo.apiVersion, Kind: mo.kind, Namespace: mo.namespace, Name: mo.name}
	m, mapErr := mapping(mo, in.c.Mapper)
	var live *metav1.PartialObjectMetadata
	var liveErr error
	if mapErr == nil {
		var ri metadata.ResourceInterface = in.c.Metadata.Resource(m.Resource)
		if mo.namespace != "" {
			ri = in.c.Metadata.Resource(m.Resource).Namespace(mo.namespace)
		}
		live, liveErr = ri.Get(ctx, mo.name, metav1.GetOptions{})
		if apierrors.IsNotFound(liveErr) {
			live, liveErr = nil, nil
		}
		if liveErr != nil {
			live = nil
		}
	}
	leaving := predict.Leaving{Manifest: mo.annotations(), Exists: live != nil}
	if live != nil {
		obj.Live = true
		obj.LiveKeep = predict.KeepPolicy(live.Annotations[predict.KeepAnnotation])
		owned := ownedBy(live, in.release, in.namespace)
		obj.Owned = &owned
		leaving.Live, leaving.Owned = live.Annotations, owned
	}
	fate := in.deployer.Fate(predict.Uninstall, leaving)

	// The stored manifest's resource policy decides first (filterManifestsToKeep): Helm
	// never reads these objects.
	switch fate {
	case predict.FateKeptManifest:
		obj.Action, obj.Reason = Keep, "helm.sh/resource-policy: keep is in the stored manifest"
		return obj, nil
	case predict.FateUntouched:
		obj.Action, obj.Reason = Untouched, fmt.Sprintf("helm.sh/resource-policy is %q in the stored manifest: Helm neither deletes it nor reports it as kept", mo.policy)
		return obj, nil
	}
	if mapErr != nil {
		obj.Action, obj.Reason = Absent, "its kind is not served by the API server, so no such object exists: "+mapErr.Error()
		in.find(CheckUnknownKind, obj.Subject, "the API server no longer serves "+mo.apiVersion+" "+mo.kind+": a Helm whose discovery is fresh fails to build its delete list and the uninstall deletes nothing (with discovery cached before the kind went away, ~/.kube/cache, it goes ahead)",
			"install the CRD that serves "+mo.kind+" again before the uninstall (and delete it afterwards if it should go), or accept retrying the uninstall")
		return obj, nil
	}
	if liveErr != nil {
		if in.rep.VerifiesOwnership && apierrors.IsForbidden(liveErr) {
			// Helm 4.3 meets the same error (when it runs with the same rights) and skips it.
			obj.Action, obj.Reason = SkipUnverifiable, "its ownership cannot be read ("+liveErr.Error()+"): Helm "+in.rep.HelmVersion+" skips it"
			in.find(CheckUnverifiable, obj.Subject, "the live object cannot be read, so Helm "+in.rep.HelmVersion+" will not delete it and it stays on the cluster",
				"run the uninstall (and this check) with credentials that can read it, or delete it yourself afterwards if it should go")
			return obj, nil
		}
		return obj, fmt.Errorf("%s: read the live object: %w", obj.Subject, liveErr)
	}
	switch {
	case fate == predict.FateAbsent:
		obj.Action, obj.Reason = Absent, "not on the cluster: nothing to delete"
		return obj, nil
	case fate == predict.FateNotOwned:
		obj.Action, obj.Reason = SkipNotOwned, fmt.Sprintf("its live ownership metadata does not name release %s/%s (%s): Helm %s skips it; Helm before 4.3 would delete it; a new release that renders it must adopt it (%s)",
			in.namespace, in.release, ownershipProblem(live, in.release, in.namespace), in.rep.HelmVersion, cmdline.HelmInstall{TakeOwnership: true})
		return obj, nil
	case !*obj.Owned:
		problem := ownershipProblem(live, in.release, in.namespace)
		obj.Action, obj.Reason = Delete, fmt.Sprintf("listed in the stored manifest; Helm %s does not look at the live ownership metadata (%s)", in.rep.HelmVersion, problem)
		in.find(CheckOwnershipStripped, obj.Subject,
			fmt.Sprintf("its live Helm ownership metadata was changed (%s), which protects it only with Helm 4.3 or newer: Helm %s deletes it", problem, in.rep.HelmVersion),
			remedy(in.release, in.namespace, obj.Kind)+"; or run the uninstall with Helm 4.3 or newer, which skips it")
	default:
		obj.Action, obj.Reason = Delete, "listed in the stored manifest without helm.sh/resource-policy: keep"
	}
	if obj.LiveKeep {
		obj.Reason = "helm.sh/resource-policy: keep is only on the live object, not in the stored manifest: Helm ignores it and deletes the object"
		in.find(CheckLiveOnlyKeep, obj.Subject, "keep is set on the live object only; helm uninstall reads the stored manifest and deletes it", remedy(in.release, in.namespace, obj.Kind))
	}
	return obj, nil
}

// remedy is the chart-migration runbook's pair of remediations for an object the
// uninstall would delete: Option A (preferred) puts keep into the stored manifest with an
// upgrade; Option C (fallback) saves the object and brings it back after the uninstall.
func remedy(rel, ns, kind string) string { return optionA(rel, ns) + "; or " + optionC(rel, ns, kind) }

// backupCommand is the command that takes Option C's backup of the release.
func backupCommand(rel, ns string) string {
	return cmdline.UninstallBackup{Release: rel, Namespace: ns}.String()
}

func optionA(rel, ns string) string {
	return "Option A: " + predict.KeepInManifest(rel, ns)
}

func optionC(rel, ns, kind string) string {
	switch kind {
	case "PersistentVolumeClaim":
		return "Option C: make its PV Retain, take a backup (`" + backupCommand(rel, ns) + "`) and bind a new claim to the same PV after the uninstall"
	case "Secret":
		return "Option C: take a backup (`" + backupCommand(rel, ns) + "`) and restore it, under the name the new release renders, before the re-install"
	default:
		return "Option C: save it (`" + cmdline.Get{Output: "yaml"}.String() + "`) and re-create it after the uninstall"
	}
}

// ownedBy is Helm's checkOwnership: the managed-by label and both release annotations
// must name this release.
func ownedBy(obj *metav1.PartialObjectMetadata, rel, ns string) bool {
	return ownershipProblem(obj, rel, ns) == ""
}

func ownershipProblem(obj *metav1.PartialObjectMetadata, rel, ns string) string {
	return predict.HelmOwnershipProblem(obj.Labels, obj.Annotations, rel, ns)
}
