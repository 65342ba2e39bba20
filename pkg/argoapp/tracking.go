package argoapp

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

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

// Settings are the entries of Argo CD's settings (argocd-cm) that a prediction reads: how
// Argo CD tells an Application's objects. Empty fields are Argo CD's defaults (argocd-cm
// sets none, or does not exist). A snapshot records them, and nothing else of argocd-cm.
type Settings struct {
	// TrackingMethod is application.resourceTrackingMethod.
	TrackingMethod string `json:"resourceTrackingMethod,omitempty"`
	// InstanceLabelKey is application.instanceLabelKey.
	InstanceLabelKey string `json:"instanceLabelKey,omitempty"`
	// InstallationID is installationID.
	InstallationID string `json:"installationID,omitempty"`
}

// ReadSettings reads the Settings of the Argo CD in namespace from its argocd-cm: the
// zero Settings (Argo CD's defaults) when argocd-cm does not exist, nil when it may not
// be read (the settings are then unknown).
func ReadSettings(ctx context.Context, cms corev1client.ConfigMapsGetter, namespace string) (*Settings, error) {
	cm, err := cms.ConfigMaps(namespace).Get(ctx, SettingsConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return &Settings{}, nil
	case apierrors.IsForbidden(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read Argo CD's settings (%s/%s): %w", namespace, SettingsConfigMap, err)
	}
	return &Settings{TrackingMethod: cm.Data[trackingMethodKey], InstanceLabelKey: cm.Data[instanceLabelKey], InstallationID: cm.Data[installationIDKey]}, nil
}

// Tracking is how an Argo CD in namespace with these settings tells the Application's
// objects (predict.ArgoTracking): the tracking method ("annotation", v3's default, when
// the settings set none), the instance label key and the installation id, with the
// Application's instance name. Nil settings (unknown) give the zero ArgoTracking, under
// which every CRD counts as tracked (the cautious answer).
func (s *Settings) Tracking(namespace string, app *Application) predict.ArgoTracking {
	if s == nil {
		return predict.ArgoTracking{}
	}
	t := predict.ArgoTracking{Method: defaultTrackingName, Instance: app.Name, LabelKey: s.InstanceLabelKey, InstallationID: s.InstallationID}
	if app.Namespace != "" && app.Namespace != namespace {
		t.Instance = app.Namespace + "_" + app.Name
	}
	if s.TrackingMethod != "" {
		t.Method = s.TrackingMethod
	}
	return t
}

// Tracking reads how the Argo CD of o tells the Application's objects: from o.Settings
// when a record gave them, else from argocd-cm (ReadSettings, Settings.Tracking). Without
// either, or where argocd-cm may not be read, it returns the zero ArgoTracking, under
// which every CRD counts as tracked (the cautious answer).
func Tracking(ctx context.Context, o Options, app *Application) (predict.ArgoTracking, error) {
	s := o.Settings
	if s == nil && o.ConfigMaps != nil {
		var err error
		if s, err = ReadSettings(ctx, o.ConfigMaps, o.namespace()); err != nil {
			return predict.ArgoTracking{}, err
		}
	}
	return s.Tracking(o.namespace(), app), nil
}
