"""``jaxlab bench --trace``: continuous batching against static batching on a seeded request trace, the paged
decode step against the contiguous one, and prefix reuse — measured side by side in one run.

* **The trace** (``data/bench/trace.json``, made by :func:`make_trace` with seed 0): 64 requests, Poisson
  arrivals, prompt lengths 16-512 and output lengths 8-256 (both long-tailed), EOS ignored so both systems do
  the same work. Arrival times are scaled at run start so the offered load (output tokens per second) is
  four times the static engine's throughput measured on a warm-up slice (a system cannot serve more than it is
  offered: at twice, the throughput ratio could not pass 2x whatever the engine does).
* **Static** (today's :class:`~jaxlab.engine.generate.Generator`): whenever it is idle it takes up to
  ``max_batch`` waiting requests (no waiting to fill) and runs them to the end of the longest. A batch is
  padded to ``max_batch`` rows so its programs have one batch size (at these batches decode reads the weights
  once per step whatever the rows, so the padding costs little). Its tokens come out of one ``generate``
  call, so a request's token times are placed evenly between that call's first token and its end.
* **Continuous** (:class:`~jaxlab.engine.continuous.Engine`): the same KV memory as static's largest cache
  (``max_batch`` x the bucket of the longest request), in pages, and admission by memory: up to ``max_running``
  requests run while their pages fit (the watermark kept free), decoded in calls of at most ``rows`` rows in the
  smallest batch-invariant row bucket.

Reported: throughput (output tokens / wall time from the first arrival to the last token), p50/p99 time to
first token and time per output token, KV use (stored tokens / capacity, averaged over the steps during which
requests waited), and the same work once more offered at twice the rate the continuous engine just served (other
prompt texts of the same lengths, so no page is reused), where memory rather than arrivals is the limit: the KV use
the target reads; the paged decode step / the contiguous one at each batch and context; p50 TTFT with prefix
reuse on and off for requests sharing a system prompt, and whether their tokens are identical.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from jaxlab.bench.prompts import TEXT
from jaxlab.bench.stats import ratio, summarize

#: The full trace's shape; ``--quick`` runs :data:`QUICK_TRACE` (a few short requests, the same code).
TRACE = {
    "requests": 64,
    "prompt": (16, 512),
    "output": (8, 256),
    "max_batch": 8,
    "load": 4.0,
    "rows": 32,
    "max_running": 64,
}
QUICK_TRACE = {
    **TRACE,
    "requests": 6,
    "prompt": (8, 40),
    "output": (2, 12),
    "max_batch": 3,
    "rows": 4,
    "max_running": 6,
}
#: The second continuous run is offered this many times the throughput the first one served: requests queue, so
#: memory, not arrivals, limits what runs (the KV-use target's condition).
OVERLOAD = 2.0
STEP_SHAPES = {"batches": (1, 8, 32), "contexts": (256, 1024), "steps": 4}
QUICK_STEP_SHAPES = {"batches": (1,), "contexts": (256,), "steps": 2}
PREFIX = {"requests": 32, "system": 400, "slots": 8, "max_running": 32, "new_tokens": 8}
QUICK_PREFIX = {"requests": 4, "system": 40, "slots": 2, "max_running": 4, "new_tokens": 2}


def make_trace(seed: int = 0, n: int = 64, prompt=(16, 512), output=(8, 256)) -> list[dict]:
    """n requests: arrival (mean gap 1, exponential), prompt_len and new_tokens, each log-uniform over its
    range (long-tailed: most short, a few long)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, n)
    gaps[0] = 0.0

    def loguniform(lo, hi):
        return np.exp(rng.uniform(np.log(lo), np.log(hi + 1), n)).astype(int).clip(lo, hi)

    lens, outs = loguniform(*prompt), loguniform(*output)
    arrivals = np.cumsum(gaps)
    return [
        {"arrival": round(float(a), 4), "prompt_len": int(p), "new_tokens": int(o)}
        for a, p, o in zip(arrivals, lens, outs)
    ]


def load_trace(quick: bool) -> list[dict]:
    """The shipped trace (``data/bench/trace.json``); the quick one is made on the spot."""
    if quick:
        t = QUICK_TRACE
        return make_trace(0, t["requests"], t["prompt"], t["output"])
    from jaxlab.io.assets import data_file

    return json.loads(Path(data_file("bench", "trace.json")).read_text())["requests"]


def prompt_tokens(tokenizer, n: int, offset: int) -> list[int]:
    """n tokens of the bench's fixed text, starting ``offset`` tokens in (wrapping), after BOS."""
    ids = tokenizer.encode(TEXT)
    out = [ids[(offset + i) % len(ids)] for i in range(n - 1)]
    bos = getattr(tokenizer, "bos_id", None)
    return [ids[0] if bos is None else bos] + out


# --------------------------------------------------------------------------------------------------
# Serving a trace
# --------------------------------------------------------------------------------------------------


def _percentiles(values) -> dict:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


def _summary(done: list[dict], t_first: float, kv_use: list[float], fill: list[float] | None = None) -> dict:
    end = max(d["finish"] for d in done)
    tokens = sum(d["n"] for d in done)
    tpot = [(d["finish"] - d["first"]) / (d["n"] - 1) for d in done if d["n"] > 1]
    return {
        "requests": len(done),
        "output_tokens": tokens,
        "wall_s": end - t_first,
        "throughput": tokens / (end - t_first),
        "ttft_s": _percentiles([d["first"] - d["arrival"] for d in done]),
        "tpot_s": _percentiles(tpot),
        "kv_use": float(np.mean(kv_use)) if kv_use else None,
        "page_fill": float(np.mean(fill)) if fill else None,
    }


def run_static(generator, requests: list[dict], max_batch: int, cache_tokens: int, clock=time.perf_counter) -> dict:
    """Serve ``requests`` ({"ids", "new_tokens", "arrival" in seconds from now}) with static batches."""
    t0 = clock()
    waiting, done, kv_use = list(requests), [], []
    while waiting:
        now = clock() - t0
        ready = [r for r in waiting if r["arrival"] <= now]
        if not ready:
            time.sleep(max(0.0, min(r["arrival"] for r in waiting) - now))
            continue
        batch = ready[:max_batch]
        for r in batch:
            waiting.remove(r)
        prompts = [r["ids"] for r in batch] + [batch[0]["ids"]] * (max_batch - len(batch))
        n_max = max(r["new_tokens"] for r in batch)
        start = clock() - t0
        res = generator.generate(prompts, n_max, ignore_eos=True)
        end = clock() - t0
        first = start + res[0].compile_seconds + res[0].prefill_seconds
        step = (end - first) / max(n_max - 1, 1)
        for r in batch:
            done.append(
                {
                    "arrival": r["arrival"],
                    "first": first,
                    "finish": first + (r["new_tokens"] - 1) * step,
                    "n": r["new_tokens"],
                }
            )
        if waiting and any(r["arrival"] <= end for r in waiting):  # requests waited during this batch
            for k in range(n_max):  # stored tokens of the rows still generating, step by step
                live = sum(len(r["ids"]) + k for r in batch if k < r["new_tokens"])
                kv_use.append(live / cache_tokens)
    return _summary(done, 0.0, kv_use)


def run_continuous(engine, requests: list[dict], clock=time.perf_counter) -> dict:
    """Serve ``requests`` with the continuous-batching engine: arrivals join between steps."""
    t0 = clock()
    pending = sorted(requests, key=lambda r: r["arrival"])
    streams = []
    engine.kv_samples.clear()
    engine.fill_samples.clear()
    kv_peak = 0.0  # the highest KV use after any step
    while pending or engine.has_work:
        now = clock() - t0
        while pending and pending[0]["arrival"] <= now:
            r = pending.pop(0)
            s = engine.add_request(r["ids"], max_new_tokens=r["new_tokens"], ignore_eos=True)
            s.arrival_s = r["arrival"]
            streams.append(s)
        if engine.has_work:
            engine.step()
            kv_peak = max(kv_peak, engine.scheduler.kv_use())
        elif pending:
            time.sleep(max(0.0, pending[0]["arrival"] - (clock() - t0)))
    done = [
        {"arrival": s.arrival_s, "first": s.first_token_at - t0, "finish": s.finished_at - t0, "n": len(s.token_ids)}
        for s in streams
    ]
    return dict(_summary(done, 0.0, engine.kv_samples, engine.fill_samples), kv_peak=kv_peak)


def serve_trace(params, tokenizer, trace: list[dict], shape: dict, log: Callable[[str], None]) -> dict:
    """``trace`` through static batches of ``shape["max_batch"]`` and the continuous engine (the same KV memory,
    admission by memory up to ``shape["max_running"]``, decode calls of up to ``shape["rows"]`` rows), arrivals
    scaled so the offered load is ``shape["load"]`` x static's throughput on a warm-up slice."""
    max_batch, load = shape["max_batch"], shape["load"]
    from jaxlab.engine.continuous import Engine
    from jaxlab.engine.generate import Generator
    from jaxlab.engine.plan import CACHE_BUCKETS, bucket

    requests = [
        {"ids": prompt_tokens(tokenizer, t["prompt_len"], 97 * i), "new_tokens": t["new_tokens"], "gap": t["arrival"]}
        for i, t in enumerate(trace)
    ]
    longest = max(len(r["ids"]) + r["new_tokens"] for r in requests)
    context = bucket(longest, CACHE_BUCKETS)
    cache_tokens = max_batch * context  # static's largest cache; the continuous engine gets as much, in pages

    static = Generator(params, tokenizer)
    log(f"trace: compiling static batches of {max_batch} (prompt buckets x cache lengths)")
    lens = sorted({len(r["ids"]) for r in requests})
    for n in sorted({static.plan([n], 1).padded for n in lens}):
        static.warmup(batch_sizes=[max_batch], prompt_lens=[n], max_new_tokens=max(r["new_tokens"] for r in requests))
    page_size = 16
    engine = Engine(
        params,
        tokenizer,
        slots=shape["rows"],
        max_running=shape["max_running"],
        page_size=page_size,
        context=context,
        kv_tokens=cache_tokens,
        decode_buckets=shape.get("decode_buckets", True),
    )
    log("trace: compiling the continuous engine (row buckets probed; decode and prefill per page-table width)")
    engine.warmup()

    # the warm-up slice: the first max_batch requests, all at once, through static -> its throughput
    slice_ = [dict(r, arrival=0.0) for r in requests[:max_batch]]
    probe = run_static(static, slice_, max_batch, cache_tokens)
    offered = load * probe["throughput"]
    total = sum(r["new_tokens"] for r in requests)

    def scale(rate: float) -> float:  # the trace's gaps -> seconds, so that its tokens are offered at ``rate`` tok/s
        return total / rate / max(requests[-1]["gap"], 1e-9)

    span = total / offered  # seconds over which the trace's tokens are offered
    for r in requests:
        r["arrival"] = r["gap"] * scale(offered)
    log(f"trace: {len(requests)} requests over {span:.0f} s (offered {offered:.1f} tok/s = {load}x static)")

    log("trace: static batching")
    st = run_static(static, requests, max_batch, cache_tokens)
    log("trace: continuous batching")
    ct = run_continuous(engine, requests)
    bucket_calls = {str(b): n for b, n in sorted(engine.runner.bucket_steps.items())}
    most_running = engine.most_running
    # KV use is measured while requests wait for memory; at the offered load the engine may admit every arrival as it
    # comes. So the same work again, offered at twice the rate the engine just served, so requests queue: how full
    # admission by memory keeps the pool when memory is the limit. (Every request at once measures mostly the ramp of
    # an empty pool filling: benchmarks/NOTES.md 27.)
    over = OVERLOAD * ct["throughput"]
    log(f"trace: continuous batching, the same work offered at {over:.1f} tok/s ({OVERLOAD:g}x what it served)")
    more = [
        dict(r, ids=prompt_tokens(tokenizer, len(r["ids"]), 97 * i + 31), arrival=r["gap"] * scale(over))
        for i, r in enumerate(requests)
    ]
    overload = run_continuous(engine, more)
    return {
        "requests": len(requests),
        "max_batch": max_batch,
        "max_running": shape["max_running"],
        "row_buckets": list(engine.runner.row_buckets),
        "bucket_calls": bucket_calls,
        "most_running": most_running,
        "kv_tokens": cache_tokens,
        "page_size": page_size,
        "load": load,
        "offered_tokens_per_s": offered,
        "warmup_static_tokens_per_s": probe["throughput"],
        "static": st,
        "continuous": ct,
        "overload": {
            "offered_tokens_per_s": over,
            **{k: overload[k] for k in ("wall_s", "throughput", "kv_use", "kv_peak", "page_fill")},
        },
        "throughput_ratio": ratio(ct["throughput"], st["throughput"]),
        "preemptions": engine.scheduler.preemptions,
    }


# --------------------------------------------------------------------------------------------------
# The paged step against the contiguous one, and prefix reuse
# --------------------------------------------------------------------------------------------------


def _time(fn, reps: int) -> dict:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return summarize(ts)


def step_ratios(params, quick: bool, reps: int, log) -> list[dict]:
    """Decode step time, paged / contiguous, at each batch and context: the same model, the same positions
    (every row at the context's last position), the two caches."""
    import jax
    import jax.numpy as jnp

    from jaxlab.engine.grammar import allow_all
    from jaxlab.engine.kvcache import init_cache, key_layout_for
    from jaxlab.engine.paged import init_paged_cache
    from jaxlab.engine.steps import GREEDY, jit_decode, jit_rows

    shapes = QUICK_STEP_SHAPES if quick else STEP_SHAPES
    cfg = params.config
    rows = []
    for ctx in shapes["contexts"]:
        for b in shapes["batches"]:
            log(f"paged vs contiguous decode step: batch {b}, context {ctx}")
            key = jax.random.key(0)
            dtype = params.policy.jnp_dtype  # each cache as its engine makes it, its key layout included
            layout = key_layout_for(params.policy.attention, dtype)
            cache = init_cache(cfg, b, ctx, dtype, key_layout=layout)
            # the first ctx - 1 slots written (as the paged rows' pages are): a read of only the written slots
            # (jaxlab's CPU kernel) does the same work as the paged one, and XLA's reads every slot either way
            written = jnp.where(jnp.arange(ctx) < ctx - 1, jnp.arange(ctx, dtype=jnp.int32), -1)
            cache = dataclasses.replace(cache, pos=jnp.broadcast_to(written, (b, ctx)), index=jnp.int32(ctx - 1))
            tok = jnp.zeros((b,), jnp.int32)
            pos = jnp.full((b,), ctx - 1, jnp.int32)
            contiguous = jit_decode.lower(params, tok, pos, cache, key, GREEDY).compile()
            state = {"cache": cache}

            def run_contiguous():
                for _ in range(shapes["steps"]):
                    state["out"], _, state["cache"] = contiguous(params, tok, pos, state["cache"], key, GREEDY)
                state["out"].block_until_ready()

            pool = init_paged_cache(cfg, b * ctx // 16 + 1, 16, dtype=dtype, key_layout=layout)
            table = np.arange(1, b * ctx // 16 + 1, dtype=np.int32).reshape(b, ctx // 16)
            pcache = pool.with_table(table)
            free = jax.device_put(allow_all(b, cfg.vocab_size))
            args = (
                params,
                tok[:, None],
                pos[:, None],
                pcache,
                jnp.zeros(b, jnp.uint32),
                GREEDY,
                jnp.ones(b, bool),
                free,
            )
            paged = jit_rows.lower(*args).compile()
            pstate = {"cache": pcache}

            def run_paged():
                for _ in range(shapes["steps"]):
                    pstate["out"], _, pstate["cache"] = paged(
                        params, tok[:, None], pos[:, None], pstate["cache"], *args[4:]
                    )
                pstate["out"].block_until_ready()

            run_contiguous(), run_paged()  # warm
            c, p = [], []
            for _ in range(reps):  # interleaved, so a slow moment of the machine hits both
                c.append(_time(run_contiguous, 1)["median"] / shapes["steps"])
                p.append(_time(run_paged, 1)["median"] / shapes["steps"])
            c, p = summarize(c), summarize(p)
            rows.append(
                {"batch": b, "context": ctx, "contiguous_s": c, "paged_s": p, "ratio": ratio(p["median"], c["median"])}
            )
    return rows


def prefix_reuse(params, tokenizer, quick: bool, log) -> dict:
    """Requests sharing a system prompt, all arriving at once: p50 TTFT with prefix reuse off and on."""
    from jaxlab.engine.continuous import Engine

    shape = QUICK_PREFIX if quick else PREFIX
    system = prompt_tokens(tokenizer, shape["system"], 0)
    prompts = [system + tokenizer.encode(f" Question {i}: what comes next?") for i in range(shape["requests"])]
    context = 64 * -(-(max(map(len, prompts)) + shape["new_tokens"]) // 64)
    kv_tokens = shape["slots"] * context  # the same KV memory on and off: room for `slots` requests without reuse
    out = {"requests": len(prompts), "system_tokens": len(system), "slots": shape["slots"], "kv_tokens": kv_tokens}
    tokens = {}
    for reuse in (False, True):
        eng = Engine(
            params,
            tokenizer,
            slots=shape["slots"],
            max_running=shape["max_running"],
            context=context,
            kv_tokens=kv_tokens,
            prefix_reuse=reuse,
        )
        log(f"prefix reuse {'on' if reuse else 'off'}: compiling")
        eng.warmup()
        t0 = time.perf_counter()
        streams = [eng.add_request(p, max_new_tokens=shape["new_tokens"], ignore_eos=True) for p in prompts]
        eng.run()
        ttft = [s.first_token_at - t0 for s in streams]
        tokens[reuse] = [s.token_ids for s in streams]
        out["on" if reuse else "off"] = {
            "ttft_s": _percentiles(ttft),
            "reused_pages": eng.pool.reused_pages,
            "most_running": eng.most_running,
            "kv_use": float(np.mean(eng.kv_samples)) if eng.kv_samples else None,
        }
    out["identical"] = tokens[True] == tokens[False]
    out["ttft_ratio"] = ratio(out["off"]["ttft_s"]["p50"], out["on"]["ttft_s"]["p50"])
    return out


def measure_trace(params, tokenizer, quick: bool, reps: int, log) -> dict:
    """Everything ``--trace`` measures."""
    shape = QUICK_TRACE if quick else TRACE
    res = {"serving": serve_trace(params, tokenizer, load_trace(quick), shape, log)}
    res["steps"] = step_ratios(params, quick, reps, log)
    res["prefix"] = prefix_reuse(params, tokenizer, quick, log)
    return res


# --------------------------------------------------------------------------------------------------
# Targets and the report
# --------------------------------------------------------------------------------------------------


def trace_targets(res: dict) -> list[dict]:
    """The issue's targets, each PASS/MISS from what this run measured."""
    s, p = res["serving"], res["prefix"]
    st, ct = s["static"], s["continuous"]
    out = [
        ("throughput", "continuous >= 3x static throughput", s["throughput_ratio"], lambda v: v >= 3.0),
        (
            "p99_ttft",
            "continuous p99 TTFT < static p99 TTFT",
            ratio(ct["ttft_s"]["p99"], st["ttft_s"]["p99"]),
            lambda v: v < 1.0,
        ),
        (
            "kv_use",
            "continuous KV use >= 80 % (offered twice what it serves)",
            s["overload"]["kv_use"],
            lambda v: v >= 0.8,
        ),
    ]
    for r in res["steps"]:
        out.append(
            (
                f"paged_b{r['batch']}_{r['context']}",
                f"paged step <= 1.2x contiguous, batch {r['batch']}, context {r['context']}",
                r["ratio"],
                lambda v: v <= 1.2,
            )
        )
    out.append(
        (
            "prefix_ttft",
            "prefix reuse: p50 TTFT >= 3x lower, identical tokens",
            p["ttft_ratio"],
            lambda v, ok=p["identical"]: v >= 3.0 and ok,
        )
    )
    return [
        {"key": k, "target": what, "measured": v, "status": "n/a" if v is None else ("PASS" if test(v) else "MISS")}
        for k, what, v, test in out
    ]


def render_trace(res: dict) -> str:
    s = res["serving"]
    lines = [
        f"Continuous batching against static batching ({s['requests']} requests, static batches of {s['max_batch']}, "
        f"continuous up to {s['max_running']} running by memory; KV memory {s['kv_tokens']} tokens for both; offered load {s['offered_tokens_per_s']:.1f} tok/s = {s['load']}x static's "
        f"{s['warmup_static_tokens_per_s']:.1f} on a warm-up slice)",
        f"  {'':12s} {'tok/s':>8s} {'wall s':>8s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'TPOT p50':>9s} {'TPOT p99':>9s} {'KV use':>7s}",
    ]

    def ms(v):
        return "-" if v is None else f"{v * 1e3:.0f} ms"

    for name in ("static", "continuous"):
        r = s[name]
        kv = "-" if r["kv_use"] is None else f"{r['kv_use'] * 100:.0f} %"
        lines.append(
            f"  {name:12s} {r['throughput']:8.1f} {r['wall_s']:8.1f} {ms(r['ttft_s']['p50']):>9s} {ms(r['ttft_s']['p99']):>9s} "
            f"{ms(r['tpot_s']['p50']):>9s} {ms(r['tpot_s']['p99']):>9s} {kv:>7s}"
        )
    lines.append(f"  continuous / static throughput: {s['throughput_ratio']:.2f}x; preemptions: {s['preemptions']}")
    calls = ", ".join(f"{n} x {b} rows" for b, n in s["bucket_calls"].items())
    lines.append(
        f"  continuous: at most {s['most_running']} running at once, KV use at its peak "
        f"{s['continuous']['kv_peak'] * 100:.0f} %; decode calls by row bucket: {calls} "
        f"(buckets kept: {', '.join(map(str, s['row_buckets']))})"
    )
    if s["continuous"]["kv_use"] is None:
        lines.append("  KV use while requests waited: none waited (admission by memory admitted every arrival)")
    a = s["overload"]
    kv = "-" if a["kv_use"] is None else f"{a['kv_use'] * 100:.0f} %"
    lines.append(
        f"  the same work offered at {a['offered_tokens_per_s']:.1f} tok/s ({OVERLOAD:g}x what it served): KV use while "
        f"requests waited {kv} (peak {a['kv_peak'] * 100:.0f} %), {a['throughput']:.1f} tok/s over {a['wall_s']:.1f} s"
    )
    fill = s["continuous"]["page_fill"]
    if fill is not None:
        lines.append(
            f"  KV use = stored tokens / all KV memory; of the pages the continuous engine held, {fill * 100:.0f} % were "
            "filled (static: a row holds its whole cache)"
        )
    lines.append("")
    lines.append("Paged decode step against the contiguous one (median of interleaved reps, seconds per step)")
    for r in res["steps"]:
        lines.append(
            f"  batch {r['batch']:>3d}  context {r['context']:>5d}  contiguous {r['contiguous_s']['median'] * 1e3:8.2f} ms"
            f"  paged {r['paged_s']['median'] * 1e3:8.2f} ms  ratio {r['ratio']:.2f}x"
        )
    p = res["prefix"]
    lines.append("")
    lines.append(
        f"Prefix reuse: {p['requests']} requests sharing a {p['system_tokens']}-token system prompt, all arriving at "
        f"once, KV memory {p['kv_tokens']} tokens (room for {p['slots']} without reuse), admission by memory"
    )
    for k in ("off", "on"):
        lines.append(
            f"  reuse {k:3s}  TTFT p50 {ms(p[k]['ttft_s']['p50']):>9s}  p99 {ms(p[k]['ttft_s']['p99']):>9s}  "
            f"pages read instead of computed {p[k]['reused_pages']}, at most {p[k]['most_running']} running, KV use "
            f"while requests waited {'-' if p[k]['kv_use'] is None else format(p[k]['kv_use'] * 100, '.0f') + ' %'}"
        )
    lines.append(f"  p50 TTFT off / on: {p['ttft_ratio']:.2f}x; tokens identical: {'yes' if p['identical'] else 'NO'}")
    return "\n".join(lines) + "\n"


def run_trace(args, out) -> int:
    """``jaxlab bench --trace``: load the float32 model, measure, print (targets with ``--targets``), write
    ``--json``."""
    import jax

    from jaxlab.bench.harness import Progress
    from jaxlab.bench.output import finish, host_meta
    from jaxlab.engine.loading import load

    log = Progress()
    quick = bool(getattr(args, "quick", False))
    reps = getattr(args, "reps", None) or (1 if quick else 3)
    model = getattr(args, "model", None)
    log(f"loading the model ({model or 'embedded SmolLM2-135M'}, float32)")
    m = load(model, dtype="float32")
    res = measure_trace(m.params, m.tokenizer, quick, reps, log)
    res["meta"] = host_meta(backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind, quick=quick)
    res["targets"] = trace_targets(res)
    text = (
        f"jaxlab bench --trace  |  {res['meta']['cpu']}  |  {res['meta']['backend']} ({res['meta']['device_kind']})\n\n"
    )
    return finish(res, text + render_trace(res), args, out)
