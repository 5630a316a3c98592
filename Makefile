# One entry point for newcomers, CI and benchmarks. Everything runs inside .venv,
# which the first target that needs it creates from pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test check lint typecheck bench clean redis-server

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## The main job on the embedded defaults: a demo fleet projected to the console channel.
run: $(STAMP)
	$(BIN)/taskcard serve

## The whole test suite plus lint, format and type checks (what CI runs).
test: redis-server check

## The cluster tests start their own Redis on loopback; install Debian's server when missing.
redis-server:
	command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server)

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q -W error --timeout=300

bench: $(STAMP)
	$(BIN)/python -m bench all

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
