package argoapp

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// SettingsConfigMap is Argo CD's settings ConfigMap, in Argo CD's namespace.
const SettingsConfigMap = "argocd-cm"

// argocd-cm's entries that say how Argo CD tells an Application's objects.
const (
	trackingMethodKey   = "application.resourceTrackingMethod"
	instanceLabelKey    = "application.instanceLabelKey"
	installationIDKey   = "installationID"
	defaultTrackingName = "annotation"
)

// Tracking reads how the Argo CD in namespace tells the Application's objects from
// argocd-cm (predict.ArgoTracking): the tracking method ("annotation", v3's default,
// when argocd-cm sets none or does not exist), the instance label key and the
// installation id, with the Application's instance name. Without a ConfigMap reader, or
// where argocd-cm may not be read, it returns the zero ArgoTracking, under which every CRD
// counts as tracked (the cautious answer).
func Tracking(ctx context.Context, o Options, app *Application) (predict.ArgoTracking, error) {
	if o.ConfigMaps == nil {
		return predict.ArgoTracking{}, nil
	}
	ns := o.namespace()
	t := predict.ArgoTracking{Method: defaultTrackingName, Instance: app.Name}
	if app.Namespace != "" && app.Namespace != ns {
		t.Instance = app.Namespace + "_" + app.Name
	}
	cm, err := o.ConfigMaps.ConfigMaps(ns).Get(ctx, SettingsConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return t, nil
	case apierrors.IsForbidden(err):
		return predict.ArgoTracking{}, nil
	case err != nil:
		return predict.ArgoTracking{}, fmt.Errorf("read Argo CD's settings (%s/%s): %w", ns, SettingsConfigMap, err)
	}
	if m := cm.Data[trackingMethodKey]; m != "" {
		t.Method = m
	}
	t.LabelKey = cm.Data[instanceLabelKey]
	t.InstallationID = cm.Data[installationIDKey]
	return t, nil
}
