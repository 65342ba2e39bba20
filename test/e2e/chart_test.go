//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/shard"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/node"
)

// TestChartPod installs the chart as a user without cert-manager does, with only the image
// tag, the pull policy and certManager.enabled=false (the chart generates the webhook's
// certificate) set, into a namespace that enforces Pod Security `restricted`, and checks the Pod that
// the kubelet runs: Ready through its probes, the image's user and read-only root, and
// /metrics served through the chart's Service. Then `helm uninstall` leaves no webhook
// configuration and nothing of the chart's but its CRDs and the leader-election Lease.
// Between the two, the chart's default CRD deletion guard refuses, through the Service,
// the deletion of a CRD that holds objects (crdGuarded).
func TestChartPod(t *testing.T) {
	rel := installChart(t, "upgradeguard-system")
	ns, node, cs := rel.ns, rel.node, rel.cs
	ctx := t.Context()
	if len(rel.pods) != 1 {
		t.Fatalf("%d upgradeguard pods, want 1", len(rel.pods))
	}
	pod := rel.pods[0]

	// The container's main process, seen from the host: the image's user, a read-only root.
	pid := containerPID(t, node, &pod)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	must(t, err, "read the container process's status")
	if uid := statusField(string(status), "Uid:"); uid == "" || strings.Fields(uid)[0] != "65532" {
		t.Errorf("the controller runs as uid %q, want 65532 (the image's nonroot user)", uid)
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	must(t, err, "read the container's mounts")
	if !rootReadOnly(string(mounts)) {
		t.Errorf("the container's root file system is writable, want read-only (the chart's securityContext)")
	}

	// /metrics through the Service, as Prometheus scrapes it.
	body, err := cs.CoreV1().Services(ns).ProxyGet("http", "upgradeguard", "8080", "/metrics", nil).DoRaw(ctx)
	must(t, err, "GET /metrics through the Service")
	for _, m := range []string{"upgradeguard_pending_migrations", "controller_runtime_reconcile_total"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	crdGuarded(t, cs, ns)
	uninstalled(t, rel)
}

// crdGuarded is the CRD deletion guard as the chart installs it by default, served by the
// Pod through the webhook Service: `kubectl delete crd` of a CRD holding three objects is
// refused with the count, the objects all stay readable and the denial is counted on
// /metrics; an empty CRD deletes at once; the annotation the denial names lets the first
// one go with its objects.
func crdGuarded(t *testing.T, cs *kubernetes.Clientset, ns string) {
	t.Helper()
	ctx := t.Context()
	const group = "guard.e2e.upgradeguard.io"
	crd := "leaderworkersets." + group
	text, err := testenv.LWSCRDText(group)
	must(t, err, "read the LeaderWorkerSet CRD")
	file := filepath.Join(t.TempDir(), "crd.yaml")
	must(t, os.WriteFile(file, []byte(text), 0o600), "write the CRD")
	kubectl(t, "apply", "--server-side", "-f", file)
	kubectl(t, "create", "namespace", "e2e-guard")
	must(t, testenv.CreateLeaderWorkerSets(ctx, cp.Config, group, "e2e-guard", 3), "create LeaderWorkerSets")

	out, err := exec.Command(filepath.Join(cp.KubeBin, "kubectl"), "--kubeconfig", cp.Kubeconfig, "delete", "crd", crd).CombinedOutput()
	if err == nil {
		t.Fatalf("kubectl delete crd %s succeeded with 3 objects; want it denied by the chart's guard:\n%s", crd, out)
	}
	for _, want := range []string{`admission webhook "crd-delete.upgradeguard.io" denied the request`,
		crd + ": the API server deletes all 3 LeaderWorkerSet objects with it", "upgradeguard.io/allow-delete=true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the denial lacks %q:\n%s", want, out)
		}
	}
	if n, err := testenv.CountLeaderWorkerSets(ctx, cp.Config, group); err != nil || n != 3 {
		t.Errorf("after the denied deletion: %d LeaderWorkerSets (%v), want 3", n, err)
	}
	body, err := cs.CoreV1().Services(ns).ProxyGet("http", "upgradeguard", "8080", "/metrics", nil).DoRaw(ctx)
	must(t, err, "GET /metrics through the Service")
	if want := `upgradeguard_crd_deletions_denied_total{crd="` + crd + `"} 1`; !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
	}

	// An empty CRD deletes at once.
	empty := strings.ReplaceAll(text, group, "empty."+group)
	emptyFile := filepath.Join(t.TempDir(), "empty.yaml")
	must(t, os.WriteFile(emptyFile, []byte(empty), 0o600), "write the empty CRD")
	kubectl(t, "apply", "--server-side", "-f", emptyFile)
	// Once it is served: before that, listing its objects answers 404, and the guard
	// refuses a deletion whose objects it cannot count. (Not `kubectl wait`: it fails at
	// once on a CRD that has no status.conditions yet, as CI saw.)
	must(t, testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(cp.Config), "leaderworkersets.empty."+group),
		"wait until the empty CRD is Established")
	kubectl(t, "delete", "crd", "leaderworkersets.empty."+group, "--timeout", "1m")

	// The way out the denial names: the annotation, then the CRD goes with its objects.
	kubectl(t, "annotate", "crd", crd, "upgradeguard.io/allow-delete=true")
	kubectl(t, "delete", "crd", crd, "--timeout", "2m")
	kubectl(t, "delete", "namespace", "e2e-guard", "--wait=false")
}

// release is the chart installed on a node of its own: the node, a clientset, the
// release namespace and the controller Pods, each Ready on the node.
type release struct {
	node *node.Node
	cs   *kubernetes.Clientset
	ns   string
	pods []corev1.Pod
	// installStarted is when `helm install` started.
	installStarted time.Time
}

// installChart builds the image (once per test binary), starts a node, and installs the
// chart as release `upgradeguard` into ns, a new namespace that enforces Pod Security
// `restricted`, the way a user without cert-manager does: the image tag, pullPolicy
// Never and certManager.enabled=false, plus set (more --set arguments). It waits until
// the Deployment's Pods are Ready. When the test ends the release is uninstalled (if the
// test has not done it) before the node stops; a failed test logs the Pods, the
// controller's log and the kubelet's.
func installChart(t *testing.T, ns string, set ...string) *release {
	t.Helper()
	started := time.Now()
	_, tag, archive := buildImage(t, e2eVersion)
	node := node.Start(t, cp, node.Options{Images: []string{archive}})
	kubectl(t, "create", "namespace", ns)
	kubectl(t, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pods:\n%s\ncontroller:\n%s\nkubelet:\n%s", kubectlOut("describe", "pods", "-n", ns),
				kubectlOut("logs", "-n", ns, "-l", "app.kubernetes.io/name=upgradeguard", "--prefix", "--tail", "60"), node.Log("kubelet", 40))
		}
		// Cluster-scoped objects of the release (its policy, webhook configurations and
		// ClusterRole) must not outlive the test: the next test installs the chart again.
		if out, err := cp.Helm("uninstall", "upgradeguard", "-n", ns, "--ignore-not-found", "--wait", "--timeout", "2m").CombinedOutput(); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
	})
	args := []string{"install", "upgradeguard", chartDir(t), "-n", ns,
		"--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "certManager.enabled=false", "--wait", "--timeout", "4m"}
	installStarted := time.Now()
	helm(t, append(args, set...)...)

	cs, err := kubernetes.NewForConfig(cp.Config)
	must(t, err, "clientset")
	pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=upgradeguard"})
	must(t, err, "list pods")
	for _, pod := range pods.Items {
		if !podReady(&pod) || pod.Spec.NodeName != node.Name {
			t.Fatalf("pod %s: ready %v on node %q, want Ready on %s", pod.Name, podReady(&pod), pod.Spec.NodeName, node.Name)
		}
	}
	t.Logf("node started and chart installed (%d Pods Ready) in %v", len(pods.Items), time.Since(started).Round(time.Second))
	return &release{node: node, cs: cs, ns: ns, pods: pods.Items, installStarted: installStarted}
}

// uninstalled runs `helm uninstall` and checks what it leaves: no webhook configuration
// (a fail-closed webhook without its Pod would refuse every HelmRelease change), the CRDs
// (Helm never deletes crds/), the controller's leader-election Lease and released
// migration Leases, which the chart README's two commands delete, and nothing else in the
// namespace or the cluster.
func uninstalled(t *testing.T, rel *release) {
	t.Helper()
	cs, ns := rel.cs, rel.ns
	pods := map[string]bool{}
	for _, p := range rel.pods {
		pods[shard.ReplicaLeaseName(p.Name)] = true
	}
	ctx := t.Context()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=upgradeguard"}
	// The positive control: before the uninstall the selectors below find the chart's
	// webhook configuration and cluster roles, so "none after" means they went.
	before, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, sel)
	must(t, err, "list validating webhook configurations")
	roles := kubectlOut("get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance=upgradeguard", "-o", "name")
	if len(before.Items) == 0 || !strings.Contains(roles, "clusterrole") {
		t.Fatalf("before helm uninstall, the selector %s finds %d validating webhook configurations and cluster roles %q: the checks after it would prove nothing",
			sel.LabelSelector, len(before.Items), strings.TrimSpace(roles))
	}
	helm(t, "uninstall", "upgradeguard", "-n", ns, "--wait", "--timeout", "2m")
	vw, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, sel)
	must(t, err, "list validating webhook configurations")
	mw, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, sel)
	must(t, err, "list mutating webhook configurations")
	if len(vw.Items)+len(mw.Items) != 0 {
		t.Errorf("after helm uninstall, %d validating and %d mutating webhook configurations remain", len(vw.Items), len(mw.Items))
	}
	for _, crd := range []string{"storagemigrations.upgradeguard.io", "storagemigrationpolicies.upgradeguard.io"} {
		if out := kubectlOut("get", "crd", crd, "-o", "name"); !strings.Contains(out, crd) {
			t.Errorf("after helm uninstall, CRD %s is gone (%s): Helm keeps crds/", crd, strings.TrimSpace(out))
		}
	}
	// The Pod terminates after the Deployment is gone. Leases stay: the leader-election
	// Lease and the Pod's member Lease (upgradeguard.io/shard=replica), which the controller
	// creates at run time (Helm has deleted the Role that would let the stopping Pod delete
	// them), and a released migration Lease per CRD migrated (the CLI's `migrate` shares
	// them). The chart's README says so and how to delete them.
	var extra []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		extra = nil
		for _, o := range strings.Fields(kubectlOut("get", "all,secrets,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
			"-n", ns, "-o", "name")) {
			if o != "serviceaccount/default" && o != "configmap/kube-root-ca.crt" {
				extra = append(extra, o)
			}
		}
		return len(extra) == 0, nil
	})
	if err != nil {
		t.Errorf("after helm uninstall, %s still holds %v", ns, extra)
	}
	leases, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
	must(t, err, "list Leases in %s", ns)
	for _, l := range leases.Items {
		ours := l.Labels["app.kubernetes.io/managed-by"] == "upgradeguard"
		released := ours && ptr.Deref(l.Spec.HolderIdentity, "") == ""
		member := ours && l.Labels[shard.LabelShard] == shard.KindReplica && pods[l.Name]
		if l.Name != "upgradeguard-controller" && !released && !member {
			t.Errorf("after helm uninstall, Lease %s/%s (holder %q) is neither the leader-election Lease, the Pod's member Lease nor a released migration Lease",
				ns, l.Name, ptr.Deref(l.Spec.HolderIdentity, ""))
		}
	}
	// The README's clean-up leaves nothing.
	kubectl(t, "delete", "lease", "-n", ns, "upgradeguard-controller", "--ignore-not-found")
	kubectl(t, "delete", "lease", "-n", ns, "-l", "app.kubernetes.io/managed-by=upgradeguard")
	if left := strings.TrimSpace(kubectlOut("get", "leases", "-n", ns, "-o", "name")); left != "" {
		t.Errorf("after the README's clean-up, %s still holds %s", ns, left)
	}
	cluster := kubectlOut("get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance=upgradeguard", "-o", "name")
	if strings.TrimSpace(cluster) != "" && !strings.Contains(cluster, "No resources") {
		t.Errorf("after helm uninstall, cluster-scoped objects remain: %s", cluster)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerPID is the host pid of the Pod's first container, from containerd.
func containerPID(t *testing.T, node *node.Node, pod *corev1.Pod) int {
	t.Helper()
	if len(pod.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s has no container status", pod.Name)
	}
	id := pod.Status.ContainerStatuses[0].ContainerID // containerd://ID
	_, id, _ = strings.Cut(id, "://")
	out, err := node.Ctr("tasks", "ls")
	must(t, err, "ctr tasks ls")
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			must(t, err, "pid of %s", id)
			return pid
		}
	}
	t.Fatalf("container %s is not among containerd's tasks:\n%s", id, out)
	return 0
}

func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// rootReadOnly reports whether the mount at / in a mountinfo is read-only.
func rootReadOnly(mountinfo string) bool {
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			return strings.Split(f[5], ",")[0] == "ro"
		}
	}
	return false
}
