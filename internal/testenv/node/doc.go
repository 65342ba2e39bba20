// Package node runs a real Kubernetes node for the tests, registered to a control plane
// of internal/testenv started with testenv.Options.Node (RunTests starts one so).
//
// Start runs, as root, containerd with the host's runc and CNI plugins (a bridge network
// of its own), and the control plane minor's kubelet, kube-proxy (iptables mode) and
// kube-scheduler from bin/kube/MINOR, plus kube-controller-manager with Controllers on the
// control plane. It builds the sandbox image from ./pause and imports it with the images
// a test asks for: the node pulls nothing. Missing says what the machine lacks, and
// `make e2e` installs and builds it all (hack/node-deps.sh, ./hack/testbin.sh --node).
//
// Node.Stop, which Start registers with t.Cleanup, drains the node (its Pods deleted, the
// kubelet stopping their containers and sandboxes), kills any task left, stops the daemons
// and kube-controller-manager, deletes the Node object, and removes kube-proxy's and the
// kubelet's iptables chains, the Pods' network namespaces, every mount under the node's
// directory, its bridge and the directory (ugnode-* in the temporary directory).
//
// If the test binary is killed (its -timeout panic, SIGKILL), the daemons die with it
// (internal/childproc), but containerd's shims and their containers are re-parented and
// can keep running, and the iptables chains, bridge, mounts and directory stay until the
// machine's next clean-up.
package node
