# One entry point for newcomers, CI and benchmarks. Everything runs inside .venv, which the
# first target that needs it creates from pyproject.toml: `make run` installs only what the
# service needs to run; the check, test and bench targets add the development tools.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install run test check lint typecheck explore bench bench-quick clean redis-server

# pip passes on what the build backend warns about a local folder. Setuptools always warns
# that an editable install may be shadowed by "folders in your working directory with the
# same name as your package": here that folder is the package itself, so this one warning
# is filtered out by its words; pip's other warnings and its errors still show.
PIP_INSTALL := PYTHONWARNINGS='ignore:Editable installation:UserWarning' $(BIN)/pip install --quiet
# A `pip install .` into this venv (not editable) leaves a copy of the package in
# site-packages that later edits never reach, while the stamps still say the venv is set up.
# Finding that copy, the next target installs the checkout editable again.
COPIED := $(wildcard $(VENV)/lib/python*/site-packages/taskcard/__init__.py)
REINSTALL := $(if $(COPIED),FORCE)
REINSTALL_NOTE := $(VENV) holds a copy of taskcard, not this checkout: installing the checkout editable again
SAY_REINSTALL := $(if $(COPIED),@echo '$(REINSTALL_NOTE)')

$(BIN)/pip:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml $(REINSTALL) | $(BIN)/pip
	$(SAY_REINSTALL)
	$(PIP_INSTALL) -e .
	touch $(RUN_STAMP)

$(DEV_STAMP): pyproject.toml $(REINSTALL) | $(BIN)/pip
	$(SAY_REINSTALL)
	$(PIP_INSTALL) -e '.[dev]'
	touch $(DEV_STAMP) $(RUN_STAMP)

FORCE:

install: $(DEV_STAMP)

## The main job on the embedded defaults: a demo fleet projected to the console channel.
run: $(RUN_STAMP)
	$(BIN)/taskcard serve

## The whole test suite plus lint, format and type checks (what CI runs).
test: redis-server check

## The cluster tests start their own Redis on loopback; install Debian's server when missing.
redis-server:
	command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server)

## Lint and format checks, then the type check: the fast part of `check`.
lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

## The tests run in two worker processes (pytest-xdist), one per core of a two-core machine.
## Every test keeps to its own folders, ports and servers, so workers never meet. Each test's
## timeout (300 s) is set in pyproject.toml alone, so a file run by itself gets the same one.
check: lint typecheck
	$(BIN)/pytest -q -W error -n 2

## The property tests with fresh random examples, ten rounds (`make test` draws the same ones
## every time): run it after changing a renderer or a reader of agent files.
explore: $(DEV_STAMP)
	for round in 1 2 3 4 5 6 7 8 9 10; do \
	  TASKCARD_HYPOTHESIS_PROFILE=explore $(BIN)/pytest -q -x \
	    $$(grep -rl '^from hypothesis import.*given' tests) || exit 1; \
	done

## Every benchmark scenario at full size (10,000 agents; about 30 minutes on 2 cores),
## appended to bench/RESULTS.md. The CPU figures depend on how the interpreter was built (the
## results name it): to measure on another one, give it a venv of its own, e.g.
## `make bench PY=/usr/bin/python3.11 VENV=.venv-opt`.
bench: redis-server $(DEV_STAMP)
	$(BIN)/python -m bench all

## The same scenarios at reduced sizes (about 5 minutes), for development: nothing recorded.
bench-quick: redis-server $(DEV_STAMP)
	$(BIN)/python -m bench all --quick --no-record

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
