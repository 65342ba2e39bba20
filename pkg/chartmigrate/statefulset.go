package chartmigrate

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// StatefulSet claims are the claims a StatefulSet's controller makes from its
// volumeClaimTemplates, one per template and ordinal, named <template>-<statefulset>-<ordinal>.
// They are not in the release's stored manifest, so helm uninstall never deletes them
// (unless the StatefulSet's persistentVolumeClaimRetentionPolicy.whenDeleted is Delete,
// which lets the garbage collector take them), and the new chart never renders them:
// its StatefulSet's controller creates them on first start unless they already exist.
// The migration pairs them like the rendered claims, deletes each old one itself (it is
// listed in Plan.ClaimDeletes and deleted by uid), and pre-creates each new one bound to
// the old volume, before the install, so the new StatefulSet finds it and uses it.

// Finding check IDs of StatefulSet claims.
const (
	CheckSTSClaimsLeft   = "statefulset-claims-left"
	CheckSTSClaimMissing = "statefulset-claim-missing"
	CheckSTSKept         = "statefulset-kept"
	// CheckSTSClaimBeyond is a claim of an ordinal the StatefulSet does not run (left by
	// an earlier scale-down): not moved, not deleted.
	CheckSTSClaimBeyond = "statefulset-claim-beyond-replicas"
)

// stsClaim is one claim of a StatefulSet, live (old release) or to be made (new chart).
type stsClaim struct {
	name, sts, template string
	ordinal             int
	// obj is the claim the new StatefulSet's controller would make (new chart only).
	obj *unstructured.Unstructured
	// uid is the live claim's uid (old release only).
	uid string
}

// StatefulSetClaimName is the name a StatefulSet's controller gives the claim of a
// template at an ordinal (k8s.io/kubernetes pkg/controller/statefulset getPersistentVolumeClaimName).
func StatefulSetClaimName(template, sts string, ordinal int) string {
	return template + "-" + sts + "-" + strconv.Itoa(ordinal)
}

func statefulSet(o *unstructured.Unstructured) (*appsv1.StatefulSet, error) {
	var s appsv1.StatefulSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &s); err != nil {
		return nil, fmt.Errorf("StatefulSet %s: %w", o.GetName(), err)
	}
	return &s, nil
}

func ordinals(s *appsv1.StatefulSet) []int {
	replicas, start := 1, 0
	if s.Spec.Replicas != nil {
		replicas = int(*s.Spec.Replicas)
	}
	if s.Spec.Ordinals != nil {
		start = int(s.Spec.Ordinals.Start)
	}
	out := make([]int, 0, replicas)
	for i := range replicas {
		out = append(out, start+i)
	}
	return out
}

// newSTSClaims lists the claims the new chart's StatefulSets will use, built as the
// StatefulSet controller builds them: the template's spec and labels plus the pod
// selector's labels.
func newSTSClaims(m map[string]*unstructured.Unstructured, ns string) ([]stsClaim, error) {
	var out []stsClaim
	for _, name := range names(m) {
		s, err := statefulSet(m[name])
		if err != nil {
			return nil, fmt.Errorf("the new chart's %w", err)
		}
		for _, t := range s.Spec.VolumeClaimTemplates {
			for _, ord := range ordinals(s) {
				c := corev1.PersistentVolumeClaim{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
					ObjectMeta: metav1.ObjectMeta{Name: StatefulSetClaimName(t.Name, s.Name, ord), Namespace: ns,
						Labels: map[string]string{}, Annotations: t.Annotations},
					Spec: t.Spec}
				for k, v := range t.Labels {
					c.Labels[k] = v
				}
				if s.Spec.Selector != nil {
					for k, v := range s.Spec.Selector.MatchLabels {
						c.Labels[k] = v
					}
				}
				obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
				if err != nil {
					return nil, err
				}
				out = append(out, stsClaim{name: c.Name, sts: s.Name, template: t.Name, ordinal: ord, obj: &unstructured.Unstructured{Object: obj}})
			}
		}
	}
	return out, nil
}

// oldSTSClaims lists the live claims of the old release's StatefulSets, for the ordinals
// the live StatefulSet runs (the manifest's when it is gone). A claim of an ordinal that
// does not exist is a note: its pod never started, so there is no data to carry.
func oldSTSClaims(ctx context.Context, kube kubernetes.Interface, m map[string]*unstructured.Unstructured, ns string) ([]stsClaim, map[string]*appsv1.StatefulSet, []Finding, error) {
	var out []stsClaim
	var fs []Finding
	live := map[string]*appsv1.StatefulSet{}
	var claims *corev1.PersistentVolumeClaimList // read once, when a StatefulSet has templates
	for _, name := range names(m) {
		s, err := statefulSet(m[name])
		if err != nil {
			return nil, nil, nil, fmt.Errorf("the old release's %w", err)
		}
		l, err := kube.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			s = l
			live[name] = l
		case !apierrors.IsNotFound(err):
			return nil, nil, nil, fmt.Errorf("StatefulSet/%s/%s: %w", ns, name, err)
		}
		for _, t := range s.Spec.VolumeClaimTemplates {
			for _, ord := range ordinals(s) {
				cn := StatefulSetClaimName(t.Name, s.Name, ord)
				c, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, cn, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
					fs = append(fs, Finding{Check: CheckSTSClaimMissing, Severity: finding.Info, Subject: manifest.SubjectOf("PersistentVolumeClaim", ns, cn),
						Message: fmt.Sprintf("StatefulSet %s runs ordinal %d but its claim for template %s does not exist (the pod never started): there is no data to carry", name, ord, t.Name)})
					continue
				case err != nil:
					return nil, nil, nil, fmt.Errorf("PersistentVolumeClaim/%s/%s: %w", ns, cn, err)
				}
				out = append(out, stsClaim{name: cn, sts: name, template: t.Name, ordinal: ord, uid: string(c.UID)})
			}
			if claims == nil {
				if claims, err = kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{}); err != nil {
					return nil, nil, nil, fmt.Errorf("list PersistentVolumeClaims in %s: %w", ns, err)
				}
			}
			fs = append(fs, claimsBeyond(claims.Items, s, t.Name, ns)...)
		}
	}
	return out, live, fs, nil
}

// claimsBeyond reports the claims of a StatefulSet's template at ordinals it does not run:
// left by an earlier scale-down, they may hold data, and the migration leaves them alone.
func claimsBeyond(claims []corev1.PersistentVolumeClaim, s *appsv1.StatefulSet, template, ns string) []Finding {
	prefix := template + "-" + s.Name + "-"
	run := ordinals(s)
	var fs []Finding
	for _, c := range claims {
		suffix, ok := strings.CutPrefix(c.Name, prefix)
		ord, err := strconv.Atoi(suffix)
		if !ok || err != nil || ord < 0 || strconv.Itoa(ord) != suffix || slices.Contains(run, ord) {
			continue
		}
		fs = append(fs, Finding{Check: CheckSTSClaimBeyond, Severity: finding.Info, Subject: manifest.SubjectOf("PersistentVolumeClaim", ns, c.Name),
			Message:     fmt.Sprintf("a claim of StatefulSet %s's template %s at ordinal %d, which it does not run (%d replicas; left by an earlier scale-down): the migration neither moves nor deletes it, so the new release does not get its data", s.Name, template, ord, len(run)),
			Remediation: fmt.Sprintf("if it holds data to carry over, scale StatefulSet %s to cover ordinal %d and plan again; otherwise delete it once you no longer need it", s.Name, ord)})
	}
	return fs
}

// pairSTS pairs old StatefulSet claims with new ones by structure: StatefulSets by name
// (as pair does), then templates by name within each pair of StatefulSets, then equal
// ordinals. Claims already used (an explicit MapPVC pair) are skipped.
func pairSTS(old, new []stsClaim, oldRel, newRel string, used, taken map[string]bool) [][2]string {
	group := func(cs []stsClaim) (stss []string, tmpls map[string][]string) {
		tmpls = map[string][]string{}
		for _, c := range cs {
			if !slices.Contains(stss, c.sts) {
				stss = append(stss, c.sts)
			}
			if !slices.Contains(tmpls[c.sts], c.template) {
				tmpls[c.sts] = append(tmpls[c.sts], c.template)
			}
		}
		slices.Sort(stss)
		return stss, tmpls
	}
	oldSTS, oldT := group(old)
	newSTS, newT := group(new)
	var out [][2]string
	stsPairs, _, _ := pair(oldSTS, newSTS, oldRel, newRel, nil)
	for _, sp := range stsPairs {
		tPairs, _, _ := pair(oldT[sp[0]], newT[sp[1]], oldRel, newRel, nil)
		for _, tp := range tPairs {
			for _, o := range old {
				if o.sts != sp[0] || o.template != tp[0] || used[o.name] {
					continue
				}
				for _, n := range new {
					if n.sts == sp[1] && n.template == tp[1] && n.ordinal == o.ordinal && !taken[n.name] {
						out = append(out, [2]string{o.name, n.name})
						used[o.name], taken[n.name] = true, true
						break
					}
				}
			}
		}
	}
	return out
}

// pairClaims pairs every old claim (rendered or StatefulSet) with a new one: explicit
// mappings first, then StatefulSet claims by StatefulSet, template and ordinal (pairSTS),
// then what is left as pair does it.
func pairClaims(old, new []string, oldSTS, newSTS []stsClaim, oldRel, newRel string, explicit map[string]string) (pairs [][2]string, oldLeft, newLeft []string) {
	used, taken := map[string]bool{}, map[string]bool{}
	for _, o := range old {
		if n, ok := explicit[o]; ok && slices.Contains(new, n) && !taken[n] {
			pairs = append(pairs, [2]string{o, n})
			used[o], taken[n] = true, true
		}
	}
	pairs = append(pairs, pairSTS(oldSTS, newSTS, oldRel, newRel, used, taken)...)
	rest, oldLeft, newLeft := pair(slices.DeleteFunc(slices.Clone(old), func(o string) bool { return used[o] }),
		slices.DeleteFunc(slices.Clone(new), func(n string) bool { return taken[n] }), oldRel, newRel, nil)
	return append(pairs, rest...), oldLeft, newLeft
}
