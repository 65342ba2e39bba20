#!/usr/bin/env bash
# argocd-deps.sh installs what `make test-argocd` runs beside Argo CD's own binary: Redis
# (Argo CD's repo-server and application-controller keep their caches there) and git (the
# repo-server clones the tests' repositories with the git command), through
# hack/apt-deps.sh (apt-get, as root; elsewhere it prints the packages and exits 2).
# Where an init system runs, Debian's package also starts a system Redis on 6379; the
# tests start their own on a free port and use nothing of it.
set -euo pipefail
exec "$(dirname "$0")/apt-deps.sh" argocd-deps redis-server git
