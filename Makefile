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

.PHONY: all venv controlplane lint test test-unit demo demo-down bench bench-scale bench-streams bench-webhook bench-services bench-failover bench-extender bench-fleet clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: Python >= 3.11 is required (found $$($(PYTHON) --version))" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	touch $(STAMP)

venv: $(STAMP)

controlplane:
	hack/build-control-plane.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: venv controlplane lint
	PATH="$(abspath $(BIN)):$$PATH" hack/run-tests.sh $(PYTEST_ARGS)

test-unit: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest tests/unit tests/component $(PYTEST_ARGS)

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
