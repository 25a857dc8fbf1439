# Quick start: `make run` (install + main job), `make test` (install + the fast tests),
# `make test-all` (every test), `make check` (what CI runs: lint and types, every test, the
# built wheel in a fresh venv).
# Everything goes into a virtual environment in .venv; with no torch there, torch==2.13.0
# is installed first (set TORCH=... to choose another), from pip's configured index: on Linux,
# PyPI's is a CUDA build; TORCH_INDEX=https://download.pytorch.org/whl/cpu gets the CPU build.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin

.PHONY: install install-dev run test test-all lint wheel-check check bench gpu-check docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The installs are editable: done once per environment and again only when
# pyproject.toml changes (a stamp in the venv), not by every target that needs them.
install: $(VENV)/.installed

# pip byte-compiles what it installs on one core (torch alone: about 35 s here);
# compileall does it on every core, once, after the installs. Like pip, it goes on past
# files that do not compile on this Python (torch ships one with 3.12 syntax).
PIP_INSTALL := $(BIN)/pip install -q --no-compile
COMPILE := $(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || \
		$(PIP_INSTALL) "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(PIP_INSTALL) -e .
	$(COMPILE)
	touch $@

install-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP_INSTALL) -e ".[dev,digits,lightning,accelerate,kernels]"
	$(COMPILE)
	touch $@

# The main job: plan the shipped transformer profile for the shipped 1 GbE cluster, its
# finalists trained for 90 s on the clock (the demo's budget; plan's default is 180 s).
run: install
	$(BIN)/bytecomp plan profiles/transformer --cluster gbe1 --out plan.yaml --verify-budget 90

# The fast tier (under 3 minutes here): unit tests, references, the hostile corpus and a
# few multi-rank smoke tests, spread over the machine's cores (pytest-xdist). test-all:
# every test, what CI runs: the fast tier as make test runs it, then the second tier
# (multi-rank, faults, notebooks, benchmark smoke runs) spread over the cores too, less
# its tests marked clock (silences, budgets, link speeds and trials timed on the clock),
# which run last, one at a time, on an otherwise idle machine.
test: install-dev
	$(BIN)/python -m pytest -q -n auto -m "not slow" --durations=15

test-all: install-dev
	$(BIN)/python -m pytest -q -n auto -m "not slow" --durations=5
	$(BIN)/python -m pytest -q -n auto --dist worksteal -m "slow and not clock" --durations=15
	$(BIN)/python -m pytest -q -m "slow and clock" --durations=5

lint: install-dev
	$(BIN)/ruff check bytecomp tests benchmarks examples
	$(BIN)/mypy

wheel-check: install
	.ci/wheel-check $(BIN)/python "$(TORCH)"

check: lint test-all wheel-check

bench: install
	$(BIN)/python benchmarks/compressors.py

# On a machine with a CUDA GPU (a CUDA build of torch: e.g. TORCH=torch==2.14.1 on a
# fresh .venv): the cuda tests, GPU compressor throughput, a one-GPU profile -> plan ->
# simulate; writes benchmarks/results/gpu-check-<date>.md.
gpu-check: install-dev
	$(BIN)/python benchmarks/gpu_check.py

# The generated parts of docs/ and the README (option tables, the API page, sample outputs,
# quoted results tables) and benchmarks/results/INDEX.md; tests/test_docs.py checks them.
docs: install
	$(BIN)/python docs/generate.py
