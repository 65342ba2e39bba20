#!/usr/bin/env bash
# node-deps.sh installs what a real node in the tests needs (internal/testenv's Node and
# `make e2e`): containerd and runc to run containers, the CNI plugins for the Pod network,
# and iptables and conntrack, which the kubelet calls. It uses apt-get, so it runs on
# Debian and Ubuntu as root; elsewhere it prints the packages to install and exits 2.
# Packages already installed are left alone, so it is cheap to run before every e2e run.
set -euo pipefail

pkgs=(containerd runc containernetworking-plugins iptables conntrack)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
((${#need[@]} == 0)) && exit 0

if ! command -v apt-get >/dev/null; then
  echo "node-deps: install these packages with your system's package manager: ${need[*]}" >&2
  exit 2
fi
if ((EUID != 0)); then
  echo "node-deps: a real node needs root; run: sudo apt-get install -y ${need[*]}" >&2
  exit 2
fi
echo "node-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
