"""JAX's persistent compilation cache, kept in jaxlab's cache folder.

With it, a fresh process that runs a program compiled before loads the executable from disk instead of
asking XLA to compile it again. Only the XLA compilation is skipped: tracing the Python function and
lowering it to StableHLO still run in every new process (for the 30-layer model, a fraction of a
second per program). Every executable is cached, however quick its compilation
(``min_compile_time_secs = 0``). ``jaxlab bench`` measures time to first token cold and warm.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from jaxlab.io.assets import cache_dir


def default_dir() -> Path:
    env = os.environ.get("JAXLAB_COMPILE_CACHE")
    return Path(env).expanduser() if env else cache_dir() / "jax"


def enable(path: str | os.PathLike | None = None) -> Path:
    """Turn the persistent compilation cache on (idempotent); returns its folder."""
    path = Path(path) if path is not None else default_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def current() -> str | None:
    """The folder in use, or None when the cache is off."""
    return jax.config.jax_compilation_cache_dir
