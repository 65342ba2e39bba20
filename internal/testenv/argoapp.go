package testenv

import (
	"context"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ApplicationCRD stands for Argo CD's Application CRD where a test only writes and
// reads Applications (no Argo CD runs): the same group, version, names and scope as
// Argo CD's own (StartArgoCD installs that one), and like it no status subresource, so
// status is written with the object. The schema is left open
// (x-kubernetes-preserve-unknown-fields).
func ApplicationCRD() *apiextv1.CustomResourceDefinition {
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: ApplicationGVR.Resource + "." + ApplicationGVR.Group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: ApplicationGVR.Group,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "applications", Singular: "application", Kind: "Application",
				ListKind: "ApplicationList", ShortNames: []string{"app", "apps"}},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: ApplicationGVR.Version, Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true),
				}},
			}},
		},
	}
}

// InstallApplicationCRD applies ApplicationCRD and waits until it is Established.
func InstallApplicationCRD(ctx context.Context, cs apiextclient.Interface) error {
	return ApplyCRD(ctx, cs, ApplicationCRD())
}
