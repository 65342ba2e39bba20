#!/usr/bin/env bash
# apt-deps.sh WHO PACKAGE... installs the Debian packages a test target needs, for
# hack/node-deps.sh and hack/argocd-deps.sh (WHO names the caller in messages). It uses
# apt-get, so it runs on Debian and Ubuntu as root; elsewhere it prints the packages to
# install and exits 2. Packages already installed are left alone, so it is cheap to run
# before every run.
set -euo pipefail

who=$1
shift
need=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
((${#need[@]} == 0)) && exit 0

if ! command -v apt-get >/dev/null; then
  echo "$who: install these packages with your system's package manager: ${need[*]}" >&2
  exit 2
fi
if ((EUID != 0)); then
  echo "$who: installing packages needs root; run: sudo apt-get install -y ${need[*]}" >&2
  exit 2
fi
echo "$who: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
