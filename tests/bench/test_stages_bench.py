"""jaxlab.bench.stages: the bench's table of the generation ladder (:func:`measure_stages`), on the tiny model.

Five rows in the report's order, each measured through the ladder's own stage functions; every float32 stage
decodes the tokens of the uncached reference. The stages themselves (tokens, compile counts, the eager first
step) are tested in tests/lab/test_stages.py through :mod:`jaxlab.lab.stages`, which imports them from here; the
bench's quick run on the embedded model (tests/bench/test_bench.py) checks the same rows end to end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.bench import report
from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options
from jaxlab.bench.stages import measure_stages
from jaxlab.engine.model import forward
from jaxlab.tools.program_export import tiny_params


def uncached_greedy(params, ids, n):
    """The whole sequence through the uncached forward, argmax, append (right-padded: one program)."""
    total = len(ids) + n
    seq = np.zeros((1, total), np.int32)
    seq[0, : len(ids)] = ids
    step = jax.jit(forward)
    for t in range(len(ids), total):
        logits, _ = step(params, jnp.asarray(seq), jnp.arange(total)[None])
        seq[0, t] = int(jnp.argmax(logits[0, t - 1]))
    return seq[0, len(ids) :].tolist()


def test_measure_stages_on_the_tiny_model():
    params = tiny_params()
    prompt = [5, 9, 11, 200, 17, 3, 80, 4]
    n = 8
    ref = uncached_greedy(params, prompt, n)
    assert len(set(ref)) > 3  # varied tokens: the comparison means something
    opts = Options(prompt_len=len(prompt), new_tokens=n, reps=2, eager_steps=2, nocache_steps=2, bf16_steps=3)
    logged = []
    setup = Setup(params=params, tokenizer=None, rows=[prompt], cache_len=32, log=logged.append)
    rows = measure_stages(opts, setup, ref)

    assert [r["stage"] for r in rows] == list(report.STAGE_ROWS)
    by = {r["stage"]: r for r in rows}
    assert {s: r["tokens_timed"] for s, r in by.items()} == {
        "eager (no jit)": 2,  # min(eager_steps, (n - 1) // (reps + 1))
        "jit, no cache": 2,
        "jit + KV cache (host loop)": n - 1,
        "whole loop on device": n - 1,
        "bfloat16 (jit + KV cache)": 3,
    }
    for s, r in by.items():
        assert r["tokens_per_s"]["median"] > 0, s
        if s != "bfloat16 (jit + KV cache)":
            assert r["tokens_match"].startswith("yes"), (s, r["tokens_match"])
    eager = by["eager (no jit)"]
    assert eager["compile_s"] is None and eager["first_call_s"] > 0 and "_compile_log" not in eager
    for s in ("jit, no cache", "jit + KV cache (host loop)", "whole loop on device", "bfloat16 (jit + KV cache)"):
        (entry,) = by[s]["_compile_log"]
        assert entry["function"] == f"{s} (stages)" and entry["seconds"] == by[s]["compile_s"] >= 0
    assert by["bfloat16 (jit + KV cache)"]["_compile_log"][0]["dtype"] == "bfloat16"
    assert sum(f"rep {opts.reps}/{opts.reps}" in line for line in logged) == 5  # each stage ran reps times
