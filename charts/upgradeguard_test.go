package charts_test

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// chartDir is the chart under test, relative to this package.
const chartDir = "upgradeguard"

// helm runs the real Helm CLI (bin/helm, 4.3.1) with its own homes. Rendering needs no
// cluster, so it also runs under -short.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	cmd := exec.Command(filepath.Join(bin, "helm"), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// render runs `helm template` for release name in namespace ns with the given --set values.
func render(t *testing.T, name, ns string, set ...string) *manifests {
	t.Helper()
	args := []string{"template", name, chartDir, "--namespace", ns, "--include-crds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return parse(t, out)
}

// manifests are rendered objects, in render order.
type manifests struct {
	objs []*unstructured.Unstructured
}

func parse(t *testing.T, out string) *manifests {
	t.Helper()
	objs, err := manifest.All(out)
	if err != nil {
		t.Fatalf("rendered YAML: %v", err)
	}
	return &manifests{objs: objs}
}

// find returns the only rendered object of kind (with the given name, when not empty).
func (m *manifests) find(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range m.objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one %s %q, rendered %d (kinds: %v)", kind, name, len(found), m.kinds())
	}
	return found[0]
}

func (m *manifests) has(kind string) bool {
	return slices.Contains(m.kinds(), kind)
}

func (m *manifests) kinds() []string {
	var out []string
	for _, o := range m.objs {
		out = append(out, o.GetKind())
	}
	return out
}

// typed decodes a rendered object into a typed API object, rejecting unknown fields, so a
// misspelt field in a template fails here and not at install time.
func typed[T any](t *testing.T, m *manifests, kind, name string) *T {
	t.Helper()
	data, err := json.Marshal(m.find(t, kind, name).Object)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	out := new(T)
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s %s does not decode strictly: %v", kind, name, err)
	}
	return out
}

func TestLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
	}{
		{"defaults", nil},
		{"cert-manager off", []string{"certManager.enabled=false"}},
		{"service monitor and PDB", []string{"metrics.serviceMonitor.enabled=true", "replicas=2", "podDisruptionBudget.enabled=true"}},
		{"webhook off, narrowed RBAC", []string{"webhook.enabled=false", "rbac.customResourceGroups={source.toolkit.fluxcd.io}"}},
	} {
		for _, strict := range []bool{false, true} {
			args := []string{"lint", chartDir}
			if strict {
				args = append(args, "--strict")
			}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := helm(t, args...)
			if err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("%s: helm %s: %v\n%s", tc.name, strings.Join(args, " "), err, out)
			}
		}
	}
}

// TestSchemaRejects proves values.schema.json stops bad values with Helm's own error,
// naming the path.
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		set, want string
	}{
		{"webhook.failurePolicy=Maybe", "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'"},
		{"replicas=0", "at '/replicas': minimum: got 0, want 1"},
		{"webhook.timeoutSeconds=31", "at '/webhook/timeoutSeconds'"},
		{"webhok.enabled=false", "additional properties 'webhok' not allowed"},
		{"metrics.port=70000", "at '/metrics/port'"},
		{"policy.rate.concurrency=65", "at '/policy/rate/concurrency'"},
		{"certManager.duration=90d", "at '/certManager/duration'"},
		{"controller.targetLeaseDuration=30", "at '/controller/targetLeaseDuration'"},
	} {
		out, err := helm(t, "template", "ug", chartDir, "--set", tc.set)
		if err == nil {
			t.Errorf("--set %s rendered; want the schema to reject it", tc.set)
			continue
		}
		if !strings.Contains(out, "values don't meet the specifications of the schema") || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: error does not say %q:\n%s", tc.set, tc.want, out)
		}
	}
	// Template-level checks that a schema cannot express.
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"podDisruptionBudget.enabled=true"}, "podDisruptionBudget.enabled needs replicas >= 2"},
		{[]string{"replicas=2", "leaderElection.enabled=false"}, "replicas > 1 needs leaderElection.enabled=true"},
	} {
		args := []string{"template", "ug", chartDir}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %v: err=%v, want an error saying %q:\n%s", tc.set, err, tc.want, out)
		}
	}
}

// contractFlags are the flags of `upgradeguard controller` the chart sets, with the
// contract's defaults, to read the rendered values back (TestDeploymentArgsRunTheRealCommand
// checks the args against the real command).
func contractFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	fs.Bool("leader-elect", true, "")
	fs.String("leader-election-namespace", "", "")
	fs.String("metrics-bind-address", ":8080", "")
	fs.String("health-probe-bind-address", ":8081", "")
	fs.Bool("enable-webhook", true, "")
	fs.Bool("crd-holds-objects-label", false, "")
	fs.Int("webhook-port", 9443, "")
	fs.String("webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "")
	fs.String("migration-lease-namespace", "", "")
	fs.Bool("gate-values-changes", false, "")
	fs.String("job-image", "", "")
	fs.String("job-namespace", "", "")
	fs.String("replica-id", "", "")
	fs.Duration("target-lease-duration", 30*time.Second, "")
	fs.Duration("target-renew-period", 10*time.Second, "")
	fs.Float32("kube-api-qps", 50, "")
	fs.Int("kube-api-burst", 300, "")
	fs.String("kubeconfig", "", "")
	return fs
}

func controllerArgs(t *testing.T, d *appsv1.Deployment) (*corev1.Container, *pflag.FlagSet) {
	t.Helper()
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("Deployment has %d containers, want 1", n)
	}
	c := &d.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "controller" {
		t.Fatalf("container args %v do not run `upgradeguard controller`", c.Args)
	}
	fs := contractFlags()
	if err := fs.Parse(c.Args[1:]); err != nil {
		t.Fatalf("Deployment args %v do not match the controller's flags: %v", c.Args, err)
	}
	if fs.NArg() != 0 {
		t.Fatalf("Deployment args have stray arguments %v", fs.Args())
	}
	return c, fs
}

// TestDeploymentArgsRunTheRealCommand parses the rendered Deployment's args with the real
// `upgradeguard controller` command (--help stops it before it connects): a flag the
// command does not have fails here.
func TestDeploymentArgsRunTheRealCommand(t *testing.T) {
	for _, set := range [][]string{
		nil,
		{"webhook.enabled=false", "metrics.enabled=false"},
		{"webhook.crdDeletion.mode=policy"},
		{"leaderElection.namespace=kube-system", "controller.migrationLeaseNamespace=flux-system", "replicas=2"},
		{"snapshot.repository=oci://registry.example.com/fleet/snapshots:prod", "snapshot.credentialsSecret=registry", "snapshot.every=30m"},
	} {
		d := typed[appsv1.Deployment](t, render(t, "ug", "ops", set...), "Deployment", "ug-upgradeguard")
		args := d.Spec.Template.Spec.Containers[0].Args
		var out, errOut bytes.Buffer
		if code := cli.Execute(t.Context(), append(slices.Clone(args), "--help"), cli.Streams{Out: &out, ErrOut: &errOut}); code != 0 {
			t.Errorf("--set %v: upgradeguard %v exits %d: %s", set, args, code, errOut.String())
		}
	}
	// The check can fail: a flag the command lacks is rejected.
	var out, errOut bytes.Buffer
	if code := cli.Execute(t.Context(), []string{"controller", "--leader-elekt=true", "--help"}, cli.Streams{Out: &out, ErrOut: &errOut}); code == 0 {
		t.Error("upgradeguard controller accepted an unknown flag")
	}
}

func flag(t *testing.T, fs *pflag.FlagSet, name string) string {
	t.Helper()
	f := fs.Lookup(name)
	if f == nil {
		t.Fatalf("no flag --%s", name)
	}
	return f.Value.String()
}

func port(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container has no port %q (ports %v)", name, c.Ports)
	return 0
}

func TestRenderDefaults(t *testing.T) {
	m := render(t, "ug", "upgradeguard-system")
	const full = "ug-upgradeguard"

	d := typed[appsv1.Deployment](t, m, "Deployment", full)
	if *d.Spec.Replicas != 1 {
		t.Errorf("replicas = %d, want 1", *d.Spec.Replicas)
	}
	c, fs := controllerArgs(t, d)
	for name, want := range map[string]string{
		"leader-elect":              "true",
		"leader-election-namespace": "", // $POD_NAMESPACE
		"metrics-bind-address":      ":8080",
		"health-probe-bind-address": ":8081",
		"gate-values-changes":       "false",
		"enable-webhook":            "true",
		"webhook-port":              "9443",
	} {
		if got := flag(t, fs, name); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
	if port(t, c, "metrics") != 8080 || port(t, c, "webhook") != 9443 || port(t, c, "health") != 8081 {
		t.Errorf("container ports %v do not match the flags", c.Ports)
	}

	// POD_NAMESPACE from the downward API: the default leader election namespace.
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAMESPACE" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("POD_NAMESPACE is not set from metadata.namespace: %+v", c.Env)
	}

	// Probes on the controller's health endpoints.
	for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Port.String() != "health" {
			t.Errorf("probe %+v, want GET %s on port health", probe, want)
		}
	}

	// Restricted security context.
	sc, psc := c.SecurityContext, d.Spec.Template.Spec.SecurityContext
	switch {
	case sc == nil || psc == nil:
		t.Fatal("no security context")
	case psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
		t.Error("pod does not run as non-root")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v, want drop ALL", sc.Capabilities)
	case psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("seccomp profile is not RuntimeDefault")
	}

	// The certificate directory is the webhook Secret, mounted read-only.
	certDir := flag(t, fs, "webhook-cert-dir")
	vm := slices.IndexFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == certDir })
	if vm < 0 || !c.VolumeMounts[vm].ReadOnly {
		t.Fatalf("--webhook-cert-dir %s is not a read-only volume mount: %+v", certDir, c.VolumeMounts)
	}
	vol := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[vm].Name })
	if vol < 0 || d.Spec.Template.Spec.Volumes[vol].Secret == nil {
		t.Fatalf("volume %s is not a Secret", c.VolumeMounts[vm].Name)
	}
	secretName := d.Spec.Template.Spec.Volumes[vol].Secret.SecretName

	// The webhook: the contract's path, behind the Service's 443, failing closed by
	// default, only for chart changes, never in its own namespace.
	vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", full)
	if len(vwc.Webhooks) != 3 {
		t.Fatalf("%d webhooks, want 3 (the HelmRelease gate, the release-record gate, the CRD deletion guard)", len(vwc.Webhooks))
	}
	// The CRD deletion guard is on and fails closed, on CRD DELETEs only, and never sees a
	// CRD annotated upgradeguard.io/allow-delete=true (matchConditions).
	if del := vwc.Webhooks[2]; del.Name != "crd-delete.upgradeguard.io" || *del.FailurePolicy != admissionregistrationv1.Fail ||
		len(del.Rules) != 1 || !slices.Equal(del.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Delete}) ||
		!slices.Equal(del.Rules[0].Resources, []string{"customresourcedefinitions"}) || len(del.MatchConditions) != 1 ||
		!strings.Contains(del.MatchConditions[0].Expression, "upgradeguard.io/allow-delete") {
		t.Errorf("CRD deletion guard %+v", del)
	}
	// The release-record and CRD gates fail open, whatever the HelmRelease gate does.
	if rec := vwc.Webhooks[1]; rec.Name != "release.upgradeguard.io" || *rec.FailurePolicy != admissionregistrationv1.Ignore ||
		rec.ObjectSelector == nil || rec.ObjectSelector.MatchLabels["owner"] != "helm" || len(rec.MatchConditions) != 1 {
		t.Errorf("release-record webhook %+v", rec)
	}
	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, m, "MutatingWebhookConfiguration", full)
	if len(mwc.Webhooks) != 1 || *mwc.Webhooks[0].FailurePolicy != admissionregistrationv1.Ignore ||
		*mwc.Webhooks[0].ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy || len(mwc.Webhooks[0].MatchConditions) != 1 {
		t.Errorf("CRD gate %+v", mwc.Webhooks)
	}
	wh := vwc.Webhooks[0]
	if *wh.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy = %s, want Fail", *wh.FailurePolicy)
	}
	// The gate bounds a decision at 25s; the API server must wait longer so the gate's own
	// message, not a timeout, reaches the user.
	if *wh.TimeoutSeconds != 30 {
		t.Errorf("timeoutSeconds = %d, want 30", *wh.TimeoutSeconds)
	}
	if *wh.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		t.Errorf("sideEffects = %s, want NoneOnDryRun", *wh.SideEffects)
	}
	svcRef := wh.ClientConfig.Service
	if svcRef == nil || svcRef.Name != full || svcRef.Namespace != "upgradeguard-system" || *svcRef.Path != "/validate-helm-toolkit-fluxcd-io-v2-helmrelease" || *svcRef.Port != 443 {
		t.Errorf("clientConfig.service %+v", svcRef)
	}
	wantRule := admissionregistrationv1.Rule{APIGroups: []string{"helm.toolkit.fluxcd.io"}, APIVersions: []string{"v2"}, Resources: []string{"helmreleases"}}
	if len(wh.Rules) != 1 || !slices.Equal(wh.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}) ||
		!slices.Equal(wh.Rules[0].APIGroups, wantRule.APIGroups) || !slices.Equal(wh.Rules[0].APIVersions, wantRule.APIVersions) || !slices.Equal(wh.Rules[0].Resources, wantRule.Resources) {
		t.Errorf("rules %+v, want UPDATE of helm.toolkit.fluxcd.io/v2 helmreleases", wh.Rules)
	}
	if len(wh.MatchConditions) != 1 || !strings.Contains(wh.MatchConditions[0].Expression, "object.spec.chart.spec.version") {
		t.Errorf("matchConditions %+v, want one on chart changes", wh.MatchConditions)
	}
	ns := wh.NamespaceSelector
	if ns == nil || len(ns.MatchExpressions) != 1 || ns.MatchExpressions[0].Key != "kubernetes.io/metadata.name" || !slices.Contains(ns.MatchExpressions[0].Values, "upgradeguard-system") {
		t.Errorf("namespaceSelector %+v does not exclude the release namespace", ns)
	}
	svc := typed[corev1.Service](t, m, "Service", full)
	sp := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == 443 })
	if sp < 0 || svc.Spec.Ports[sp].TargetPort.String() != "webhook" {
		t.Errorf("Service ports %+v: 443 does not target the webhook port", svc.Spec.Ports)
	}

	// cert-manager issues the Secret the Pod mounts, and injects the CA.
	cert := m.find(t, "Certificate", full+"-webhook")
	if got, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); got != secretName {
		t.Errorf("Certificate secretName %q, Pod mounts %q", got, secretName)
	}
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if !slices.Contains(dns, full+".upgradeguard-system.svc") {
		t.Errorf("Certificate dnsNames %v miss the Service name", dns)
	}
	if got := vwc.Annotations["cert-manager.io/inject-ca-from"]; got != "upgradeguard-system/"+full+"-webhook" {
		t.Errorf("inject-ca-from = %q", got)
	}
	if m.has("Secret") {
		t.Error("cert-manager mode renders a Secret; cert-manager owns it")
	}

	// The example policy, decoded strictly into the API type.
	pol := typed[v1alpha1.StorageMigrationPolicy](t, m, "StorageMigrationPolicy", "default")
	if !pol.IsProactive() || !pol.AutoMigrates() || pol.Spec.Rate.QPS != 20 {
		t.Errorf("policy %+v", pol.Spec)
	}

	// CRDs come from crds/ (generated) and the ServiceMonitor and PDB are off.
	for _, crd := range []string{"storagemigrations.upgradeguard.io", "storagemigrationpolicies.upgradeguard.io"} {
		m.find(t, "CustomResourceDefinition", crd)
	}
	if m.has("ServiceMonitor") || m.has("PodDisruptionBudget") {
		t.Errorf("optional objects rendered by default: %v", m.kinds())
	}
	typed[corev1.ServiceAccount](t, m, "ServiceAccount", full)
	crb := typed[rbacv1.ClusterRoleBinding](t, m, "ClusterRoleBinding", full)
	if crb.RoleRef.Name != full || len(crb.Subjects) != 1 || crb.Subjects[0].Name != d.Spec.Template.Spec.ServiceAccountName || crb.Subjects[0].Namespace != "upgradeguard-system" {
		t.Errorf("ClusterRoleBinding %+v does not bind the controller's ServiceAccount", crb)
	}
}

// TestRenderClusterRoleIsGenerated proves the chart's ClusterRole carries exactly the
// rules generated from the markers (config/rbac/role.yaml).
func TestRenderClusterRoleIsGenerated(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var generated rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &generated); err != nil {
		t.Fatal(err)
	}
	m := render(t, "ug", "upgradeguard-system")
	cr := typed[rbacv1.ClusterRole](t, m, "ClusterRole", "ug-upgradeguard")
	if len(cr.Rules) == 0 || !equalJSON(t, cr.Rules, generated.Rules) {
		t.Errorf("chart rules differ from config/rbac/role.yaml: run make generate\nchart: %+v\ngenerated: %+v", cr.Rules, generated.Rules)
	}
	narrowed := typed[rbacv1.ClusterRole](t, render(t, "ug", "upgradeguard-system", "rbac.customResourceGroups={source.toolkit.fluxcd.io,helm.toolkit.fluxcd.io}"), "ClusterRole", "ug-upgradeguard")
	for _, r := range narrowed.Rules {
		if slices.Contains(r.APIGroups, "*") {
			t.Errorf("rbac.customResourceGroups left a wildcard rule: %+v", r)
		}
	}
	if len(narrowed.Rules) != len(cr.Rules) {
		t.Errorf("narrowing changed the number of rules: %d -> %d", len(cr.Rules), len(narrowed.Rules))
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

func TestRenderVariants(t *testing.T) {
	t.Run("snapshot.repository: the controller pushes snapshots with the Secret's credentials", func(t *testing.T) {
		d := typed[appsv1.Deployment](t, render(t, "ug", "ops", "snapshot.repository=oci://registry.example.com/fleet/snapshots:prod",
			"snapshot.credentialsSecret=registry", "snapshot.every=30m", "snapshot.argocdNamespace=gitops"), "Deployment", "ug-upgradeguard")
		c := d.Spec.Template.Spec.Containers[0]
		for _, want := range []string{"--snapshot-push=oci://registry.example.com/fleet/snapshots:prod", "--snapshot-every=30m",
			"--snapshot-argocd-namespace=gitops", "--snapshot-registry-config=/etc/upgradeguard/registry/.dockerconfigjson"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args %v lack %s", c.Args, want)
			}
		}
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "snapshot-registry" && m.MountPath == "/etc/upgradeguard/registry"
		})
		secret := slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "snapshot-registry" && v.Secret != nil && v.Secret.SecretName == "registry"
		})
		if !mounted || !secret {
			t.Errorf("the Secret registry is not mounted at /etc/upgradeguard/registry: %v %v", c.VolumeMounts, d.Spec.Template.Spec.Volumes)
		}
		d = typed[appsv1.Deployment](t, render(t, "ug", "ops"), "Deployment", "ug-upgradeguard")
		if slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--snapshot") }) {
			t.Errorf("snapshot flags without snapshot.repository: %v", d.Spec.Template.Spec.Containers[0].Args)
		}
	})
	t.Run("cert-manager off: a Helm-generated CA signs the Service name", func(t *testing.T) {
		m := render(t, "ug", "ops", "certManager.enabled=false")
		if m.has("Certificate") || m.has("Issuer") {
			t.Fatalf("cert-manager objects rendered with certManager.enabled=false: %v", m.kinds())
		}
		sec := typed[corev1.Secret](t, m, "Secret", "ug-upgradeguard-webhook-tls")
		vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", "ug-upgradeguard")
		if _, ok := vwc.Annotations["cert-manager.io/inject-ca-from"]; ok {
			t.Error("inject-ca-from set without cert-manager")
		}
		mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, m, "MutatingWebhookConfiguration", "ug-upgradeguard")
		for _, b := range [][]byte{vwc.Webhooks[0].ClientConfig.CABundle, vwc.Webhooks[1].ClientConfig.CABundle, vwc.Webhooks[2].ClientConfig.CABundle,
			mwc.Webhooks[0].ClientConfig.CABundle} {
			if !bytes.Equal(b, sec.Data["ca.crt"]) {
				t.Error("a caBundle is not the Secret's ca.crt")
			}
		}
		verifyServing(t, sec, "ug-upgradeguard.ops.svc")
	})
	t.Run("ServiceMonitor on scrapes the metrics port", func(t *testing.T) {
		m := render(t, "ug", "ops", "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
		sm := m.find(t, "ServiceMonitor", "ug-upgradeguard")
		if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetLabels()["release"] != "prom" {
			t.Errorf("ServiceMonitor %s labels %v", sm.GetAPIVersion(), sm.GetLabels())
		}
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		svc := typed[corev1.Service](t, m, "Service", "ug-upgradeguard")
		for k, v := range sel {
			if svc.Labels[k] != v {
				t.Errorf("ServiceMonitor selects %s=%s; the Service has %q", k, v, svc.Labels[k])
			}
		}
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" ||
			!slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" }) {
			t.Errorf("ServiceMonitor endpoints %v do not name the Service's metrics port", eps)
		}
	})
	t.Run("failurePolicy Ignore", func(t *testing.T) {
		m := render(t, "ug", "ops", "webhook.failurePolicy=Ignore", "webhook.timeoutSeconds=5", "webhook.excludeNamespaces={flux-system}")
		wh := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", "ug-upgradeguard").Webhooks[0]
		if *wh.FailurePolicy != admissionregistrationv1.Ignore || *wh.TimeoutSeconds != 5 {
			t.Errorf("failurePolicy %s timeout %d", *wh.FailurePolicy, *wh.TimeoutSeconds)
		}
		if got := wh.NamespaceSelector.MatchExpressions[0].Values; !slices.Equal(got, []string{"ops", "flux-system"}) {
			t.Errorf("excluded namespaces %v", got)
		}
	})
	t.Run("replicas 3 share the fleet, each named by its Pod", func(t *testing.T) {
		m := render(t, "ug", "ops", "replicas=3", "controller.targetLeaseDuration=20s", "controller.targetRenewPeriod=5s", "controller.kubeAPIQPS=200")
		d := typed[appsv1.Deployment](t, m, "Deployment", "ug-upgradeguard")
		c, fs := controllerArgs(t, d)
		if flag(t, fs, "kube-api-qps") != "200" || flag(t, fs, "kube-api-burst") != "300" {
			t.Errorf("--kube-api-qps=%s --kube-api-burst=%s, want 200 and the default 300", flag(t, fs, "kube-api-qps"), flag(t, fs, "kube-api-burst"))
		}
		if *d.Spec.Replicas != 3 || flag(t, fs, "replica-id") != "$(POD_NAME)" || flag(t, fs, "target-lease-duration") != "20s" || flag(t, fs, "target-renew-period") != "5s" {
			t.Errorf("replicas %d, --replica-id=%s --target-lease-duration=%s --target-renew-period=%s", *d.Spec.Replicas,
				flag(t, fs, "replica-id"), flag(t, fs, "target-lease-duration"), flag(t, fs, "target-renew-period"))
		}
		// The kubelet expands $(POD_NAME) in args from the container's env.
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAME" })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.name" {
			t.Errorf("POD_NAME is not set from metadata.name: %+v", c.Env)
		}
		// The ClusterRole lets every replica take, renew and hand over Leases.
		role := typed[rbacv1.ClusterRole](t, m, "ClusterRole", "ug-upgradeguard")
		if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, "coordination.k8s.io") && slices.Contains(r.Resources, "leases") &&
				!slices.ContainsFunc([]string{"get", "list", "create", "update", "delete"}, func(v string) bool { return !slices.Contains(r.Verbs, v) })
		}) {
			t.Errorf("the ClusterRole does not let the controller get, list, create, update and delete Leases: %+v", role.Rules)
		}
	})
	t.Run("replicas 2 with leader election and a PDB", func(t *testing.T) {
		m := render(t, "ug", "ops", "replicas=2", "podDisruptionBudget.enabled=true")
		d := typed[appsv1.Deployment](t, m, "Deployment", "ug-upgradeguard")
		_, fs := controllerArgs(t, d)
		if *d.Spec.Replicas != 2 || flag(t, fs, "leader-elect") != "true" {
			t.Errorf("replicas %d leader-elect %s", *d.Spec.Replicas, flag(t, fs, "leader-elect"))
		}
		pdb := typed[policyv1.PodDisruptionBudget](t, m, "PodDisruptionBudget", "ug-upgradeguard")
		if pdb.Spec.MinAvailable.IntValue() != 1 || !equalJSON(t, pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
			t.Errorf("PDB %+v does not cover the Deployment's Pods", pdb.Spec)
		}
	})
	t.Run("webhook off", func(t *testing.T) {
		m := render(t, "ug", "ops", "webhook.enabled=false", "metrics.enabled=false", "policy.create=false")
		for _, k := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Certificate", "Issuer", "Secret", "Service", "StorageMigrationPolicy"} {
			if m.has(k) {
				t.Errorf("%s rendered with the webhook and metrics off", k)
			}
		}
		_, fs := controllerArgs(t, typed[appsv1.Deployment](t, m, "Deployment", "ug-upgradeguard"))
		if flag(t, fs, "enable-webhook") != "false" || flag(t, fs, "metrics-bind-address") != "0" {
			t.Errorf("--enable-webhook=%s --metrics-bind-address=%s", flag(t, fs, "enable-webhook"), flag(t, fs, "metrics-bind-address"))
		}
	})
	t.Run("release-record and CRD gates and the CRD deletion guard off", func(t *testing.T) {
		m := render(t, "ug", "ops", "webhook.releaseRecords.enabled=false", "webhook.crdGate.enabled=false", "webhook.crdDeletion.enabled=false")
		if m.has("MutatingWebhookConfiguration") {
			t.Error("MutatingWebhookConfiguration rendered with webhook.crdGate.enabled=false")
		}
		if vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", "ug-upgradeguard"); len(vwc.Webhooks) != 1 {
			t.Errorf("%d webhooks with webhook.releaseRecords.enabled=false and webhook.crdDeletion.enabled=false, want 1", len(vwc.Webhooks))
		}
	})
	t.Run("CRD deletion guard: its own failurePolicy", func(t *testing.T) {
		m := render(t, "ug", "ops", "webhook.crdDeletion.failurePolicy=Ignore", "webhook.crdDeletion.timeoutSeconds=4")
		vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", "ug-upgradeguard")
		i := slices.IndexFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == "crd-delete.upgradeguard.io" })
		if i < 0 {
			t.Fatalf("no crd-delete.upgradeguard.io webhook in %d webhooks", len(vwc.Webhooks))
		}
		if wh := vwc.Webhooks[i]; *wh.FailurePolicy != admissionregistrationv1.Ignore || *wh.TimeoutSeconds != 4 {
			t.Errorf("crd-delete.upgradeguard.io failurePolicy %s timeout %d, want Ignore 4", *wh.FailurePolicy, *wh.TimeoutSeconds)
		}
		if *vwc.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail {
			t.Errorf("the HelmRelease gate's failurePolicy %s, want Fail (webhook.failurePolicy is its own)", *vwc.Webhooks[0].FailurePolicy)
		}
	})
	t.Run("lease namespaces", func(t *testing.T) {
		m := render(t, "ug", "ops", "leaderElection.namespace=kube-system", "controller.migrationLeaseNamespace=flux-system")
		_, fs := controllerArgs(t, typed[appsv1.Deployment](t, m, "Deployment", "ug-upgradeguard"))
		if flag(t, fs, "leader-election-namespace") != "kube-system" || flag(t, fs, "migration-lease-namespace") != "flux-system" {
			t.Errorf("lease namespaces %s %s", flag(t, fs, "leader-election-namespace"), flag(t, fs, "migration-lease-namespace"))
		}
	})
}

// verifyServing checks that the Secret's tls.crt chains to its ca.crt for dnsName, the way
// the API server verifies the webhook.
func verifyServing(t *testing.T, sec *corev1.Secret, dnsName string) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(sec.Data["ca.crt"]) {
		t.Fatal("ca.crt holds no certificate")
	}
	block, _ := pem.Decode(sec.Data["tls.crt"])
	if block == nil {
		t.Fatal("tls.crt holds no PEM block")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: dnsName}); err != nil {
		t.Errorf("serving certificate does not verify for %s: %v", dnsName, err)
	}
	if len(sec.Data["tls.key"]) == 0 {
		t.Error("tls.key is empty")
	}
}

// TestRenderWebhookMirrorsCanonical: the chart's webhooks (the HelmRelease gate and the
// release-record gate in the ValidatingWebhookConfiguration, the CRD gate in the
// MutatingWebhookConfiguration) agree with the canonical configuration in
// config/webhook/manifests.yaml on everything but names and certificates.
func TestRenderWebhookMirrorsCanonical(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	canon := parse(t, string(data))
	if len(canon.objs) != 2 {
		t.Fatalf("config/webhook/manifests.yaml holds %d objects, want 2", len(canon.objs))
	}
	canonical := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, canon, "ValidatingWebhookConfiguration", "")
	canonicalCRD := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, canon, "MutatingWebhookConfiguration", "")
	m := render(t, "upgradeguard", "upgradeguard-system", "fullnameOverride=upgradeguard")
	rendered := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration", "upgradeguard")
	renderedCRD := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, m, "MutatingWebhookConfiguration", "upgradeguard")
	if len(rendered.Webhooks) != len(canonical.Webhooks) || len(renderedCRD.Webhooks) != len(canonicalCRD.Webhooks) {
		t.Fatalf("chart renders %d+%d webhooks, canonical has %d+%d", len(rendered.Webhooks), len(renderedCRD.Webhooks), len(canonical.Webhooks), len(canonicalCRD.Webhooks))
	}
	type pair struct {
		got, want admissionregistrationv1.ValidatingWebhook
	}
	pairs := []pair{}
	for i := range canonical.Webhooks {
		pairs = append(pairs, pair{rendered.Webhooks[i], canonical.Webhooks[i]})
	}
	// The CRD gate's fields, compared the same way (reinvocationPolicy below).
	asValidating := func(w admissionregistrationv1.MutatingWebhook) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{Name: w.Name, ClientConfig: w.ClientConfig, Rules: w.Rules, FailurePolicy: w.FailurePolicy,
			MatchPolicy: w.MatchPolicy, NamespaceSelector: w.NamespaceSelector, ObjectSelector: w.ObjectSelector, SideEffects: w.SideEffects,
			TimeoutSeconds: w.TimeoutSeconds, MatchConditions: w.MatchConditions}
	}
	pairs = append(pairs, pair{asValidating(renderedCRD.Webhooks[0]), asValidating(canonicalCRD.Webhooks[0])})
	if !equalJSON(t, renderedCRD.Webhooks[0].ReinvocationPolicy, canonicalCRD.Webhooks[0].ReinvocationPolicy) {
		t.Errorf("reinvocationPolicy: chart %v, canonical %v", renderedCRD.Webhooks[0].ReinvocationPolicy, canonicalCRD.Webhooks[0].ReinvocationPolicy)
	}
	for _, p := range pairs {
		got, want := p.got, p.want
		for _, c := range []struct {
			field     string
			got, want any
		}{
			{"name", got.Name, want.Name},
			{"rules", got.Rules, want.Rules},
			{"matchPolicy", got.MatchPolicy, want.MatchPolicy},
			{"failurePolicy", got.FailurePolicy, want.FailurePolicy},
			{"sideEffects", got.SideEffects, want.SideEffects},
			{"timeoutSeconds", got.TimeoutSeconds, want.TimeoutSeconds},
			{"objectSelector", got.ObjectSelector, want.ObjectSelector},
			{"namespaceSelector", got.NamespaceSelector, want.NamespaceSelector},
			{"path", got.ClientConfig.Service.Path, want.ClientConfig.Service.Path},
			{"service", got.ClientConfig.Service.Name + "/" + got.ClientConfig.Service.Namespace, want.ClientConfig.Service.Name + "/" + want.ClientConfig.Service.Namespace},
			{"matchConditions", len(got.MatchConditions), len(want.MatchConditions)},
		} {
			if !equalJSON(t, c.got, c.want) {
				t.Errorf("%s %s: chart %+v, canonical %+v", want.Name, c.field, c.got, c.want)
			}
		}
		if want.Name != "helmrelease.upgradeguard.io" && !equalJSON(t, got.MatchConditions, want.MatchConditions) {
			t.Errorf("%s matchConditions: chart %+v, canonical %+v", want.Name, got.MatchConditions, want.MatchConditions)
		}
	}
}
