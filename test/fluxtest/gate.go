package fluxtest

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// Gated is a control plane with the real Flux controllers and upgradeguard running the
// way a cluster runs it: the controller's manager with the HelmRelease gate, the
// release-record gate and the CRD gate on a real webhook server, the canonical webhook
// configuration (config/webhook) installed on the API server, and a
// StorageMigrationPolicy "kyverno" with autoMigrate for kyverno.io (proactive mode off:
// only the gate migrates). The fluxgate tests and `make demo` share it.
type Gated struct {
	Env // its UG reads and writes upgradeguard's and Flux's objects

	stops []func() error
}

// StartGated starts it all. Call Stop when done, also after an error.
func StartGated(ctx context.Context) (*Gated, error) {
	g := &Gated{}
	root, err := testenv.RepoRoot()
	if err != nil {
		return g, err
	}
	cp, err := testenv.Start(testenv.Options{Webhooks: &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook")}}})
	if err != nil {
		return g, err
	}
	g.CP = cp
	if err := testenv.ApplyUpgradeguardCRDs(ctx, cp.Config); err != nil {
		return g, err
	}
	f, err := flux.StartControllers(ctx, cp)
	if err != nil {
		return g, err
	}
	g.Flux = f
	g.stops = append(g.stops, f.Stop)
	scheme := flux.Scheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return g, err
	}
	if g.UG, err = client.New(cp.Config, client.Options{Scheme: scheme}); err != nil {
		return g, err
	}

	wh := cp.Webhooks
	mgr, err := controller.NewManager(cp.Config, controller.Options{
		LeaderElectionNamespace: "default", MetricsAddr: "0", ProbeAddr: "0",
		EnableWebhook: true, WebhookPort: wh.LocalServingPort, WebhookCertDir: wh.LocalServingCertDir,
	})
	if err != nil {
		return g, err
	}
	dir, err := os.MkdirTemp("", "upgradeguard-gated-")
	if err != nil {
		return g, err
	}
	g.stops = append(g.stops, func() error { return os.RemoveAll(dir) })
	if err := webhook.Setup(mgr, webhook.Options{Timeout: 20 * time.Second, HelmCacheDir: filepath.Join(dir, "helm")}); err != nil {
		return g, err
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	g.stops = append(g.stops, func() error { cancel(); return <-done })

	// Gate only: proactive mode would migrate before any upgrade needs it.
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "kyverno"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{"kyverno.io"}, Proactive: ptr.To(false)}}
	if err := g.UG.Create(ctx, policy); err != nil {
		return g, err
	}
	return g, waitServing(ctx, net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort)))
}

// Stop stops upgradeguard, Flux and the control plane, in that order, and returns what
// went wrong on the way (the manager's error included).
func (g *Gated) Stop() error {
	var err error
	for i := len(g.stops) - 1; i >= 0; i-- {
		err = errors.Join(err, g.stops[i]())
	}
	g.stops = nil
	if g.CP != nil {
		err = errors.Join(err, g.CP.Stop())
		g.CP = nil
	}
	return err
}

func waitServing(ctx context.Context, addr string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a readiness probe of our own loopback server
		if err != nil {
			return false, nil
		}
		return true, conn.Close()
	})
	if err != nil {
		return errors.Join(errors.New("the webhook server at "+addr+" is not serving"), err)
	}
	return nil
}
