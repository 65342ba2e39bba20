// Package chartmigrate owns moving a Helm release from one chart to another while keeping
// its data: the volumes behind its PersistentVolumeClaims and its credentials Secrets.
// Helm cannot do this by itself: an uninstall deletes what the stored manifest lists, and
// the new chart names its claims and Secrets differently. This is the seed runbook's
// Option C carried out by the tool, step by step, with every step recorded so that a
// re-run after a failure resumes where it stopped.
//
// Plan reads the old release, the new chart's rendered objects, the live claims and
// volumes and the uninstall pre-flight, and says which old claim becomes which new one,
// which Secret is restored under which name, what the uninstall deletes and what blocks.
// Execute carries the plan out (see Steps). Neither prints; Execute reports progress
// through a callback.
package chartmigrate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Finding is something the plan found, with what to do about it. A blocking finding
// stops Execute unless the caller overrides it.
type Finding = finding.Finding

// Finding check IDs of the migration itself.
const (
	CheckPVCUnmapped       = "pvc-unmapped"
	CheckPVCUnbound        = "pvc-unbound"
	CheckStorageClass      = "storage-class-mismatch"
	CheckSizeTooLarge      = "size-too-large"
	CheckSizeSmaller       = "size-smaller"
	CheckAccessModes       = "access-modes-mismatch"
	CheckNotRetain         = "pv-not-retain"
	CheckSecretUnmapped    = "secret-unmapped"
	CheckKeptRenamed       = "kept-under-old-name"
	CheckNewReleaseInUse   = "new-release-exists"
	CheckNewPVCUnprovision = "new-pvc-fresh"
)

// The options of a migration (Request, PlanInput) that a finding's Input names: the
// front end words each as its own flag.
const (
	OptionNewRelease = "chartmigrate.NewRelease"
	OptionMapPVC     = "chartmigrate.MapPVC"
	OptionMapSecret  = "chartmigrate.MapSecret"
)

// Volume is one old claim moving to a new one, with the identity of the volume behind
// it: the PV's name and uid and what it points at (CSI handle, hostPath, local path,
// NFS export). Execute proves the new claim is bound to this same volume.
type Volume struct {
	OldPVC         string   `json:"oldPVC"`
	NewPVC         string   `json:"newPVC"`
	PV             string   `json:"pv"`
	PVUID          string   `json:"pvUID"`
	Source         string   `json:"source"`
	ReclaimPolicy  string   `json:"reclaimPolicy"`
	StorageClass   string   `json:"storageClass"`
	Capacity       string   `json:"capacity"`
	NewClass       string   `json:"newStorageClass"`
	NewSize        string   `json:"newSize"`
	NewAccessModes []string `json:"newAccessModes"`
	// Kept: the uninstall keeps the old claim (keep in the stored manifest) and the new
	// one has the same name, so the claim is re-stamped for the new release instead.
	Kept bool `json:"kept,omitempty"`
	// OldStatefulSet and NewStatefulSet say which StatefulSet template and ordinal the
	// claim belongs to, when a StatefulSet's controller makes it rather than the chart.
	OldStatefulSet *STSRef `json:"oldStatefulSet,omitempty"`
	NewStatefulSet *STSRef `json:"newStatefulSet,omitempty"`
	// OldPVCUID is the old StatefulSet claim's uid: the migration deletes that claim
	// itself (DeleteOld), with the uid as a precondition, since helm uninstall leaves it.
	OldPVCUID string `json:"oldPVCUID,omitempty"`
	DeleteOld bool   `json:"deleteOld,omitempty"`
	// NewObject is the new chart's rendered claim (or the claim its StatefulSet's
	// controller would make), the base of the pre-created one.
	NewObject map[string]any `json:"-"`
}

// STSRef names a StatefulSet's volumeClaimTemplate and ordinal.
type STSRef struct {
	Name     string `json:"name"`
	Template string `json:"template"`
	Ordinal  int    `json:"ordinal"`
}

func (r *STSRef) String() string {
	return fmt.Sprintf("StatefulSet %s template %s ordinal %d", r.Name, r.Template, r.Ordinal)
}

// Secret is one old Secret restored under the name the new chart renders.
type Secret struct {
	Old  string   `json:"old"`
	New  string   `json:"new"`
	Type string   `json:"type"`
	Keys []string `json:"keys"`
	Kept bool     `json:"kept,omitempty"`
}

// Plan is what a migration will do. It holds no Secret data and no values.
type Plan struct {
	Release         string `json:"release"`
	Namespace       string `json:"namespace"`
	Revision        int    `json:"revision"`
	OldChart        string `json:"oldChart"`
	NewRelease      string `json:"newRelease"`
	NewChart        string `json:"newChart"`
	NewChartVersion string `json:"newChartVersion"`

	Volumes []Volume `json:"volumes"`
	Secrets []Secret `json:"secrets"`
	// FreshPVCs are claims of the new chart with no old counterpart: they get new volumes.
	FreshPVCs []string `json:"freshPVCs"`
	// ClaimDeletes are the StatefulSet claims the migration deletes itself after the
	// uninstall (Kind/namespace/name): helm uninstall leaves them. No other claim is
	// ever deleted by the migration.
	ClaimDeletes []string `json:"claimDeletes"`
	// Deletes and Kept are what the uninstall deletes and keeps (Kind/namespace/name).
	Deletes []string `json:"deletes"`
	Kept    []string `json:"kept"`

	Findings []Finding `json:"findings"`
	Steps    []string  `json:"steps"`
	// Safe is true when no finding blocks.
	Safe bool `json:"safe"`
}

// Blocking returns the blocking findings.
func (p *Plan) Blocking() []Finding {
	var out []Finding
	for _, f := range p.Findings {
		if f.Blocks() {
			out = append(out, f)
		}
	}
	return out
}

// Preflight is what the uninstall pre-flight (pkg/uninstall Check) says about the old
// release, as the plan needs it.
type Preflight struct {
	Deletes  []string
	Kept     []string
	Findings []Finding
}

// PlanInput is what Plan works from.
type PlanInput struct {
	// Old is the old release's last revision: its stored manifest is what the uninstall
	// deletes.
	Old *release.Release
	// NewRelease is the new release's name; NewManifest the new chart rendered for it.
	NewRelease      string
	NewChart        string
	NewChartVersion string
	NewManifest     string
	Namespace       string
	Preflight       Preflight
	// MapPVC and MapSecret pair old names with new ones where the plan cannot tell.
	MapPVC    map[string]string
	MapSecret map[string]string
	// NewReleaseExists says that a release with the new name is already installed.
	NewReleaseExists bool
}

// MakePlan builds the migration plan. It only reads.
func MakePlan(ctx context.Context, kube kubernetes.Interface, in PlanInput) (*Plan, error) {
	pl, err := newPlanner(kube, in)
	if err != nil {
		return nil, err
	}
	if err := pl.volumes(ctx); err != nil {
		return nil, err
	}
	if err := pl.secrets(ctx); err != nil {
		return nil, err
	}
	p := pl.p
	p.Findings = append(p.Findings, in.Preflight.Findings...)
	p.Safe = len(p.Blocking()) == 0
	p.Steps = steps(p)
	return p, nil
}

// planner builds one Plan, phase by phase: the manifests, the volumes, the Secrets.
type planner struct {
	kube             kubernetes.Interface
	in               PlanInput
	p                *Plan
	oldObjs, newObjs map[string]map[string]*unstructured.Unstructured
}

// claims are every claim on one side, by name (rendered ones and StatefulSet ones), and
// the StatefulSet claims among them.
type claims struct {
	objs map[string]*unstructured.Unstructured
	sts  map[string]stsClaim
	list []stsClaim
}

func newPlanner(kube kubernetes.Interface, in PlanInput) (*planner, error) {
	p := &Plan{Release: in.Old.Name, Namespace: in.Namespace, Revision: in.Old.Version, NewRelease: in.NewRelease,
		NewChart: in.NewChart, NewChartVersion: in.NewChartVersion,
		Volumes: []Volume{}, Secrets: []Secret{}, FreshPVCs: []string{}, ClaimDeletes: []string{},
		Deletes: orEmpty(in.Preflight.Deletes), Kept: orEmpty(in.Preflight.Kept), Findings: []Finding{}}
	if in.Old.Chart != nil && in.Old.Chart.Metadata != nil {
		p.OldChart = in.Old.Chart.Metadata.Name + "-" + in.Old.Chart.Metadata.Version
	}
	pl := &planner{kube: kube, in: in, p: p}
	var err error
	if pl.oldObjs, err = byKind(in.Old.Manifest, in.Namespace); err != nil {
		return nil, fmt.Errorf("release %s revision %d: %w", in.Old.Name, in.Old.Version, err)
	}
	if pl.newObjs, err = byKind(in.NewManifest, in.Namespace); err != nil {
		return nil, fmt.Errorf("chart %s: %w", in.NewChart, err)
	}
	if in.NewReleaseExists {
		p.Findings = append(p.Findings, Finding{Check: CheckNewReleaseInUse, Subject: "release " + in.NewRelease, Severity: finding.Blocking,
			Message:     "a release named " + in.NewRelease + " is already installed in namespace " + in.Namespace,
			Remediation: "choose another name for the new release", Input: &finding.Input{Option: OptionNewRelease, Value: "NAME"}})
	}
	return pl, nil
}

// kept says whether the uninstall keeps the object.
func (pl *planner) kept(kind, name string) bool {
	return slices.Contains(pl.p.Kept, pl.subject(kind, name))
}

// subject names an object of the release namespace as reports do.
func (pl *planner) subject(kind, name string) string {
	return manifest.SubjectOf(kind, pl.in.Namespace, name)
}

// sides gathers the claims of the old release and of the new chart.
func (pl *planner) sides(ctx context.Context) (old, new claims, liveSTS map[string]*appsv1.StatefulSet, err error) {
	oldSTS, liveSTS, stsFindings, err := oldSTSClaims(ctx, pl.kube, pl.oldObjs["StatefulSet"], pl.in.Namespace)
	if err != nil {
		return old, new, nil, err
	}
	newSTS, err := newSTSClaims(pl.newObjs["StatefulSet"], pl.in.Namespace)
	if err != nil {
		return old, new, nil, fmt.Errorf("chart %s: %w", pl.in.NewChart, err)
	}
	pl.p.Findings = append(pl.p.Findings, stsFindings...)
	old = claims{objs: maps.Clone(pl.oldObjs["PersistentVolumeClaim"]), sts: map[string]stsClaim{}, list: oldSTS}
	new = claims{objs: maps.Clone(pl.newObjs["PersistentVolumeClaim"]), sts: map[string]stsClaim{}, list: newSTS}
	for _, c := range oldSTS {
		old.add(c, &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": c.name}}})
	}
	for _, c := range newSTS {
		new.add(c, c.obj)
	}
	return old, new, liveSTS, nil
}

func (c *claims) add(sc stsClaim, obj *unstructured.Unstructured) {
	if c.objs == nil {
		c.objs = map[string]*unstructured.Unstructured{}
	}
	c.objs[sc.name], c.sts[sc.name] = obj, sc
}

// volumes pairs the claims and plans each pair's volume.
func (pl *planner) volumes(ctx context.Context) error {
	old, new, liveSTS, err := pl.sides(ctx)
	if err != nil {
		return err
	}
	pairs, unmapped, fresh := pairClaims(names(old.objs), names(new.objs), old.list, new.list, pl.in.Old.Name, pl.in.NewRelease, pl.in.MapPVC)
	pl.unpaired(unmapped, fresh)
	leftBy := map[string][]string{}
	for _, pr := range pairs {
		v, findings, err := volume(ctx, pl.kube, pl.in.Namespace, old.objs[pr[0]], new.objs[pr[1]])
		if err != nil {
			return err
		}
		if c, ok := new.sts[pr[1]]; ok {
			v.NewStatefulSet = &STSRef{Name: c.sts, Template: c.template, Ordinal: c.ordinal}
		}
		if c, ok := old.sts[pr[0]]; ok {
			findings = append(findings, pl.oldSTSClaim(&v, c, liveSTS[c.sts], leftBy)...)
		}
		findings = append(findings, pl.keptClaim(&v, findings)...)
		pl.p.Volumes = append(pl.p.Volumes, v)
		pl.p.Findings = append(pl.p.Findings, findings...)
	}
	pl.claimsLeft(leftBy)
	return nil
}

// unpaired are the new claims that get a new volume and the old ones nothing takes.
func (pl *planner) unpaired(unmapped, fresh []string) {
	pl.p.FreshPVCs = fresh
	for _, n := range fresh {
		pl.p.Findings = append(pl.p.Findings, Finding{Check: CheckNewPVCUnprovision, Severity: finding.Info, Subject: pl.subject("PersistentVolumeClaim", n),
			Message: "the new chart's claim has no old counterpart: it gets a new, empty volume"})
	}
	for _, n := range unmapped {
		pl.p.Findings = append(pl.p.Findings, Finding{Check: CheckPVCUnmapped, Subject: pl.subject("PersistentVolumeClaim", n), Severity: finding.Blocking,
			Message:     "no claim of the new chart takes this claim's volume: its data would stay on a retained PV that nothing uses",
			Remediation: "pair it with a claim the new chart renders, or one its StatefulSets will use", Input: &finding.Input{Option: OptionMapPVC, Value: n + "=NEW-CLAIM"}})
	}
}

// oldSTSClaim decides what becomes of an old StatefulSet's claim: kept as it is, blocked
// by a kept StatefulSet, or deleted by the migration after the uninstall.
func (pl *planner) oldSTSClaim(v *Volume, c stsClaim, live *appsv1.StatefulSet, leftBy map[string][]string) []Finding {
	v.OldStatefulSet = &STSRef{Name: c.sts, Template: c.template, Ordinal: c.ordinal}
	v.OldPVCUID = c.uid
	gcDeletes := live != nil && live.Spec.PersistentVolumeClaimRetentionPolicy != nil &&
		live.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	switch {
	case v.OldPVC == v.NewPVC && !gcDeletes:
		// The claim stays where it is and the new StatefulSet (or the new chart's
		// claim of that name) takes it as it is.
		v.Kept = true
	case pl.kept("StatefulSet", c.sts):
		return []Finding{{Check: CheckSTSKept, Subject: pl.subject("StatefulSet", c.sts), Severity: finding.Blocking,
			Message:     "the uninstall keeps this StatefulSet, whose pods hold " + v.OldPVC + " and whose controller would make it again: the volume cannot move to " + v.NewPVC,
			Remediation: "delete the StatefulSet yourself (" + cmdline.Delete{Resource: "statefulset", Name: c.sts, Namespace: pl.in.Namespace}.String() + ") and plan again"}}
	default:
		v.DeleteOld = true
		pl.p.ClaimDeletes = append(pl.p.ClaimDeletes, pl.subject("PersistentVolumeClaim", v.OldPVC))
		leftBy[c.sts] = append(leftBy[c.sts], v.OldPVC)
	}
	return nil
}

// keptClaim handles a claim the uninstall keeps: under the same name it carries over as
// it is (its volume's policy does not matter); under another name it blocks.
func (pl *planner) keptClaim(v *Volume, findings []Finding) []Finding {
	v.Kept = v.Kept || pl.kept("PersistentVolumeClaim", v.OldPVC) && v.OldPVC == v.NewPVC
	if v.Kept {
		// A kept claim is never deleted, so execute leaves its volume's policy alone.
		for i := range findings {
			if findings[i].Check == CheckNotRetain && findings[i].Subject == manifest.SubjectOf("PersistentVolume", "", v.PV) {
				findings[i].Message = "reclaimPolicy is " + v.ReclaimPolicy + "; the claim " + v.OldPVC + " is kept as it is, so the migration does not put the data at risk"
				findings[i].Remediation = "none needed for the migration; Retain protects against a later deletion of the claim"
			}
		}
	}
	if !pl.kept("PersistentVolumeClaim", v.OldPVC) || v.OldPVC == v.NewPVC {
		return nil
	}
	return []Finding{{Check: CheckKeptRenamed, Subject: pl.subject("PersistentVolumeClaim", v.OldPVC), Severity: finding.Blocking,
		Message:     "the uninstall keeps this claim, so it stays bound to " + v.PV + " and the new claim " + v.NewPVC + " cannot take the volume",
		Remediation: "delete the kept claim after the uninstall yourself, or, if the new chart can use the name " + v.OldPVC + ", pair the claim with itself",
		Input:       &finding.Input{Option: OptionMapPVC, Value: v.OldPVC + "=" + v.OldPVC}}}
}

// claimsLeft notes, per StatefulSet, the claims helm uninstall leaves and the migration
// deletes.
func (pl *planner) claimsLeft(leftBy map[string][]string) {
	for _, sts := range names(leftBy) {
		pl.p.Findings = append(pl.p.Findings, Finding{Check: CheckSTSClaimsLeft, Severity: finding.Info, Subject: pl.subject("StatefulSet", sts),
			Message: "helm uninstall does not delete the claims of this StatefulSet's volumeClaimTemplates (they are not in the stored manifest): " +
				"the migration deletes " + strings.Join(leftBy[sts], ", ") + " itself, by uid, once the StatefulSet is gone and their volumes are Retain"})
	}
}

// secrets pairs the credentials Secrets and reads each old one's type and keys (never
// its data).
func (pl *planner) secrets(ctx context.Context) error {
	in := pl.in
	oldSec, newSec := credentials(pl.oldObjs["Secret"]), credentials(pl.newObjs["Secret"])
	secPairs, unmappedSec, _ := pair(names(oldSec), names(newSec), in.Old.Name, in.NewRelease, in.MapSecret)
	for _, n := range unmappedSec {
		pl.p.Findings = append(pl.p.Findings, Finding{Check: CheckSecretUnmapped, Severity: finding.Info, Subject: pl.subject("Secret", n),
			Message:     "no Secret of the new chart takes this Secret's data: it is in the backup but not restored",
			Remediation: "restore it under the name the new chart reads", Input: &finding.Input{Option: OptionMapSecret, Value: n + "=NEW-NAME"}})
	}
	for _, pr := range secPairs {
		s := Secret{Old: pr[0], New: pr[1], Kept: pl.kept("Secret", pr[0]) && pr[0] == pr[1]}
		live, err := pl.kube.CoreV1().Secrets(in.Namespace).Get(ctx, pr[0], metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return &MissingSecretError{Namespace: in.Namespace, Name: pr[0]}
		case err != nil:
			return fmt.Errorf("Secret %s/%s: %w", in.Namespace, pr[0], err)
		}
		s.Type = string(live.Type)
		s.Keys = slices.Sorted(maps.Keys(live.Data))
		pl.p.Secrets = append(pl.p.Secrets, s)
	}
	return nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// byKind splits a manifest into kind -> name -> object, namespaced to ns.
func byKind(text, ns string) (map[string]map[string]*unstructured.Unstructured, error) {
	objs, err := manifest.All(text)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetNamespace() != ns {
			continue
		}
		if out[o.GetKind()] == nil {
			out[o.GetKind()] = map[string]*unstructured.Unstructured{}
		}
		out[o.GetKind()][o.GetName()] = o
	}
	return out, nil
}

// credentials keeps the Secrets a re-install needs: not service-account tokens, not
// Helm's own storage, not TLS material a controller re-issues.
func credentials(m map[string]*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for n, o := range m {
		t, _, _ := unstructured.NestedString(o.Object, "type")
		if t == string(corev1.SecretTypeServiceAccountToken) || t == "helm.sh/release.v1" {
			continue
		}
		out[n] = o
	}
	return out
}

func names[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// pair matches old names with new ones: explicit mappings first, then equal names, then
// equal names once each release's name is taken out ("olddb-data" and "newdb-data"),
// then the one old name left with the one new name left. It returns the pairs, the old
// names left over and the new names left over.
func pair(old, new []string, oldRel, newRel string, explicit map[string]string) (pairs [][2]string, oldLeft, newLeft []string) {
	used := map[string]bool{}
	taken := map[string]bool{}
	add := func(o, n string) {
		pairs = append(pairs, [2]string{o, n})
		used[o], taken[n] = true, true
	}
	for _, o := range old {
		if n, ok := explicit[o]; ok && slices.Contains(new, n) {
			add(o, n)
		}
	}
	strip := func(name, rel string) string {
		return strings.Trim(strings.Replace(name, rel, "", 1), "-.")
	}
	for _, rule := range []func(o, n string) bool{
		func(o, n string) bool { return o == n },
		func(o, n string) bool { return strip(o, oldRel) == strip(n, newRel) },
	} {
		for _, o := range old {
			if used[o] {
				continue
			}
			for _, n := range new {
				if !taken[n] && rule(o, n) {
					add(o, n)
					break
				}
			}
		}
	}
	for _, o := range old {
		if !used[o] {
			oldLeft = append(oldLeft, o)
		}
	}
	for _, n := range new {
		if !taken[n] {
			newLeft = append(newLeft, n)
		}
	}
	if len(oldLeft) == 1 && len(newLeft) == 1 {
		add(oldLeft[0], newLeft[0])
		return pairs, nil, nil
	}
	return pairs, oldLeft, newLeft
}

// volume reads the old claim's PV and compares the new claim with it.
func volume(ctx context.Context, kube kubernetes.Interface, ns string, oldObj, newObj *unstructured.Unstructured) (Volume, []Finding, error) {
	var newPVC corev1.PersistentVolumeClaim
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(newObj.Object, &newPVC); err != nil {
		return Volume{}, nil, fmt.Errorf("the new chart's PersistentVolumeClaim %s: %w", newObj.GetName(), err)
	}
	v := Volume{OldPVC: oldObj.GetName(), NewPVC: newObj.GetName(), NewObject: newObj.Object}
	subject := manifest.SubjectOf("PersistentVolumeClaim", ns, v.OldPVC)
	if newPVC.Spec.StorageClassName != nil {
		v.NewClass = *newPVC.Spec.StorageClassName
	}
	req := newPVC.Spec.Resources.Requests[corev1.ResourceStorage]
	v.NewSize = req.String()
	for _, m := range newPVC.Spec.AccessModes {
		v.NewAccessModes = append(v.NewAccessModes, string(m))
	}
	live, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, v.OldPVC, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return v, []Finding{{Check: CheckPVCUnbound, Subject: subject, Severity: finding.Blocking,
			Message: "the old release's claim is not on the cluster: there is no volume to carry over", Remediation: "restore the claim, or drop it from the claim pairing",
			Input: &finding.Input{Option: OptionMapPVC}}}, nil
	case err != nil:
		return v, nil, fmt.Errorf("%s: %w", subject, err)
	}
	if live.Status.Phase != corev1.ClaimBound || live.Spec.VolumeName == "" {
		return v, []Finding{{Check: CheckPVCUnbound, Subject: subject, Severity: finding.Blocking,
			Message: fmt.Sprintf("the claim is %s, not Bound: there is no volume to carry over", live.Status.Phase), Remediation: "wait until it is Bound"}}, nil
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, live.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return v, nil, fmt.Errorf("PersistentVolume %s of %s: %w", live.Spec.VolumeName, subject, err)
	}
	v.PV, v.PVUID, v.Source = pv.Name, string(pv.UID), VolumeSource(pv)
	v.ReclaimPolicy, v.StorageClass = string(pv.Spec.PersistentVolumeReclaimPolicy), pv.Spec.StorageClassName
	capacity := pv.Spec.Capacity[corev1.ResourceStorage]
	v.Capacity = capacity.String()

	var fs []Finding
	if v.ReclaimPolicy != string(corev1.PersistentVolumeReclaimRetain) {
		fs = append(fs, Finding{Check: CheckNotRetain, Severity: finding.Info, Subject: manifest.SubjectOf("PersistentVolume", "", v.PV),
			Message:     "reclaimPolicy is " + v.ReclaimPolicy + ": the uninstall would delete the data",
			Remediation: "execute patches it to Retain first, after confirmation"})
	}
	if newPVC.Spec.StorageClassName != nil && v.NewClass != v.StorageClass {
		fs = append(fs, Finding{Check: CheckStorageClass, Subject: subject, Severity: finding.Blocking,
			Message:     fmt.Sprintf("the new claim %s asks for storageClassName %q, the volume %s has %q: it would not bind", v.NewPVC, v.NewClass, v.PV, v.StorageClass),
			Remediation: "set the new chart's storage class to " + v.StorageClass + " in its values"})
	}
	if newPVC.Spec.StorageClassName == nil {
		// The claim takes the cluster's default class, if any, at creation; the
		// pre-created claim names the volume's class so it binds.
		v.NewClass = v.StorageClass
	}
	switch c := req.Cmp(capacity); {
	case req.IsZero():
	case c > 0:
		fs = append(fs, Finding{Check: CheckSizeTooLarge, Subject: subject, Severity: finding.Blocking,
			Message:     fmt.Sprintf("the new claim %s requests %s, more than the volume's %s: it would not bind", v.NewPVC, v.NewSize, v.Capacity),
			Remediation: "set the new chart's size to " + v.Capacity + " in its values"})
	case c < 0:
		fs = append(fs, Finding{Check: CheckSizeSmaller, Severity: finding.Info, Subject: subject,
			Message: fmt.Sprintf("the new claim %s requests %s; the volume holds %s and keeps it", v.NewPVC, v.NewSize, v.Capacity)})
	}
	for _, m := range newPVC.Spec.AccessModes {
		if !slices.Contains(pv.Spec.AccessModes, m) {
			fs = append(fs, Finding{Check: CheckAccessModes, Subject: subject, Severity: finding.Blocking,
				Message:     fmt.Sprintf("the new claim %s asks for access mode %s, which the volume %s does not offer", v.NewPVC, m, v.PV),
				Remediation: "set the new chart's access modes to the volume's in its values"})
		}
	}
	return v, fs, nil
}

// VolumeSource names what a PV points at: the storage that holds the data.
func VolumeSource(pv *corev1.PersistentVolume) string {
	s := pv.Spec.PersistentVolumeSource
	switch {
	case s.CSI != nil:
		return "csi:" + s.CSI.Driver + ":" + s.CSI.VolumeHandle
	case s.HostPath != nil:
		return "hostPath:" + s.HostPath.Path
	case s.Local != nil:
		return "local:" + s.Local.Path
	case s.NFS != nil:
		return "nfs:" + s.NFS.Server + ":" + s.NFS.Path
	}
	return "unknown"
}

// Step names, in order.
const (
	StepBackup    = "backup"
	StepRetain    = "retain"
	StepUninstall = "uninstall"
	StepClaimRefs = "claim-refs"
	StepPVCs      = "pre-create-pvcs"
	StepSecrets   = "restore-secrets"
	StepInstall   = "install"
	StepVerify    = "verify"
)

// Steps are the steps of Execute, in order.
var Steps = []string{StepBackup, StepRetain, StepUninstall, StepClaimRefs, StepPVCs, StepSecrets, StepInstall, StepVerify}

func steps(p *Plan) []string {
	var retain, claims, secrets []string
	for _, v := range p.Volumes {
		if v.PV == "" {
			continue
		}
		if v.ReclaimPolicy != string(corev1.PersistentVolumeReclaimRetain) {
			retain = append(retain, v.PV)
		}
		switch {
		case v.Kept && v.NewStatefulSet != nil:
			claims = append(claims, fmt.Sprintf("leave the claim %s as it is, for %s (bound to %s)", v.OldPVC, v.NewStatefulSet, v.PV))
		case v.Kept:
			claims = append(claims, fmt.Sprintf("re-stamp the kept claim %s for release %s (bound to %s)", v.OldPVC, p.NewRelease, v.PV))
		case v.NewStatefulSet != nil:
			claims = append(claims, fmt.Sprintf("%s -> %s on %s (%s; for %s, not owned by Helm)", v.OldPVC, v.NewPVC, v.PV, v.Source, v.NewStatefulSet))
		default:
			claims = append(claims, fmt.Sprintf("%s -> %s on %s (%s)", v.OldPVC, v.NewPVC, v.PV, v.Source))
		}
	}
	for _, s := range p.Secrets {
		secrets = append(secrets, s.Old+" -> "+s.New)
	}
	claimDeletes := ""
	if len(p.ClaimDeletes) > 0 {
		claimDeletes = "; then, once the old StatefulSets are gone, delete the StatefulSet claims it leaves behind, each by its uid: " +
			strings.Join(p.ClaimDeletes, ", ")
	}
	retainStep := "make sure every bound PV is Retain: all are"
	if len(retain) > 0 {
		retainStep = "patch these PVs to reclaimPolicy Retain (asks first): " + strings.Join(retain, ", ")
	}
	return []string{
		"1. " + StepBackup + ": write the Secrets and the PVC and PV definitions (StatefulSet claims included) to the backup directory",
		"2. " + StepRetain + ": " + retainStep,
		fmt.Sprintf("3. %s: %s (deletes %d object(s), keeps %d; listed above)%s", StepUninstall, cmdline.HelmUninstall{Release: p.Release}, len(p.Deletes), len(p.Kept), claimDeletes),
		"4. " + StepClaimRefs + ": free each retained PV of its old claim and reserve it for the new one",
		"5. " + StepPVCs + ": pre-create the new claims bound to the retained PVs (the chart's claims owned by release " + p.NewRelease +
			", StatefulSet claims left to their StatefulSet, which takes them by name): " + orNone(claims),
		"6. " + StepSecrets + ": restore the Secrets under the names the new chart renders: " + orNone(secrets),
		fmt.Sprintf("7. %s: %s", StepInstall, cmdline.HelmInstall{Release: p.NewRelease, Chart: p.NewChart + "-" + p.NewChartVersion}),
		"8. " + StepVerify + ": every new claim is Bound to its old PV (same name, uid and volume source) and every restored Secret holds the same data",
	}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "; ")
}

// ErrBlocked says the plan has blocking findings: Execute refuses it, having changed
// nothing (ExecOptions.Override runs it anyway, once they are read and accepted).
var ErrBlocked = errors.New("the plan has blocking findings")

// FindingReport is the migration plan as CI reads it: one case, the release, with the
// plan's findings (blocking ones stop Execute; the notes are what it takes care of).
func (p *Plan) FindingReport() finding.Report {
	return finding.Report{Tool: "release-migrate", Cases: []finding.Case{{
		Name: manifest.SubjectOf("Release", p.Namespace, p.Release), Findings: p.Findings,
	}}}
}
