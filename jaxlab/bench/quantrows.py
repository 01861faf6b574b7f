"""The quantized decode rows: the decode step of float32 and of each weight format x KV-cache format at each
batch size, side by side in one process (:func:`measure_quant`), and where each variant starts to pay
(:func:`crossover`)."""

from __future__ import annotations

import dataclasses
import statistics
import time

from jaxlab.bench.costmodel import decode_step_bytes
from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options
from jaxlab.bench.stats import ratio, summarize, summary_map

METHOD = (
    "decode step (forward + greedy pick, cache donated, token to host each step, the next step launched before "
    "it is read, as Generator's loop does) of every variant, "
    "compiled and warmed up first, then alternated rep by rep in one process; vs_float32 = median "
    "over repetitions of float32's step time / this step time in the same repetition (paired, so a "
    "slow drift in machine load cancels); bytes/step = weights + K/V of the mean context in the "
    "variant's cache format"
)


def quant_label(weights: str, kv: str) -> str:
    """ "int8", "int8 + int8 KV", "float32 + int8 KV", ... (the same labels as ``jaxlab.quant.quality.label``)."""
    return weights if kv == "float32" else f"{weights} + int8 KV"


def is_baseline(row: dict) -> bool:
    """The float32 weights with the float32 cache: what every other variant is compared with."""
    return (row["weights"], row["kv_cache"]) == ("float32", "float32")


def measure_quant(opts: Options, setup: Setup, quantized: dict) -> dict:
    """The decode step of float32 and of each quantized variant (weights x KV cache) at each batch size,
    side by side in this process, as the A/B harness of ``benchmarks/NOTES.md`` does: every program is
    compiled and run once first; then each of max(reps, 5) repetitions runs ``quant_steps`` steps of every
    variant in turn (the order rotates by one per repetition), so that load from other processes hits all
    variants alike.

    A step is the library's (:func:`jaxlab.engine.steps.decode_step`, jitted with the cache donated:
    forward + greedy pick) with the token sent to the host after each step and the next step launched before that
    read, as ``Generator`` does. The
    cache holds ``prompt_len`` filled slots of ``cache_len`` (zeros: the step's cost does not depend on
    what the cache holds, as attention reads every slot). The weights are quantized as
    ``jaxlab.load(quant=...)`` does (``quant.quantize_model``: W8A8 calibrated); ``quantized``
    ({format: Params}) is filled for the quality report to reuse."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxlab import quant
    from jaxlab.engine.kvcache import init_cache, key_layout_for
    from jaxlab.engine.sampling import SamplingParams
    from jaxlab.engine.steps import jit_decode

    P, k, cache_len, log = opts.prompt_len, opts.quant_steps, setup.cache_len, setup.log
    reps = max(opts.reps, 5)  # short measurements on a shared machine: more repetitions (as the prefill)
    batches = opts.quant_batch_sizes
    params = setup.params
    cfg = params.config
    quantize_s = {}
    for fmt in opts.quant_formats:
        if fmt not in quantized:
            log(f"quantized decode: quantizing the weights to {fmt}")
            t0 = time.perf_counter()
            quantized[fmt] = quant.quantize_model(params, setup.tokenizer, fmt)
            quantize_s[fmt] = time.perf_counter() - t0
    weights = {"float32": params, **quantized}
    variants = list(
        dict.fromkeys(
            [("float32", "float32")] + [(w, kv) for w in ("float32", *opts.quant_formats) for kv in opts.quant_kv]
        )
    )
    samp = SamplingParams().state()
    key = jax.random.key(0)
    first = {b: jnp.asarray([r[-1] for r in setup.rows[:b]], jnp.int32) for b in batches}
    positions = {b: [jnp.full((b,), P + s, jnp.int32) for s in range(k)] for b in batches}

    def fresh_cache(b, kv, w):
        # the key layout Generator gives it (keys transposed for a float32 cache on XLA:CPU: the attention kernel's)
        cache = init_cache(cfg, b, cache_len, kv, key_layout=key_layout_for(weights[w].policy.attention, kv))
        slots = jnp.arange(cache_len, dtype=jnp.int32)
        pos = jnp.broadcast_to(jnp.where(slots < P, slots, -1), (b, cache_len))
        return jax.block_until_ready(dataclasses.replace(cache, pos=pos, index=jnp.asarray(P, jnp.int32)))

    compiled, compile_log = {}, []
    for b in batches:
        for w, kv in variants:
            log(f"quantized decode: compile {quant_label(w, kv)}, batch {b}")
            t0 = time.perf_counter()
            compiled[w, kv, b] = jit_decode.lower(
                weights[w], first[b], positions[b][0], fresh_cache(b, kv, w), key, samp
            ).compile()
            compile_log.append(
                {
                    "function": "decode step (quant rows)",
                    "dtype": quant_label(w, kv),
                    "batch": b,
                    "tokens": None,
                    "cache_len": cache_len,
                    "seconds": time.perf_counter() - t0,
                }
            )

    def run(w, kv, b, steps=k) -> float:
        fn, p, cache = compiled[w, kv, b], weights[w], fresh_cache(b, kv, w)
        t0 = time.perf_counter()
        out = fn(p, first[b], positions[b][0], cache, key, samp)
        for s in range(steps):
            tokens, _, cache = out
            # the next step is launched before this one's tokens are read (it takes them on the device), as in
            # Generator's loop: the host's read and the next dispatch overlap the device's step
            out = fn(p, tokens, positions[b][s + 1], cache, key, samp) if s + 1 < steps else None
            np.asarray(tokens)  # the host gets every token, as in Generator's loop
        return (time.perf_counter() - t0) / steps

    log("quantized decode: warm-up (two steps of every program)")
    for b in batches:
        for v in variants:
            run(*v, b, steps=min(2, k))
    times: dict[tuple, list[float]] = {}
    for rep in range(reps):
        order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
        for b in batches:
            log(f"quantized decode: batch {b}, rep {rep + 1}/{reps} ({len(variants)} variants x {k} steps)")
            for w, kv in order:
                times.setdefault((w, kv, b), []).append(run(w, kv, b))
    rows = []
    compile_s = {(c["dtype"], c["batch"]): c["seconds"] for c in compile_log}
    for b in batches:
        base = times["float32", "float32", b]
        for w, kv in variants:
            t = times[w, kv, b]
            st = summarize(t)
            wb = weights[w].nbytes()
            paired = summarize([x / y for x, y in zip(base, t)])  # float32 / this, same repetition
            rows.append(
                {
                    "weights": w,
                    "kv_cache": kv,
                    "label": quant_label(w, kv),
                    "batch": b,
                    "step_s": st,
                    "tokens_per_s": summary_map(st, lambda x: b / x),
                    "vs_float32": paired["median"],
                    "vs_float32_per_rep": paired,
                    "vs_float32_of_medians": ratio(statistics.median(base), st["median"]),
                    "weight_bytes": wb,
                    "bytes_per_step": decode_step_bytes(wb, cfg, b, P + k / 2, kv),
                    "compile_s": compile_s[quant_label(w, kv), b],
                    "key_layout": key_layout_for(weights[w].policy.attention, kv),
                }
            )
    return {
        "rows": rows,
        "crossover": crossover_rows(rows),
        "batch_sizes": list(batches),
        "steps": k,
        "reps": reps,
        "prompt_len": P,
        "cache_len": cache_len,
        "quantize_s": quantize_s,
        "compile": compile_log,
        "method": METHOD,
    }


def crossover(ratios: dict) -> dict:
    """Where a format pays, from {batch: ratio} with ratio = float32 step time / its step time (> 1 pays).

    -> {"pays_at": batches where ratio > 1, "from": the smallest batch from which it pays at every larger
    measured batch (None if it does not pay at the largest), "text"}. Weight-only formats usually pay at
    small batches (decode reads the weights) and stop paying at large ones (compute), so "up to b8"
    is as much a crossover as "from b8"."""
    bs = sorted(b for b, r in ratios.items() if r is not None)
    pays = [b for b in bs if ratios[b] > 1.0]
    tail = []
    for b in reversed(bs):
        if ratios[b] <= 1.0:
            break
        tail.insert(0, b)
    if not bs:
        text = "not measured"
    elif not pays:
        text = "never (<= 1x at every batch)"
    elif pays == bs:
        text = "at every batch measured"
    elif pays == tail:
        text = f"from b{pays[0]}"
    elif pays == bs[: len(pays)]:
        text = f"up to b{pays[-1]} (loses from b{bs[len(pays)]})"
    else:
        text = "at " + ", ".join(f"b{b}" for b in pays)
    return {"pays_at": pays, "from": tail[0] if tail else None, "text": text}


def crossover_rows(rows: list[dict]) -> list[dict]:
    """One row per quantized variant (not the float32 baseline): its ratio at each batch and :func:`crossover`."""
    out = {}
    for r in rows:
        if not is_baseline(r):
            out.setdefault((r["weights"], r["kv_cache"]), {})[r["batch"]] = r["vs_float32"]
    return [
        {"label": quant_label(w, kv), "weights": w, "kv_cache": kv, "ratios": ratios, **crossover(ratios)}
        for (w, kv), ratios in out.items()
    ]


def best_at_batch(rows: list[dict], batch: int) -> dict | None:
    """The quantized row with the highest ratio over float32 at ``batch`` (None if none was measured)."""
    cands = [r for r in rows if r["batch"] == batch and not is_baseline(r) and r.get("vs_float32") is not None]
    return max(cands, key=lambda r: r["vs_float32"], default=None)
