# lmforge developer targets. Everything a target needs is installed by `make install`
# into .venv (torch is pinned to the CPU wheel the CI machines carry locally).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
EXTRAS  ?= server,lmi-dist,local,dev
DEMO_DIR ?= .demo

.PHONY: install test test-unit test-integration lint fmt demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -q

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: install
	$(BIN)/python -m pytest -q -m integration

lint: install
	$(BIN)/ruff check src tests examples bench
	$(BIN)/ruff format --check src tests examples bench
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format src tests examples bench
	$(BIN)/ruff check --fix src tests examples bench

demo: install
	@PY=$(BIN)/python DEMO_DIR=$(DEMO_DIR) bash examples/demo.sh

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python bench/serving_throughput.py
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
