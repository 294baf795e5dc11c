# One set of targets for people, pre-commit and CI (.ci/run).
# The first of these on PATH that runs and is Python >= 3.11 (a pyenv shim may exist but not run);
# `make PY=...` overrides.
PY_CANDIDATES := python3.13 python3.12 python3.11 python3
PY_OK := -c 'import sys; sys.exit(sys.version_info < (3, 11))'
ifeq ($(origin PY),undefined)
PY := $(shell for p in $(PY_CANDIDATES); do $$p $(PY_OK) >/dev/null 2>&1 && { echo $$p; break; }; done)
endif
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install format lint typecheck test test-unit test-integration test-e2e all demo bench chaos clean

$(STAMP): pyproject.toml
	@test -n "$(PY)" || { echo "need Python >= 3.11: none of $(PY_CANDIDATES) on PATH qualifies (or run make PY=/path/to/python)"; exit 1; }
	@$(PY) $(PY_OK) >/dev/null 2>&1 || { echo "need Python >= 3.11: $(PY) is missing or older"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP)
	$(BIN)/pytest -q tests

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

test-e2e: $(STAMP)
	$(BIN)/pytest -q tests/e2e

all: lint typecheck test

demo: $(STAMP)
	$(BIN)/unstuck demo

bench: $(STAMP)
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.loops
	$(BIN)/python -m bench.repair
	$(BIN)/python -m bench.watchdog
	$(BIN)/python -m bench.http_door
	$(BIN)/python -m bench.cancel_breaker
	$(BIN)/python -m bench.async_sessions

MINUTES ?= 5
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos --minutes $(MINUTES)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
