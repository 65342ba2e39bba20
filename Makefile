# upgradeguard: the front door. `make help` lists the targets.
SHELL := /usr/bin/env bash
BIN   := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GOLANGCI_LINT_VERSION := v2.15.0
TEST_TIMEOUT ?= 30m
BENCH_N ?= 20000

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Targets:\n"} /^[a-zA-Z0-9_-]+:.*##/ { printf "  %-10s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

CLI_PKG := github.com/upgradeguard/upgradeguard/internal/cli
COMMIT  := $(shell git rev-parse HEAD 2>/dev/null)
COMMIT_DATE := $(shell git log -1 --format=%cI 2>/dev/null)

# CGO_ENABLED=0 as the release binaries (hack/dist). With cgo, kustomize (linked through
# cli-runtime) brings in the plugin package, so the linker builds for plugins: it keeps every
# method of every linked type and exports every symbol to the dynamic loader. 104 MB
# instead of 80 MB, and 85-90 MiB peak RSS for `version` instead of 55-57 MiB
# (docs/benchmarks.md, CLI start-up weight).
.PHONY: build
build: ## Build bin/upgradeguard (static, as released)
	CGO_ENABLED=0 go build -ldflags "-s -w -X $(CLI_PKG).Version=$(VERSION) -X $(CLI_PKG).Commit=$(COMMIT) -X $(CLI_PKG).BuildDate=$(COMMIT_DATE)" -o $(BIN)/upgradeguard ./cmd/upgradeguard

# Release artefacts (hack/dist). RELEASE_VERSION defaults to the v* tag on HEAD, else a Go
# pseudo-version of HEAD; every timestamp is the commit time (or SOURCE_DATE_EPOCH).
DIST ?= $(CURDIR)/dist
RELEASE_VERSION ?=

.PHONY: image
image: ## Build the OCI image index (linux/amd64, linux/arm64) into dist/image, without a container daemon
	go run ./hack/dist -out $(DIST) -version "$(RELEASE_VERSION)" image

.PHONY: dist
dist: $(BIN)/cyclonedx-gomod $(BIN)/validate-krew-manifest ## Build release archives, checksums, SBOMs, the krew manifest and the Helm plugins into dist/
	go run ./hack/dist -out $(DIST) -version "$(RELEASE_VERSION)" -cyclonedx-gomod $(BIN)/cyclonedx-gomod archives
	$(BIN)/validate-krew-manifest -manifest $(DIST)/plugins/upgradeguard.yaml -skip-install

$(BIN)/cyclonedx-gomod: hack/tools/cyclonedx-gomod/go.mod
	cd hack/tools/cyclonedx-gomod && CGO_ENABLED=0 go build -o $(BIN)/cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod

$(BIN)/validate-krew-manifest: hack/tools/krew/go.mod
	cd hack/tools/krew && CGO_ENABLED=0 go build -o $(BIN)/validate-krew-manifest sigs.k8s.io/krew/cmd/validate-krew-manifest

.PHONY: testbin
testbin: ## Build the real control planes, the Helm CLIs and Flux's controllers into bin/ (skips what is current)
	./hack/testbin.sh

# CI runs everything on the default Kubernetes minor (the newest GA one in
# internal/testenv/kube-versions), and again on the oldest one and on the newest one (a
# pre-release before its GA) the packages whose answers depend most on the API server's
# version: check, migrate and the gate, the CRD schema judges (crdschema: what the API
# server's own validation refuses changes between minors), and every package that asserts
# the API server's own storedVersions rejection in the running minor's wording
# (crdversions.WordingFor): the webhook, the CLI, applycheck and the Flux incident tests;
# and the same Flux scenarios through upgradeguard's gates (fluxgate).
KUBE_VERSIONS := internal/testenv/kube-versions
KUBE_DEFAULT := $(shell awk '!/^\#/ && NF && $$2 !~ /-/ { m = $$1 } END { print m }' $(KUBE_VERSIONS))
KUBE_CI := $(shell awk '!/^\#/ && NF { print $$1; exit }' $(KUBE_VERSIONS))
KUBE_NEWEST := $(shell awk '!/^\#/ && NF { m = $$1 } END { print m }' $(KUBE_VERSIONS))
KUBE_CI_PACKAGES := ./pkg/check/... ./pkg/migrate/... ./pkg/gate/... ./pkg/crdschema/... ./pkg/admissionpolicy/... \
	./internal/webhook/... ./internal/cli/... ./pkg/applycheck/... ./test/fluxtest/... \
	./test/fluxgate/... ./pkg/kubeclient/...

# Every test must run: hack/noskip reads go test -json, prints what a plain go test would
# (result lines and the output of failing tests) and fails the run if a test skipped.
# Tests run in a shuffled order (a new seed each run), so none depends on another having
# run first; for a failed package noskip prints the command that repeats its order.
NOSKIP := $(BIN)/noskip
# Test packages run TEST_P at a time (go test -p; its default is the number of cores). Our
# packages mostly wait on API servers and controllers: two at a time kept 2 cores 15-60%
# busy (40-85% beside the node tests), so a third uses what is left.
TEST_P ?= 3
GOTEST := go test -json -count=1 -shuffle=on -p $(TEST_P) -timeout $(TEST_TIMEOUT)

$(BIN)/noskip: hack/noskip/main.go
	go build -o $(BIN)/noskip ./hack/noskip

# The release tests (hack/dist) cross-compile the binaries for every image platform: about
# 2 minutes from a warm build cache, 18 from a cold one (compiling every dependency for
# linux/arm64 too), so they are a part of their own that CI runs only when the budget
# allows (.ci/run).
DIST_PACKAGES := ./hack/dist/...

.PHONY: test test-default test-dist test-oldest test-newest
test: test-default test-dist test-oldest test-newest ## Run unit and integration tests (real kube-apiserver, kube-controller-manager, etcd, Helm and Flux), the release builds, then the version-dependent packages on the oldest and the newest minor; fails if a test skips

.PHONY: testbin-default
testbin-default: ## Build only what make test-default runs on: the default minor, Helm 4 and 3, Flux
	./hack/testbin.sh --kube default

# The system packages the suite runs besides bin/ (curl and jq for deploy/ci's script).
.PHONY: test-deps
test-deps: ## Install the system packages make test-default needs: curl and jq (apt-get; needs root unless already installed)
	./hack/test-deps.sh

test-default: $(BIN)/noskip testbin-default test-deps ## The whole suite on the default minor, but for the release builds (make test-dist)
	set -o pipefail; pkgs=$$(go list ./... | grep -Ev '/hack/dist(/|$$)') && $(GOTEST) $$pkgs | $(NOSKIP)

test-dist: $(BIN)/noskip testbin-default ## The release builds: archives, the krew manifest, the Helm plugins and the image, cross-compiled for every platform
	set -o pipefail; $(GOTEST) $(DIST_PACKAGES) | $(NOSKIP)

test-oldest: $(BIN)/noskip ## KUBE_CI_PACKAGES on the oldest minor
	./hack/testbin.sh --kube oldest
	set -o pipefail; UPGRADEGUARD_KUBE_VERSION=$(KUBE_CI) $(GOTEST) $(KUBE_CI_PACKAGES) | $(NOSKIP) -env UPGRADEGUARD_KUBE_VERSION=$(KUBE_CI)

# The newest minor is a pre-release until its GA (its control plane builds with the Go
# toolchain kube-versions names for it). At its GA it becomes the default minor too, and
# this target repeats part of test-default until the next minor's pre-release is added.
test-newest: $(BIN)/noskip ## KUBE_CI_PACKAGES on the newest minor (a pre-release before its GA)
	./hack/testbin.sh --kube newest
	set -o pipefail; UPGRADEGUARD_KUBE_VERSION=$(KUBE_NEWEST) $(GOTEST) $(KUBE_CI_PACKAGES) | $(NOSKIP) -env UPGRADEGUARD_KUBE_VERSION=$(KUBE_NEWEST)

.PHONY: e2e node-bin
node-bin: ## Build what a real test node runs into bin/ (installs containerd, runc, the CNI plugins, iptables and conntrack with apt-get; needs root)
	./hack/node-deps.sh
	./hack/testbin.sh --kube $(KUBE_DEFAULT) --node

e2e: $(BIN)/noskip node-bin ## Run upgradeguard as users install it: the image and the chart on a real node (needs root; installs containerd, runc and the CNI plugins with apt-get)
	set -o pipefail; $(GOTEST) -tags e2e ./test/e2e/... | $(NOSKIP)
	set -o pipefail; $(GOTEST) -tags e2e ./internal/testenv/node/... | $(NOSKIP)

# What CI can afford of e2e: the chart's Pod on a real node and Job mode on a second
# cluster's node (the image, the chart, the Job with its generated RBAC), without the long
# migrations of the hand-over and upgrade tests. Same set-up steps as e2e. Both also run
# the node harness's own test (a node whose test binary is killed is cleaned up), after
# test/e2e and not beside it: two nodes on one host share the iptables chains.
# noskip -want fails the run when a name here matches no test (renamed or removed).
E2E_CI_LIST  := TestChartPod TestHelmControllerHeldThroughService TestJobMode TestJobModeMissingRule TestJobModeFieldLoss TestJobModeNoResult
empty :=
space := $(empty) $(empty)
comma := ,
E2E_CI_TESTS := ^($(subst $(space),|,$(E2E_CI_LIST)))$$

.PHONY: e2e-ci
e2e-ci: $(BIN)/noskip node-bin ## Run the e2e subset CI can afford: the chart's Pod and Job mode on a real node (needs root, as e2e)
	set -o pipefail; $(GOTEST) -tags e2e -run '$(E2E_CI_TESTS)' ./test/e2e/... | $(NOSKIP) -want '$(subst $(space),$(comma),$(E2E_CI_LIST))'
	set -o pipefail; $(GOTEST) -tags e2e ./internal/testenv/node/... | $(NOSKIP)

# The e2e tests e2e-ci leaves out, the long migrations: the chart's default policy on the
# Flux incident, the two-replica hand-over, the three-replica fleet failover and helm upgrade
# mid-migration (about 12 minutes here).
# .ci/run's second lane runs them after e2e-ci when its budget leaves the time.
E2E_LONG_LIST  := TestPolicyMigratesFluxIncident TestTwoReplicasHandOver TestFleetShardFailover TestHelmUpgradeMidMigration
E2E_LONG_TESTS := ^($(subst $(space),|,$(E2E_LONG_LIST)))$$

.PHONY: e2e-long
e2e-long: $(BIN)/noskip node-bin ## Run the e2e tests e2e-ci leaves out: the default policy on the Flux incident, the replica hand-over, the fleet failover, helm upgrade mid-migration (needs root, as e2e)
	set -o pipefail; $(GOTEST) -tags e2e -run '$(E2E_LONG_TESTS)' ./test/e2e/... | $(NOSKIP) -want '$(subst $(space),$(comma),$(E2E_LONG_LIST))'

# Argo CD's binary (a 203 MiB cgo build of 25-40 minutes on two cores, through its own Go
# 1.27 toolchain) is not part of testbin: this target builds it and what its tests run
# on, installs Redis (hack/argocd-deps.sh, apt-get), and runs test/argocd (build tag argocd).
.PHONY: argocd-bin test-argocd
argocd-bin: ## Build Argo CD and what its tests run on into bin/ (installs redis-server with apt-get)
	./hack/argocd-deps.sh
	./hack/testbin.sh --kube $(KUBE_DEFAULT) --no-flux --argocd

test-argocd: $(BIN)/noskip argocd-bin ## Run the real Argo CD (repo-server, application-controller, Redis) through the storage boundary, with and without the CRD gate, and a sync wave held on a StorageMigration (builds Argo CD first)
	set -o pipefail; $(GOTEST) -tags argocd ./test/argocd/... | $(NOSKIP)

.PHONY: test-matrix
test-matrix: ## Run every control-plane test package on every Kubernetes minor of internal/testenv/kube-versions and print a pass/fail table
	./hack/testbin.sh --kube all
	./hack/test-matrix.sh

.PHONY: unit
unit: ## Run only the tests that need no control plane
	go test -count=1 -shuffle=on -short ./...

# The demo's last act needs Flux's controllers, whose first build takes about 15 minutes. It
# starts once what the first acts need is built (so they start as soon as before), runs in
# the background while they run (log: $(FLUX_BUILD_LOG)), and the demo waits for it before
# the Flux act. Later runs find it built and wait for nothing.
FLUX_BUILD_LOG    := $(BIN)/flux-build.log
FLUX_BUILD_STATUS := $(BIN)/flux-build.status

.PHONY: demo
demo: build ## Reproduce the Flux storage-version incidents, predict and fix them, then the real helm-controller upgrading through the gate
	./hack/testbin.sh --demo
	@rm -f $(FLUX_BUILD_STATUS)
	@echo "Building Flux's controllers in the background for the last act (log: $(FLUX_BUILD_LOG))"
	@{ ./hack/testbin.sh --flux-only > $(FLUX_BUILD_LOG) 2>&1; echo $$? > $(FLUX_BUILD_STATUS); } &
	go run ./hack/demo -flux-build-log $(FLUX_BUILD_LOG) -flux-build-status $(FLUX_BUILD_STATUS)

.PHONY: demo-flux
demo-flux: ## Run only the demo's last act: the real Flux controllers upgrading a semver-range HelmRelease through the gate
	./hack/testbin.sh --demo
	./hack/testbin.sh --flux-only
	go run ./hack/demo -only flux

.PHONY: bench
bench: testbin build ## Measure check and migrate against the local control plane, with ratios to in-run baselines
	go run ./hack/bench -n $(BENCH_N) all

# RBAC: the +kubebuilder:rbac markers under internal/ -> config/rbac/role.yaml; the chart's
# ClusterRole reads its rules from charts/upgradeguard/files/clusterrole.yaml.
.PHONY: generate
generate: $(BIN)/controller-gen ## Regenerate deepcopy code, CRDs and RBAC (-> config/crd, config/rbac, charts/upgradeguard)
	$(BIN)/controller-gen object paths=./api/...
	$(BIN)/controller-gen crd paths=./api/... output:crd:dir=config/crd
	@if [ -d charts/upgradeguard ]; then mkdir -p charts/upgradeguard/crds && cp config/crd/*.yaml charts/upgradeguard/crds/; fi
	$(BIN)/controller-gen rbac:roleName=upgradeguard paths=./internal/... output:rbac:dir=config/rbac
	@if [ -d charts/upgradeguard ]; then mkdir -p charts/upgradeguard/files && cp config/rbac/role.yaml charts/upgradeguard/files/clusterrole.yaml; fi

# Generated and committed: CRDs, deepcopy, RBAC, and their copies in the chart.
GENERATED := api config charts/upgradeguard/crds charts/upgradeguard/files

.PHONY: verify
verify: generate ## Fail when generated code or CRDs are stale (run make generate and commit)
	@git diff --exit-code -- $(GENERATED) || { echo "generated files are stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "generated files are not committed: run make generate and commit"; exit 1; }

$(BIN)/controller-gen: hack/tools/controller-gen/go.mod
	cd hack/tools/controller-gen && go build -o $(BIN)/controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen

# As depguard keeps the layers, hack/cmdliteral keeps the commands: a kubectl, helm, flux,
# argocd or upgradeguard command told to a person is built by package cmdline, nowhere else.
.PHONY: lint
lint: $(BIN)/golangci-lint ## Run golangci-lint (pinned), gofmt and hack/cmdliteral
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "run gofmt -w"; exit 1; }
	$(BIN)/golangci-lint run ./...
	go run ./hack/cmdliteral .

$(BIN)/golangci-lint:
	GOBIN=$(BIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

.PHONY: clean
clean: ## Remove build outputs (keeps the control plane: use clean-all)
	rm -f $(BIN)/upgradeguard
	rm -rf $(DIST)

.PHONY: clean-all
clean-all: ## Remove bin/ entirely
	rm -rf $(BIN)
