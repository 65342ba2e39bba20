#!/usr/bin/env bash
# testbin.sh builds the real binaries that tests and the demo run against, from the Go
# module proxy, and skips each one that bin/ already holds at its pinned version:
#   bin/kube/1.NN/  kube-apiserver, kube-controller-manager, kubectl and the etcd that
#                   Kubernetes 1.NN was released with, one directory per minor, side by side;
#   bin/helm        Helm 4, and bin/helm3, Helm 3 (releases installed the way Helm 3 users did);
#   bin/flux/       Flux's source-controller and helm-controller, run outside the cluster;
#   bin/argocd/     Argo CD (only with --argocd): one busybox binary, argocd, that runs as the
#                   repo-server or the application-controller by ARGOCD_BINARY_NAME, with its
#                   CRDs, base config objects and git wrapper from the same module.
# Each is built through a pinned tools module under hack/tools (hack/kube-tools.sh writes the
# one for a new Kubernetes version). Builds land in the Go build cache, so a machine (or CI)
# that keeps the cache rebuilds in seconds.
#
# Usage: hack/testbin.sh [--demo] [--kube MINORS] [--no-flux] [--argocd]
#   (no flags)     what `make test` needs: the default minor ($KUBE_DEFAULT), the minor CI also
#                  runs check, migrate and the gate on ($KUBE_CI), Helm 4 and 3, and Flux.
#   --demo         only what `make demo` runs: kube-apiserver and etcd of the default minor, and
#                  Helm 4. A newcomer's first demo waits for nothing else.
#   --kube MINORS  the control planes of these minors (comma-separated: 1.32, default,
#                  oldest, newest; or "all", or "none") instead of the default and the
#                  oldest; `make test-matrix` uses --kube all, `make test-newest` --kube
#                  newest (the last minor in the file, a pre-release before its GA).
#   --no-flux, --no-helm
#                  leave out Flux's controllers, or the Helm CLIs. With --kube none they make
#                  a build of one part alone (.ci/run's builder builds each later part's
#                  binaries so, beside the tests, and no two builds write one file).
#   --flux-only    only Flux's controllers (make demo-flux).
#   --node         also what a real test node runs (make e2e): the default minor's kubelet,
#                  kube-proxy and kube-scheduler.
#   --argocd       also Argo CD (make test-argocd). Not built by default: it is a 203 MiB cgo
#                  binary whose first build takes 25-40 minutes on two cores, and its module
#                  needs a Go 1.27 toolchain ($ARGOCD_GOTOOLCHAIN, which the go command fetches
#                  from the module proxy; this module alone uses it).
# The Kubernetes minors and versions are internal/testenv/kube-versions (one file for the
# tests, this script and the Makefile). Kubernetes 1.38 is served as a pre-release until its
# GA (2026-12-16), and needs Go 1.27: its control plane builds with its toolchain from that
# file (fetched like Argo CD's), the rest with the machine's Go. When v1.38.0 is served, its
# version in that file is the swap: this script then rewrites hack/tools/kube-1.38.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
stamps="$bin/.stamps"
mkdir -p "$bin" "$stamps"

# The Kubernetes minors we test, each at the newest patch (or pre-release, before a minor's
# GA) the module proxy serves, and the Go toolchain a minor needs beyond the machine's:
# KUBE_DEFAULT is the newest at a GA version, KUBE_CI the oldest, KUBE_NEWEST the newest.
declare -A KUBE=() KUBE_GOTOOLCHAIN=()
KUBE_ALL="" KUBE_DEFAULT=""
while read -r m v toolchain; do
  [[ -z $m || $m == \#* ]] && continue
  KUBE[$m]=$v KUBE_ALL+="${KUBE_ALL:+ }$m"
  [[ -z $toolchain ]] || KUBE_GOTOOLCHAIN[$m]=$toolchain
  [[ $v == *-* ]] || KUBE_DEFAULT=$m
done <"$root/internal/testenv/kube-versions"
KUBE_CI=${KUBE_ALL%% *} KUBE_NEWEST=${KUBE_ALL##* }
HELM_VERSION=v4.3.1
HELM3_VERSION=v3.22.0
HELM_CONTROLLER_VERSION=v1.6.2
SOURCE_CONTROLLER_VERSION=v1.9.1
ARGOCD_VERSION=v3.6.1
ARGOCD_GOTOOLCHAIN=go1.27.3

demo=false flux=true helm=true node=false argocd=false minors="$KUBE_DEFAULT $KUBE_CI"
while (($#)); do
  case "$1" in
    --demo) demo=true; flux=false; minors=$KUBE_DEFAULT ;;
    --kube)
      [[ $# -ge 2 ]] || { echo "testbin: --kube needs a list of minors, for example --kube 1.32,1.37" >&2; exit 2; }
      minors=${2//,/ }; [[ $minors == all ]] && minors=$KUBE_ALL; [[ $minors == none ]] && minors=""
      minors=${minors/default/$KUBE_DEFAULT} minors=${minors/oldest/$KUBE_CI} minors=${minors/newest/$KUBE_NEWEST}; shift ;;
    --no-flux) flux=false ;;
    --no-helm) helm=false ;;
    --flux-only) minors="" helm=false ;;
    --node) node=true ;;
    --argocd) argocd=true ;;
    --with-kcm | --with-kubectl) ;; # always built now; accepted for older callers
    *) echo "testbin: unknown argument $1 (see the usage at the top of hack/testbin.sh)" >&2; exit 2 ;;
  esac
  shift
done
for m in $minors; do
  [[ -n ${KUBE[$m]:-} ]] || { echo "testbin: Kubernetes $m is not one of the tested minors ($KUBE_ALL)" >&2; exit 2; }
done

# stampfile PATH: the stamp recording PATH's version (bin/kube/1.37/etcd -> .stamps/kube_1.37_etcd).
stampfile() {
  local name=${1#"$bin"/}
  echo "$stamps/${name//\//_}"
}

# need PATH VERSION: true when PATH is missing or was built at another version.
need() {
  [[ -x "$1" && -f "$(stampfile "$1")-$2" ]] && return 1
  return 0
}

stamp() {
  local s
  s=$(stampfile "$1")
  rm -f "$s-"*
  touch "$s-$2"
}

# build OUT VERSION MODULE_DIR LDFLAGS PACKAGE: a static build, unless the call sets
# TESTBIN_CGO=1 (as --argocd does; a CGO_ENABLED the user exported changes nothing here).
build() {
  local out=$1 version=$2 dir=$3 ldflags=$4 pkg=$5
  need "$out" "$version" || return 0
  echo "testbin: building ${out#"$root"/} $version"
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && CGO_ENABLED=${TESTBIN_CGO:-0} go build -ldflags "$ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  stamp "$out" "$version"
}

kube_ldflags() { # VERSION
  local v=${1#v} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$1 \
-X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/component-base/version.gitTreeState=clean"
}

for m in $minors; do
  version=${KUBE[$m]} tools="$root/hack/tools/kube-$m" dest="$bin/kube/$m"
  toolchain=${KUBE_GOTOOLCHAIN[$m]:-$(go env GOTOOLCHAIN)}
  if ! grep -qF "Generated by hack/kube-tools.sh $version." "$tools/go.mod" 2>/dev/null; then
    echo "testbin: hack/tools/kube-$m does not pin $version: writing it (hack/kube-tools.sh $version); commit the result"
    GOTOOLCHAIN=$toolchain "$root/hack/kube-tools.sh" "$version"
  fi
  etcd=$(sed -n 's|^require go.etcd.io/etcd/server/v3 \(v[0-9.]*\)$|\1|p' "$tools/etcd/go.mod")
  GOTOOLCHAIN=$toolchain build "$dest/etcd" "$etcd" "$tools/etcd" "-s -w" .
  names="kube-apiserver kube-controller-manager kubectl"
  $demo && names=kube-apiserver
  for name in $names; do
    GOTOOLCHAIN=$toolchain build "$dest/$name" "$version" "$tools" "$(kube_ldflags "$version")" "k8s.io/kubernetes/cmd/$name"
  done
done

if $node; then
  version=${KUBE[$KUBE_DEFAULT]}
  for name in kubelet kube-proxy kube-scheduler; do
    build "$bin/kube/$KUBE_DEFAULT/$name" "$version" "$root/hack/tools/kube-$KUBE_DEFAULT" "$(kube_ldflags "$version")" "k8s.io/kubernetes/cmd/$name"
  done
fi

if $helm; then
  build "$bin/helm" "$HELM_VERSION" "$root/hack/tools/helm" \
    "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" helm.sh/helm/v4/cmd/helm
  if ! $demo; then
    build "$bin/helm3" "$HELM3_VERSION" "$root/hack/tools/helm3" \
      "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION" helm.sh/helm/v3/cmd/helm
  fi
fi

if $flux; then
  build "$bin/flux/helm-controller" "$HELM_CONTROLLER_VERSION" "$root/hack/tools/helm-controller" "-s -w" github.com/fluxcd/helm-controller
  build "$bin/flux/source-controller" "$SOURCE_CONTROLLER_VERSION" "$root/hack/tools/source-controller" "-s -w" github.com/fluxcd/source-controller
fi

if $argocd; then
  # Built with cgo, as it was first built and run here; the version is set the way Argo
  # CD's Makefile sets it (the binary reports v3.6.1+unknown: no commit is stamped).
  TESTBIN_CGO=1 GOTOOLCHAIN=$ARGOCD_GOTOOLCHAIN build "$bin/argocd/argocd" "$ARGOCD_VERSION" "$root/hack/tools/argocd" \
    "-s -w -X github.com/argoproj/argo-cd/v3/common.version=${ARGOCD_VERSION#v}" github.com/argoproj/argo-cd/v3/cmd
  # What a local Argo CD needs beside its binary, from the same module: its CRDs, the base
  # config objects (argocd-cm and friends) and the git wrapper the repo-server runs from
  # PATH (without it every manifest generation fails with "permission denied").
  src=$(cd "$root/hack/tools/argocd" && GOTOOLCHAIN=$ARGOCD_GOTOOLCHAIN go list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3)
  mkdir -p "$bin/argocd/manifests/crds" "$bin/argocd/manifests/config"
  install -m 0644 "$src"/manifests/crds/*-crd.yaml "$bin/argocd/manifests/crds/"
  install -m 0644 "$src"/manifests/base/config/argocd-*.yaml "$bin/argocd/manifests/config/"
  install -m 0755 "$src/hack/git-verify-wrapper.sh" "$bin/argocd/git-verify-wrapper.sh"
fi

ready=()
[[ -n $minors ]] && ready+=("Kubernetes ${minors// /, } (bin/kube/MINOR)")
$node && ready+=("the kubelet, kube-proxy and kube-scheduler of Kubernetes $KUBE_DEFAULT")
$helm && ready+=("Helm $HELM_VERSION")
$helm && ! $demo && ready+=("Helm 3 $HELM3_VERSION")
$flux && ready+=("Flux source-controller $SOURCE_CONTROLLER_VERSION and helm-controller $HELM_CONTROLLER_VERSION")
$argocd && ready+=("Argo CD $ARGOCD_VERSION (bin/argocd/argocd)")
msg=$(printf ', %s' "${ready[@]}")
echo "testbin: ready in bin/: ${msg#, }"
