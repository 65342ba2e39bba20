package predict

import (
	"fmt"
	"strings"

	"github.com/Masterminds/semver/v3"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// HelmDeployer is Helm at Version (3.18, 4.2.4, 4.3): its CLI, or a program on its SDK.
// The zero value is the newest Helm modelled (Helm4).
//
// Helm's rules, read in helm.sh/helm/v4 v4.3.1 and helm.sh/helm/v3 v3.22.0 (pkg/action,
// pkg/kube):
//   - An upgrade or rollback deletes every object that the manifest of the revision it
//     starts from lists and the target's manifest does not (matched by group, kind,
//     namespace and name), once every apply succeeded, unless the LIVE object's
//     helm.sh/resource-policy is exactly "keep" (Client.Update). A manifest holds what
//     templates/ renders, never crds/: a CRD that moves from templates/ to crds/ leaves
//     the release, and the upgrade does not create it again (an upgrade never reads
//     crds/).
//   - An uninstall deletes every object of the last revision's stored manifest unless
//     that manifest gives it helm.sh/resource-policy ("keep", in any case and spacing,
//     keeps it; any other value leaves it untouched); the live annotation does nothing
//     (filterManifestsToKeep). Helm 4.3 and newer also skip an object whose live
//     ownership metadata does not name the release (verifyOwnershipBeforeDelete).
//   - crds/ files are created by an install when missing, and never updated or deleted.
//   - A delete the API server refuses: Helm 3's upgrade logs it and succeeds, leaving the
//     object listed by no manifest; Helm 4's upgrade fails ("failed to delete resource").
type HelmDeployer struct {
	// Version is Helm's version; empty is Helm4's.
	Version string
}

// The Helm releases upgradeguard links and is tested with (bin/helm and bin/helm3).
var (
	Helm4 = HelmDeployer{Version: "4.3.1"}
	Helm3 = HelmDeployer{Version: "3.22.0"}
)

// ownershipSince is the first Helm whose uninstall skips objects whose live ownership
// does not name the release (verifyOwnershipBeforeDelete, helm/helm#31584).
var ownershipSince = semver.MustParse("4.3.0")

// Helm is the deployer Helm at version (4.3, v4.2.4, 3.18; empty: Helm4). It refuses
// what is not a version, and Helm 2, whose releases are stored differently.
func Helm(version string) (HelmDeployer, error) {
	if version == "" {
		return Helm4, nil
	}
	v, err := semver.NewVersion(version)
	if err != nil {
		return HelmDeployer{}, fmt.Errorf("Helm version %q: want a version such as 4.3, 4.2.4 or 3.18 (the Helm that will run it: `%s`)", version, cmdline.HelmVersion{})
	}
	if v.Major() < 3 {
		return HelmDeployer{}, fmt.Errorf("Helm version %q: Helm 2 is not supported (its release storage differs); want 3.x or 4.x", version)
	}
	return HelmDeployer{Version: strings.TrimPrefix(version, "v")}, nil
}

func (h HelmDeployer) version() string {
	if h.Version == "" {
		return Helm4.Version
	}
	return h.Version
}

// major is the Helm major version (4 when the version does not parse).
func (h HelmDeployer) major() uint64 {
	v, err := semver.NewVersion(h.version())
	if err != nil {
		return 4
	}
	return v.Major()
}

// String names the deployer: "Helm 4.3.1".
func (h HelmDeployer) String() string { return "Helm " + h.version() }

// Spec is the deployer as a report records it.
func (h HelmDeployer) Spec() DeployerSpec { return DeployerSpec{Kind: KindHelm, Version: h.version()} }

// who names the deployer in a reason about op: Helm 3 and Helm 4 upgrade and roll back
// by the same rules, so only an uninstall names the version.
func (h HelmDeployer) who(op Operation) string {
	if op != Uninstall {
		return "Helm"
	}
	return h.String()
}

// VerifiesOwnership reports whether the uninstall skips an object whose live Helm
// ownership metadata does not name the release (Helm 4.3 and newer).
func (h HelmDeployer) VerifiesOwnership() bool {
	v, err := semver.NewVersion(h.version())
	return err == nil && !v.LessThan(ownershipSince)
}

// Fate applies Helm's rules for op to one object that leaves the release.
func (h HelmDeployer) Fate(op Operation, l Leaving) Fate {
	if op == Uninstall {
		if v, ok := l.Manifest[KeepAnnotation]; ok {
			if KeepPolicy(v) {
				return FateKeptManifest
			}
			return FateUntouched
		}
		switch {
		case !l.Exists:
			return FateAbsent
		case !l.Owned && h.VerifiesOwnership():
			return FateNotOwned
		}
		return FateDeleted
	}
	switch {
	case !l.Exists:
		return FateAbsent
	case l.Live[KeepAnnotation] == KeepValue: // Client.Update compares exactly
		return FateKeptLive
	}
	return FateDeleted
}

// removals is Removals for Helm: for an upgrade or rollback, the CRDs the current
// manifest renders (templates/) and the incoming manifest no longer does, whether or not
// the incoming chart ships them in crds/; for an uninstall, every one the manifest
// renders. crds/ files never leave: Helm never deletes them.
func (h HelmDeployer) removals(c ReleaseChange) []Removal {
	rendered := map[string]bool{}
	shipped := map[string]ChartCRD{}
	if c.Operation != Uninstall {
		for _, in := range c.Incoming {
			if in.Source == Templates {
				rendered[in.CRD.Name] = true
			} else {
				shipped[in.CRD.Name] = in
			}
		}
	}
	var out []Removal
	for _, cur := range c.Current {
		live := c.Live[cur.CRD.Name]
		if cur.Source != Templates || rendered[cur.CRD.Name] || live == nil {
			continue
		}
		r := Removal{Live: live, From: cur, Fate: h.Fate(c.Operation, Leaving{
			Manifest: cur.CRD.Annotations, Exists: true, Live: live.Annotations,
			Owned: HelmOwnershipProblem(live.Labels, live.Annotations, c.Release, c.Namespace) == "",
		})}
		if s, ok := shipped[cur.CRD.Name]; ok {
			r.Shipped = &s
		}
		out = append(out, r)
	}
	return out
}

// decideRemoved is DecideRemoved for Helm.
func (h HelmDeployer) decideRemoved(op Operation, r Removal, objects *int64) Decision {
	live := r.Live
	f := removedDecision(r)
	who := h.who(op)
	leaves := fmt.Sprintf("the %s target no longer renders it", op)
	if r.Shipped != nil {
		leaves = fmt.Sprintf("the %s target moves it from templates/ to crds/, which is not part of the release manifest", op)
	}
	if op == Uninstall {
		leaves = "the release's stored manifest renders it"
	}
	kind := live.Spec.Names.Kind
	f.Verdict = OK
	switch r.Fate {
	case FateKeptLive:
		f.Reason = fmt.Sprintf("%s, but the live CRD carries %s=%s: %s leaves it and its objects in place, outside the release", leaves, KeepAnnotation, KeepValue, who)
	case FateKeptManifest, FateUntouched:
		f.Reason = fmt.Sprintf("%s with %s in the manifest: %s leaves it", leaves, KeepAnnotation, who)
	case FateNotOwned:
		f.Reason = fmt.Sprintf("%s, but its live ownership metadata names another release: %s skips it", leaves, who)
	case FateAbsent:
		f.Reason = leaves + ", and it is not on the cluster"
	default:
		again := ""
		if r.Shipped != nil {
			again = fmt.Sprintf("; the %s does not create it again (only an install creates crds/ files)", op)
		}
		switch {
		case objects == nil:
			f.Verdict = Delete
			f.Reason = fmt.Sprintf("%s, so %s deletes the CRD and every %s object (how many could not be read)%s", leaves, who, kind, again)
		case *objects > 0:
			f.Verdict = Delete
			f.Reason = fmt.Sprintf("%s, so %s deletes the CRD and %s%s", leaves, who, objectsOf(*objects, kind), again)
		case r.Shipped != nil:
			f.Verdict = Delete
			f.Reason = fmt.Sprintf("%s, so %s deletes the CRD%s: it holds no %s objects today, but the release is left without the CRD its chart ships", leaves, who, again, kind)
		default:
			f.Reason = fmt.Sprintf("%s, so %s deletes the CRD; it holds no %s objects, so nothing is lost", leaves, who, kind)
		}
	}
	f.Reason += files(r)
	return f
}

// KeepAdvice words how to keep the live CRDs that op would delete, and why it works.
// Helm's upgrade or rollback reads helm.sh/resource-policy from the live CRD, so
// annotating it before the operation is enough; an uninstall reads it from the stored
// manifest only, so the live annotation does nothing there.
func (h HelmDeployer) KeepAdvice(op Operation, live []*apiextv1.CustomResourceDefinition, release, namespace string) string {
	if op == Uninstall {
		return fmt.Sprintf("keep it: helm uninstall reads %s from the release's stored manifest, not from the live CRD (annotating the live CRD does not help): "+
			"first %s; then uninstall", KeepAnnotation, KeepInManifest(release, namespace))
	}
	return fmt.Sprintf("keep it: %s before the %s (%s reads %s from the live CRD when the %s drops it, and leaves the CRD and its objects in place, outside the release)",
		Keep(names(live)), op, h.who(op), KeepAnnotation, op)
}

// KeepCommands is one Keep of the live CRDs.
func (h HelmDeployer) KeepCommands(_ Operation, live []*apiextv1.CustomResourceDefinition) []cmdline.Annotate {
	return []cmdline.Annotate{Keep(names(live))}
}

// Kept adds helm.sh/resource-policy=keep to a copy of the annotations.
func (h HelmDeployer) Kept(annotations map[string]string) map[string]string {
	out := copyAnnotations(annotations)
	out[KeepAnnotation] = KeepValue
	return out
}

// removedDecision is the decision on a removed CRD before a deployer's rules decide it.
func removedDecision(r Removal) Decision {
	f := Decision{Name: r.Live.Name, Source: r.From.Source, MissingStoredVersions: []string{}, IncomingVersions: []crdversions.Version{}}
	fillLive(&f, r.Live)
	f.Conversion = crdversions.Conversion(r.Live)
	return f
}

// copyAnnotations is a copy of annotations with room for one more.
func copyAnnotations(annotations map[string]string) map[string]string {
	out := make(map[string]string, len(annotations)+1)
	for k, v := range annotations {
		out[k] = v
	}
	return out
}
