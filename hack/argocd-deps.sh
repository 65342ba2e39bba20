#!/usr/bin/env bash
# argocd-deps.sh installs what `make test-argocd` runs beside Argo CD's own binary: Redis
# (Argo CD's repo-server and application-controller keep their caches there) and git (the
# repo-server clones the tests' repositories with the git command). It uses apt-get, so it
# runs on Debian and Ubuntu as root; elsewhere it prints the packages to install and
# exits 2. Packages already installed are left alone.
set -euo pipefail

pkgs=(redis-server git)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
((${#need[@]} == 0)) && exit 0

if ! command -v apt-get >/dev/null; then
  echo "argocd-deps: install these packages with your system's package manager: ${need[*]}" >&2
  exit 2
fi
if ((EUID != 0)); then
  echo "argocd-deps: installing packages needs root; run: sudo apt-get install -y ${need[*]}" >&2
  exit 2
fi
echo "argocd-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Where an init system runs, Debian's package also starts a system Redis on 6379; the tests
# start their own on a free port and use nothing of it.
