#!/usr/bin/env bash
# testbin.sh builds the real control plane and Helm CLI that tests and the demo run against:
#   bin/kube-apiserver, bin/kube-controller-manager, bin/kubectl, bin/etcd, bin/helm (Helm 4)
#   and bin/helm3 (Helm 3: releases installed the way Helm 3 users did, then upgraded by Helm 4).
#   kcm is built because the release-safety tests need PV binding, garbage collection and
#   namespace cleanup; kubectl because tests reproduce operators' `kubectl patch` with the
#   real client. --with-kcm and --with-kubectl are accepted for older callers.
# Each binary is built from the Go module proxy through the pinned tools modules under
# hack/tools, and skipped when bin/ already holds it at the pinned version. Builds land in
# the Go build cache, so a machine (or CI) that keeps the cache rebuilds in seconds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
stamps="$bin/.stamps"
mkdir -p "$bin" "$stamps"

KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
HELM_VERSION=v4.3.1
HELM3_VERSION=v3.22.0

# --demo builds only what `make demo` runs (kube-apiserver, etcd, Helm 4): a newcomer's
# first demo does not wait for the binaries only the tests need.
demo=false
for arg in "$@"; do
  case "$arg" in
    --demo) demo=true ;;
    --with-kcm | --with-kubectl) ;; # always built now
    *) echo "testbin: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# need NAME VERSION: true when bin/NAME is missing or was built at another version.
need() {
  [[ -x "$bin/$1" && -f "$stamps/$1-$2" ]] && return 1
  return 0
}

stamp() {
  rm -f "$stamps/$1-"*
  touch "$stamps/$1-$2"
}

kube_ldflags() {
  local v=${KUBE_VERSION#v} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
-X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/component-base/version.gitTreeState=clean"
}

build_kube() { # NAME
  local name=$1
  if need "$name" "$KUBE_VERSION"; then
    echo "testbin: building $name $KUBE_VERSION (first build takes about 5 minutes on 2 cores)"
    (cd "$root/hack/tools/kube-apiserver" && \
      CGO_ENABLED=0 go build -ldflags "$(kube_ldflags)" -o "$bin/$name" "k8s.io/kubernetes/cmd/$name")
    stamp "$name" "$KUBE_VERSION"
  fi
}

build_kube kube-apiserver
if ! $demo; then
  build_kube kube-controller-manager
  build_kube kubectl
fi

if need etcd "$ETCD_VERSION"; then
  echo "testbin: building etcd $ETCD_VERSION"
  (cd "$root/hack/tools/etcd" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$bin/etcd" .)
  stamp etcd "$ETCD_VERSION"
fi

if need helm "$HELM_VERSION"; then
  echo "testbin: building helm $HELM_VERSION"
  (cd "$root/hack/tools/helm" && CGO_ENABLED=0 go build \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    -o "$bin/helm" helm.sh/helm/v4/cmd/helm)
  stamp helm "$HELM_VERSION"
fi

if $demo; then
  echo "testbin: ready for the demo: kube-apiserver $KUBE_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION in bin/ (make testbin builds the rest)"
  exit 0
fi

if need helm3 "$HELM3_VERSION"; then
  echo "testbin: building helm3 $HELM3_VERSION"
  (cd "$root/hack/tools/helm3" && CGO_ENABLED=0 go build \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION" \
    -o "$bin/helm3" helm.sh/helm/v3/cmd/helm)
  stamp helm3 "$HELM3_VERSION"
fi

echo "testbin: ready: kube-apiserver, kube-controller-manager and kubectl $KUBE_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION, helm3 $HELM3_VERSION in bin/"
