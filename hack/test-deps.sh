#!/usr/bin/env bash
# test-deps.sh installs the Debian packages `make test-default` needs besides Go and bin/:
# bash, curl and jq, which deploy/ci/upgradeguard-review.sh (the GitHub Action's and the
# GitLab template's logic) runs and deploy/ci's tests run it with, through hack/apt-deps.sh
# (apt-get, as root; elsewhere it prints the packages to install and exits 2).
set -euo pipefail
exec "$(dirname "$0")/apt-deps.sh" test-deps bash curl jq
