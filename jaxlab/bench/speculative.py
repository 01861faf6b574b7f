"""Speculative decoding measured by task type (batch 1, greedy, identical tokens checked): the prompts, acceptance
and decode speed-up against plain greedy (:func:`measure`, also notebook 10's), and the bench's rows, run on the
bench's generator so its compiled programs are reused. The decoder itself is :mod:`jaxlab.engine.speculative`."""

from __future__ import annotations

from typing import Mapping, Sequence

from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options
from jaxlab.engine.generate import Generator
from jaxlab.engine.model import Params
from jaxlab.engine.speculative import DEFAULT_DRAFT_LAYERS, DEFAULT_K, METHODS, SpeculativeDecoder
from jaxlab.io.tokenizer import prompt_ids

PARAGRAPH = (
    "The lighthouse stood on a rock at the end of the harbour. Every evening the keeper climbed "
    "the stairs, lit the lamp and watched the ships come home before the storm."
)
CODE = "def area(width, height):\n    retrun width * height\n\nprint(area(3, 4))"

#: Prompts by task (all 65-128 tokens with the chat template: one prefill bucket): three whose
#: answer copies from the prompt, and one open-ended.
TASK_PROMPTS: dict[str, list[str]] = {
    "copy: repeat": [f"Repeat this text exactly: {PARAGRAPH}"],
    "copy: fix code": [f"Fix the typo in this code and show the corrected code:\n{CODE}"],
    "copy: extract": [
        "Extract the names of the people from this text and list them: Alice met Bob at the "
        "station at noon, then Carol and Dave joined them for lunch with Eve, and Frank came late."
    ],
    "open-ended": [
        "Write a short story about a robot who learns to paint. Give the robot a name, describe "
        "the studio where it works, and tell what the other robots think of its first picture."
    ],
}


#: The same, grouped by task *type* (with a second open-ended prompt): rows for ``jaxlab bench``.
TASK_TYPES: dict[str, list[str]] = {
    "copy-heavy": [p for task, ps in TASK_PROMPTS.items() if task.startswith("copy") for p in ps],
    "open-ended": TASK_PROMPTS["open-ended"]
    + [
        "Write a short poem about the sea at night, in four lines, with the moon, a boat and a lighthouse in it, "
        "and say in one sentence afterwards what the poem is about."
    ],
}


def measure(
    params: Params,
    tokenizer,
    prompts_by_task: Mapping[str, Sequence] | None = None,
    k: int = DEFAULT_K,
    max_new_tokens: int = 32,
    methods: Sequence[str] = METHODS,
    draft_layers: int = DEFAULT_DRAFT_LAYERS,
    repeats: int = 2,
    batch: int = 1,
    generator: Generator | None = None,
    outputs: dict | None = None,
) -> list[dict]:
    """Acceptance and decode speed-up against plain greedy (:class:`jaxlab.Generator`), by task.

    Prompts are texts (wrapped in the chat template) or id lists. With ``batch`` 1 each prompt runs
    alone; otherwise each task's prompts are cycled to fill one batch. Plain and speculative runs of a
    prompt are interleaved ``repeats`` times and the fastest of each is kept (a shared machine's load
    comes in bursts); a run that compiled anything is run again, so no timing includes compilation.
    Returns one row per (task, method): task, method, k, batch, acceptance (fraction of draft tokens
    kept), tokens/call (decode-phase tokens per target-model call; plain decoding: 1), plain and
    speculative decode tokens/s, speed-up, and identical ("yes" when every row's tokens equal plain
    greedy's). Pass ``generator`` to reuse a :class:`jaxlab.Generator` (and its compiled programs)
    for the baseline, and a dict as ``outputs`` to receive each task's prompts and plain greedy
    tokens (``{task: (prompt id lists, generated id lists)}``)."""
    prompts_by_task = TASK_PROMPTS if prompts_by_task is None else prompts_by_task
    as_ids = {
        task: [prompt_ids(tokenizer, p) if isinstance(p, str) else list(p) for p in ps]
        for task, ps in prompts_by_task.items()
    }
    batches = {
        task: ([[p] for p in ps] if batch == 1 else [[ps[i % len(ps)] for i in range(batch)]])
        for task, ps in as_ids.items()
    }
    plain = generator or Generator(params, tokenizer)
    decoders = {m: SpeculativeDecoder(params, tokenizer, method=m, k=k, draft_layers=draft_layers) for m in methods}
    runners = {
        "plain": (
            lambda ps: plain.generate(ps, max_new_tokens, ignore_eos=True),
            lambda res: res[0].compile_seconds > 0,
        )
    }
    for m, dec in decoders.items():
        runners[m] = (lambda ps, dec=dec: dec.generate(ps, max_new_tokens), lambda res: res[0].compiles > 0)

    rows = []
    for task, group in batches.items():
        totals = {
            name: {"secs": 0.0, "tokens": 0, "proposed": 0, "accepted": 0, "calls": 0, "same": True} for name in runners
        }
        reference = []
        for prompts in group:
            best: dict = {}
            for _ in range(max(1, repeats)):
                for name, (run, compiled) in runners.items():
                    res = run(prompts)
                    while compiled(res):
                        res = run(prompts)
                    secs = max(r.decode_seconds for r in res)
                    if name not in best or secs < best[name][0]:
                        best[name] = (secs, res)
            ref = [r.generated_ids for r in best["plain"][1]]
            reference.append(ref)
            for name, (secs, res) in best.items():
                t = totals[name]
                t["secs"] += secs
                t["tokens"] += sum(len(r.generated_ids) - 1 for r in res)
                if name != "plain":
                    t["proposed"] += sum(r.proposed for r in res)
                    t["accepted"] += sum(r.accepted for r in res)
                    t["calls"] += res[0].target_calls * len(res)
                    t["same"] &= [r.generated_ids for r in res] == ref
        if outputs is not None:
            outputs[task] = ([p for prompts in group for p in prompts], [g for ref in reference for g in ref])
        plain_tps = totals["plain"]["tokens"] / totals["plain"]["secs"]
        for m in decoders:
            t = totals[m]
            spec_tps = t["tokens"] / t["secs"]
            rows.append(
                {
                    "task": task,
                    "method": m if m == "ngram" else f"draft L={draft_layers}",
                    "k": k,
                    "batch": batch,
                    "acceptance": t["accepted"] / t["proposed"] if t["proposed"] else float("nan"),
                    "tokens/call": t["tokens"] / t["calls"],
                    "plain tok/s": plain_tps,
                    "spec tok/s": spec_tps,
                    "speed-up": spec_tps / plain_tps,
                    "identical": "yes" if t["same"] else "no",
                }
            )
    return rows


def measure_speculative(opts: Options, setup: Setup) -> list[dict]:
    """n-gram and draft-model drafting (n-gram only with --quick) against plain greedy, copy-heavy vs
    open-ended prompts."""
    setup.log("speculative decoding: n-gram and draft model, copy-heavy vs open-ended prompts")
    quick = opts.quick
    return measure(
        setup.params,
        setup.tokenizer,
        TASK_TYPES,
        k=4,
        max_new_tokens=16 if quick else 32,
        methods=("ngram",) if quick else ("ngram", "draft"),
        repeats=1 if quick else 2,
        draft_layers=min(DEFAULT_DRAFT_LAYERS, max(1, setup.params.config.n_layers // 2)),  # 8 of SmolLM2's 30
        generator=setup.generator,
    )


def copy_heavy_speedup(rows: list[dict]) -> float | None:
    """Speed-up of n-gram drafting on the copy-heavy prompts; 0 when its tokens were not identical."""
    row = next((r for r in rows if r["task"] == "copy-heavy" and r["method"] == "ngram"), None)
    if row is None:
        return None
    return row["speed-up"] if row["identical"] == "yes" else 0.0
