# imgbuild developer targets. `make demo` and `make test` do all set-up on a fresh Debian
# machine (as root): Docker engine, local registry with auth, base image, Python venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REGISTRY ?= 127.0.0.1:5000
SERVICES := scripts/services.sh
CA_CERT ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt))
PYTEST_ARGS ?=
# ruff with the rule set in pyproject.toml, mypy on the package (lint-static; `make test` runs it)
LINT_STATIC = $(PY) -m ruff check buildkit_py tests bench scripts && $(PY) -m mypy

# The suite in two pytest processes side by side (tests/conftest.py, IMGBUILD_TEST_ENGINE_GROUP):
# the tests without an engine and Docker 20.10's; Docker 26's, podman's and buildah's. Each waits
# on its engines and the registry more than on the cores, so the run takes about the longer half.
# Measured (CI runs of 2026-12-06): this split 30:01 and 39:15; podman and buildah in the first half
# instead 40:46 and 34:56 (they cost more there than their own durations), so they stay here.
# Each half's output is printed whole when both are done; either failing fails the run.
GROUP_A := none,docker20
GROUP_B := docker26,podman,buildah
TEST_GROUPS = a=$$(mktemp); b=$$(mktemp); \
	IMGBUILD_TEST_ENGINE_GROUP=$(GROUP_A) $(PY) -m pytest $(PYTEST_ARGS) >"$$a" 2>&1 & pa=$$!; \
	IMGBUILD_TEST_ENGINE_GROUP=$(GROUP_B) $(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) >"$$b" 2>&1 & pb=$$!; \
	wait $$pa; sa=$$?; wait $$pb; sb=$$?; \
	echo "=== tests without an engine and on docker20 (exit $$sa)"; cat "$$a"; \
	echo "=== tests on docker26, podman, buildah (exit $$sb)"; cat "$$b"; rm -f "$$a" "$$b"; \
	[ $$sa = 0 ] && [ $$sb = 0 ]

.PHONY: help venv services services-down demo test unit lint lint-static bench golden clean

help:
	@echo "make demo      build recipes/demo.yaml and push it to the local registry ($(REGISTRY))"
	@echo "make test      the whole suite, end-to-end tests included (starts the services)"
	@echo "make unit      only the tests that need no engine"
	@echo "make bench     benchmarks in bench/, printed as ratios"
	@echo "make golden    rewrite the golden Dockerfiles after an intended change"
	@echo "make services  install/start engine, registry, base image; services-down stops them"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || $(SERVICES) install
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $@

venv: $(STAMP)

services:
	$(SERVICES) up

services-down:
	$(SERVICES) down

# The main job: engine + registry + base image, build the demo, push it with auth, show it.
# On the modern engine (Docker 26 + buildx + containerd store) when services.sh started it.
demo: services venv
	@set -euo pipefail; eval "$$($(SERVICES) env)"; \
	export DOCKER_CONFIG=$${DOCKER_CONFIG:-$$HOME/.docker}; \
	if [[ ",$$IMGBUILD_TEST_ENGINES," == *,docker26,* ]]; then \
	    export IMGBUILD_DOCKER=$$IMGBUILD_TEST_DOCKER26_CLIENT DOCKER_HOST=$$IMGBUILD_TEST_DOCKER26_HOST; \
	    echo "demo on Docker 26 + buildx + containerd image store ($$DOCKER_HOST)"; fi; \
	$(PY) -m buildkit_py login $(REGISTRY) -u "$$IMGBUILD_TEST_REGISTRY_USER" --password-stdin \
	    < "$$IMGBUILD_TEST_REGISTRY_PASSWORD_FILE"; \
	$(PY) -m buildkit_py build recipes/demo.yaml --registry $(REGISTRY) --push \
	    $(if $(CA_CERT),--ca-cert $(CA_CERT)); \
	if command -v nvidia-smi >/dev/null; then $(PY) -m buildkit_py check $(REGISTRY)/demo/cuda-hello:0.1.0; \
	else echo "(no GPU here: checking against a sample 535 data-center driver)"; \
	     $(PY) -m buildkit_py check $(REGISTRY)/demo/cuda-hello:0.1.0 --driver 535.104.05; fi; \
	$${IMGBUILD_DOCKER:-/usr/bin/docker} run --rm --network none $(REGISTRY)/demo/cuda-hello:0.1.0

# In CI (CI=true) missing services fail the run; elsewhere end-to-end tests skip. The E2E tests
# run on every engine services.sh lists in IMGBUILD_TEST_ENGINES (docker20 and docker26).
# Lint runs while the services start (a cold mypy took 33 s; `up` mostly waits for daemons): its
# output is held until `up` is done, and a finding still fails the run before any test.
test: venv
	@lint_log=$$(mktemp); { $(LINT_STATIC); } >"$$lint_log" 2>&1 & lint=$$!; \
	$(SERVICES) up || { [ "$${CI:-}" != true ] && echo "services unavailable: end-to-end tests will skip"; }; \
	up_status=$$?; wait $$lint; lint_status=$$?; cat "$$lint_log"; rm -f "$$lint_log"; \
	[ $$up_status = 0 ] && [ $$lint_status = 0 ]
	@eval "$$($(SERVICES) env)"; $(TEST_GROUPS)

unit: venv
	$(PY) -m pytest -m "not e2e" $(PYTEST_ARGS)

# Pinned linters (test extras): ruff with the rule set in pyproject.toml, mypy on the package,
# hadolint on every golden Dockerfile. Part of `make test`, so CI fails on a finding.
lint: lint-static
	$(PY) -m pytest -q tests/test_render.py -k hadolint

# The static half of lint (ruff, mypy): the first thing `make test` runs, so CI fails on a finding.
# (hadolint runs inside the test suite.)
lint-static: venv
	$(LINT_STATIC)

golden: venv
	UPDATE_GOLDEN=1 $(PY) -m pytest tests/test_render.py -k golden

bench: services venv
	@eval "$$($(SERVICES) env)"; $(PY) bench/run.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
