// Package servicereconciler is an example of a controller that deploys a chart itself and
// gates every chart version bump with upgradeguard's library gate (pkg/gate): it reconciles
// DemoService objects, each running one version of a chart on a target cluster, and sets
// the gate's StorageMigrationRequired and StorageMigrationInProgress conditions on them.
// It is the shape of a service provider; copy the pattern, not the types.
package servicereconciler

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group of the example's service resource.
var GroupVersion = schema.GroupVersion{Group: "example.upgradeguard.io", Version: "v1alpha1"}

// AddToScheme adds DemoService and DemoServiceList to a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &DemoService{}, &DemoServiceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// DemoService is one service, deployed from one chart at spec.chartVersion.
type DemoService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DemoServiceSpec   `json:"spec,omitempty"`
	Status DemoServiceStatus `json:"status,omitempty"`
}

// DemoServiceSpec is what the service's owner asks for.
type DemoServiceSpec struct {
	// ChartVersion is the version of the service's chart to run.
	ChartVersion string `json:"chartVersion"`
}

// DemoServiceStatus is what the controller reports.
type DemoServiceStatus struct {
	// ObservedGeneration is the generation whose chart version was applied or blocked.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// AppliedVersion is the chart version running now.
	AppliedVersion string `json:"appliedVersion,omitempty"`
	// Conditions hold Ready and the gate's StorageMigrationRequired and
	// StorageMigrationInProgress.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DemoServiceList is a list of DemoServices.
type DemoServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DemoService `json:"items"`
}

// DeepCopyInto copies s into out.
func (s *DemoService) DeepCopyInto(out *DemoService) {
	*out = *s
	out.TypeMeta = s.TypeMeta
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = s.Spec
	out.Status = s.Status
	if s.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(s.Status.Conditions))
		for i := range s.Status.Conditions {
			s.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy returns a copy of s.
func (s *DemoService) DeepCopy() *DemoService {
	if s == nil {
		return nil
	}
	out := new(DemoService)
	s.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (s *DemoService) DeepCopyObject() runtime.Object { return s.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *DemoServiceList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := new(DemoServiceList)
	*out = *l
	listMeta := l.ListMeta
	listMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]DemoService, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
