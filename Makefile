# Every target does its own set-up and is safe to run again: a second run only does what changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
# pip is told to prefer wheels already on this disk (torch==2.13.0 CPU build); see README.
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: install models serve test lint typecheck unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: if anything else pulled it in, pip would pick a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[dev]"
	touch $@

install: $(STAMP)

models: install
	$(BIN)/kvgate models

serve: models
	$(BIN)/kvgate serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: models
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck unit

bench: models
	$(PIP) install -e ".[dev,bench]"
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
