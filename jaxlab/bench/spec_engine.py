"""Speculative decoding on the continuous engine, side by side (``python -m jaxlab.bench.spec_engine``): each row its
own accepted run (:class:`~jaxlab.engine.continuous.Engine` with ``speculative=k``) against the same engine without
drafts and against the lockstep :class:`~jaxlab.engine.speculative.SpeculativeDecoder`, on one batch that mixes
copy-heavy and open-ended prompts (:data:`~jaxlab.bench.speculative.TASK_TYPES`), greedy, tokens checked identical.
Its stored run (``data/bench/speculative-engine-cpu.json``) is what notebook 10 shows."""

from __future__ import annotations

from typing import Sequence

from jaxlab.bench.speculative import TASK_PROMPTS, TASK_TYPES
from jaxlab.engine.model import Params
from jaxlab.engine.speculative import DEFAULT_K, SpeculativeDecoder
from jaxlab.io.tokenizer import prompt_ids


def measure_engine(
    params: Params,
    tokenizer,
    prompts: Sequence | None = None,
    k: int = DEFAULT_K,
    max_new_tokens: int = 32,
    repeats: int = 2,
    context: int = 256,
) -> dict:
    """Speculative decoding on the continuous engine (each row its own accepted run) against the same engine without
    drafts and against the lockstep :class:`~jaxlab.engine.speculative.SpeculativeDecoder` (the batch advances by
    its worst row's count), greedy, one batch that mixes copy-heavy and open-ended prompts (default: every prompt of
    :data:`TASK_TYPES`). Both engines are warmed up, then run ``repeats`` times interleaved (the fastest kept).
    -> {"rows": one per road (tokens per decode row-call, acceptance, seconds, tokens/s, identical to plain greedy
    on the engine), "speed_up": speculative engine / plain engine, "host"}."""
    import time

    from jaxlab.bench.output import host_meta
    from jaxlab.engine.continuous import Engine

    texts = [p for ps in TASK_TYPES.values() for p in ps] if prompts is None else list(prompts)
    ids = [prompt_ids(tokenizer, p) if isinstance(p, str) else list(p) for p in texts]
    n = len(ids)
    engines = {
        name: Engine(params, tokenizer, slots=n, page_size=16, chunk=64, context=context, speculative=spec)
        for name, spec in (("plain", 0), ("speculative", k))
    }
    for eng in engines.values():
        eng.warmup()
    best: dict = {}
    for _ in range(max(1, repeats)):
        for name, eng in engines.items():
            calls, drafted, kept = eng.row_calls, eng.drafted, eng.accepted
            t0 = time.perf_counter()
            res = eng.generate(ids, max_new_tokens, ignore_eos=True)
            secs = time.perf_counter() - t0
            if name not in best or secs < best[name]["secs"]:
                best[name] = {"secs": secs, "tokens": [r.generated_ids for r in res], "calls": eng.row_calls - calls,
                              "drafted": eng.drafted - drafted, "accepted": eng.accepted - kept}  # fmt: skip
    lockstep = SpeculativeDecoder(params, tokenizer, method="ngram", k=k)
    res = lockstep.generate(ids, max_new_tokens)
    while res[0].compiles:
        res = lockstep.generate(ids, max_new_tokens)
    want = best["plain"]["tokens"]
    rows = []
    for name, b in best.items():
        tokens = sum(len(t) - 1 for t in b["tokens"])  # after the first (the prefill makes that one)
        rows.append({"road": f"engine, {name}", "tokens/call": tokens / b["calls"] if b["calls"] else float("nan"),
                     "acceptance": b["accepted"] / b["drafted"] if b["drafted"] else float("nan"),
                     "seconds": b["secs"], "tok/s": n * max_new_tokens / b["secs"],
                     "identical": "yes" if b["tokens"] == want else "no"})  # fmt: skip
    proposed, accepted = sum(r.proposed for r in res), sum(r.accepted for r in res)
    rows.append({"road": "lockstep decoder (batch minimum)", "tokens/call": res[0].tokens_per_call,
                 "acceptance": accepted / proposed if proposed else float("nan"), "seconds": None, "tok/s": None,
                 "identical": "yes" if [r.generated_ids for r in res] == want else "no"})  # fmt: skip
    return {
        "rows": rows,
        "speed_up": best["plain"]["secs"] / best["speculative"]["secs"],
        "k": k,
        "batch": n,
        "max_new_tokens": max_new_tokens,
        "host": host_meta(),
    }


def render_engine(res: dict) -> str:
    """The :func:`measure_engine` table, its ratio and its host."""
    what = "copy-heavy and open-ended prompts mixed" if res["batch"] > 1 else "one copy-heavy prompt alone"
    lines = [f"speculative decoding on the engine: k={res['k']}, batch {res['batch']} ({what}), "
             f"{res['max_new_tokens']} new tokens each, greedy; {res['host']['cpu']}, {res['host']['date']}",
             f"{'road':36s}{'tokens/call':>12s}{'acceptance':>12s}{'seconds':>9s}{'tok/s':>8s}{'identical':>11s}"]  # fmt: skip
    for r in res["rows"]:
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.2f}"
        tps = "-" if r["tok/s"] is None else f"{r['tok/s']:.1f}"
        lines.append(
            f"{r['road']:36s}{r['tokens/call']:12.2f}{r['acceptance']:12.2f}{secs:>9s}{tps:>8s}{r['identical']:>11s}"
        )
    lines.append(
        f"speculative engine / plain engine: {res['speed_up']:.2f}x the tokens per second (measured side by side, one run)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jaxlab.bench.spec_engine [--k K] [--json PATH]``: speculative decoding on the continuous engine
    against the same engine without drafts and the lockstep decoder, on the embedded model (float32): the mixed batch
    (``mixed``) and one copy-heavy request alone (``alone``, the low load speculative decoding is for), printed."""
    import argparse
    import json
    from pathlib import Path

    from jaxlab.engine.loading import load

    p = argparse.ArgumentParser(prog="python -m jaxlab.bench.spec_engine", description=main.__doc__)
    p.add_argument("--k", type=int, default=DEFAULT_K)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args(argv)
    m = load(dtype="float32")
    runs = {}
    for name, prompts in (("mixed", None), ("alone", TASK_PROMPTS["copy: repeat"])):
        runs[name] = measure_engine(
            m.params, m.tokenizer, prompts, k=args.k, max_new_tokens=args.new_tokens, repeats=args.repeats
        )
        print(render_engine(runs[name]) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": runs["mixed"]["host"], **runs}, indent=1) + "\n", encoding="utf-8")
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
