#!/usr/bin/env bash
# test-matrix.sh runs every package whose tests start a control plane (they import
# internal/testenv or one of its packages: node, flux, argocd, servers) on each Kubernetes
# minor, and prints a table of package x minor.
# Usage: hack/test-matrix.sh [MINOR ...]   (default: every tested minor; build them first
# with ./hack/testbin.sh --kube all, which `make test-matrix` does). Logs go to
# $MATRIX_LOGS (default: a temporary directory). Exits 1 when any cell failed.
set -uo pipefail
cd "$(dirname "$0")/.."
minors=("$@")
((${#minors[@]})) || mapfile -t minors < <(awk '!/^#/ && NF { print $1 }' internal/testenv/kube-versions)
logs=${MATRIX_LOGS:-$(mktemp -d -t upgradeguard-matrix-XXXX)}
mkdir -p "$logs"
timeout=${TEST_TIMEOUT:-30m}

mod=$(go list -m)
mapfile -t pkgs < <(go list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
  awk -v t="$mod/internal/testenv" '{ for (i = 2; i <= NF; i++) if ($i == t || index($i, t "/") == 1) { print $1; break } }')

declare -A result
failed=0
for m in "${minors[@]}"; do
  for p in "${pkgs[@]}"; do
    short=${p#"$mod"/}
    log="$logs/${m}_${short//\//_}.log"
    echo "test-matrix: Kubernetes $m: $short" >&2
    # Shuffled like make test; a failing log starts with the -test.shuffle seed to repeat.
    if UPGRADEGUARD_KUBE_VERSION=$m go test -count=1 -shuffle=on -timeout "$timeout" "$p" >"$log" 2>&1; then
      result[$m,$short]=pass
    else
      result[$m,$short]=FAIL
      failed=1
    fi
  done
done

printf '\n| package |'; printf ' %s |' "${minors[@]}"; printf '\n|---|'; printf -- '---|%.0s' "${minors[@]}"; echo
for p in "${pkgs[@]}"; do
  short=${p#"$mod"/}
  printf '| %s |' "$short"
  for m in "${minors[@]}"; do printf ' %s |' "${result[$m,$short]}"; done
  echo
done
echo
echo "test-matrix: logs in $logs"
exit $failed
