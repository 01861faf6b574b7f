"""Shared fixtures: the embedded model and the reference (transformers), each loaded once per session.

Parity figures recorded with the ``parity`` fixture are printed at the end of the run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

_PARITY: list[str] = []
SOLUTIONS = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"


def load_solution(name: str):
    """The module notebooks/solutions/<name>.py (the exercises' solutions), imported from its path."""
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def gguf_path():
    from jaxlab.io import assets

    return assets.model_path()


@pytest.fixture(scope="session")
def smollm(gguf_path):
    """The embedded SmolLM2-135M (params + tokenizer), float32."""
    from jaxlab.engine.loading import load

    return load()


@pytest.fixture(scope="session")
def generator(smollm):
    from jaxlab.engine.generate import Generator

    return Generator(smollm.params, smollm.tokenizer)


@pytest.fixture(scope="module")
def converted_cache(tmp_path_factory, gguf_path):
    """A cache folder of the module's own (the user's stays untouched) into which the embedded model's
    float parameters are converted once: tests of the quantized-parameter cache write next to them."""
    from jaxlab.engine import loading

    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXLAB_CACHE", str(path))
        loading.load_params()
    return path


@pytest.fixture(scope="session")
def reference(gguf_path):
    """(model, tokenizer) of Hugging Face transformers on the same GGUF, float32 CPU."""
    from jaxlab.tools.reference import load_reference

    return load_reference(gguf_path)


@pytest.fixture(scope="session")
def parity():
    """parity(line): record a measured parity figure for the end-of-run summary."""
    return _PARITY.append


def pytest_terminal_summary(terminalreporter):
    if _PARITY:
        terminalreporter.section("parity with the reference (transformers, float32)")
        for line in _PARITY:
            terminalreporter.write_line(line)
