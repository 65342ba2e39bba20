package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	release "helm.sh/helm/v4/pkg/release/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	admissionclient "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/registry"
)

// ReleaseSource reads stored Helm releases.
type ReleaseSource interface {
	// Releases returns the current revision of every release in namespace ("" for all).
	Releases(ctx context.Context, namespace string) ([]*release.Release, error)
	// Current returns the current revision of one release, or a *helmrelease.NotFoundError.
	Current(ctx context.Context, namespace, name string) (*release.Release, error)
}

// HelmStorage is the ReleaseSource over Helm's own storage driver.
type HelmStorage struct {
	Clientset kubernetes.Interface
	// Driver is secret (default) or configmap.
	Driver helmrelease.Driver
}

// Releases implements ReleaseSource.
func (h HelmStorage) Releases(ctx context.Context, namespace string) ([]*release.Release, error) {
	r, err := helmrelease.NewReader(h.Clientset, namespace, h.Driver)
	if err != nil {
		return nil, err
	}
	return r.Releases(ctx)
}

// Current implements ReleaseSource.
func (h HelmStorage) Current(ctx context.Context, namespace, name string) (*release.Release, error) {
	r, err := helmrelease.NewReader(h.Clientset, namespace, h.Driver)
	if err != nil {
		return nil, err
	}
	return r.Current(ctx, name)
}

// Sources are the clients the audit reads through. It only reads.
type Sources struct {
	// Dynamic lists Flux HelmReleases and StorageMigrationPolicies.
	Dynamic dynamic.Interface
	// Metadata lists CRDs (labels and names are all the policy selection needs).
	Metadata metadata.Interface
	Leases   coordclient.LeasesGetter
	Releases ReleaseSource
	// Objects reads the ConfigMaps and Secrets a HelmRelease's spec.valuesFrom names, so
	// the values are composed as helm-controller composes them. Nil leaves valuesFrom
	// unresolved: the stored revision's values are used instead.
	Objects fluxrelease.Reader
	// Webhooks lists MutatingWebhookConfigurations, to find upgradeguard's CRD gate for
	// Argo CD Applications. Nil does not count the gate.
	Webhooks admissionclient.MutatingWebhookConfigurationsGetter
}

// Options choose what is audited.
type Options struct {
	// Namespace limits the audit to one namespace; "" audits every namespace.
	Namespace string
	// Registry is the chart registry (registry.Default() when nil).
	Registry *registry.Registry
	// Now is the clock for the Lease check (time.Now when nil).
	Now func() time.Time
	// Guard, when set, is the controller and the proactive policies that look after this
	// cluster from elsewhere (a fleet's platform cluster), used instead of reading the
	// audited cluster's own Lease and policies.
	Guard *Guard
}

// Guard is who looks after a cluster from outside it.
type Guard struct {
	Controller Controller
	// Policies are proactive policies (spec.targets selects the cluster).
	Policies []*v1alpha1.StorageMigrationPolicy
}

var (
	helmReleaseGVR = helmv2.GroupVersion.WithResource("helmreleases")
	policyGVR      = v1alpha1.GroupVersion.WithResource("storagemigrationpolicies")
	crdGVR         = apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
)

// Run audits the cluster. Errors mean the audit could not run (unreachable API server,
// missing permissions, unreadable release); what it finds is in the report.
func Run(ctx context.Context, src Sources, o Options) (*Report, error) {
	if o.Registry == nil {
		o.Registry = registry.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	rep := &Report{Scope: o.Namespace, Policies: []string{}, Releases: []Release{}}

	hrs, err := listHelmReleases(ctx, src.Dynamic, o.Namespace)
	if err != nil {
		return nil, err
	}
	rels, err := src.Releases.Releases(ctx, o.Namespace)
	if err != nil {
		return nil, err
	}
	inputs, err := join(ctx, src.Releases, o.Namespace, hrs, rels)
	if err != nil {
		return nil, err
	}

	if src.Objects != nil {
		if err := composeValues(ctx, src.Objects, inputs); err != nil {
			return nil, err
		}
	}

	j := &judge{reg: o.Registry}
	var policies []*v1alpha1.StorageMigrationPolicy
	if o.Guard != nil {
		j.controller, policies = o.Guard.Controller, o.Guard.Policies
	} else {
		if j.controller, err = controllerStatus(ctx, src.Leases, o.Now()); err != nil {
			return nil, err
		}
		if policies, err = listPolicies(ctx, src.Dynamic); err != nil {
			return nil, err
		}
	}
	rep.Controller = j.controller
	for _, p := range policies {
		if p.IsProactive() {
			j.policies = append(j.policies, p)
			rep.Policies = append(rep.Policies, p.Name)
		}
	}
	if len(j.policies) > 0 {
		if j.crds, err = liveCRDs(ctx, src.Metadata); err != nil {
			return nil, err
		}
	}

	for _, in := range inputs {
		r, err := j.evaluate(in)
		if err != nil {
			return nil, err
		}
		rep.Releases = append(rep.Releases, r)
	}
	slices.SortFunc(rep.Releases, func(a, b Release) int { return strings.Compare(a.Subject, b.Subject) })
	if err := j.argoCD(ctx, src, o.Namespace, rep); err != nil {
		return nil, err
	}
	rep.Warnings = j.warnings
	rep.Summary = summarize(rep.Releases)
	for _, a := range rep.Applications {
		rep.Summary.Applications++
		if a.Protected {
			rep.Summary.ApplicationsProtected++
		}
	}
	return rep, nil
}

// argoCD audits the Argo CD Applications in namespace ("" for all) that deploy CRDs. A
// cluster without Argo CD's Application CRD has none, and the report says nothing of it.
func (j *judge) argoCD(ctx context.Context, src Sources, namespace string, rep *Report) error {
	apps, err := argoapp.List(ctx, src.Dynamic, namespace)
	if err != nil {
		return err
	}
	apps = slices.DeleteFunc(apps, func(a *argoapp.Application) bool { crds, _ := resourcesOf(a); return len(crds) == 0 })
	if len(apps) == 0 {
		return nil
	}
	gate, err := crdGate(ctx, src.Webhooks, j.controller)
	if err != nil {
		return err
	}
	rep.CRDGate, rep.Applications = &gate, j.applications(apps, gate)
	return nil
}

func summarize(rels []Release) Summary {
	s := Summary{Releases: len(rels)}
	for _, r := range rels {
		if !r.ShipsCRDs {
			continue
		}
		s.ShipCRDs++
		if r.Protected {
			s.Protected++
		}
		if r.Upgrade.Protected {
			s.UpgradeProtected++
		}
		if r.Rollback.Protected {
			s.RollbackProtected++
		}
	}
	s.Coverage = fmt.Sprintf("%d/%d", s.Protected, s.ShipCRDs)
	return s
}

// listHelmReleases lists Flux HelmReleases (v2). A cluster without Flux has none: that is
// not an error.
func listHelmReleases(ctx context.Context, dyn dynamic.Interface, ns string) ([]*helmv2.HelmRelease, error) {
	items, err := kubeclient.ListAll(ctx, dyn.Resource(helmReleaseGVR).Namespace(ns), metav1.ListOptions{})
	if isAbsent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list Flux HelmReleases (%s): %w", helmReleaseGVR.GroupVersion(), err)
	}
	var out []*helmv2.HelmRelease
	for i := range items {
		var hr helmv2.HelmRelease
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(items[i].Object, &hr); err != nil {
			return nil, fmt.Errorf("HelmRelease %s/%s: decode: %w", items[i].GetNamespace(), items[i].GetName(), err)
		}
		out = append(out, &hr)
	}
	return out, nil
}

// listPolicies lists StorageMigrationPolicies. Without the upgradeguard CRDs there are none.
func listPolicies(ctx context.Context, dyn dynamic.Interface) ([]*v1alpha1.StorageMigrationPolicy, error) {
	list, err := dyn.Resource(policyGVR).List(ctx, metav1.ListOptions{})
	if isAbsent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list StorageMigrationPolicies: %w", err)
	}
	out := make([]*v1alpha1.StorageMigrationPolicy, 0, len(list.Items))
	for i := range list.Items {
		var p v1alpha1.StorageMigrationPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &p); err != nil {
			return nil, fmt.Errorf("StorageMigrationPolicy %s: decode: %w", list.Items[i].GetName(), err)
		}
		out = append(out, &p)
	}
	return out, nil
}

// liveCRDs returns the cluster's CRDs with what Selects reads: labels, and the group,
// which is the name after the plural (the API server requires <plural>.<group>).
func liveCRDs(ctx context.Context, md metadata.Interface) (map[string]*apiextv1.CustomResourceDefinition, error) {
	list, err := md.Resource(crdGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CustomResourceDefinitions: %w", err)
	}
	out := make(map[string]*apiextv1.CustomResourceDefinition, len(list.Items))
	for _, m := range list.Items {
		_, group, _ := strings.Cut(m.Name, ".")
		out[m.Name] = &apiextv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: m.Name, Labels: m.Labels},
			Spec:       apiextv1.CustomResourceDefinitionSpec{Group: group},
		}
	}
	return out, nil
}

// controllerStatus finds the controller's leader-election Lease in any namespace. It
// counts as running when the Lease has a holder and was renewed within its
// leaseDurationSeconds: the rule leader election itself uses to call a Lease held.
func controllerStatus(ctx context.Context, leases coordclient.LeasesGetter, now time.Time) (Controller, error) {
	list, err := leases.Leases("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", ControllerLeaseName).String()})
	if apierrors.IsForbidden(err) {
		return Controller{Reason: "cannot list Leases (forbidden): whether the controller runs is unknown, so upgradeguard protection is not counted; grant list on leases.coordination.k8s.io"}, nil
	}
	if err != nil {
		return Controller{}, fmt.Errorf("list Leases named %s (to see whether upgradeguard's controller runs): %w", ControllerLeaseName, err)
	}
	if len(list.Items) == 0 {
		return Controller{Reason: "no Lease " + ControllerLeaseName + " in any namespace: the controller is not running (or runs without --leader-elect)"}, nil
	}
	var best Controller
	for _, l := range list.Items {
		c := Controller{Lease: l.Namespace + "/" + l.Name}
		if l.Spec.HolderIdentity != nil {
			c.Holder = *l.Spec.HolderIdentity
		}
		dur := defaultLeaseDuration
		if l.Spec.LeaseDurationSeconds != nil {
			dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		switch {
		case c.Holder == "":
			c.Reason = "Lease " + c.Lease + " has no holder: the controller released it or has not started"
		case l.Spec.RenewTime == nil:
			c.Reason = "Lease " + c.Lease + " was never renewed"
		case now.After(l.Spec.RenewTime.Add(dur)):
			c.Reason = fmt.Sprintf("Lease %s expired: last renewed %s, lease duration %s", c.Lease, l.Spec.RenewTime.UTC().Format(time.RFC3339), dur)
		default:
			c.Running = true
			c.Reason = "Lease " + c.Lease + " is held by " + c.Holder
		}
		if c.Running || best.Lease == "" {
			best = c
		}
		if c.Running {
			break
		}
	}
	return best, nil
}

// join pairs each HelmRelease with its stored Helm release (storage namespace, release
// name); the Helm releases left over are reported on their own.
func join(ctx context.Context, src ReleaseSource, ns string, hrs []*helmv2.HelmRelease, rels []*release.Release) ([]input, error) {
	byKey := map[[2]string]*release.Release{}
	for _, r := range rels {
		byKey[[2]string{r.Namespace, r.Name}] = r
	}
	used := map[[2]string]bool{}
	var out []input
	for _, hr := range hrs {
		in := input{hr: hr}
		if hr.Spec.KubeConfig != nil {
			in.note = "the release runs on a remote cluster (spec.kubeConfig): its stored release was not read"
			out = append(out, in)
			continue
		}
		storageNS := hr.Status.StorageNamespace
		if storageNS == "" {
			storageNS = hr.GetStorageNamespace()
		}
		k := [2]string{storageNS, hr.GetReleaseName()}
		if r, ok := byKey[k]; ok {
			in.rel = r
		} else if ns != "" && storageNS != ns {
			// Stored outside the audited namespace: read just this one.
			r, err := src.Current(ctx, storageNS, hr.GetReleaseName())
			var nf *helmrelease.NotFoundError
			switch {
			case errors.As(err, &nf):
			case err != nil:
				return nil, err
			default:
				in.rel = r
			}
		}
		if in.rel == nil {
			in.note = fmt.Sprintf("no stored Helm release %s/%s: not installed yet, or installed elsewhere", k[0], k[1])
		}
		used[k] = true
		out = append(out, in)
	}
	for _, r := range rels {
		if !used[[2]string{r.Namespace, r.Name}] {
			out = append(out, input{rel: r})
		}
	}
	return out, nil
}

// isAbsent is true when a resource type is not served: its CRD is not installed.
func isAbsent(err error) bool { return kubeclient.IsNotServed(err) }

// composeValues resolves spec.valuesFrom for the HelmReleases that set it. A reference
// helm-controller could not resolve either, or one the audit may not read, is not fatal:
// that release falls back to its stored values and says why (the message names the
// reference, never its content).
func composeValues(ctx context.Context, r fluxrelease.Reader, inputs []input) error {
	for i := range inputs {
		in := &inputs[i]
		if in.hr == nil || len(in.hr.Spec.ValuesFrom) == 0 {
			continue
		}
		v, err := fluxrelease.Values(ctx, r, in.hr)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			in.valuesErr = err.Error()
			continue
		}
		in.composed = v
	}
	return nil
}

// NewSources builds the sources of an audit from one REST config: one client set, with
// release storage read through driver ("secret" or "configmap"; "" is secret). The audit
// of one cluster and of each target of a fleet read through it.
func NewSources(cfg *rest.Config, driver helmrelease.Driver) (Sources, error) {
	c, err := kubeclient.New(cfg)
	if err != nil {
		return Sources{}, fmt.Errorf("build clients: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Sources{}, fmt.Errorf("build clients: %w", err)
	}
	// spec.valuesFrom names ConfigMaps and Secrets: read them as helm-controller does.
	objects, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return Sources{}, fmt.Errorf("build clients: %w", err)
	}
	return Sources{Dynamic: dyn, Metadata: c.Metadata, Leases: c.Leases, Releases: HelmStorage{Clientset: c.Kube, Driver: driver},
		Objects: objects, Webhooks: c.Kube.AdmissionregistrationV1()}, nil
}
