# Two entry points for a fresh machine (see README): `make sweep` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.jointtune-installed
SWEEP ?= examples/sweep.yaml

.PHONY: install sweep test lint clean

# A machine that already has torch (the GPU images) keeps it: the venv sees the system packages.
# Without torch and without a GPU, pip takes the CPU wheel torch 2.13.0 (never a multi-GB CUDA build).
$(STAMP): pyproject.toml
	@echo "make: installing jointtune and its dependencies into $(VENV) (minutes the first time, quiet meanwhile)"
	@if $(PY) -c "import torch" 2>/dev/null; then $(PY) -m venv --system-site-packages $(VENV); \
	 else $(PY) -m venv $(VENV); fi
	@if ! $(BIN)/python -c "import torch" 2>/dev/null; then \
	   if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	   else $(BIN)/pip install -q "torch==2.13.0"; fi; fi
	$(BIN)/pip install -q -e '.[dev,postgres]'
	@touch $(STAMP)
	@echo "make: jointtune is $(BIN)/jointtune; '. $(BIN)/activate' puts it on this shell's PATH (README, Set-up)"

# The GPU image's Triton, beside the venv's: tests compile the kernel for sm_90 with both versions.
GPU_TRITON := $(VENV)/gpu-triton/.installed
# (About 640 MB; without a package index the compile check for it is skipped, or fails where
# JOINTTUNE_REQUIRE_GPU_TRITON=1 is set.)
$(GPU_TRITON): $(STAMP)
	@echo "make test: installing the GPU image's Triton 3.6.0 (about 640 MB) into $(VENV)/gpu-triton, once"
	@if $(BIN)/pip install -q --no-deps --target $(VENV)/gpu-triton "triton==3.6.0"; then touch $(GPU_TRITON); \
	 else echo "triton 3.6.0 could not be installed: its sm_90 compile check will be skipped"; fi

install: $(STAMP)

sweep: $(STAMP)
	$(BIN)/jointtune sweep $(SWEEP)

# The dashboard's browser test needs Debian's chromium; install it when it's missing (as root).
# README.md, "Set-up", says what this installs and how to skip it. Two pytest-xdist workers: CI has 2 cores, and
# most tests are single-threaded Python (the Triton interpreter); every test has its own database, store and ports.
# worksteal: a worker that runs out takes the other's pending tests (with `load` one sat idle for a minute at the
# end). --durations=25: the slowest tests in CI's log, where a slow new test shows.
test: $(STAMP) $(GPU_TRITON)
	@command -v chromium >/dev/null 2>&1 || { echo "make test: installing Debian's chromium with apt-get (as root)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium could not be installed: the dashboard's browser test will be skipped"
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal --durations=25

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
