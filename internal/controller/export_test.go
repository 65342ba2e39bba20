package controller

import (
	"context"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
)

// WithProgressHook returns o with f called after each page a migration saved its place
// at, on the migration's goroutine: a test holds a migration there, mid-way, with its
// place saved.
func WithProgressHook(o Options, f func(ctx context.Context, sm *v1alpha1.StorageMigration)) Options {
	o.progressHook = f
	return o
}

// EnsureProactive is ensureMigration for a proactive policy's StorageMigration of crd,
// with live standing for the CRD read from the API server.
func EnsureProactive(ctx context.Context, c client.Client, crd *apiextv1.CustomResourceDefinition,
	live func(context.Context) (*apiextv1.CustomResourceDefinition, error), policy *v1alpha1.StorageMigrationPolicy) (bool, error) {
	return ensureMigration(ctx, c, ProactiveName(crd.Name), crd, live, policy, nil, nil)
}
