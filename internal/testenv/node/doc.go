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
// If the test binary dies without Stop (killed by SIGKILL, its -timeout panic, an exit
// that runs no clean-up), the daemons die with it (internal/childproc), and the node's
// reaper cleans up the rest. Start starts it first: the test binary again, not tied to
// it, which waits for the end of a pipe that only the test binary holds (reaper.go). It
// then kills the daemons, starts the node's containerd again on its own state to kill and
// delete the tasks whose shims kept running (failing that, kills the shims with their
// containers and deletes the containers with runc), and removes what Stop removes with
// the same code: the iptables chains, the network namespaces, the mounts, the bridge and
// the directory. Nothing of the node is left; should the reaper's clean-up fail, it
// writes why to DIR.reaper.log beside the directory. After Stop the reaper exits having
// done nothing. TestNodeCleanedUpAfterKill and TestNodeStopLeavesNothing (build tag e2e,
// run by make e2e and e2e-ci) check both ways on a node running a Pod.
package node
