"""Speculative decoding by task type (batch 1, greedy, identical tokens checked): the rows
:func:`jaxlab.lab.speculation.measure` measures, run on the bench's generator so its compiled programs
are reused."""

from __future__ import annotations

from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options


def measure_speculative(opts: Options, setup: Setup) -> list[dict]:
    """n-gram and draft-model drafting (n-gram only with --quick) against plain greedy, copy-heavy vs
    open-ended prompts."""
    from jaxlab.lab import speculation

    setup.log("speculative decoding: n-gram and draft model, copy-heavy vs open-ended prompts")
    quick = opts.quick
    return speculation.measure(
        setup.params,
        setup.tokenizer,
        speculation.TASK_TYPES,
        k=4,
        max_new_tokens=16 if quick else 32,
        methods=("ngram",) if quick else ("ngram", "draft"),
        repeats=1 if quick else 2,
        generator=setup.generator,
    )


def copy_heavy_speedup(rows: list[dict]) -> float | None:
    """Speed-up of n-gram drafting on the copy-heavy prompts; 0 when its tokens were not identical."""
    row = next((r for r in rows if r["task"] == "copy-heavy" and r["method"] == "ngram"), None)
    if row is None:
        return None
    return row["speed-up"] if row["identical"] == "yes" else 0.0
