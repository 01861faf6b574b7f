"""The two roads to a model on JAX, timed side by side: ``transformers``' PyTorch model run through torchax
(:mod:`jaxlab.tools.torchax_bridge`) and jaxlab's own Flax model (:mod:`jaxlab.engine.steps`), on the same GGUF,
the same prompt, float32, the same cache length.

:func:`measure_torchax` warms both up (every program compiled), then in each repetition runs torchax's greedy
generation and jaxlab's one after the other: the prefill (the prompt in, the first token on the host) and the
decode steps (one program per token, the host reading each token, as a streaming loop must). It keeps the best of
the repetitions, the ratios native / torchax of those best times (below 1: jaxlab's road is faster), the greedy
tokens of both roads and of ``transformers``' eager ``generate`` (all three must agree), and the host it ran on.

The native loop feeds the prompt at its own length (no bucket padding) so that both roads run the same shapes:
prefill [1, T] and decode [1, 1] over a cache of :func:`~jaxlab.tools.torchax_bridge.cache_length` slots.
"""

from __future__ import annotations

import time
from importlib import metadata
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxlab.bench.output import host_meta
from jaxlab.bench.stats import ratio
from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import Params
from jaxlab.engine.steps import GREEDY, jit_decode, jit_prefill
from jaxlab.tools import torchax_bridge
from jaxlab.tools.reference import load_reference, reference_greedy


def native_greedy(params: Params, prompt_ids: Sequence[int], new_tokens: int, cache_len: int) -> dict:
    """jaxlab's greedy generation with the engine's jitted steps, timed like
    :func:`~jaxlab.tools.torchax_bridge.greedy`: {"tokens", "prefill_s", "decode_s"}."""
    cfg = params.config
    cache = init_cache(cfg, 1, cache_len, params.policy.jnp_dtype)
    tokens = jnp.asarray([list(prompt_ids)], jnp.int32)  # [1, T], no padding
    positions = jnp.arange(len(prompt_ids), dtype=jnp.int32)[None]  # [1, T]
    t0 = time.perf_counter()
    nxt, _, cache = jit_prefill(params, tokens, positions, cache, None, GREEDY)
    out = [int(np.asarray(nxt)[0])]
    t1 = time.perf_counter()
    pos = len(prompt_ids)
    for _ in range(new_tokens - 1):
        nxt, _, cache = jit_decode(params, nxt, jnp.asarray([pos], jnp.int32), cache, None, GREEDY)
        out.append(int(np.asarray(nxt)[0]))
        pos += 1
    return {"tokens": out, "prefill_s": t1 - t0, "decode_s": time.perf_counter() - t1}


def measure_torchax(
    gguf_path,
    prompt_ids: Sequence[int],
    new_tokens: int = 16,
    reps: int = 3,
    *,
    reference=None,
    params: Params | None = None,
    log=None,
) -> dict:
    """Prefill seconds and decode seconds per token of both roads, best of ``reps`` synchronized runs each, in one
    run; see the module docstring. ``reference`` is an already loaded ``(model, tokenizer)`` of ``transformers``
    (:func:`~jaxlab.tools.reference.load_reference`) and ``params`` jaxlab's float32 parameters of the same file
    (:func:`jaxlab.engine.loading.load_params`); each is loaded from ``gguf_path`` when None."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be at least 2 (one prefill token, then decode steps), got {new_tokens}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    log = log or (lambda msg: None)
    if params is None:
        from jaxlab.engine.loading import load_params

        params = load_params(str(gguf_path), dtype="float32")[0]
    if params.policy.dtype != "float32":
        raise ValueError(f"the comparison runs in float32; got parameters in {params.policy.dtype}")
    model, _ = reference or load_reference(gguf_path)
    prompt_ids = [int(t) for t in prompt_ids]
    tx = torchax_bridge.bridge(model)
    cache_len = torchax_bridge.cache_length(len(prompt_ids), new_tokens)

    log("warm-up: compiling both roads' prefill and decode programs")
    t0 = time.perf_counter()
    torchax_bridge.greedy(tx, prompt_ids, new_tokens, cache_len)
    t1 = time.perf_counter()
    native_greedy(params, prompt_ids, new_tokens, cache_len)
    t2 = time.perf_counter()

    tx_runs, native_runs = [], []
    for rep in range(reps):
        log(f"rep {rep + 1}/{reps}: torchax, then jaxlab")
        tx_runs.append(torchax_bridge.greedy(tx, prompt_ids, new_tokens, cache_len))
        native_runs.append(native_greedy(params, prompt_ids, new_tokens, cache_len))
    steps = new_tokens - 1
    tx_best = {
        "prefill_s": min(r.prefill_s for r in tx_runs),
        "decode_s_per_token": min(r.decode_s for r in tx_runs) / steps,
        "first_run_s": t1 - t0,
        "tokens": tx_runs[-1].tokens,
    }
    native_best = {
        "prefill_s": min(r["prefill_s"] for r in native_runs),
        "decode_s_per_token": min(r["decode_s"] for r in native_runs) / steps,
        "first_run_s": t2 - t1,
        "tokens": native_runs[-1]["tokens"],
    }
    log("transformers' own greedy generate (eager PyTorch)")
    hf_tokens = reference_greedy(model, prompt_ids, new_tokens)
    same = tx_best["tokens"] == native_best["tokens"] == hf_tokens
    return {
        "what": "greedy generation of one prompt, float32, batch 1: prefill = the prompt in and the first token on "
        "the host; decode = seconds per later token (one program per token, the host reading each); best of reps; "
        "first_run_s = the warm-up run, compiling included",
        "prompt_len": len(prompt_ids),
        "new_tokens": new_tokens,
        "cache_len": cache_len,
        "reps": reps,
        "dtype": "float32",
        "torchax": tx_best,
        "native": native_best,
        "native_over_torchax": {
            "prefill": ratio(native_best["prefill_s"], tx_best["prefill_s"]),
            "decode": ratio(native_best["decode_s_per_token"], tx_best["decode_s_per_token"]),
        },
        "transformers_tokens": hf_tokens,
        "tokens_agree": same,
        "missing_overloads": len(torchax_bridge.missing_overloads()),
        "host": host_meta(torchax=metadata.version("torchax")),
    }


def render(res: dict) -> str:
    """A few lines a notebook or a terminal prints: each road's times, the ratios and the token check."""
    tx, nat, r = res["torchax"], res["native"], res["native_over_torchax"]
    host = res["host"]
    return "\n".join(
        [
            f"prompt {res['prompt_len']} tokens, {res['new_tokens']} new, cache {res['cache_len']}, float32, "
            f"best of {res['reps']} on {host['cpu']} ({host['cpus']} CPUs)",
            f"{'':10s}{'prefill ms':>12s}{'decode ms/token':>17s}{'first run s':>13s}",
            f"{'torchax':10s}{tx['prefill_s'] * 1e3:12.1f}{tx['decode_s_per_token'] * 1e3:17.2f}"
            f"{tx['first_run_s']:13.1f}",
            f"{'jaxlab':10s}{nat['prefill_s'] * 1e3:12.1f}{nat['decode_s_per_token'] * 1e3:17.2f}"
            f"{nat['first_run_s']:13.1f}",
            f"jaxlab / torchax: prefill {r['prefill']:.2f}x the time, decode {r['decode']:.2f}x",
            f"greedy tokens: torchax, jaxlab and transformers {'agree' if res['tokens_agree'] else 'DIFFER'}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jaxlab.bench.torchax [--json PATH]``: both roads on golden prompt 6 (40 tokens), printed; with
    ``--json``, the result, the two decode programs' StableHLO sizes and the host (``meta``) written for a notebook
    to show where torch is not installed (``data/bench/torchax-cpu.json``)."""
    import argparse
    import json
    from pathlib import Path

    from jaxlab.engine.loading import load_params
    from jaxlab.io import assets
    from jaxlab.tools.reference import load_golden

    p = argparse.ArgumentParser(prog="python -m jaxlab.bench.torchax", description=main.__doc__)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args(argv)
    gguf = assets.model_path()
    params = load_params(str(gguf), dtype="float32")[0]
    ids = load_golden()["prompts"][5]["prompt_ids"]
    reference = load_reference(gguf)
    res = measure_torchax(gguf, ids, args.new_tokens, args.reps, reference=reference, params=params, log=print)
    print(render(res))
    if args.json:
        tx = torchax_bridge.bridge(reference[0])
        res["hlo"] = torchax_bridge.hlo_summary(tx, params, res["cache_len"])
        args.json.write_text(json.dumps({"meta": res["host"], **res}, indent=1) + "\n", encoding="utf-8")
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
