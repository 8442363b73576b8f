# rocshare — every entry point. `make demo` and `make test` install what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The Kubernetes version of the control plane, kubelet and kubelet peer (make test K8S_VERSION=1.37.2).
# Empty: controlplane/k8s/default-version. Every version with controlplane/k8s/<version>/go.mod is
# supported; each is built into .cache/k8s/<version>/bin. Scripts and tests read K8S_VERSION too.
K8S_VERSION ?=
ifneq ($(strip $(K8S_VERSION)),)
export K8S_VERSION
endif
# The version tests/e2e/dra runs its own control plane on (rocshare_dev.devcluster.controlplane.DRA_K8S_VERSION):
# DRA consumable capacity is on by default from 1.36. `make test` and `make e2e` build it too (cached).
DRA_K8S_VERSION := 1.37.2
K8S_VERSIONS := $(shell ls controlplane/k8s/*/go.mod 2>/dev/null | cut -d/ -f3 | sort -V)
# The real node's container runtime: containerd2 (default; containerd 2.x built by `make
# containerd`, CDI on, as DRA needs) or containerd (Debian's 1.6, no CDI). tests/realnode read it
# as ROCSHARE_REALNODE_RUNTIME (`make test REAL_NODE_RUNTIME=containerd`).
REAL_NODE_RUNTIME ?= containerd2
export ROCSHARE_REALNODE_RUNTIME ?= $(REAL_NODE_RUNTIME)
REAL_NODE_BUILDS := $(if $(filter containerd2,$(REAL_NODE_RUNTIME)),containerd)

.PHONY: help venv controlplane controlplane-dra crds lint unit e2e test test-matrix chaos bench cluster-up cluster-down demo demo-down clean \
	real-node-deps images real-node-up real-node-down containerd observability-deps helm argocd chart docs docs-reference hook

help:
	@echo "make demo         local control plane + simulated AMD GPU fleet + samples, then show the slices"
	@echo "make demo-down    stop everything make demo started"
	@echo "make test         lint, unit, integration and e2e tests (builds the control plane once, cached)"
	@echo "                  K8S_VERSION=1.37.2 picks the Kubernetes version (default $$(cat controlplane/k8s/default-version))"
	@echo "make test-matrix  make test on every supported version ($(K8S_VERSIONS)); summary in run/test-matrix"
	@echo "make bench        benchmarks -> docs/benchmarks.json, docs/benchmarks.md (HAMI_SRC=<HAMi checkout>: HAMi beside)"
	@echo "make chaos        the long chaos run"
	@echo "make cluster-up   only the control plane (kubeconfig in run/cluster/kubeconfig); cluster-down stops it"
	@echo "make images       operator, agent, kube-scheduler, pause and base images, built here (buildah, cached)"
	@echo "make real-node-up a real kubelet + containerd node beside the control plane, in its own netns; real-node-down"
	@echo "                  on containerd 2.x built here (make containerd; CDI on); REAL_NODE_RUNTIME=containerd: Debian's 1.6"
	@echo "make chart        charts/rocshare from manifests/ (the chart is generated; make helm builds helm)"
	@echo "make docs         the documentation site from docs/ into site/ (mkdocs, strict)"
	@echo "make docs-reference  docs/reference/*.md from the CRDs, the metrics and the Helm values"

# Python environment, pinned: pyproject.toml pins direct dependencies, constraints.txt the rest.
$(STAMP): pyproject.toml dev/pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]' -e ./dev
	touch $(STAMP)

venv: $(STAMP)

# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, the kubelet, the kubelet peer
# and pause at K8S_VERSION, built from Go modules into .cache/k8s/<version>/bin (cached by a stamp; a
# second run does nothing).
controlplane:
	@controlplane/build.sh

# The DRA e2e's control plane, beside the default one (a no-op when K8S_VERSION is that version).
controlplane-dra:
	@K8S_VERSION=$(DRA_K8S_VERSION) controlplane/build.sh

# helm, built from its Go module (dev/helm/go.mod pins helm.sh/helm/v3) into
# .cache/helm/<version>/bin, apart from the control plane (cached by a stamp).
helm:
	@dev/helm/build.sh >/dev/null

# Argo CD's application controller and repo server (one binary), built from its Go module
# (dev/argocd/go.mod pins github.com/argoproj/argo-cd/v3) into .cache/argocd/<version>/bin, cached
# by a stamp; with Redis and git from Debian when missing (tests/e2e/test_argocd.py and
# tests/realnode/test_argocd.py run them).
argocd:
	@dev/argocd/install-deps.sh
	@dev/argocd/build.sh >/dev/null

# charts/rocshare, generated from manifests/ and samples/ (tests/unit/manifests/test_chart.py
# fails when it is stale, and proves `helm template` equals `kubectl kustomize`).
chart: $(STAMP) controlplane
	$(BIN)/rocshare-dev chart

# The documentation site: docs/ -> site/, strict (a broken link fails). `make test` builds it too
# (tests/unit/test_docs_site.py); docs/reference/ is generated (make docs-reference).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-reference: $(STAMP)
	$(BIN)/rocshare-dev docs reference

crds: $(STAMP)
	$(BIN)/rocshare crds --out crds

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/pycodestyle src operator nodeagent dev tests
	$(BIN)/rocshare crds --out crds --check

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q $(PYTEST_ARGS)

e2e: $(STAMP) controlplane controlplane-dra observability-deps helm argocd
	$(BIN)/pytest tests/e2e -q $(PYTEST_ARGS)

test: $(STAMP) controlplane controlplane-dra lint images observability-deps helm hook argocd $(REAL_NODE_BUILDS)
	$(BIN)/pytest tests -q $(PYTEST_ARGS)

# rocshare's in-container memory hook, its stub ROCm runtime and hook-probe (hook/Makefile; hook/deps.sh
# installs gcc, Debian's real HIP runtime and unpacks trixie's ROCm headers into .cache/hook-deps).
# tests/hook runs its C tests (plain, ASan, UBSan) and drives it under LD_AUDIT.
hook:
	@dev/hook/install-deps.sh
	$(MAKE) -C hook all real-runtime loadcheck-test

# The suite on every supported Kubernetes version, one after the other (CI runs the default only).
test-matrix: $(STAMP)
	@dev/test-matrix.sh $(K8S_VERSIONS)

# Prometheus (tests/e2e/test_dashboards.py) and libdrm's amdgpu.ids (GPU names): Debian packages
# when missing.
observability-deps:
	@dev/observability/install-deps.sh

# The real node (tests/realnode, make real-node-up): Debian packages when missing (containerd,
# runc, CNI plugins, buildah, mmdebstrap, ...; quick when all are there), then the images.
real-node-deps:
	@dev/realnode/install-deps.sh

# Images built here, no registry: a bookworm base (mmdebstrap), pause, kube-scheduler from
# .cache/bin, operator and agent from images/*.Dockerfile. Cached by content stamps in .cache/images.
images: real-node-deps controlplane
	@dev/realnode/build-images.sh

real-node-up: $(STAMP) images $(REAL_NODE_BUILDS)
	$(BIN)/rocshare-dev real-node up --runtime $(REAL_NODE_RUNTIME)

# containerd 2.x and its runc shim (+ ctr) from their Go module (dev/containerd/go.mod) into
# .cache/containerd/<version>/bin (cached by a stamp; 157 s with empty Go caches), for the real node.
containerd:
	@dev/containerd/build.sh >/dev/null

real-node-down: $(STAMP)
	$(BIN)/rocshare-dev real-node down

# The long chaos run (30 min of faults; ROCSHARE_CHAOS_FAULT_S=<s> for another length): its report
# table replaces the marked one in docs/reliability.md, its JSON goes to .cache/chaos-long.json.
chaos: $(STAMP) controlplane
	flock /tmp/rocshare-e2e.lock env ROCSHARE_CHAOS=long ROCSHARE_CHAOS_TABLE=docs/reliability.md \
		ROCSHARE_CHAOS_REPORT=.cache/chaos-long.json $(BIN)/pytest tests/e2e/test_chaos.py -q -s -m chaos $(PYTEST_ARGS)

# HAMI_SRC=<a checkout of Project-HAMi/HAMi>: the e2e section also runs HAMi's scheduler (built there,
# with HAMi's own go.mod, into .cache/hami) on the same fleet; without it HAMi's figures say "not run".
HAMI_SRC ?=
bench: $(STAMP) controlplane controlplane-dra
	$(BIN)/rocshare-dev bench all --out docs $(if $(strip $(HAMI_SRC)),--hami-src $(HAMI_SRC))

cluster-up: $(STAMP) controlplane
	$(BIN)/rocshare-dev cluster up

cluster-down: $(STAMP)
	$(BIN)/rocshare-dev cluster down

demo: $(STAMP) controlplane
	$(BIN)/rocshare-dev demo up

demo-down: $(STAMP)
	$(BIN)/rocshare-dev demo down

clean: demo-down cluster-down real-node-down
	rm -rf run
