package servicereconciler

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// deploy installs or upgrades the service's release (named after it, in its namespace,
// release data in Secrets) to ch with the Helm SDK, as `helm upgrade --install` does:
// server-side apply for a new release, the release's own apply method for an upgrade, and
// no waiting for workloads to become ready (a real service would choose a wait strategy).
func deploy(ctx context.Context, target *rest.Config, svc *DemoService, ch *chart.Chart) error {
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(logr.ToSlogHandler(logr.FromContextOrDiscard(ctx))))
	if err := cfg.Init(&restClientGetter{config: target, namespace: svc.Namespace}, svc.Namespace, "secret"); err != nil {
		return fmt.Errorf("helm configuration: %w", err)
	}
	history := action.NewHistory(cfg)
	history.Max = 1
	_, err := history.Run(svc.Name)
	switch {
	case errors.Is(err, driver.ErrReleaseNotFound):
		install := action.NewInstall(cfg)
		install.ReleaseName, install.Namespace = svc.Name, svc.Namespace
		install.WaitStrategy = kube.HookOnlyStrategy
		if _, err := install.RunWithContext(ctx, ch, nil); err != nil {
			return fmt.Errorf("helm install %s/%s %s: %w", svc.Namespace, svc.Name, ch.Metadata.Version, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("read release %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = svc.Namespace
	upgrade.WaitStrategy = kube.HookOnlyStrategy
	if _, err := upgrade.RunWithContext(ctx, svc.Name, ch, nil); err != nil {
		return fmt.Errorf("helm upgrade %s/%s to %s: %w", svc.Namespace, svc.Name, ch.Metadata.Version, err)
	}
	return nil
}

// restClientGetter hands the Helm SDK a REST config the controller already has, instead
// of a kubeconfig file.
type restClientGetter struct {
	config    *rest.Config
	namespace string
}

func (g *restClientGetter) ToRESTConfig() (*rest.Config, error) {
	return rest.CopyConfig(g.config), nil
}

func (g *restClientGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(g.config)
	if err != nil {
		return nil, err
	}
	return memory.NewMemCacheClient(dc), nil
}

func (g *restClientGetter) ToRESTMapper() (meta.RESTMapper, error) {
	dc, err := g.ToDiscoveryClient()
	if err != nil {
		return nil, err
	}
	return restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(dc), dc, nil), nil
}

func (g *restClientGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return clientcmd.NewDefaultClientConfig(*clientcmdapi.NewConfig(), &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: g.namespace}})
}
