package controller

import (
	"context"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
)

// WithProgressHook returns o with f called after each page a migration saved its place
// at, on the migration's goroutine: a test holds a migration there, mid-way, with its
// place saved.
func WithProgressHook(o Options, f func(ctx context.Context, sm *v1alpha1.StorageMigration)) Options {
	o.progressHook = f
	return o
}
