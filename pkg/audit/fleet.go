package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// FleetReport is the audit of every target cluster a label selector picks from the
// kubeconfig Secrets of one namespace of the platform cluster.
type FleetReport struct {
	Namespace string          `json:"namespace"`
	Selector  string          `json:"selector"`
	Clusters  []ClusterReport `json:"clusters"`
	// NeedsAction counts the clusters that need an operator.
	NeedsAction int `json:"needsAction"`
}

// ClusterReport is one target cluster of a FleetReport.
type ClusterReport struct {
	Name   string `json:"name"`
	Secret string `json:"secret"`
	// Error says why the cluster could not be audited (unreachable, forbidden, no
	// kubeconfig); the rest of the report is then empty.
	Error string `json:"error,omitempty"`
	// PendingCRDs have stored versions other than their storage version.
	PendingCRDs []PendingCRD `json:"pendingCRDs"`
	// Unprotected are the releases that ship CRDs and are protected neither by an
	// upstream hook nor by upgradeguard, and the Argo CD Applications that deploy CRDs
	// unprotected (the CRD gate is not counted from a platform cluster).
	Unprotected []string `json:"unprotectedReleases"`
	// Coverage is "protected/shipCRDs" of the cluster's releases.
	Coverage string `json:"coverage"`
	// LastMigration is the cluster's latest StorageMigration on the platform cluster.
	LastMigration *MigrationOutcome `json:"lastMigration,omitempty"`
	NeedsAction   bool              `json:"needsAction"`
}

// PendingCRD is a CRD whose storedVersions hold more than its storage version.
type PendingCRD struct {
	Name           string   `json:"name"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
	// MigratingBy are the StorageVersionMigrations migrating it right now (created by
	// anyone): it is pending, but under way.
	MigratingBy []string `json:"migratingBy,omitempty"`
}

// MigrationOutcome is a StorageMigration's outcome.
type MigrationOutcome struct {
	Name    string         `json:"name"`
	Phase   v1alpha1.Phase `json:"phase"`
	Message string         `json:"message,omitempty"`
	// Time is its completion time, else its creation time.
	Time metav1.Time `json:"time"`
}

// FleetOptions choose the targets of a fleet audit.
type FleetOptions struct {
	// Namespace of the kubeconfig Secrets on the platform cluster.
	Namespace string
	// Selector picks the Secrets by label.
	Selector labels.Selector
	// Key holding the kubeconfig; kubeclient.KubeconfigKeys when empty.
	Key string
	// Timeout bounds the audit of one cluster. Default 1m.
	Timeout time.Duration
	// Audit applies to each cluster (Namespace "" audits every namespace).
	Audit Options
	// HelmDriver is the Helm release storage on the targets (secret or configmap).
	HelmDriver helmrelease.Driver
}

// Platform is how a fleet audit reads the platform cluster: the kubeconfig Secrets,
// the controller's Lease, the policies and the StorageMigrations.
type Platform struct {
	Clientset kubernetes.Interface
	Dynamic   dynamic.Interface
	Leases    coordclient.LeasesGetter
}

// NewPlatform builds the clients of a fleet audit from the platform cluster's REST config.
func NewPlatform(cfg *rest.Config) (Platform, error) {
	c, err := kubeclient.New(cfg)
	if err != nil {
		return Platform{}, fmt.Errorf("build clients: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Platform{}, fmt.Errorf("build clients: %w", err)
	}
	return Platform{Clientset: c.Kube, Dynamic: dyn, Leases: c.Leases}, nil
}

var migrationGVR = v1alpha1.GroupVersion.WithResource("storagemigrations")

// RunFleet audits every target cluster, each in its own goroutine with its own timeout,
// so one that is down only marks itself. Errors mean the platform cluster could not be
// read; a target's failure is in its ClusterReport.
func RunFleet(ctx context.Context, pl Platform, o FleetOptions) (*FleetReport, error) {
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	if o.Audit.Now == nil {
		o.Audit.Now = time.Now
	}
	secrets, err := pl.Clientset.CoreV1().Secrets(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: o.Selector.String()})
	if err != nil {
		return nil, fmt.Errorf("list kubeconfig Secrets in %s: %w", o.Namespace, err)
	}
	ctrl, err := controllerStatus(ctx, pl.Leases, o.Audit.Now())
	if err != nil {
		return nil, err
	}
	policies, err := listPolicies(ctx, pl.Dynamic)
	if err != nil {
		return nil, err
	}
	last, err := lastMigrations(ctx, pl.Dynamic)
	if err != nil {
		return nil, err
	}
	rep := &FleetReport{Namespace: o.Namespace, Selector: o.Selector.String(), Clusters: make([]ClusterReport, len(secrets.Items))}
	var wg sync.WaitGroup
	for i := range secrets.Items {
		s := &secrets.Items[i]
		cr := &rep.Clusters[i]
		cr.Name, cr.Secret = kubeclient.ClusterName(s), s.Name
		cr.LastMigration = last[cr.Name]
		guard := &Guard{Controller: ctrl}
		var selErr error
		for _, p := range policies {
			ok, err := selectsSecret(p, s)
			selErr = errors.Join(selErr, err)
			if ok && p.IsProactive() {
				guard.Policies = append(guard.Policies, p)
			}
		}
		if selErr != nil {
			// A policy that cannot say whether it covers this cluster may be the one meant to.
			cr.Error = selErr.Error()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, o.Timeout)
			defer cancel()
			if err := auditCluster(cctx, s, guard, o, cr); err != nil {
				cr.Error = err.Error()
			}
		}()
	}
	wg.Wait()
	for i := range rep.Clusters {
		c := &rep.Clusters[i]
		c.NeedsAction = c.Error != "" || len(c.PendingCRDs) > 0 || len(c.Unprotected) > 0 ||
			c.LastMigration != nil && c.LastMigration.Phase == v1alpha1.PhaseFailed
		if c.NeedsAction {
			rep.NeedsAction++
		}
	}
	slices.SortFunc(rep.Clusters, func(a, b ClusterReport) int { return strings.Compare(a.Name, b.Name) })
	return rep, nil
}

// selectsSecret reports whether the fleet policy p covers the kubeconfig Secret s.
func selectsSecret(p *v1alpha1.StorageMigrationPolicy, s *corev1.Secret) (bool, error) {
	if p.Spec.Targets == nil || p.Spec.Targets.Namespace != s.Namespace {
		return false, nil
	}
	sel, err := p.TargetSelector()
	if err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(s.Labels)), nil
}

func auditCluster(ctx context.Context, s *corev1.Secret, guard *Guard, o FleetOptions, cr *ClusterReport) error {
	cfg, err := kubeclient.ConfigFromSecret(s, o.Key)
	if err != nil {
		return err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rest.NoWarnings{}
	crds, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	list, err := crds.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list CustomResourceDefinitions: %w", err)
	}
	active, err := inProgress(ctx, cfg)
	if err != nil {
		return err
	}
	cr.PendingCRDs = []PendingCRD{}
	for i := range list.Items {
		c := &list.Items[i]
		if migrate.NeedsMigration(c) {
			cr.PendingCRDs = append(cr.PendingCRDs, PendingCRD{Name: c.Name, StorageVersion: crdversions.StorageVersion(c), StoredVersions: c.Status.StoredVersions,
				MigratingBy: svmNames(active[c.Name])})
		}
	}
	src, err := NewSources(cfg, o.HelmDriver)
	if err != nil {
		return err
	}
	// The CRD gate is not counted from the platform cluster: whether a target's webhook
	// is served is not what the platform's controller Lease says.
	src.Webhooks = nil
	ao := o.Audit
	ao.Guard = guard
	rep, err := Run(ctx, src, ao)
	if err != nil {
		return err
	}
	cr.Unprotected = []string{}
	for _, r := range rep.Releases {
		if r.ShipsCRDs && !r.Protected {
			cr.Unprotected = append(cr.Unprotected, r.Subject)
		}
	}
	for _, a := range rep.Applications {
		if !a.Protected {
			cr.Unprotected = append(cr.Unprotected, a.Subject)
		}
	}
	cr.Coverage = rep.Summary.Coverage
	return nil
}

// lastMigrations is each target cluster's latest StorageMigration (by its cluster label).
func lastMigrations(ctx context.Context, dyn dynamic.Interface) (map[string]*MigrationOutcome, error) {
	list, err := dyn.Resource(migrationGVR).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelCluster})
	if isAbsent(err) {
		return map[string]*MigrationOutcome{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list StorageMigrations: %w", err)
	}
	out := map[string]*MigrationOutcome{}
	for i := range list.Items {
		var sm v1alpha1.StorageMigration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &sm); err != nil {
			return nil, errors.Join(fmt.Errorf("StorageMigration %s: decode", list.Items[i].GetName()), err)
		}
		m := &MigrationOutcome{Name: sm.Name, Phase: sm.Status.Phase, Time: sm.CreationTimestamp}
		if sm.Status.CompletionTime != nil {
			m.Time = *sm.Status.CompletionTime
		}
		for _, c := range sm.Status.Conditions {
			if c.Type == v1alpha1.ConditionFailed && c.Status == metav1.ConditionTrue {
				m.Message = c.Message
			}
		}
		cluster := sm.Labels[v1alpha1.LabelCluster]
		if prev := out[cluster]; prev == nil || prev.Time.Before(&m.Time) {
			out[cluster] = m
		}
	}
	return out, nil
}

// inProgress are the target's StorageVersionMigrations in progress, by CRD.
func inProgress(ctx context.Context, cfg *rest.Config) (map[string][]svm.Migration, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return svm.Active(ctx, dyn)
}

// svmNames are the migrations' names, nil for none (omitted from JSON).
func svmNames(ms []svm.Migration) []string {
	if len(ms) == 0 {
		return nil
	}
	return svm.Names(ms)
}
