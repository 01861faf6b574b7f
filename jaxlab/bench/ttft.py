"""Time to first token, cold and warm: each in a fresh child process (``python -m jaxlab.bench --ttft-child``),
with an empty and then a filled persistent compilation cache.

The parent runs the children before it starts its own backend when it can: a TPU belongs to one
process, so a child started later would measure the CPU (and its figure says so: :func:`ttft_note`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from jaxlab.bench.options import DEFAULTS
from jaxlab.bench.prompts import TEXT, make_prompts
from jaxlab.bench.stats import summarize

#: The repository root: the children run there, so ``-m jaxlab.bench`` finds this checkout's package.
ROOT = Path(__file__).resolve().parents[2]


def measure_ttft(prompt_len: int, reps: int, log) -> dict:
    """Cold and warm time to first token, each in a fresh process (see :func:`ttft_child`).

    The children get this process's accelerator when they can (:func:`jaxlab.tools.hardware.child_env`);
    ``backend`` is the one they ran on and ``note`` labels it when it is not this process's."""
    from jaxlab.tools import hardware

    cold, warm, runs = [], [], []
    for rep in range(reps):
        with tempfile.TemporaryDirectory(prefix="jaxlab-ttft-") as cache:
            for kind in ("cold", "warm"):
                log(f"time to first token: {kind} child process, rep {rep + 1}/{reps}")
                env = dict(hardware.child_env(), JAXLAB_COMPILE_CACHE=cache)
                cmd = [sys.executable, "-m", "jaxlab.bench", "--ttft-child", "--prompt-len", str(prompt_len)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=str(ROOT))
                line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
                if proc.returncode != 0 or line is None:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                    raise RuntimeError(f"TTFT child failed (exit {proc.returncode}): {' | '.join(tail)}")
                r = json.loads(line)
                r.update(kind=kind, rep=rep)
                runs.append(r)
                (cold if kind == "cold" else warm).append(r["ttft_s"])
    backends = sorted({r.get("backend", "unknown") for r in runs})
    return {
        "cold": summarize(cold),
        "warm": summarize(warm),
        "runs": runs,
        "backend": ",".join(backends),
        "note": ttft_note(backends),
    }


def ttft_note(child_backends: Sequence[str], parent_backend: str | None = None) -> str | None:
    """The label of the TTFT figures when a child ran on another backend than this process (None if none did)."""
    from jaxlab.tools.hardware import figure_note

    notes = [n for n in (figure_note(b, parent_backend) for b in child_backends) if n]
    return "; ".join(dict.fromkeys(notes)) or None


def ttft_child(prompt_len: int) -> dict:
    """Run in a fresh process: enable the persistent compilation cache (folder from
    ``JAXLAB_COMPILE_CACHE``), load the model (not timed), then time ``Generator.generate([ids], 1)``."""
    t_start = time.perf_counter()
    import jax

    from jaxlab.engine.generate import Generator
    from jaxlab.engine.loading import load
    from jaxlab.tools import compile_cache
    from jaxlab.tools.profile import CompileCounter

    folder = compile_cache.enable()
    m = load(dtype="float32")  # as the parent's rows
    gen = Generator(m.params, m.tokenizer)
    ids = make_prompts(m.tokenizer.encode(TEXT), 1, prompt_len)[0]
    t_loaded = time.perf_counter()
    with CompileCounter() as cc:
        t0 = time.perf_counter()
        r = gen.generate([ids], 1)
        ttft = time.perf_counter() - t0
    return {
        "ttft_s": ttft,
        "compile_s": r[0].compile_seconds,
        "prefill_s": r[0].prefill_seconds,
        "compiles": cc.count,
        "cache_hits": cc.cache_hits,
        "first_token": r[0].generated_ids[0],
        "startup_s": t_loaded - t_start,
        "cache_dir": str(folder),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
    }


def child_main(argv=None) -> int:
    """``python -m jaxlab.bench --ttft-child [--prompt-len T]``: print :func:`ttft_child`'s JSON line."""
    p = argparse.ArgumentParser(prog="python -m jaxlab.bench")
    p.add_argument("--ttft-child", action="store_true", required=True, help="time to first token, in this process")
    p.add_argument("--prompt-len", type=int, default=DEFAULTS["prompt_len"])
    a = p.parse_args(argv)
    print(json.dumps(ttft_child(a.prompt_len)))
    return 0
