package argoapp

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestTracking: the tracking settings come from argocd-cm in Argo CD's namespace, with v3's
// default (annotation) when it sets none or does not exist; the instance name is
// namespace_name for an Application outside that namespace; no reader, or a forbidden
// read, leaves them unknown (every CRD tracked). Settings a snapshot recorded are read
// instead of argocd-cm.
func TestTracking(t *testing.T) {
	cm := func(data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: SettingsConfigMap, Namespace: DefaultNamespace}, Data: data}
	}
	app := func(ns string) *Application {
		a := &Application{}
		a.Name, a.Namespace = "widgets", ns
		return a
	}
	forbidden := fake.NewClientset()
	forbidden.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, SettingsConfigMap, nil)
	})
	for _, tc := range []struct {
		name string
		o    Options
		app  *Application
		want predict.ArgoTracking
	}{
		{"no reader", Options{}, app(DefaultNamespace), predict.ArgoTracking{}},
		{"no argocd-cm: v3's default", Options{ConfigMaps: fake.NewClientset().CoreV1()}, app(DefaultNamespace),
			predict.ArgoTracking{Method: "annotation", Instance: "widgets"}},
		{"argocd-cm without tracking settings", Options{ConfigMaps: fake.NewClientset(cm(map[string]string{"url": "x"})).CoreV1()}, app(DefaultNamespace),
			predict.ArgoTracking{Method: "annotation", Instance: "widgets"}},
		{"label tracking with its own key and an installation id", Options{ConfigMaps: fake.NewClientset(cm(map[string]string{
			"application.resourceTrackingMethod": "label", "application.instanceLabelKey": "argocd.argoproj.io/instance", "installationID": "prod"})).CoreV1()},
			app(DefaultNamespace), predict.ArgoTracking{Method: "label", LabelKey: "argocd.argoproj.io/instance", InstallationID: "prod", Instance: "widgets"}},
		{"an Application in another namespace", Options{ConfigMaps: fake.NewClientset().CoreV1()}, app("team"),
			predict.ArgoTracking{Method: "annotation", Instance: "team_widgets"}},
		{"forbidden", Options{ConfigMaps: forbidden.CoreV1()}, app(DefaultNamespace), predict.ArgoTracking{}},
		{"recorded settings (a snapshot)", Options{Settings: &Settings{TrackingMethod: "label", InstallationID: "prod"}}, app("team"),
			predict.ArgoTracking{Method: "label", InstallationID: "prod", Instance: "team_widgets"}},
		{"recorded settings win over argocd-cm", Options{Settings: &Settings{}, ConfigMaps: fake.NewClientset(cm(map[string]string{
			"application.resourceTrackingMethod": "label"})).CoreV1()}, app(DefaultNamespace), predict.ArgoTracking{Method: "annotation", Instance: "widgets"}},
	} {
		got, err := Tracking(t.Context(), tc.o, tc.app)
		if err != nil || got != tc.want {
			t.Errorf("%s: Tracking() = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}
