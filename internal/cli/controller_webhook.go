package cli

import (
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// The HelmRelease admission gate, served by `upgradeguard controller` unless
// --enable-webhook=false.
func init() {
	setupWebhooks = func(mgr ctrl.Manager, o controller.Options) error {
		if !o.EnableWebhook {
			return nil
		}
		return webhook.Setup(mgr, webhook.Options{})
	}
}
