#!/usr/bin/env bash
# node-deps.sh installs what a real node in the tests needs (internal/testenv/node and
# `make e2e`): containerd and runc to run containers, the CNI plugins for the Pod network,
# and iptables and conntrack, which the kubelet calls (through hack/apt-deps.sh: apt-get,
# as root; elsewhere it prints the packages to install and exits 2).
set -euo pipefail
exec "$(dirname "$0")/apt-deps.sh" node-deps containerd runc containernetworking-plugins iptables conntrack
