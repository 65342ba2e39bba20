package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// The LeaderWorkerSet CRD of the real lws charts in the fixtures: chart 0.7.0 renders it
// from templates/, chart 0.8.0 ships it in crds/ (kubernetes-sigs/lws#880), so an
// upgrade from one to the other deletes it with every LeaderWorkerSet.
const (
	LWSGroup = "leaderworkerset.x-k8s.io"
	LWSCRD   = "leaderworkersets." + LWSGroup
	// LWSCRDFile is the CRD's file in the fixtures.
	LWSCRDFile = "charts/lws-0.7.0/templates/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
)

// lwsWebhooks are the admission webhook configurations the lws charts render: they send
// every LeaderWorkerSet write to the lws controller, which does not run on a control
// plane without a node, and refuse it (failurePolicy Fail).
var lwsWebhooks = []string{"lws-mutating-webhook-configuration", "lws-validating-webhook-configuration"}

// LWSCRDText is the real LeaderWorkerSet CRD with its API group renamed to group (the CRD
// is then leaderworkersets.GROUP), so that a test can install it beside another copy.
func LWSCRDText(group string) (string, error) {
	fx, err := Fixtures()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(fx, LWSCRDFile))
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(string(data), LWSGroup, group), nil
}

// CreateLeaderWorkerSets creates n LeaderWorkerSets of the LeaderWorkerSet CRD of group
// (LWSGroup, or a renamed one) in namespace ns, at v1. It first deletes the webhook
// configurations an lws chart installed (see lwsWebhooks), so the API server admits them,
// and waits for the CRD to be established.
func CreateLeaderWorkerSets(ctx context.Context, cfg *rest.Config, group, ns string, n int) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ext, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := WaitEstablished(ctx, ext, "leaderworkersets."+group); err != nil {
		return err
	}
	for _, name := range lwsWebhooks {
		err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		err = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return CreateObjects(ctx, cfg, Objects{
		GVR:  schema.GroupVersionResource{Group: group, Version: "v1", Resource: "leaderworkersets"},
		Kind: "LeaderWorkerSet", Namespaces: []string{ns}, PerNS: n,
		Spec: map[string]any{"leaderWorkerTemplate": map[string]any{"workerTemplate": map[string]any{
			"spec": map[string]any{"containers": []any{map[string]any{"name": "worker", "image": "registry.k8s.io/pause:3.10"}}},
		}}},
	})
}

// CountLeaderWorkerSets counts the LeaderWorkerSets of group in every namespace; an
// error when the kind is not served (its CRD is gone).
func CountLeaderWorkerSets(ctx context.Context, cfg *rest.Config, group string) (int, error) {
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	list, err := md.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "leaderworkersets"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list the LeaderWorkerSets of %s: %w", group, err)
	}
	return len(list.Items), nil
}

// CRDLeaves is one way a CRD leaves a Helm release other than the lws move to crds/: the
// chart a release runs, rendering the CRD from templates/, and the chart and values an
// upgrade moves it to, which no longer render it.
type CRDLeaves struct {
	Name string
	// From and To write those charts under dir, around crd (a CRD's YAML), and return
	// their paths.
	From, To func(dir, crd string) (string, error)
	// Set are the upgrade's values (--set).
	Set []string
}

// CRDLeavingCases are the ways a CRD leaves a Helm release by an upgrade: a values toggle
// switched off (crds.enabled, installCRDs, crd.create: astronomer#3433), the subchart that
// rendered it removed, and a move to another chart. Every chart also renders a ConfigMap.
func CRDLeavingCases() []CRDLeaves {
	subchart := func(dir, crd string) (string, error) {
		return leaveChart(dir, "platform", "1.0.0", map[string]string{
			"charts/widgets-crds/Chart.yaml":         "apiVersion: v2\nname: widgets-crds\nversion: 1.0.0\n",
			"charts/widgets-crds/templates/crd.yaml": crd,
		})
	}
	return []CRDLeaves{
		leaveByValue("crds.enabled"), leaveByValue("installCRDs"), leaveByValue("crd.create"),
		{Name: "subchart removed", From: subchart, To: func(dir, _ string) (string, error) {
			return leaveChart(dir, "platform", "2.0.0", map[string]string{})
		}},
		{Name: "chart to chart", From: func(dir, crd string) (string, error) {
			return leaveChart(dir, "widgets", "1.0.0", map[string]string{"templates/crd.yaml": crd})
		}, To: func(dir, _ string) (string, error) {
			return leaveChart(dir, "widgets-operator", "1.0.0", map[string]string{})
		}},
	}
}

// leaveByValue is a chart whose CRD renders while the boolean value at path (a.b) is
// true, as chart values such as crds.enabled, installCRDs and crd.create do; the upgrade
// sets it false.
func leaveByValue(path string) CRDLeaves {
	values, parts := "", strings.Split(path, ".")
	for i, p := range parts {
		values += strings.Repeat("  ", i) + p + ":"
		if i == len(parts)-1 {
			values += " true"
		}
		values += "\n"
	}
	write := func(dir, crd string) (string, error) {
		return leaveChart(dir, "widgets", "1.0.0", map[string]string{"values.yaml": values,
			"templates/crd.yaml": "{{- if .Values." + path + " }}\n" + crd + "\n{{- end }}\n"})
	}
	return CRDLeaves{Name: "values " + path, From: write, To: write, Set: []string{path + "=false"}}
}

// leaveConfigMap is the template every chart of CRDLeavingCases renders beside its CRD.
const leaveConfigMap = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\ndata:\n  chart: {{ .Chart.Name }}\n"

func leaveChart(dir, name, version string, files map[string]string) (string, error) {
	files["templates/configmap.yaml"] = leaveConfigMap
	return WriteChart(filepath.Join(dir, name+"-"+version), name, version, files)
}
