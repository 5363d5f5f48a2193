# fnserve: every target sets itself up from nothing (a virtualenv in .venv).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
MANIFEST := layers/models/models/manifest.toml
HOLDOUT  := layers/models/models/digits-holdout.npz
PORT     ?= 8080

.PHONY: setup run test lint bench models clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fnserve needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/fnserve predict digits-accurate $(HOLDOUT) -m $(MANIFEST) -n 5
	$(BIN)/fnserve serve -m $(MANIFEST) --port $(PORT)

lint: setup
	$(BIN)/ruff check layers/fnserve functions tests infra
	$(BIN)/ruff format --check layers/fnserve functions tests infra
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: setup
	@command -v wrk >/dev/null || { echo "installing wrk (Debian) for the HTTP load benchmark"; \
		apt-get install -y -qq wrk >/dev/null 2>&1 || echo "could not install wrk: the load part will be skipped"; }
	$(PY) -m tests.bench.bench_service
	$(PY) -m tests.bench.bench_http
	$(PY) -m tests.bench.bench_sqs
	$(PY) -m tests.bench.bench_cascade

models: setup
	$(PY) infra/models/build_demo_models.py layers/models/models

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
