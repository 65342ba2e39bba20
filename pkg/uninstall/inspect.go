package uninstall

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

type inspector struct {
	c   *Clients
	rep *Report
	// deployer runs op, the operation whose deletes are inspected.
	deployer           predict.Deployer
	op                 predict.Operation
	release, namespace string
	// listed holds the subjects of the stored manifest.
	listed map[string]bool
	pods   map[string][]podRef
	// policies evaluates the admission policies for a CRD's deletion (nil: not asked).
	policies PolicyEvaluator
}

type podRef struct {
	subject string
	claims  []string
	owners  []metav1.OwnerReference
}

func (in *inspector) find(check, subject, msg, remediation string) {
	in.rep.Findings = append(in.rep.Findings, Finding{Check: check, Subject: subject, Severity: finding.Danger, Message: msg, Remediation: remediation})
}

// details looks behind the objects the uninstall deletes: volumes, credentials and
// cascades.
func (in *inspector) details(ctx context.Context) error {
	deletedClasses := map[string]bool{}
	for _, o := range in.rep.Objects {
		if o.Action == Delete && o.Kind == "StorageClass" {
			deletedClasses[o.Name] = true
		}
	}
	for i := range in.rep.Objects {
		o := &in.rep.Objects[i]
		if o.Action != Delete || !o.Live {
			continue
		}
		var err error
		switch {
		case o.Kind == "PersistentVolumeClaim" && isCore(o.APIVersion):
			err = in.pvc(ctx, o, deletedClasses)
		case o.Kind == "Secret" && isCore(o.APIVersion):
			err = in.secret(ctx, o)
		case o.Kind == "Namespace" && isCore(o.APIVersion):
			err = in.namespaceCascade(ctx, o)
		case o.Kind == "CustomResourceDefinition":
			err = in.crdCascade(ctx, o)
		case o.Kind == "StorageClass":
			err = in.storageClass(ctx, o)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", o.Subject, err)
		}
	}
	return nil
}

func isCore(apiVersion string) bool { return apiVersion == "v1" }

func (in *inspector) pvc(ctx context.Context, o *Object, deletedClasses map[string]bool) error {
	pvc, err := in.c.Kube.CoreV1().PersistentVolumeClaims(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	info := &PVCInfo{Phase: string(pvc.Status.Phase), Volume: pvc.Spec.VolumeName}
	if pvc.Spec.StorageClassName != nil {
		info.StorageClass = *pvc.Spec.StorageClassName
	}
	info.StorageClassDeleted = info.StorageClass != "" && deletedClasses[info.StorageClass]
	o.PVC = info
	if info.Volume != "" {
		pv, err := in.c.Kube.CoreV1().PersistentVolumes().Get(ctx, info.Volume, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("read its PersistentVolume %s: %w", info.Volume, err)
		default:
			info.ReclaimPolicy = string(pv.Spec.PersistentVolumeReclaimPolicy)
		}
	}
	switch info.ReclaimPolicy {
	case string(corev1.PersistentVolumeReclaimDelete), string(corev1.PersistentVolumeReclaimRecycle):
		in.find(CheckPVDelete, o.Subject,
			fmt.Sprintf("deleting the claim makes PersistentVolume %s (reclaimPolicy %s) erase its data: DATA LOSS", info.Volume, info.ReclaimPolicy),
			fmt.Sprintf("first make the volume outlive the claim: `%s`; then keep the claim with %s; or Option C: take a backup (`%s`) and bind a new claim to PV %s after the uninstall", cmdline.RetainVolume{PersistentVolume: info.Volume}, optionA(in.release, in.namespace), backupCommand(in.release, in.namespace), info.Volume))
	case string(corev1.PersistentVolumeReclaimRetain):
		in.find(CheckPVCDeleted, o.Subject,
			fmt.Sprintf("the claim is deleted; PersistentVolume %s (Retain) keeps the data but goes Released, and only a claim bound to it by hand gets it back", info.Volume),
			remedy(in.release, in.namespace, o.Kind))
	}
	users, err := in.foreignUsers(ctx, o.Namespace, o.Name)
	if err != nil {
		return err
	}
	info.UsedBy = users
	if len(users) > 0 {
		in.find(CheckPVCInUse, o.Subject,
			fmt.Sprintf("mounted by %s outside the release: they hold the claim in Terminating (kubernetes.io/pvc-protection) until they stop", strings.Join(users, ", ")),
			"before the uninstall, let them finish or stop them (for example `"+stopCommand(users[0])+"`), or the uninstall leaves the claim Terminating")
	}
	return nil
}

// foreignUsers lists the running pods and unfinished Jobs in ns that mount claim and are
// not part of the release (neither listed in the manifest nor owned by something listed).
func (in *inspector) foreignUsers(ctx context.Context, ns, claim string) ([]string, error) {
	var out []string
	jobs := map[string]bool{}
	for list, err := range kubeclient.Pages(ctx, in.c.Kube.BatchV1().Jobs(ns).List, metav1.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list Jobs in %s: %w", ns, err)
		}
		for i := range list.Items {
			j := &list.Items[i]
			subject := manifest.SubjectOf("Job", ns, j.Name)
			if jobFinished(j) || in.listed[subject] || !mounts(j.Spec.Template.Spec.Volumes, claim) {
				continue
			}
			mine, err := in.ownedByRelease(ctx, ns, j.OwnerReferences, 0)
			if err != nil {
				return nil, err
			}
			if !mine {
				out = append(out, subject)
				jobs[j.Name] = true
			}
		}
	}
	pods, err := in.podsIn(ctx, ns)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if !slices.Contains(p.claims, claim) || in.listed[p.subject] {
			continue
		}
		if job := controllerOf(p.owners); job != nil && job.Kind == "Job" && jobs[job.Name] {
			continue // reported as its Job
		}
		mine, err := in.ownedByRelease(ctx, ns, p.owners, 0)
		if err != nil {
			return nil, err
		}
		if !mine {
			out = append(out, p.subject)
		}
	}
	sort.Strings(out)
	return out, nil
}

func controllerOf(refs []metav1.OwnerReference) *metav1.OwnerReference {
	for i := range refs {
		if refs[i].Controller != nil && *refs[i].Controller {
			return &refs[i]
		}
	}
	return nil
}

func (in *inspector) podsIn(ctx context.Context, ns string) ([]podRef, error) {
	if p, ok := in.pods[ns]; ok {
		return p, nil
	}
	var out []podRef
	for pods, err := range kubeclient.Pages(ctx, in.c.Kube.CoreV1().Pods(ns).List, metav1.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list pods in %s: %w", ns, err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // a finished pod holds no volume
			}
			ref := podRef{subject: manifest.SubjectOf("Pod", ns, p.Name), owners: p.OwnerReferences}
			for _, v := range p.Spec.Volumes {
				if v.PersistentVolumeClaim != nil {
					ref.claims = append(ref.claims, v.PersistentVolumeClaim.ClaimName)
				}
			}
			if len(ref.claims) > 0 {
				out = append(out, ref)
			}
		}
	}
	in.pods[ns] = out
	return out, nil
}

func mounts(vols []corev1.Volume, claim string) bool {
	for _, v := range vols {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}

func jobFinished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// ownedByRelease follows controller owner references (a pod's ReplicaSet, its
// Deployment) up to a few levels and reports whether one of them is in the manifest.
func (in *inspector) ownedByRelease(ctx context.Context, ns string, owners []metav1.OwnerReference, depth int) (bool, error) {
	if depth > 4 {
		return false, nil
	}
	for _, ref := range owners {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			continue
		}
		m, err := in.c.Mapper.RESTMapping(schema.GroupKind{Group: gv.Group, Kind: ref.Kind}, gv.Version)
		if err != nil {
			continue
		}
		subjectNS := ns
		if m.Scope.Name() != "namespace" {
			subjectNS = ""
		}
		subject := manifest.SubjectOf(ref.Kind, subjectNS, ref.Name)
		if in.listed[subject] {
			return true, nil
		}
		var ri metadata.ResourceInterface = in.c.Metadata.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = in.c.Metadata.Resource(m.Resource).Namespace(ns)
		}
		owner, err := ri.Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("read owner %s: %w", subject, err)
		}
		if ok, err := in.ownedByRelease(ctx, ns, owner.OwnerReferences, depth+1); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// secretTypesWithoutCredentials are Secret types a re-install re-creates on its own.
var secretTypesWithoutCredentials = []corev1.SecretType{corev1.SecretTypeServiceAccountToken, "helm.sh/release.v1"}

func (in *inspector) secret(ctx context.Context, o *Object) error {
	s, err := in.c.Kube.CoreV1().Secrets(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(s.Data))
	for k := range s.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	o.Secret = &SecretInfo{Type: string(s.Type), Keys: keys}
	if len(keys) == 0 || slices.Contains(secretTypesWithoutCredentials, s.Type) {
		return nil
	}
	in.find(CheckSecret, o.Subject,
		fmt.Sprintf("deletes Secret %s (type %s, keys %s): a re-install mints new values or refuses, while data kept on volumes still expects these", o.Name, s.Type, strings.Join(keys, ", ")),
		"take a backup before the uninstall: `"+backupCommand(in.release, in.namespace)+"`, and restore it under the name the new release renders (Option C); or keep it in place with "+optionA(in.release, in.namespace))
	return nil
}

func (in *inspector) namespaceCascade(ctx context.Context, o *Object) error {
	lists, err := in.c.Discovery.ServerPreferredNamespacedResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return fmt.Errorf("discover namespaced resources: %w", err)
	}
	cas := &Cascade{Counts: map[string]int{}}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || r.Name == "events" {
				continue
			}
			gvr := gv.WithResource(r.Name)
			n, err := in.count(ctx, gvr, o.Name, func(name string) bool { return in.listed[r.Kind+"/"+o.Name+"/"+name] })
			if err != nil {
				if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
					continue
				}
				return err
			}
			if n > 0 {
				cas.Counts[resourceKey(gvr)] += n
				cas.Total += n
			}
		}
	}
	o.Cascade = cas
	if cas.Total > 0 {
		in.find(CheckNamespaceCascade, o.Subject,
			fmt.Sprintf("deleting the namespace also deletes %d object(s) the release does not list: %s", cas.Total, countsText(cas.Counts)),
			remedy(in.release, in.namespace, o.Kind)+"; or move what must survive out of the namespace first")
	}
	return nil
}

func (in *inspector) crdCascade(ctx context.Context, o *Object) error {
	crd, err := in.c.CRDs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, o.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	version := ""
	for _, v := range crd.Spec.Versions {
		if v.Served && (version == "" || v.Storage) {
			version = v.Name
		}
	}
	cas := &Cascade{Counts: map[string]int{}}
	o.Cascade = cas
	if version == "" {
		return nil
	}
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural}
	n, err := in.count(ctx, gvr, "", func(string) bool { return false })
	if err != nil {
		return err
	}
	if n > 0 {
		cas.Counts[resourceKey(gvr)], cas.Total = n, n
	}
	// The verdict on a deleted CRD is predict's, the one every door gives.
	objects := int64(n)
	f := predict.DecideRemoved(in.op, in.deployer, predict.Removal{Live: crd, From: predict.ChartCRD{CRD: crd, Source: predict.Templates}, Fate: predict.FateDeleted}, &objects)
	keep := in.deployer.KeepAdvice(in.op, []*apiextv1.CustomResourceDefinition{crd}, in.release, in.namespace)
	if f.Verdict == predict.Delete {
		in.find(CheckCRDCascade, o.Subject, f.Reason, keep)
	}
	return in.deletionPolicies(ctx, o, crd, keep)
}

// deletionPolicies evaluates the admission policies for the CRD's deletion: a denial is
// the CheckCRDDeletionDenied finding (every Helm's uninstall fails on it), and policies
// that cannot be read are said in Report.PoliciesNotAsked.
func (in *inspector) deletionPolicies(ctx context.Context, o *Object, crd *apiextv1.CustomResourceDefinition, keep string) error {
	if in.policies == nil {
		return nil
	}
	ds, err := in.policies.PolicyDenials(ctx, crd, nil)
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		if in.rep.PoliciesNotAsked == "" {
			in.rep.PoliciesNotAsked = err.Error()
		}
		return nil
	case len(ds) == 0:
		return nil
	}
	o.Policies = ds
	in.find(CheckCRDDeletionDenied, o.Subject, admissionpolicy.Message(ds)+": helm uninstall deletes the release's other objects and then fails on this one, leaving the release half-uninstalled",
		keep+"; or meet the policy's own exception (its message says which) and uninstall again")
	return nil
}

func (in *inspector) storageClass(ctx context.Context, o *Object) error {
	var users []string
	for pvs, err := range kubeclient.Pages(ctx, in.c.Kube.CoreV1().PersistentVolumes().List, metav1.ListOptions{}) {
		if err != nil {
			return fmt.Errorf("list PersistentVolumes: %w", err)
		}
		for _, pv := range pvs.Items {
			if pv.Spec.StorageClassName == o.Name {
				users = append(users, pv.Name)
			}
		}
	}
	sort.Strings(users)
	o.Storage = &StorageInfo{PersistentVolumes: users}
	if len(users) > 0 {
		in.find(CheckStorageClass, o.Subject,
			fmt.Sprintf("deleting the StorageClass leaves %d PersistentVolume(s) on a class that no longer exists (%s): claims for them cannot be re-created until it is", len(users), strings.Join(users, ", ")),
			remedy(in.release, in.namespace, o.Kind))
	}
	return nil
}

// count counts the objects of gvr in ns ("" for all), page by page, skipping those skip
// names.
func (in *inspector) count(ctx context.Context, gvr schema.GroupVersionResource, ns string, skip func(name string) bool) (int, error) {
	var ri metadata.ResourceInterface = in.c.Metadata.Resource(gvr)
	if ns != "" {
		ri = in.c.Metadata.Resource(gvr).Namespace(ns)
	}
	n := 0
	for list, err := range kubeclient.Pages(ctx, ri.List, metav1.ListOptions{}) {
		if err != nil {
			var status apierrors.APIStatus
			if errors.As(err, &status) {
				return 0, err
			}
			return 0, fmt.Errorf("list %s: %w", resourceKey(gvr), err)
		}
		for _, item := range list.Items {
			if !skip(item.Name) {
				n++
			}
		}
	}
	return n, nil
}

func resourceKey(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Resource
	}
	return gvr.Resource + "." + gvr.Group
}

func countsText(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}

// stopCommand is the kubectl command that stops one user of a claim (Kind/ns/name).
func stopCommand(subject string) string {
	parts := strings.SplitN(subject, "/", 3)
	if len(parts) != 3 {
		return cmdline.Delete{Resource: subject}.String()
	}
	return cmdline.Delete{Resource: strings.ToLower(parts[0]), Name: parts[2], Namespace: parts[1]}.String()
}
