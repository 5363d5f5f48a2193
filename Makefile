# fnserve: every target sets itself up from nothing (a virtualenv in .venv).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
MANIFEST := layers/models/models/manifest.toml
HOLDOUT  := layers/models/models/digits-holdout.npz

.PHONY: setup run test lint bench models clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fnserve needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/fnserve models -m $(MANIFEST)
	$(BIN)/fnserve predict digits-fast $(HOLDOUT) -m $(MANIFEST) -n 12
	$(BIN)/fnserve predict digits-accurate $(HOLDOUT) -m $(MANIFEST) -n 12

lint: setup
	$(BIN)/ruff check layers/fnserve functions tests infra
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: setup
	$(PY) -m tests.bench.bench_service

models: setup
	$(PY) infra/models/build_demo_models.py layers/models/models

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
