package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Gateway API's standard CRDs in the fixtures, at two releases: v1.5.1 ships the
// ValidatingAdmissionPolicy SafeUpgrades, which refuses CRDs of a bundle older than
// v1.5.0, so a rollback from v1.5.1 to v1.4.1 is refused by it.
const (
	GatewayAPIOld = "v1.4.1"
	GatewayAPINew = "v1.5.1"
	// SafeUpgrades is the policy's name, and its binding's.
	SafeUpgrades = "safe-upgrades.gateway.networking.k8s.io"
	// SafeUpgradesRefusal is the policy's message for an older bundle.
	SafeUpgradesRefusal = "Installing CRDs with version before v1.5.0 is prohibited by default. " +
		"Uninstall ValidatingAdmissionPolicy safe-upgrades.gateway.networking.k8s.io to install older versions."
	gatewayAPIGroup = "gateway.networking.k8s.io"
	safeUpgradesVAP = "_vap_safeupgrades.yaml"
)

// GatewayAPICRDFiles are the fixture files (relative to Fixtures) of a release's standard
// CRDs, the policy's file left out.
func GatewayAPICRDFiles(tag string) ([]string, error) {
	fx, err := Fixtures()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join("crds", "gateway-api", tag)
	entries, err := os.ReadDir(filepath.Join(fx, dir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), safeUpgradesVAP) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// GatewayAPIChart writes a chart whose templates/ hold a release's standard CRDs, the
// chart version the release's ("1.4.1" for v1.4.1).
func GatewayAPIChart(dir, tag string) (string, error) {
	files, err := GatewayAPICRDFiles(tag)
	if err != nil {
		return "", err
	}
	return FixtureChart(dir, "gateway-api-crds", strings.TrimPrefix(tag, "v"), files...)
}

// GatewayAPICRDs are a release's standard CRDs.
func GatewayAPICRDs(tag string) ([]*apiextv1.CustomResourceDefinition, error) {
	files, err := GatewayAPICRDFiles(tag)
	if err != nil {
		return nil, err
	}
	return ReadCRDs(files...)
}

// SafeUpgradesPolicy is v1.5.1's ValidatingAdmissionPolicy and its binding, as the
// fixture holds them.
func SafeUpgradesPolicy() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	fx, err := Fixtures()
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(filepath.Join(fx, "crds", "gateway-api", GatewayAPINew, "gateway.networking.k8s.io"+safeUpgradesVAP))
	if err != nil {
		return nil, nil, err
	}
	docs, err := manifest.Documents(string(data))
	if err != nil {
		return nil, nil, err
	}
	var policy *admissionregistrationv1.ValidatingAdmissionPolicy
	var binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, d := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(d.Text), &tm); err != nil {
			return nil, nil, err
		}
		switch tm.Kind {
		case "ValidatingAdmissionPolicy":
			policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = yaml.UnmarshalStrict([]byte(d.Text), policy)
		case "ValidatingAdmissionPolicyBinding":
			binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = yaml.UnmarshalStrict([]byte(d.Text), binding)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if policy == nil || binding == nil {
		return nil, nil, fmt.Errorf("%s: no policy and binding", GatewayAPINew)
	}
	return policy, binding, nil
}

// InstallSafeUpgrades creates Gateway API's safe-upgrades policy and binding, and returns
// once the API server's admission enforces them (a dry-run create of a CRD of the group
// at bundle v1.0.0 is refused by it: the policy reaches admission through an informer,
// a moment after it is stored). When the test ends they are deleted, and the cleanup
// waits until the same dry run is accepted again.
func (c *ControlPlane) InstallSafeUpgrades(t testing.TB) {
	t.Helper()
	policy, binding, err := SafeUpgradesPolicy()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	kc := kubernetes.NewForConfigOrDie(c.Config)
	vaps := kc.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	bindings := kc.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if _, err := vaps.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := vaps.Delete(ctx, policy.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := c.waitSafeUpgrades(ctx, false); err != nil {
			t.Errorf("the API server still enforces %s after its deletion: %v", SafeUpgrades, err)
		}
	})
	if err := c.waitSafeUpgrades(ctx, true); err != nil {
		t.Fatalf("the API server does not enforce %s: %v", SafeUpgrades, err)
	}
}

// waitSafeUpgrades polls a dry-run create of an old-bundle CRD of the group until the
// policy refuses it (enforced) or it is accepted (!enforced).
func (c *ControlPlane) waitSafeUpgrades(ctx context.Context, enforced bool) error {
	crds := apiextclient.NewForConfigOrDie(c.Config).ApiextensionsV1().CustomResourceDefinitions()
	probe := &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "probes." + gatewayAPIGroup,
			Annotations: map[string]string{"gateway.networking.k8s.io/bundle-version": "v1.0.0", "gateway.networking.k8s.io/channel": "standard",
				"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/2466"}},
		Spec: apiextv1.CustomResourceDefinitionSpec{Group: gatewayAPIGroup, Scope: apiextv1.ClusterScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "probes", Kind: "Probe"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object"}}}}},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = crds.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused := last != nil && strings.Contains(last.Error(), SafeUpgrades)
		if last != nil && !refused {
			return false, last
		}
		return refused == enforced, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last answer: %w)", err, last)
	}
	return nil
}

// GatewayAPICRDNames are the names of a release's CRDs, sorted.
func GatewayAPICRDNames(tag string) ([]string, error) {
	crds, err := GatewayAPICRDs(tag)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range crds {
		out = append(out, c.Name)
	}
	slices.Sort(out)
	return out, nil
}
