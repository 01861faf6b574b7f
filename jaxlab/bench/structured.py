"""``jaxlab bench --structured``: what a grammar's token mask buys and what it costs, on the shipped extraction task.

**Quality.** The extraction task's test split (``data/finetune/test.jsonl``, 250 items; ``--limit N`` the first N),
greedy through the continuous engine, the base model without and with the answer's JSON schema
(:data:`jaxlab.train.task.SCHEMA`), and the same for a LoRA adapter given with ``--adapter DIR``. For each:
schema-valid % (the whole reply is one object with exactly the schema's keys and types), match % (the task's own
score: the first JSON object equals the answer) and field-exact % (the answer's fields the reply has exactly).

**Cost.** The decode step at batch 1 and 32, every row constrained by the schema against every row free, in one
engine (the same compiled program: free rows pass an all-ones mask): per step, the median wall time over the
steps where every row is decoding (all prompts in, none finished), and the host's share spent computing masks
and advancing matchers; two rounds of (free, constrained), each kind's best median, since a shared machine's
speed drifts over a run (one round once gave the free step 1.5x the time of the same step a minute later). The
ratio constrained / free is the target's.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import jax

#: The issue's targets: a masked decode step at most this many times the free one, at batch 1 and at batch 32.
COST_LIMIT = 1.15
COST_BATCHES = (1, 32)


def _engine(params, tokenizer, slots: int):
    """An engine whose first step takes every prompt in (a token budget past them all): from the second step on
    every row decodes, so the steps timed are decode steps of ``slots`` rows."""
    from jaxlab.engine.continuous import Engine

    return Engine(params, tokenizer, slots=slots, context=256, token_budget=slots * 256)


def quality(params, tokenizer, items: list[dict], label: str, log, slots: int = 32, max_new_tokens: int = 96) -> list:
    """The rows without and with the schema for one set of weights."""
    from jaxlab.engine.grammar import Constraint
    from jaxlab.io.tokenizer import prompt_ids
    from jaxlab.train.task import SCHEMA, fields_exact, schema_valid, score

    eng = _engine(params, tokenizer, slots)
    prompts = [prompt_ids(tokenizer, e["prompt"]) for e in items]
    rows = []
    for constrained in (False, True):
        log(f"{label}, {'with' if constrained else 'without'} the schema: {len(items)} items")
        t0 = time.perf_counter()
        constraint = Constraint.json_schema(SCHEMA) if constrained else None
        got = eng.generate(prompts, max_new_tokens, constraint=constraint)
        replies = [r.text for r in got]
        n = len(items)
        rows.append(
            {
                "weights": label,
                "schema": constrained,
                "n": n,
                "schema_valid": sum(schema_valid(r) for r in replies) / n,
                "match": sum(score(r, e["answer"])["match"] for r, e in zip(replies, items)) / n,
                "field_exact": sum(fields_exact(r, e["answer"]) for r, e in zip(replies, items)) / n,
                "tokens": sum(len(r.generated_ids) for r in got),
                "seconds": time.perf_counter() - t0,
                "examples": replies[:3],
            }
        )
    return rows


def step_cost(params, tokenizer, items: list[dict], batch: int, log, new_tokens: int = 96, reps: int = 2) -> dict:
    """Decode step times at ``batch`` rows, every row free and every row constrained, in one engine: ``reps``
    rounds of (free, constrained), each kind's best median (a shared machine drifts between runs of seconds)."""
    from jaxlab.engine.grammar import Constraint
    from jaxlab.io.tokenizer import prompt_ids
    from jaxlab.train.task import SCHEMA

    eng = _engine(params, tokenizer, batch)
    eng.warmup()
    prompts = [prompt_ids(tokenizer, items[i % len(items)]["prompt"]) for i in range(batch)]
    out = {"batch": batch}
    for rep in range(reps):
        for name, constraint in (("free", None), ("schema", Constraint.json_schema(SCHEMA))):
            log(f"decode step cost at batch {batch}: {name} ({rep + 1} of {reps})")
            kw = {"ignore_eos": True} if constraint is None else {"constraint": constraint}
            streams = [eng.add_request(p, max_new_tokens=new_tokens, **kw) for p in prompts]
            times, host = [], []
            while eng.has_work:
                steady = all(s.first_token_at is not None for s in streams) and not any(s.finished for s in streams)
                g0, t0 = eng.grammar_seconds, time.perf_counter()
                eng.step()
                if steady:
                    times.append(time.perf_counter() - t0)
                    host.append(eng.grammar_seconds - g0)
            if len(times) < 3:
                raise RuntimeError(f"only {len(times)} steady decode steps at batch {batch}: ask for more new tokens")
            got = {"step_s": statistics.median(times), "grammar_s": statistics.median(host), "steps": len(times)}
            if name not in out or got["step_s"] < out[name]["step_s"]:
                out[name] = got
    out["ratio"] = out["schema"]["step_s"] / out["free"]["step_s"]
    out["grammar_share"] = out["schema"]["grammar_s"] / out["schema"]["step_s"]
    return out


def measure_structured(limit: int | None, adapter: str | None, log, quick: bool = False) -> dict:
    from jaxlab.engine.loading import load
    from jaxlab.io.assets import data_file
    from jaxlab.train import lora
    from jaxlab.train.data import read_jsonl

    m = load(dtype="float32")
    items = read_jsonl(data_file("finetune", "test.jsonl"))
    items = items[: limit or (16 if quick else len(items))]
    rows = quality(m.params, m.tokenizer, items, "base", log)
    if adapter:
        label = f"adapter {Path(adapter).name}"
        rows += quality(lora.merge_folder(m.params, adapter), m.tokenizer, items, label, log)
    cost = [step_cost(m.params, m.tokenizer, items, b, log) for b in ((1, 4) if quick else COST_BATCHES)]
    return {"items": len(items), "split": "data/finetune/test.jsonl", "rows": rows, "cost": cost}


def structured_targets(res: dict) -> list[dict]:
    """The issue's targets, each PASS/MISS from what this run measured."""
    out = []
    for r in res["rows"]:
        if r["schema"]:
            what = f"100 % schema-valid with the schema, {r['weights']} ({r['n']} items)"
            out.append((f"valid_{r['weights']}", what, r["schema_valid"], lambda v: v == 1.0))
    for c in res["cost"]:
        what = f"masked decode step <= {COST_LIMIT}x the free one at batch {c['batch']}"
        out.append((f"cost_b{c['batch']}", what, c["ratio"], lambda v: v <= COST_LIMIT))
    return [
        {"key": k, "target": what, "measured": v, "status": "PASS" if test(v) else "MISS"} for k, what, v, test in out
    ]


def render_structured(res: dict) -> str:
    lines = [
        f"extraction task, {res['items']} items of {res['split']}, greedy, at most 96 new tokens",
        "",
        f"{'weights':28s} {'schema':>6s} {'valid':>7s} {'match':>7s} {'fields':>7s} {'tokens':>7s} {'seconds':>8s}",
    ]
    for r in res["rows"]:
        lines.append(
            f"{r['weights'][:28]:28s} {'yes' if r['schema'] else 'no':>6s} {r['schema_valid']:7.1%} {r['match']:7.1%} "
            f"{r['field_exact']:7.1%} {r['tokens']:7d} {r['seconds']:8.1f}"
        )
    lines += [
        "",
        f"{'batch':>5s} {'free ms/step':>13s} {'schema ms/step':>15s} {'ratio':>6s} {'grammar (host) ms':>18s}",
    ]
    for c in res["cost"]:
        lines.append(
            f"{c['batch']:5d} {c['free']['step_s'] * 1e3:13.1f} {c['schema']['step_s'] * 1e3:15.1f} {c['ratio']:6.2f} "
            f"{c['schema']['grammar_s'] * 1e3:18.2f}"
        )
    return "\n".join(lines) + "\n"


def run_structured(args, out) -> int:
    from jaxlab.bench.harness import Progress
    from jaxlab.bench.output import finish, host_meta

    log = Progress()
    quick = bool(getattr(args, "quick", False))
    res = measure_structured(getattr(args, "limit", None), getattr(args, "adapter", None), log, quick=quick)
    res["meta"] = host_meta(quick=quick, backend=jax.default_backend())
    res["targets"] = structured_targets(res)
    text = (
        f"jaxlab bench --structured  |  {res['meta']['cpu']}  |  {os.cpu_count()} CPUs, backend "
        f"{jax.default_backend()}  |  {res['meta']['date']}\n\n"
    )
    return finish(res, text + render_structured(res), args, out)
