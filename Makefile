# The two commands of the README: `make demo` and `make test`. Everything they need is
# installed from this repository's files: a venv with the pinned Python dependencies and
# the control-plane binaries built from pinned Go modules into a reused cache.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= .demo
PYTEST_ARGS ?=
DOCS_PORT ?= 8000
DOCS_SITE ?= site

.PHONY: all venv controlplane promtool lint docs docs-gen monitoring-gen test test-unit image test-image demo demo-down bench bench-scale bench-streams bench-webhook bench-services bench-failover bench-extender bench-fleet bench-partition clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: Python >= 3.11 is required (found $$($(PYTHON) --version))" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint,docs]'
	touch $(STAMP)

venv: $(STAMP)

controlplane:
	hack/build-control-plane.sh

# promtool alone (for `make lint`), from the pinned Prometheus module into the same cache.
promtool:
	hack/build-control-plane.sh --only promtool

lint: venv promtool
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/hadolint Dockerfile
	$(BIN)/python hack/lint-markdown.py
	PYTHON=$(BIN)/python hack/promtool-check.sh
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

# The site on http://127.0.0.1:8000 (loopback only), rebuilt as pages change.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

# docs/reference/*.md from the programs' parsers, metric registries and contracts, and
# docs/layout.md from the docstrings and the import graph
# (tests/unit/test_docs_reference.py fails while they are stale).
docs-gen: venv
	$(BIN)/python hack/gen-docs.py

# manifests/monitoring/ and the chart's dashboards from charts/tensile/files/alerts.yaml and
# the dashboards' code (tests/unit/test_monitoring.py fails while they are stale).
monitoring-gen: venv
	$(BIN)/python hack/gen-monitoring.py

test: venv controlplane lint
	PATH="$(abspath $(BIN)):$$PATH" hack/run-tests.sh $(PYTEST_ARGS)

test-unit: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest tests/unit tests/component $(PYTEST_ARGS)

# The image (Dockerfile) with whatever builder the machine has (hack/build-image.sh).
image:
	hack/build-image.sh

# Builds the image, then runs a program in it (skipped without buildah); not in `make test`.
test-image: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest tests/image $(PYTEST_ARGS)

demo: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python hack/demo.py up --dir $(DEMO_DIR)

demo-down: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python hack/demo.py down --dir $(DEMO_DIR)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

bench: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/forwarding.py $(BENCH_ARGS)

bench-scale: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/scale.py $(BENCH_ARGS)

bench-streams: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/streams.py $(BENCH_ARGS)

bench-webhook: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/webhook.py $(BENCH_ARGS)

bench-services: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/services.py $(BENCH_ARGS)

bench-failover: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/failover.py $(BENCH_ARGS)

bench-extender: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/extender.py $(BENCH_ARGS)

bench-fleet: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/fleet.py $(BENCH_ARGS)

bench-partition: venv controlplane
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/partition.py $(BENCH_ARGS)
