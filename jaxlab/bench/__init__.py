"""``jaxlab bench``: prefill and decode speed of the embedded SmolLM2-135M, as ratios measured in one run.

Absolute tokens/s depend on the machine and on whatever else it is doing, so every headline number here
is a *ratio* of two things measured side by side in the same process, minutes apart:

* against this machine's own **ceilings**, measured in the same run: memory bandwidth (read + write
  bytes of a >= 1 GiB copy, :func:`jaxlab.tools.profile.measure_bandwidth`) and float32 matmul FLOP/s
  (:func:`jaxlab.tools.profile.measure_matmul_flops`; a bfloat16 matmul is measured beside it);
* on a known accelerator, also against the chip's **published peaks** (:mod:`jaxlab.tools.hardware`: bfloat16
  dense FLOP/s and memory bandwidth from the vendor's pages), each figure as % of both;
* against a **peer**: Hugging Face ``transformers`` (PyTorch eager, float32, CPU) running ``generate``
  on the same GGUF weights, the same prompts and batch sizes, greedy, EOS ignored; its greedy tokens are
  compared with ours row by row.

Quantization (``jaxlab.quant``): the decode step of each weight format x KV-cache format against float32,
all measured side by side in one process (:func:`measure_quant`), with where each format starts to pay
(:func:`crossover`); ``--quality`` adds :func:`jaxlab.quant.quality.quality_report` (perplexity, KL, greedy
agreement, memory), and ``--targets`` says whether the format that meets a speed target also meets the
quality targets. ``--quant-only`` measures only these.

Method: every timed quantity is measured ``--reps`` times after a warm-up (compiled programs, touched
memory) and reported as the median with the min-max spread; every JAX timing ends with a host transfer
or ``block_until_ready``. Time to first token runs in fresh child processes with an empty (cold) and
then a filled (warm) persistent compilation cache, before this process starts its own backend (a TPU
belongs to one process: a child started later would measure the CPU; if it did, the figure says so).
See ``benchmarks/README.md``.

The pure helpers (:func:`summarize`, :func:`bandwidth_roofline_pct`, :func:`evaluate_targets`, ...)
need no model and are unit-tested; :func:`run_bench` does the measuring and :func:`render` the table.
This module imports only the standard library at import time (``jaxlab.cli`` imports it to build its
parser); jax, the model and torch are imported when a benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------

DEFAULTS = {
    "batch_sizes": (1, 8, 32, 128),
    "new_tokens": 128,
    "prompt_len": 128,
    "reps": 3,
    "bandwidth_mib": 1024,
    "matmul_n": 2048,
    "eager_steps": 8,
    "nocache_steps": 8,
    "bf16_steps": 16,
    "quant_batch_sizes": (1, 8, 32),
    "quant_steps": 16,
}
QUICK = {
    "batch_sizes": (1, 2),
    "new_tokens": 8,
    "prompt_len": 16,
    "reps": 1,
    "bandwidth_mib": 64,
    "matmul_n": 512,
    "eager_steps": 2,
    "nocache_steps": 2,
    "bf16_steps": 3,
    "quant_batch_sizes": (1, 2),
    "quant_steps": 3,
}
QUANT_FORMATS = ("int8", "int4", "w8a8")  # jaxlab.quant.FORMATS (not imported here: stdlib only at import)
KV_FORMATS = ("float32", "int8")  # jaxlab.quant.KV_FORMATS

#: The issue's targets: (key in the metrics dict, description, comparison, threshold, unit).
TARGETS = (
    ("decode_b1_vs_peer", "decode batch 1 >= 1.4x transformers", ">=", 1.4, "x"),
    ("decode_b1_bw_pct", "decode batch 1 >= 85 % of the bandwidth roofline", ">=", 85.0, "%"),
    ("decode_b32_vs_peer", "decode batch 32 >= 1.25x transformers", ">=", 1.25, "x"),
    ("prefill_vs_peer", "prefill >= 1.0x transformers", ">=", 1.0, "x"),
    ("prefill_matmul_pct", "prefill >= 80 % of the matmul ceiling", ">=", 80.0, "%"),
    ("compile_max_s", "<= 3 s compile per jitted function", "<=", 3.0, "s"),
    ("ttft_warm_s", "warm time to first token <= 1 s", "<=", 1.0, "s"),
    (
        "speculative_copy_speedup",
        "speculative (n-gram) on copy-heavy prompts >= 1.3x plain greedy, identical tokens",
        ">=",
        1.3,
        "x",
    ),
    ("quant_b32_best", "quantized decode batch 32 >= 2x float32 (best format)", ">=", 2.0, "x"),
    ("quant_b1_best", "quantized decode batch 1 >= 1.3x float32 (best format)", ">=", 1.3, "x"),
)
#: Speed targets whose format must also meet the quality targets: (batch, key of the speed target).
QUALITY_LINKED = ((32, "quant_b32_best"), (1, "quant_b1_best"))

# A fixed English text; prompts are windows of its tokens (different per row, all the same length).
TEXT = """\
The history of the lighthouse is, in a quiet way, the history of trade. Long before anyone printed a
chart, sailors watched for fires kept burning on headlands, and a town that wanted ships to call made
sure its fire was the brightest on the coast. The famous tower at Alexandria was built of pale stone
and rose higher than any building its visitors had seen; travellers wrote that its light could be
seen from a day's sailing away, which was surely an exaggeration, but a useful one for the merchants
who paid for the fuel.

For most of the following centuries the technology hardly changed. A keeper climbed the stairs at
dusk, trimmed the wicks, polished the glass and sat through the night listening to the wind. Coal
gave way to oil, and oil to gas, but the light itself stayed weak until a French engineer, Augustin
Fresnel, worked out how to bend it. His lens, a set of glass rings arranged like the steps of a
shallow staircase, gathered the glow of a single flame into a beam that carried twenty miles. Within
a few decades nearly every important light in the world had one.

Keeping a light was lonely work, and the records kept by keepers are full of small details: the day
the supply boat was late, the number of birds that struck the lantern in autumn fog, the price of
flour, a child born on the rock. Some stations were so exposed that the keepers were relieved only
when the sea allowed, and a storm could stretch a four-week turn into three months. Others stood at
the end of a village street, and the keeper's garden was famous for its roses.

Electric lamps, automatic switches and, later, satellite navigation made the keepers unnecessary.
The last of them left their towers within living memory. Many of the buildings are now museums or
holiday cottages, and a few still shine every night, unattended, because a small boat on a dark sea
trusts a light it can see more than a number on a screen.

A good loaf of bread needs only four things: flour, water, salt and time. The flour gives the
structure, because the proteins in wheat form long elastic chains when they are wet and worked. The
water wakes the yeast and lets the starch swell. Salt tightens the dough and seasons it; without salt
bread tastes flat however well it has risen. Time is the ingredient most recipes underestimate. A
dough left to ferment slowly in a cool kitchen develops a deeper flavour and a more open crumb than
one hurried along in a warm oven, and it is easier to shape.

Bakers talk about the windowpane test: stretch a small piece of dough between your fingers, and if
it becomes thin enough to let light through without tearing, the gluten is ready. Then the dough is
folded, rested, divided and shaped. A tight surface holds the gas in and gives the loaf its height.
A sharp cut across the top, made just before baking, lets the crust open where the baker chooses
instead of splitting at random. Steam in the first minutes of baking keeps the surface soft long
enough for the loaf to expand, and then the crust sets, browns and begins to sing as it cools.

Rivers shape the land more patiently than any engineer. A stream that carries a little sand every
day will, over thousands of years, cut a valley through solid rock. Where the slope eases, the water
slows and drops what it carried, building bars, islands and wide flat plains that flood in spring
and feed the fields that grow along them. People have always settled beside rivers for their water,
their fish and their soil, and then spent centuries trying to stop them from moving.

The weather forecast on the evening news is the result of an enormous calculation. The atmosphere
is divided into millions of boxes, and for each one a computer estimates how the temperature,
pressure, humidity and wind will change over the next few minutes, using the laws of physics and
the measurements of thousands of stations, balloons, ships and satellites. Then it repeats the step,
again and again, until it has reached next week. Small errors grow as the calculation runs, which
is why a forecast for tomorrow is usually right and a forecast for ten days ahead is a rough guide.

Learning a musical instrument teaches patience in a way few other things do. The first weeks are
full of noise: strings that buzz, notes that crack, fingers that will not go where they are told.
Progress is slow and uneven, and it often seems to happen overnight, after a week of practice in
which nothing improved. Teachers say that ten minutes every day is worth more than two hours once a
week, because the hands learn by repetition and the memory of a movement fades quickly. The reward
comes gradually, on the evening when a piece that was impossible a month ago is simply played.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``jaxlab bench`` (called by :mod:`jaxlab.cli`)."""
    d = DEFAULTS
    parser.add_argument(
        "--batch-sizes",
        type=_int_list,
        default=None,
        metavar="B,B,...",
        help=f"decode batch sizes (default {','.join(map(str, d['batch_sizes']))})",
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=None,
        metavar="N",
        help=f"tokens generated per row, EOS ignored (default {d['new_tokens']})",
    )
    parser.add_argument(
        "--prompt-len", type=int, default=None, metavar="T", help=f"prompt tokens per row (default {d['prompt_len']})"
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        metavar="R",
        help=f"repetitions of every timed measurement; the median is reported (default {d['reps']})",
    )
    parser.add_argument(
        "--bandwidth-mib",
        type=int,
        default=None,
        metavar="MIB",
        help=f"size of the copy that measures the bandwidth ceiling (default {d['bandwidth_mib']})",
    )
    parser.add_argument(
        "--matmul-n",
        type=int,
        default=None,
        metavar="N",
        help=f"size of the n x n float32 matmul that measures the compute ceiling (default {d['matmul_n']})",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the transformers (PyTorch) comparison")
    parser.add_argument("--no-ttft", action="store_true", help="skip the time-to-first-token child processes")
    parser.add_argument(
        "--stages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the decode stages: eager, jit without cache, jit + cache, on device, bfloat16",
    )
    parser.add_argument(
        "--speculative",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure speculative decoding (n-gram and draft model) against plain greedy by task type",
    )
    parser.add_argument(
        "--quant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the quantized decode step: float32 and each --quant-formats, each with each "
        "--quant-kv cache, at --quant-batch-sizes, side by side in this process",
    )
    parser.add_argument(
        "--quant-batch-sizes",
        type=_int_list,
        default=None,
        metavar="B,B,...",
        help=f"batch sizes of the quantized decode rows (default {','.join(map(str, d['quant_batch_sizes']))})",
    )
    parser.add_argument(
        "--quant-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"decode steps per timed measurement of the quantized rows (default {d['quant_steps']})",
    )
    parser.add_argument(
        "--quant-formats",
        type=_choices(QUANT_FORMATS),
        default=QUANT_FORMATS,
        metavar="F,F,...",
        help=f"weight formats of the quantization and quality rows (default {','.join(QUANT_FORMATS)})",
    )
    parser.add_argument(
        "--quant-kv",
        type=_choices(KV_FORMATS),
        default=KV_FORMATS,
        metavar="KV,KV",
        help=f"KV cache formats of the quantization and quality rows (default {','.join(KV_FORMATS)})",
    )
    parser.add_argument(
        "--quality",
        action="store_true",
        help="quality of each format against float32: perplexity on data/eval, KL, top-1 and greedy "
        "agreement over 32 chat prompts, memory (about 5 minutes on 2 cores)",
    )
    parser.add_argument(
        "--quant-only",
        action="store_true",
        help="only the quantization rows (and --quality): skip prefill, the float32 decode rows, the "
        "peer, the stages, speculative decoding and time to first token",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="with --quant-only: the model to quantize and evaluate (a .gguf file, a HF checkpoint "
        "folder or hub id; default: the embedded SmolLM2-135M)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a smoke test: batch 1,2, 8 new tokens, prompt 16, 1 rep, small ceilings "
        "and a small quality report",
    )
    parser.add_argument("--targets", action="store_true", help="print the issue's targets as PASS/MISS lines")
    parser.add_argument("--json", metavar="PATH", default=None, help="write every number to this JSON file")
    parser.add_argument("--plot", metavar="PATH", default=None, help="write a roofline plot (PNG) to this file")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return values


def _choices(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(allowed)}, got {text!r}")
        return values

    return parse


def resolve_options(args: argparse.Namespace) -> dict:
    """Defaults (or the --quick set), overridden by whatever was given explicitly."""
    base = dict(QUICK if getattr(args, "quick", False) else DEFAULTS)
    for key in base:
        value = getattr(args, key, None)
        if value is not None:
            base[key] = value
    base["batch_sizes"] = tuple(sorted(set(base["batch_sizes"])))
    base["quant_batch_sizes"] = tuple(sorted(set(base["quant_batch_sizes"])))
    quant_only = bool(getattr(args, "quant_only", False))
    base.update(
        quick=bool(getattr(args, "quick", False)),
        float=not quant_only,  # the float32 prefill/decode rows and everything measured against them
        peer=not getattr(args, "no_peer", False) and not quant_only,
        ttft=not getattr(args, "no_ttft", False) and not quant_only,
        stages=bool(getattr(args, "stages", True)) and not quant_only,
        speculative=bool(getattr(args, "speculative", True)) and not quant_only,
        quant=bool(getattr(args, "quant", True)),
        quant_formats=tuple(getattr(args, "quant_formats", None) or QUANT_FORMATS),
        quant_kv=tuple(getattr(args, "quant_kv", None) or KV_FORMATS),
        quality=bool(getattr(args, "quality", False)),
        model=getattr(args, "model", None),
        targets=bool(getattr(args, "targets", False)),
        json=getattr(args, "json", None),
        plot=getattr(args, "plot", None),
    )
    from jaxlab.errors import InvalidRequestError

    if base["model"] is not None and not quant_only:
        raise InvalidRequestError(
            "--model sets the model of the quantization and quality rows; add --quant-only "
            "(the float32 rows and the peer always run the embedded GGUF)"
        )
    if quant_only and not (base["quant"] or base["quality"]):
        raise InvalidRequestError(
            "--quant-only with --no-quant and without --quality measures nothing; drop --no-quant or add --quality"
        )
    if quant_only and base["plot"]:
        raise InvalidRequestError("--plot draws the float32 prefill and decode roofline; drop --plot or --quant-only")
    if base["quant_steps"] < 1:
        raise InvalidRequestError(f"--quant-steps must be >= 1, got {base['quant_steps']}")

    for key in ("new_tokens", "prompt_len", "reps", "bandwidth_mib", "matmul_n"):
        if base[key] < 1:
            raise InvalidRequestError(f"--{key.replace('_', '-')} must be >= 1, got {base[key]}")
    if base["new_tokens"] < 2:
        raise InvalidRequestError("--new-tokens must be >= 2 (decode speed needs at least one decode step)")
    return base


# --------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested)
# --------------------------------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict:
    """Median and spread of repeated measurements: {median, min, max, n, values}."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals), "values": vals}


def summary_map(s: dict, fn) -> dict:
    """The summary of ``fn(value)`` for each value (fn monotone: min/max are mapped and re-sorted)."""
    return summarize([fn(v) for v in s["values"]])


def ratio(a: float | None, b: float | None) -> float | None:
    if (
        a is None
        or b is None
        or not b
        or (isinstance(a, float) and math.isnan(a))
        or (isinstance(b, float) and math.isnan(b))
    ):
        return None
    return a / b


def bandwidth_roofline_pct(bytes_per_step: float, step_seconds: float, bandwidth: float) -> float:
    """Achieved bandwidth as % of the ceiling: bytes read per step / step time / bandwidth x 100."""
    return 100.0 * bytes_per_step / step_seconds / bandwidth


def compute_pct(flops: float, seconds: float, peak_flops: float) -> float:
    """Achieved FLOP/s as % of the matmul ceiling."""
    return 100.0 * flops / seconds / peak_flops


def published_peaks(chip) -> dict | None:
    """A :class:`jaxlab.tools.hardware.Chip`'s datasheet peaks per jax device, as the report stores them (None: no chip)."""
    if chip is None:
        return None
    return {
        "chip": chip.name,
        "flops_per_s": chip.device_peak_flops,
        "dtype": chip.peak_dtype,
        "bandwidth_bytes_per_s": chip.device_bandwidth,
        "devices_per_chip": chip.devices_per_chip,
        "source": chip.source,
    }


def matmul_params(cfg) -> tuple[int, int]:
    """(weights multiplied per token in the decoder layers, weights of the output head)."""
    per_layer = cfg.dim * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * cfg.dim * cfg.ffn_dim
    return cfg.n_layers * per_layer, cfg.vocab_size * cfg.dim


def attention_flops(cfg, batch: int, tokens: int, context_before: int) -> float:
    """FLOPs of causal attention (QK^T and PV, 2 x head_dim each per query-key pair) for ``tokens``
    new tokens per row after ``context_before`` cached ones: query i sees context_before + i + 1 keys."""
    keys = tokens * context_before + tokens * (tokens + 1) / 2
    return 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * batch * keys


def prefill_flops(cfg, batch: int, prompt_len: int) -> float:
    """Model FLOPs of a prefill: 2 x layer weights x tokens + causal attention + the output head for the
    last position only (what ``last_only`` computes)."""
    layer_w, head_w = matmul_params(cfg)
    return 2.0 * layer_w * batch * prompt_len + 2.0 * head_w * batch + attention_flops(cfg, batch, prompt_len, 0)


def decode_context(prompt_len: int, new_tokens: int) -> float:
    """Mean number of keys a decode step attends to: step j (1..N-1) sees prompt_len + j keys."""
    return prompt_len + new_tokens / 2.0


def decode_step_flops(cfg, batch: int, context: float) -> float:
    """Model FLOPs of one decode step (one token per row) at a mean context of ``context`` keys."""
    layer_w, head_w = matmul_params(cfg)
    return 2.0 * (layer_w + head_w) * batch + 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * batch * context


def kv_bytes(cfg, batch: int, tokens: float, itemsize: int) -> float:
    """Bytes of K and V for ``tokens`` positions per row."""
    return 2.0 * cfg.n_layers * batch * tokens * cfg.n_kv_heads * cfg.head_dim * itemsize


def decode_step_bytes(weight_bytes: float, cfg, batch: int, context: float, itemsize: int) -> float:
    """Bytes a decode step must read: every weight once + the K/V of the ``context`` tokens of each row."""
    return weight_bytes + kv_bytes(cfg, batch, context, itemsize)


def kv_vector_bytes(cfg, kv: str) -> int:
    """Bytes of one cached key or value vector: head_dim float32s, or head_dim int8s plus a float32 scale."""
    return cfg.head_dim * 4 if kv == "float32" else cfg.head_dim + 4


def kv_bytes_format(cfg, batch: int, tokens: float, kv: str) -> float:
    """Bytes of K and V for ``tokens`` positions per row in a ``kv`` ("float32" / "int8") cache."""
    return 2.0 * cfg.n_layers * batch * tokens * cfg.n_kv_heads * kv_vector_bytes(cfg, kv)


def quant_label(weights: str, kv: str) -> str:
    """ "int8", "int8 + int8 KV", "float32 + int8 KV", ... (the same labels as ``jaxlab.quant.quality.label``)."""
    return weights if kv == "float32" else f"{weights} + int8 KV"


def is_baseline(row: dict) -> bool:
    return (row["weights"], row["kv_cache"]) == ("float32", "float32")


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


def speed_quality_targets(rows: list[dict], quality: dict | None) -> list[dict]:
    """For each speed target of :data:`QUALITY_LINKED`: does a format that meets it also meet the quality
    targets (ppl increase <= 1 %, greedy agreement >= 90 %), measured in the same run?

    PASS: the fastest such format that meets both; MISS: formats meet the speed target, none meets the
    quality targets; "n/a" when the batch was not measured, no format met the speed target, or the
    quality was not measured in this run (``quality`` None)."""
    thresholds = {key: thr for key, _, _, thr, _ in TARGETS}
    out = []
    q_rows = {(r["weights"], r["kv_cache"]): r for r in (quality or {}).get("rows", [])}
    for batch, key in QUALITY_LINKED:
        thr = thresholds[key]
        target = (
            f"the format meeting the batch-{batch} speed target also meets ppl +<= 1 % and greedy agreement >= 90 %"
        )
        at_b = [r for r in rows if r["batch"] == batch and not is_baseline(r) and r.get("vs_float32") is not None]
        fast = sorted((r for r in at_b if r["vs_float32"] >= thr), key=lambda r: -r["vs_float32"])
        if not at_b:
            status, note = "n/a", f"batch {batch} not measured"
        elif not fast:
            status, note = "n/a", f"no format met the speed target ({thr:g}x)"
        elif quality is None:
            status, note = "n/a", "quality not measured in this run (add --quality)"
        else:

            def describe(r):
                q = q_rows.get((r["weights"], r["kv_cache"]))
                if q is None:
                    return f"{quant_label(r['weights'], r['kv_cache'])} {r['vs_float32']:.2f}x: quality not measured"
                return (
                    f"{q['label']} {r['vs_float32']:.2f}x: ppl {q['ppl_increase_pct']:+.2f} %, greedy agreement "
                    f"{100 * q['greedy_agreement']:.1f} %"
                )

            good = [r for r in fast if q_rows.get((r["weights"], r["kv_cache"]), {}).get("status") == "PASS"]
            status, note = ("PASS", describe(good[0])) if good else ("MISS", "; ".join(describe(r) for r in fast))
        out.append(
            {
                "target": target,
                "key": f"{key}_quality",
                "threshold": None,
                "op": None,
                "unit": "",
                "measured": None,
                "status": status,
                "note": note,
            }
        )
    return out


def first_divergence(ours: Sequence[Sequence[int]], peer: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """(row, token index) of the first differing token (scanning rows in order), or None if identical."""
    for r, (a, b) in enumerate(zip(ours, peer)):
        a, b = list(a), list(b)
        for t in range(max(len(a), len(b))):
            if t >= len(a) or t >= len(b) or a[t] != b[t]:
                return r, t
    if len(ours) != len(peer):
        return min(len(ours), len(peer)), 0
    return None


def divergence_text(div: tuple[int, int] | None, rows: int) -> str:
    if div is None:
        return f"identical ({rows} row{'s' if rows != 1 else ''})"
    return f"first divergence at row {div[0]}, token {div[1]}"


def evaluate_targets(metrics: dict) -> list[dict]:
    """The issue's targets on measured numbers -> [{target, key, threshold, unit, measured, status}].

    ``status`` is "PASS", "MISS", or "n/a" when the number was not measured (no peer, batch not run...)."""
    out = []
    for key, text, op, threshold, unit in TARGETS:
        value = metrics.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            status = "n/a"
        elif op == ">=":
            status = "PASS" if value >= threshold else "MISS"
        else:
            status = "PASS" if value <= threshold else "MISS"
        out.append(
            {
                "target": text,
                "key": key,
                "threshold": threshold,
                "op": op,
                "unit": unit,
                "measured": value,
                "status": status,
                "detail": metrics.get(f"{key}_label"),
            }
        )
    return out


def target_lines(evaluated: list[dict]) -> list[str]:
    lines = []
    for t in evaluated:
        v = t["measured"]
        if t.get("note"):
            got = t["note"]
        elif v is None:
            got = "not measured"
        elif t["unit"] == "x":
            got = f"measured {v:.2f}x"
        elif t["unit"] == "%":
            got = f"measured {v:.1f} %"
        else:
            got = f"measured {v:.2f} s"
        if t.get("detail") and v is not None:
            got += f" ({t['detail']})"
        lines.append(f"{t['status']:<4}  {t['target']}: {got}")
    return lines


def make_prompts(ids: Sequence[int], rows: int, length: int) -> list[list[int]]:
    """``rows`` windows of ``length`` tokens from ``ids`` at evenly spaced starts (distinct rows as long
    as the text allows); the text is repeated when it is too short."""
    ids = list(ids)
    if not ids:
        raise ValueError("no token ids to take prompts from")
    need = length + max(rows - 1, 0)
    while len(ids) < need:
        ids = ids + ids
    stride = (len(ids) - length) // max(rows - 1, 1)
    return [ids[r * stride : r * stride + length] for r in range(rows)]


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def fmt_summary(s: dict | None, scale: float = 1.0) -> str:
    """'median (min–max)' of a summary, each value times ``scale``; just the median for one value."""
    if not s or s.get("median") is None:
        return "-"
    med = _num(s["median"] * scale)
    if s["n"] <= 1:
        return med
    return f"{med} ({_num(s['min'] * scale)}–{_num(s['max'] * scale)})"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def fmt_pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.1f} %"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------


class _Progress:
    def __init__(self, enabled: bool = True):
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.enabled = enabled

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str) -> None:
        if self.enabled:
            sys.stderr.write(f"[bench {self.elapsed():6.0f} s, cpu {time.process_time() - self.cpu0:6.0f} s] {msg}\n")
            sys.stderr.flush()


def _timed_generator(params, tokenizer):
    """A :class:`~jaxlab.engine.generate.Generator` that records each AOT compile (function, shapes, seconds,
    XLA's memory analysis). It only observes ``_get``; generation is the library's."""
    from jaxlab.engine.generate import Generator

    class TimedGenerator(Generator):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.compile_log: list[dict] = []
            self.programs: dict[tuple, Any] = {}  # (function, batch, tokens, cache_len) -> compiled program

        def _get(self, name, jitted, args, static=None):
            fn, compile_s = super()._get(name, jitted, args, static)
            if compile_s:
                entry = {"function": name, "seconds": compile_s, "dtype": self.params.policy.dtype}
                if name in ("prefill", "decode"):
                    entry.update(
                        batch=int(args[1].shape[0]),
                        tokens=int(args[1].shape[1]) if args[1].ndim > 1 else 1,
                        cache_len=int(args[3].length),
                    )
                else:
                    entry.update(batch=int(args[0].shape[0]), tokens=None, cache_len=None)
                try:
                    mem = fn.memory_analysis()
                    entry["temp_bytes"] = getattr(mem, "temp_size_in_bytes", None)
                except Exception:
                    entry["temp_bytes"] = None
                cost = _xla_cost(fn)
                entry["xla_flops"], entry["xla_bytes_accessed"] = cost.get("flops"), cost.get("bytes accessed")
                self.compile_log.append(entry)
                self.programs[(name, entry["batch"], entry["tokens"], entry["cache_len"])] = fn
            return fn, compile_s

    return TimedGenerator(params, tokenizer)


def _xla_cost(compiled) -> dict:
    """XLA's cost analysis of a compiled program (what :func:`jaxlab.tools.profile.cost_analysis` reads), as one dict."""
    try:
        raw = compiled.cost_analysis()
    except Exception:
        return {}
    if isinstance(raw, (list, tuple)):
        merged: dict = {}
        for d in raw:
            for k, v in (d or {}).items():
                merged[k] = merged.get(k, 0.0) + v
        return merged
    return dict(raw or {})


_PEERS: dict[str, Any] = {}  # gguf path -> loaded transformers model (one load per process)


def load_peer(gguf_path):
    """The model half of :func:`jaxlab.tools.reference.load_reference` (no tokenizer: the bench feeds token ids),
    loaded once per process."""
    key = str(Path(gguf_path).resolve())
    if key not in _PEERS:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(
            str(Path(key).parent), gguf_file=Path(key).name, dtype=torch.float32
        )
        model.eval()
        _PEERS[key] = model
    return _PEERS[key]


def _peer_generate(model, rows: Sequence[Sequence[int]], n: int) -> dict:
    """transformers ``generate``: greedy, EOS ignored (as :func:`jaxlab.tools.reference.reference_greedy`), equal-
    length rows. A logits processor stamps the time after every forward pass, so decode time is the
    span between the first and the last stamp (n - 1 decode steps), as in our ``decode_seconds``."""
    import copy

    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Stamps(LogitsProcessor):
        def __init__(self):
            self.t: list[float] = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None  # ignore EOS: always n tokens
    gc.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 2
    gc.do_sample = False
    gc.max_new_tokens = n
    gc.min_new_tokens = None
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    stamps = Stamps()
    x = torch.tensor([list(r) for r in rows], dtype=torch.long)
    mask = torch.ones_like(x)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(
            x, generation_config=gc, attention_mask=mask, logits_processor=LogitsProcessorList([stamps])
        )
        total = time.perf_counter() - t0
    p = x.shape[1]
    return {
        "tokens": out[:, p:].tolist(),
        "total_s": total,
        "decode_s": stamps.t[-1] - stamps.t[0] if len(stamps.t) > 1 else None,
        "prefill_s": stamps.t[0] - t0 if stamps.t else None,
    }


def _threads_info(peer_loaded: bool) -> dict:
    flags = os.environ.get("XLA_FLAGS", "")
    try:
        schedulable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        schedulable = os.cpu_count()
    intra = [f for f in flags.split() if "intra_op" in f or "multi_thread_eigen" in f or "thread" in f]
    info = {
        "os_cpu_count": os.cpu_count(),
        "schedulable_cpus": schedulable,
        "xla_flags": flags,
        "xla_thread_flags": intra,
        "xla_intra_op_threads": None if intra else schedulable,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch_threads": None,
    }
    if peer_loaded:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
    return info


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for pkg in ("jaxlab", "jax", "jaxlib", "flax", "numpy", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def estimate_seconds(opts: dict, peak_flops: float, weight_bytes: float, n_params: float) -> float:
    """A rough run-time estimate (printed up front): FLOPs at ~40 % of the matmul ceiling, a decode step no
    faster than the weights at an assumed 10 GB/s, the peer ~1.5x our time, plus fixed costs."""
    eff = 0.4 * peak_flops
    n, p, reps = opts["new_tokens"], opts["prompt_len"], opts["reps"]
    total = 15.0  # load model, ceilings
    impls = 2.5 if opts["peer"] else 1.0  # ours + peer
    variants = (1 + len(opts["quant_formats"])) * len(opts["quant_kv"])
    if opts["quant"]:  # a compile per program; quantized steps taken as twice float32's (int4 is slower)
        for b in opts["quant_batch_sizes"]:
            step = max(weight_bytes / 10e9, 2 * n_params * b / eff)
            total += variants * (5.0 + (max(reps, 5) + 1) * opts["quant_steps"] * 2 * step)
    if opts["quality"]:  # measured on 2 busy cores: ~20-60 s per variant at the default sizes
        total += 20.0 + variants * (15.0 if opts["quick"] else 45.0)
    if not opts["float"]:
        return total
    for b in opts["batch_sizes"]:
        step = max(weight_bytes / 10e9, 2 * n_params * b / eff)
        run = (n - 1) * step + 2 * n_params * b * p / eff
        total += 10.0 + (reps + 0.2) * run * impls  # compile + warm-up + reps
    total += (reps + 1) * 2 * n_params * p / eff * impls  # prefill
    if opts["stages"]:
        step1 = max(weight_bytes / 10e9, 2 * n_params / eff)
        total += 30.0 + reps * (
            opts["eager_steps"] * 0.5 + opts["nocache_steps"] * 2 * n_params * (p + n) / eff + 3 * (n - 1) * step1
        )
    if opts["peer"]:
        total += 25.0  # load the peer
    if opts["ttft"]:
        total += reps * 2 * 15.0
    return total


def _ttft_children(prompt_len: int, reps: int, log) -> dict:
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
                proc = subprocess.run(
                    cmd,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=900,
                    cwd=str(Path(__file__).resolve().parents[2]),
                )
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


def run_bench(opts: dict, log=None) -> dict:
    """Measure everything; returns the results dict (what ``--json`` writes)."""
    log = log or _Progress()
    t_run = time.perf_counter()
    import jax
    import jax.numpy as jnp

    from jaxlab import __version__
    from jaxlab.engine.loading import load
    from jaxlab.engine.plan import CACHE_BUCKETS, bucket
    from jaxlab.tools import hardware, profile

    P, N, reps = opts["prompt_len"], opts["new_tokens"], opts["reps"]
    batch_sizes = opts["batch_sizes"]
    res: dict[str, Any] = {"options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in opts.items()}}
    ttft_first = opts["ttft"] and not hardware.backend_started()
    if ttft_first:  # before this process takes the accelerator: the children measure it, not the CPU
        res["ttft"] = _ttft_children(P, reps, log)

    log(f"loading the model ({opts['model'] or 'embedded SmolLM2-135M'}, float32)")
    m = load(opts["model"], dtype="float32")  # the float32 rows on every backend; bfloat16 is its own stage
    params, tok = m.params, m.tokenizer
    cfg = params.config
    weight_bytes = params.nbytes()
    n_params = cfg.n_params()
    if P + N > cfg.max_seq_len:
        from jaxlab.errors import InvalidRequestError

        raise InvalidRequestError(
            f"--prompt-len + --new-tokens = {P + N} exceeds the model's context {cfg.max_seq_len}"
        )
    text_ids = tok.encode(TEXT)
    rows_all = make_prompts(text_ids, max(batch_sizes + opts["quant_batch_sizes"] + (1,)), P)
    row0 = rows_all[0]
    cache_len = bucket(P + N, CACHE_BUCKETS)
    dev = jax.devices()[0]
    chip = hardware.chip_for(dev.device_kind)  # None on a CPU or a chip without published peaks
    persistent = jax.config.jax_compilation_cache_dir

    log(f"compute ceiling: {opts['matmul_n']}x{opts['matmul_n']} float32 matmul")
    ceil_reps = max(3, reps)
    peaks = [profile.measure_matmul_flops(opts["matmul_n"], repeats=ceil_reps)]
    est = estimate_seconds(opts, peaks[0], weight_bytes, n_params)
    log(
        f"rough estimate of the whole run: ~{est / 60:.0f} min (machine: {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f})"
    )

    # ---- compile (warm-up) everything jaxlab will time ------------------------------------------
    gen, mem_after = None, {}
    if opts["float"]:
        gen = _timed_generator(params, tok)
        for b in sorted(set(batch_sizes) | {1}):
            log(f"compile + warm-up: Generator batch {b} (prefill for the prompt bucket, decode step)")
            with profile.CompileCounter() as cc:
                gen.warmup(batch_sizes=[b], prompt_lens=[P], max_new_tokens=N)
            res.setdefault("compile_cache_hits", 0)
            res["compile_cache_hits"] += cc.cache_hits
        mem_after = profile.memory_stats()

    # ---- ceilings -------------------------------------------------------------------------------
    log(f"ceilings: copy of {opts['bandwidth_mib']} MiB, {opts['matmul_n']}^2 matmul")
    bws = [profile.measure_bandwidth(opts["bandwidth_mib"] << 20, repeats=ceil_reps)]
    peaks.append(profile.measure_matmul_flops(opts["matmul_n"], repeats=ceil_reps))
    peaks_bf16 = [profile.measure_matmul_flops(opts["matmul_n"], jnp.bfloat16, repeats=ceil_reps)]

    # ---- the peer ------------------------------------------------------------------------------
    peer = None
    peer_reason = "disabled (--no-peer)" if opts["float"] else "not run (--quant-only)"
    if opts["peer"]:
        try:
            import importlib

            importlib.import_module("torch")
            importlib.import_module("transformers")
        except ImportError as e:
            peer_reason = f"torch/transformers not importable ({e})"
        else:
            from jaxlab.io import assets

            log("loading the peer: transformers (PyTorch eager, float32) on the same GGUF")
            peer = load_peer(assets.model_path())
            peer_reason = None
            log("peer warm-up (batch 1, 2 tokens)")
            _peer_generate(peer, [row0], 2)
    res["peer"] = {
        "enabled": peer is not None,
        "reason": peer_reason,
        "what": "transformers AutoModelForCausalLM.generate, PyTorch eager, float32, CPU, greedy, EOS ignored",
    }
    res["meta"] = {
        "jaxlab": __version__,
        "versions": _versions(),
        "backend": jax.default_backend(),
        "device": str(dev),
        "device_kind": dev.device_kind,
        "cpu": _cpu_name(),
        "python": platform.python_version(),
        "chip": hardware.describe_peaks(chip, dev.device_kind),
        "threads": _threads_info(peer is not None),
        "load_average_start": os.getloadavg(),
        "persistent_compile_cache": persistent,
        "model": "SmolLM2-135M-Instruct (embedded GGUF, Q4_1 dequantized)"
        if opts["model"] is None
        else f"{m.source} (float32)",
        "params": n_params,
        "weight_bytes": weight_bytes,
        "prompt_source": "windows of a fixed English text (jaxlab.bench.TEXT)",
    }

    # ---- float32: prefill, decode, stages, speculative --------------------------------------------
    res.update(prefill=None, decode=[], stages=[], speculative=[])
    mem_decode = {}
    if opts["float"]:
        mem_decode = _float_speed(opts, res, params, tok, gen, peer, rows_all, cache_len, log)

    # ---- quantized decode rows, then the quality report (which reuses the quantized weights) -------
    quantized: dict[str, Any] = {}
    res["quant"] = measure_quant(opts, params, tok, quantized, rows_all, cache_len, log) if opts["quant"] else None
    res["quality"] = None
    if opts["quality"]:
        from jaxlab.quant import quality

        res["quality"] = quality.quality_report(
            loaded=m,
            formats=opts["quant_formats"],
            kv_formats=opts["quant_kv"],
            sizes=quality.SMALL if opts["quick"] else quality.DEFAULT,
            quantized=quantized,
            kv_batch=max(opts["quant_batch_sizes"]),
            kv_len=cache_len,
            log=log,
        )

    # ---- ceilings again (the best the machine showed during the run is the ceiling) ----------------
    log("ceilings again, at the end")
    bws.append(profile.measure_bandwidth(opts["bandwidth_mib"] << 20, repeats=ceil_reps))
    peaks.append(profile.measure_matmul_flops(opts["matmul_n"], repeats=ceil_reps))
    peaks_bf16.append(profile.measure_matmul_flops(opts["matmul_n"], jnp.bfloat16, repeats=ceil_reps))
    res["ceilings"] = ceilings = {
        "bandwidth_bytes_per_s": max(bws),
        "bandwidth_samples": bws,
        "bandwidth_copy_bytes": opts["bandwidth_mib"] << 20,
        "matmul_flops_per_s": max(peaks),
        "matmul_samples": peaks,
        "matmul_n": opts["matmul_n"],
        "ridge_flop_per_byte": max(peaks) / max(bws),
        "matmul_bf16_flops_per_s": max(peaks_bf16),
        "matmul_bf16_samples": peaks_bf16,
        "published": published_peaks(chip),
        "method": "each sample is the best of max(3, reps) synchronized runs; samples are taken at the start, after "
        "the compile warm-up and at the end of the run, and the ceiling is the largest (the best this machine "
        "showed during the run); bandwidth = (read + write bytes) / time of a donated x + 1 over float32 x; "
        "compute = 2 n^3 / time of an n x n float32 matmul at Precision.HIGHEST (and the same in bfloat16, "
        "float32 accumulation: what accelerators publish their peaks in; XLA:CPU computes it in float32); "
        "published = the chip's datasheet peaks per jax device (jaxlab.tools.hardware), None on a CPU",
    }
    if opts["float"]:
        add_rooflines(res, ceilings)
    if res["quant"]:
        pub = ceilings["published"]
        for r in res["quant"]["rows"]:
            r["bw_roofline_pct"] = bandwidth_roofline_pct(
                r["bytes_per_step"], r["step_s"]["median"], ceilings["bandwidth_bytes_per_s"]
            )
            r["published_bw_pct"] = (
                bandwidth_roofline_pct(r["bytes_per_step"], r["step_s"]["median"], pub["bandwidth_bytes_per_s"])
                if pub
                else None
            )

    # ---- compile times ---------------------------------------------------------------------------
    res["compile"] = (
        (gen.compile_log if gen else [])
        + [c for s in res["stages"] for c in s.pop("_compile_log", [])]
        + (res["quant"]["compile"] if res["quant"] else [])
    )

    # ---- memory ----------------------------------------------------------------------------------
    res["memory"] = {
        "weights_float32_bytes": weight_bytes,
        "weights_bfloat16_bytes": weight_bytes // 2,
        "weights_quantized_bytes": {f: q.nbytes() for f, q in quantized.items()},
        "cache_len": cache_len,
    }
    if opts["float"]:
        temps = [c.get("temp_bytes") or 0 for c in gen.compile_log]
        res["memory"].update(
            {
                "kv_cache_bytes": {str(b): kv_bytes(cfg, b, cache_len, 4) for b in batch_sizes},
                "largest_xla_temp_bytes": max(temps) if temps else None,
                "after_compile_warmup": mem_after,
                "after_decode": mem_decode,
                "peak_rss_jaxlab_bytes": mem_after.get("process_peak_rss_bytes"),
                "note": "peak_rss_jaxlab_bytes is the process peak RSS after jaxlab's compile + warm-up at every batch size "
                "(a real prefill of the largest batch, caches allocated), before the bandwidth copy and the peer; "
                "later snapshots include both",
            }
        )

    # ---- time to first token (here only if this process already held its device at the start) -------
    if opts["ttft"] and not ttft_first:
        res["ttft"] = _ttft_children(P, reps, log)
    elif not opts["ttft"]:
        res["ttft"] = None

    res["memory"]["final"] = profile.memory_stats()
    res["metrics"] = headline_metrics(res)
    res["targets"] = evaluate_targets(res["metrics"]) + speed_quality_targets(
        (res["quant"] or {}).get("rows", []), res["quality"]
    )
    res["meta"]["load_average_end"] = os.getloadavg()
    res["meta"]["elapsed_s"] = time.perf_counter() - t_run
    log(f"done in {res['meta']['elapsed_s'] / 60:.1f} min")
    return res


def _float_speed(opts, res, params, tok, gen, peer, rows_all, cache_len, log) -> dict:
    """The float32 rows: prefill and decode against the peer, the stages and speculative decoding (filled
    into ``res``); returns the memory snapshot taken after decode."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxlab.engine.generate import decode_on_device
    from jaxlab.engine.kvcache import init_cache
    from jaxlab.engine.model import cast_params, default_policy, forward
    from jaxlab.tools import profile

    P, N, reps = opts["prompt_len"], opts["new_tokens"], opts["reps"]
    batch_sizes = opts["batch_sizes"]
    cfg = params.config
    weight_bytes = params.nbytes()
    row0 = rows_all[0]
    itemsize = 4

    # ---- prefill (batch 1) ---------------------------------------------------------------------
    pre_ours, pre_peer, pre_ratio = [], [], []
    pre_reps = max(reps, 5)  # short measurements: more repetitions
    for rep in range(pre_reps):
        log(f"prefill ({P} tokens, batch 1): rep {rep + 1}/{pre_reps}")
        t0 = time.perf_counter()
        gen.generate([row0], 1)
        t_ours = time.perf_counter() - t0
        pre_ours.append(t_ours)
        if peer is not None:
            pr = _peer_generate(peer, [row0], 1)
            pre_peer.append(pr["total_s"])
            pre_ratio.append(pr["total_s"] / t_ours)
    flops_pre = prefill_flops(cfg, 1, P)
    s_ours = summarize(pre_ours)
    xla_pre = [c for c in gen.compile_log if c["function"] == "prefill" and c["batch"] == 1]
    res["prefill"] = {
        "batch": 1,
        "prompt_len": P,
        "what": "wall time of generate([prompt], max_new_tokens=1): prefill + first token (both implementations)",
        "ours_s": s_ours,
        "ours_tokens_per_s": summary_map(s_ours, lambda t: P / t),
        "peer_s": summarize(pre_peer) if pre_peer else None,
        "peer_tokens_per_s": summary_map(summarize(pre_peer), lambda t: P / t) if pre_peer else None,
        "vs_peer": ratio(statistics.median(pre_peer), s_ours["median"]) if pre_peer else None,
        "vs_peer_per_rep": summarize(pre_ratio) if pre_ratio else None,
        "flops_model": flops_pre,
        "bytes_model": weight_bytes + kv_bytes(cfg, 1, P, itemsize),
        "flops_source": "model: 2 x layer weights x tokens + causal attention + head (last position)",
        "xla_flops": xla_pre[0]["xla_flops"] if xla_pre else None,
        "xla_flops_note": "XLA's cost analysis of the compiled prefill program (prompt padded to its bucket; attention "
        "over every cache slot, masked ones included), for comparison with the model count",
    }

    # ---- decode ---------------------------------------------------------------------------------
    context = decode_context(P, N)
    decode_rows = []
    ours_tokens_b1 = None
    for b in batch_sizes:
        rows = rows_all[:b]
        steps = N - 1
        ours_t, peer_t, ratios, recompiles = [], [], [], 0
        ours_ids = peer_ids = None
        for rep in range(reps):
            log(f"decode batch {b}: rep {rep + 1}/{reps} (jaxlab)")
            results = gen.generate(rows, N, ignore_eos=True)
            recompiles += int(results[0].compile_seconds > 0)
            ours_t.append(results[0].decode_seconds)
            ours_ids = [r.generated_ids for r in results]
            if peer is not None:
                log(f"decode batch {b}: rep {rep + 1}/{reps} (transformers)")
                pr = _peer_generate(peer, rows, N)
                peer_t.append(pr["decode_s"])
                peer_ids = pr["tokens"]
                ratios.append(pr["decode_s"] / results[0].decode_seconds)
        if b == 1:
            ours_tokens_b1 = ours_ids[0]
        so = summarize(ours_t)
        nbytes = decode_step_bytes(weight_bytes, cfg, b, context, itemsize)
        flops = decode_step_flops(cfg, b, context)
        div = first_divergence(ours_ids, peer_ids) if peer_ids is not None else None
        sp = summarize(peer_t) if peer_t else None
        decode_rows.append(
            {
                "batch": b,
                "new_tokens": N,
                "decode_steps": steps,
                "ours_decode_s": so,
                "ours_tokens_per_s": summary_map(so, lambda t: b * steps / t),
                "ours_step_s": summary_map(so, lambda t: t / steps),
                "peer_decode_s": sp,
                "peer_tokens_per_s": summary_map(sp, lambda t: b * steps / t) if sp else None,
                "vs_peer": ratio(sp["median"], so["median"]) if sp else None,
                "vs_peer_per_rep": summarize(ratios) if ratios else None,
                "bytes_per_step": nbytes,
                "weight_bytes": weight_bytes,
                "kv_bytes_per_step": nbytes - weight_bytes,
                "kv_bytes_allocated": kv_bytes(cfg, b, cache_len, itemsize),
                "mean_context": context,
                "flops_per_step": flops,
                "tokens_identical": (div is None) if peer_ids is not None else None,
                "first_divergence": None if div is None else {"row": div[0], "token": div[1]},
                "greedy_check": divergence_text(div, b) if peer_ids is not None else "no peer",
                "recompiled_reps": recompiles,
            }
        )
    res["decode"] = decode_rows
    mem_decode = profile.memory_stats()

    # ---- stages (decode, batch 1) ---------------------------------------------------------------
    stages = []
    if opts["stages"]:
        if ours_tokens_b1 is None:  # batch 1 not among the decode batch sizes: run it for the stages
            ours_tokens_b1 = gen.generate([row0], N, ignore_eos=True)[0].generated_ids
        stages = _stages(
            opts,
            params,
            tok,
            gen,
            row0,
            ours_tokens_b1,
            cache_len,
            log,
            jax,
            jnp,
            np,
            profile,
            forward,
            init_cache,
            decode_on_device,
            cast_params,
            default_policy,
        )
    peer_b1 = next((d for d in decode_rows if d["batch"] == 1 and d["peer_tokens_per_s"]), None)
    for s in stages:
        s["vs_peer"] = ratio(s["tokens_per_s"]["median"], peer_b1["peer_tokens_per_s"]["median"]) if peer_b1 else None
    res["stages"] = stages

    # ---- speculative decoding by task type (batch 1, greedy, identical tokens checked) -------------
    res["speculative"] = []
    if opts["speculative"]:
        from jaxlab.lab import speculation

        log("speculative decoding: n-gram and draft model, copy-heavy vs open-ended prompts")
        quick = opts["quick"]
        res["speculative"] = speculation.measure(
            params,
            tok,
            speculation.TASK_TYPES,
            k=4,
            max_new_tokens=16 if quick else 32,
            methods=("ngram",) if quick else ("ngram", "draft"),
            repeats=1 if quick else 2,
            generator=gen,
        )

    return mem_decode


def measure_quant(opts: dict, params, tokenizer, quantized: dict, rows_all, cache_len: int, log) -> dict:
    """The decode step of float32 and of each quantized variant (weights x KV cache) at each batch size,
    side by side in this process, as the A/B harness of ``benchmarks/NOTES.md`` does: every program is
    compiled and run once first; then each of max(reps, 5) repetitions runs ``quant_steps`` steps of every
    variant in turn (the order rotates by one per repetition), so that load from other processes hits all
    variants alike.

    A step is the library's (``generate._decode_step``: forward + greedy pick, cache donated) with the
    token sent to the host after each step, as ``Generator`` does. The cache holds ``prompt_len`` filled
    slots of ``cache_len`` (zeros: the step's cost does not depend on what the cache holds, as attention
    reads every slot). The weights are quantized as ``jaxlab.load(quant=...)`` does
    (``quant.quantize_model``: W8A8 calibrated); ``quantized`` ({format: Params}) is filled for the
    quality report to reuse."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxlab import quant
    from jaxlab.engine.kvcache import init_cache
    from jaxlab.engine.sampling import SamplingParams
    from jaxlab.engine.steps import jit_decode

    P, k = opts["prompt_len"], opts["quant_steps"]
    reps = max(opts["reps"], 5)  # short measurements on a shared machine: more repetitions (as the prefill)
    batches = opts["quant_batch_sizes"]
    cfg = params.config
    quantize_s = {}
    for fmt in opts["quant_formats"]:
        if fmt not in quantized:
            log(f"quantized decode: quantizing the weights to {fmt}")
            t0 = time.perf_counter()
            quantized[fmt] = quant.quantize_model(params, tokenizer, fmt)
            quantize_s[fmt] = time.perf_counter() - t0
    weights = {"float32": params, **quantized}
    variants = list(
        dict.fromkeys(
            [("float32", "float32")] + [(w, kv) for w in ("float32", *opts["quant_formats"]) for kv in opts["quant_kv"]]
        )
    )
    step = jit_decode
    samp = SamplingParams().state()
    key = jax.random.key(0)
    first = {b: jnp.asarray([r[-1] for r in rows_all[:b]], jnp.int32) for b in batches}
    positions = {b: [jnp.full((b,), P + s, jnp.int32) for s in range(k)] for b in batches}

    def fresh_cache(b, kv):
        cache = init_cache(cfg, b, cache_len, jnp.int8 if kv == "int8" else jnp.float32)
        slots = jnp.arange(cache_len, dtype=jnp.int32)
        pos = jnp.broadcast_to(jnp.where(slots < P, slots, -1), (b, cache_len))
        return jax.block_until_ready(dataclasses.replace(cache, pos=pos, index=jnp.asarray(P, jnp.int32)))

    compiled, compile_log = {}, []
    for b in batches:
        for w, kv in variants:
            log(f"quantized decode: compile {quant_label(w, kv)}, batch {b}")
            t0 = time.perf_counter()
            compiled[w, kv, b] = step.lower(
                weights[w], first[b], positions[b][0], fresh_cache(b, kv), key, samp
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
        fn, p, tokens, cache = compiled[w, kv, b], weights[w], first[b], fresh_cache(b, kv)
        t0 = time.perf_counter()
        for s in range(steps):
            tokens, _, cache = fn(p, tokens, positions[b][s], cache, key, samp)
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
                    "bytes_per_step": wb + kv_bytes_format(cfg, b, P + k / 2, kv),
                    "compile_s": compile_s[quant_label(w, kv), b],
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
        "method": "decode step (forward + greedy pick, cache donated, token to host each step) of every variant, "
        "compiled and warmed up first, then alternated rep by rep in one process; vs_float32 = median "
        "over repetitions of float32's step time / this step time in the same repetition (paired, so a "
        "slow drift in machine load cancels); bytes/step = weights + K/V of the mean context in the "
        "variant's cache format",
    }


def add_rooflines(res: dict, ceilings: dict) -> None:
    """Fill in the ceiling-relative numbers of the prefill and decode results (after the ceilings are final)."""
    from jaxlab.tools.profile import Roofline

    bw, peak = ceilings["bandwidth_bytes_per_s"], ceilings["matmul_flops_per_s"]
    pub = ceilings.get("published")
    roof = Roofline(bw, peak)
    pre = res["prefill"]
    pre["matmul_ceiling_pct"] = compute_pct(pre["flops_model"], pre["ours_s"]["median"], peak)
    pre["peer_matmul_ceiling_pct"] = (
        compute_pct(pre["flops_model"], pre["peer_s"]["median"], peak) if pre["peer_s"] else None
    )
    pre["published_flops_pct"] = (
        compute_pct(pre["flops_model"], pre["ours_s"]["median"], pub["flops_per_s"]) if pub else None
    )
    for d in res["decode"]:
        step_s = d["ours_step_s"]["median"]
        nbytes, flops = d["bytes_per_step"], d["flops_per_step"]
        d["bw_roofline_pct"] = bandwidth_roofline_pct(nbytes, step_s, bw)
        d["roofline_bound"] = roof.bound(flops, nbytes)
        d["roofline_pct"] = 100.0 * roof.fraction(flops, nbytes, step_s)
        d["published_bw_pct"] = bandwidth_roofline_pct(nbytes, step_s, pub["bandwidth_bytes_per_s"]) if pub else None


def _stages(
    opts,
    params,
    tok,
    gen,
    row0,
    ref_tokens,
    cache_len,
    log,
    jax,
    jnp,
    np,
    profile,
    forward,
    init_cache,
    decode_on_device,
    cast_params,
    default_policy,
) -> list[dict]:
    """Decode at batch 1, five ways. Each returns tokens/s over its decode steps and its compile time;
    its tokens are checked against the jit + cache host loop (float32 stages must agree)."""
    P, N, reps = opts["prompt_len"], opts["new_tokens"], opts["reps"]
    cfg = params.config
    out = []

    def match(tokens):
        n = min(len(tokens), len(ref_tokens))
        d = first_divergence([tokens[:n]], [ref_tokens[:n]])
        return f"yes ({n} tokens)" if d is None else f"differs from token {d[1]}"

    # Stages 1 and 4 start from a cache prefilled by one compiled prefill program (public API only:
    # forward + init_cache), so only their decode is measured.
    def prefill_first(params, tokens, positions, cache):
        logits, cache = forward(params, tokens, positions, cache, last_only=True)
        return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    log("stages: compile a prefill program for the eager and on-device stages")
    ptoks, ppos = jnp.asarray([row0], jnp.int32), jnp.arange(P, dtype=jnp.int32)[None]
    t0 = time.perf_counter()
    prefill_c = (
        jax.jit(prefill_first, donate_argnums=(3,)).lower(params, ptoks, ppos, init_cache(cfg, 1, cache_len)).compile()
    )
    compile_pre = time.perf_counter() - t0

    def prefill():
        return prefill_c(params, ptoks, ppos, init_cache(cfg, 1, cache_len))

    # 1. eager: no jit, op by op, with the cache (few tokens; the prompt is prefilled by the compiled prefill)
    k = max(1, min(opts["eager_steps"], (N - 1) // (reps + 1)))
    log(f"stage eager (no jit): {reps} x {k} decode steps, op by op")
    nxt, cache = prefill()
    toks, pos = [int(nxt[0])], P

    def eager_step(nxt, cache, pos):
        logits, cache = forward(params, nxt[:, None], jnp.asarray([[pos]], jnp.int32), cache)
        nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        return nxt, cache

    t0 = time.perf_counter()
    nxt, cache = eager_step(nxt, cache, pos)
    toks.append(int(nxt[0]))
    pos += 1
    first_call = time.perf_counter() - t0
    times = []
    for rep in range(reps):
        log(f"stage eager: rep {rep + 1}/{reps}")
        t0 = time.perf_counter()
        for _ in range(k):
            nxt, cache = eager_step(nxt, cache, pos)
            toks.append(int(nxt[0]))  # host transfer = synchronization
            pos += 1
        times.append(time.perf_counter() - t0)
    out.append(
        {
            "stage": "eager (no jit)",
            "tokens_timed": k,
            "tokens_per_s": summarize([k / t for t in times]),
            "compile_s": None,
            "first_call_s": first_call,
            "tokens_match": match(toks),
            "note": "op-by-op decode step (forward with the KV cache, no jax.jit around it); the first call, which "
            "compiles each op for its shapes, is reported instead of a compile",
        }
    )
    del cache

    # 2. jit, no cache: recompute the whole fixed-length window every token
    L = P + N
    k = max(1, min(opts["nocache_steps"], (N - 1) // (reps + 1)))
    log(f"stage jit without cache: compile (window {L} tokens), then {reps} x {k} steps")

    def nocache_step(params, tokens, positions):
        logits, _ = forward(params, tokens, positions, None, last_only=True)
        return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)

    toks_np = np.full((1, L), cfg.pad_id, np.int32)
    pos_np = np.full((1, L), -1, np.int32)
    toks_np[0, L - P :] = row0
    pos_np[0, L - P :] = np.arange(P)
    jitted = jax.jit(nocache_step)
    t0 = time.perf_counter()
    compiled = jitted.lower(params, jnp.asarray(toks_np), jnp.asarray(pos_np)).compile()
    compile_nc = time.perf_counter() - t0
    toks = []

    def nc_step():
        nonlocal toks_np, pos_np
        nxt = int(compiled(params, jnp.asarray(toks_np), jnp.asarray(pos_np))[0])
        toks.append(nxt)
        nxt_pos = pos_np[0, -1] + 1
        toks_np = np.concatenate([toks_np[:, 1:], [[nxt]]], axis=1).astype(np.int32)
        pos_np = np.concatenate([pos_np[:, 1:], [[nxt_pos]]], axis=1).astype(np.int32)

    nc_step()  # warm-up (first token)
    times = []
    for rep in range(reps):
        log(f"stage jit without cache: rep {rep + 1}/{reps}")
        t0 = time.perf_counter()
        for _ in range(k):
            nc_step()
        times.append(time.perf_counter() - t0)
    out.append(
        {
            "stage": "jit, no cache",
            "tokens_timed": k,
            "tokens_per_s": summarize([k / t for t in times]),
            "compile_s": compile_nc,
            "tokens_match": match(toks),
            "note": f"one compiled forward over a fixed, left-padded window of {L} tokens, recomputed per token",
            "_compile_log": [
                {
                    "function": "nocache_step",
                    "batch": 1,
                    "tokens": L,
                    "cache_len": None,
                    "seconds": compile_nc,
                    "dtype": "float32",
                }
            ],
        }
    )

    # 3. + 4. jit + KV cache (the Generator's host loop) and the whole decode loop on device, measured
    #    back to back in each repetition so that both see the same machine state
    log("stage whole loop on device: compile the loop")
    loop = jax.jit(decode_on_device, static_argnames=("steps",), donate_argnums=(3,))
    first, cache = prefill()
    first_pos = jnp.asarray([P], jnp.int32)
    t0 = time.perf_counter()
    loop_c = loop.lower(params, first, first_pos, cache, steps=N).compile()
    compile_loop = time.perf_counter() - t0
    _, cache = loop_c(params, first, first_pos, cache)  # warm-up run
    jax.block_until_ready(cache)
    host_times, times, dev_tokens = [], [], None
    for rep in range(reps):
        log(f"stages jit + KV cache and whole loop on device: rep {rep + 1}/{reps}")
        host_times.append(gen.generate([row0], N, ignore_eos=True)[0].decode_seconds)
        first, cache = prefill()
        jax.block_until_ready((first, cache))
        t0 = time.perf_counter()
        toks_dev, cache = loop_c(params, first, first_pos, cache)
        toks_dev = np.asarray(toks_dev)  # host transfer = synchronization
        times.append(time.perf_counter() - t0)
        dev_tokens = toks_dev[0].tolist()
    del cache
    dec_compile = next((c["seconds"] for c in gen.compile_log if c["function"] == "decode" and c["batch"] == 1), None)
    out.append(
        {
            "stage": "jit + KV cache (host loop)",
            "tokens_timed": N - 1,
            "tokens_per_s": summarize([(N - 1) / t for t in host_times]),
            "compile_s": dec_compile,
            "tokens_match": "yes (reference)",
            "note": "Generator.generate: one compiled decode step per token, donated cache, token to host each "
            "step; re-measured here, back to back with the on-device loop",
        }
    )
    out.append(
        {
            "stage": "whole loop on device",
            "tokens_timed": N - 1,
            "tokens_per_s": summarize([(N - 1) / t for t in times]),
            "compile_s": compile_loop,
            "tokens_match": match(dev_tokens),
            "note": "decode_on_device: one lax.fori_loop over N - 1 steps, tokens to host once at the end",
            "_compile_log": [
                {
                    "function": "prefill (stages)",
                    "batch": 1,
                    "tokens": P,
                    "cache_len": cache_len,
                    "seconds": compile_pre,
                    "dtype": "float32",
                },
                {
                    "function": "on-device loop",
                    "batch": 1,
                    "tokens": N,
                    "cache_len": cache_len,
                    "seconds": compile_loop,
                    "dtype": "float32",
                },
            ],
        }
    )

    # 5. bfloat16 (Generator on bf16 weights and cache); fewer tokens: XLA's CPU bf16 matrix-vector
    #    products are slow, and decode speed at batch 1 hardly depends on the context length
    k = max(1, min(opts["bf16_steps"], N - 1))
    log(f"stage bfloat16: cast weights, compile, warm-up ({k} decode steps per rep)")
    params16 = cast_params(params, default_policy("bfloat16"))
    gen16 = _timed_generator(params16, tok)
    gen16.warmup(batch_sizes=[1], prompt_lens=[P], max_new_tokens=k + 1)
    times, toks16 = [], None
    for rep in range(reps):
        log(f"stage bfloat16: rep {rep + 1}/{reps}")
        r = gen16.generate([row0], k + 1, ignore_eos=True)[0]
        times.append(r.decode_seconds)
        toks16 = r.generated_ids
    d16 = first_divergence([toks16], [ref_tokens[: len(toks16)]])
    out.append(
        {
            "stage": "bfloat16 (jit + KV cache)",
            "tokens_timed": k,
            "tokens_per_s": summarize([k / t for t in times]),
            "compile_s": next((c["seconds"] for c in gen16.compile_log if c["function"] == "decode"), None),
            "tokens_match": f"yes ({len(toks16)} tokens)"
            if d16 is None
            else f"differs from token {d16[1]} (expected: bf16 rounding)",
            "note": "cast_params(params, default_policy('bfloat16')): bf16 weights, activations and KV cache",
            "_compile_log": gen16.compile_log,
        }
    )
    del params16, gen16
    return out


def headline_metrics(res: dict) -> dict:
    """The numbers the targets read (None where not measured)."""
    dec = {d["batch"]: d for d in res.get("decode") or []}
    pre = res.get("prefill") or {}
    gen_compiles = [
        c["seconds"]
        for c in res.get("compile", [])
        if c["function"] in ("prefill", "first", "decode") and c.get("dtype") == "float32"
    ]
    ttft = res.get("ttft")
    qrows = (res.get("quant") or {}).get("rows", [])
    best = {b: best_at_batch(qrows, b) for b in (1, 32)}
    return {
        "decode_b1_vs_peer": dec[1]["vs_peer"] if 1 in dec else None,
        "decode_b1_bw_pct": dec[1]["bw_roofline_pct"] if 1 in dec else None,
        "decode_b32_vs_peer": dec[32]["vs_peer"] if 32 in dec else None,
        "prefill_vs_peer": pre.get("vs_peer"),
        "prefill_matmul_pct": pre.get("matmul_ceiling_pct"),
        "compile_max_s": max(gen_compiles) if gen_compiles else None,
        "ttft_warm_s": ttft["warm"]["median"] if ttft else None,
        "speculative_copy_speedup": _copy_heavy_speedup(res.get("speculative") or []),
        "quant_b32_best": best[32]["vs_float32"] if best[32] else None,
        "quant_b32_best_label": best[32]["label"] if best[32] else None,
        "quant_b1_best": best[1]["vs_float32"] if best[1] else None,
        "quant_b1_best_label": best[1]["label"] if best[1] else None,
    }


def _copy_heavy_speedup(rows: list[dict]) -> float | None:
    """Speed-up of n-gram drafting on the copy-heavy prompts; 0 when its tokens were not identical."""
    row = next((r for r in rows if r["task"] == "copy-heavy" and r["method"] == "ngram"), None)
    if row is None:
        return None
    return row["speed-up"] if row["identical"] == "yes" else 0.0


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _table(rows: list[list[str]], headers: list[str], title: str) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def render(res: dict) -> str:
    """The aligned plain-text report: header block, then one table per part."""
    meta, ceil = res["meta"], res["ceilings"]
    th = meta["threads"]
    v = meta["versions"]
    opts = res["options"]
    peer_on = res["peer"]["enabled"]
    reps = opts["reps"]
    xla_threads = (
        f"{th['xla_intra_op_threads']} (intra-op pool = schedulable CPUs; XLA_FLAGS "
        f"{'unset' if not th['xla_flags'] else repr(th['xla_flags'])})"
        if th["xla_intra_op_threads"]
        else f"set by XLA_FLAGS {th['xla_thread_flags']}"
    )
    torch_threads = (
        f"torch {th['torch_threads']} (get_num_threads; OMP_NUM_THREADS {th['omp_num_threads'] or 'unset'}, "
        f"OMP_WAIT_POLICY {th['omp_wait_policy'] or 'unset'})"
        if peer_on
        else "torch - (no peer)"
    )
    la0, la1 = meta["load_average_start"][0], meta.get("load_average_end", [float("nan")])[0]
    head = [
        f"jaxlab bench - {meta['model']}, float32 unless noted",
        f"device      {meta['backend']} {meta['device']} ({meta['cpu']}; {th['os_cpu_count']} CPUs, "
        f"{th['schedulable_cpus']} schedulable; load average {la0:.1f} at start, {la1:.1f} at end)",
        "versions    "
        + ", ".join(
            f"{k} {v[k]}" for k in ("jaxlab", "jax", "jaxlib", "flax", "numpy", "torch", "transformers") if v.get(k)
        ),
        f"threads     XLA {xla_threads}; {torch_threads}",
        f"ceilings    bandwidth {ceil['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (read+write of a {fmt_bytes(ceil['bandwidth_copy_bytes'])} "
        f"copy; samples {', '.join(f'{x / 1e9:.1f}' for x in ceil['bandwidth_samples'])}), matmul "
        f"{ceil['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s ({ceil['matmul_n']}^2 float32; samples "
        f"{', '.join(f'{x / 1e9:.0f}' for x in ceil['matmul_samples'])}); best sample of the run; "
        f"ridge {ceil['ridge_flop_per_byte']:.1f} FLOP/B"
        + (
            f"; bfloat16 matmul {ceil['matmul_bf16_flops_per_s'] / 1e9:.1f} GFLOP/s"
            if ceil.get("matmul_bf16_flops_per_s")
            else ""
        ),
        "published   " + published_line(ceil.get("published"), ceil, meta.get("device_kind", "cpu")),
        f"method      median of {reps} rep{'s' if reps != 1 else ''} (min-max in brackets) after warm-up; prompts "
        f"{opts['prompt_len']} tokens (windows of a fixed text, one per row); {opts['new_tokens']} new tokens, EOS ignored, greedy",
        f"peer        {res['peer']['what'] if peer_on else res['peer']['reason']}",
    ]
    busy = max(la0, 0 if la1 != la1 else la1)
    if busy > 0.5 * (th["schedulable_cpus"] or 1):
        head.append(
            f"WARNING     the machine was busy (load average up to {busy:.1f} on {th['schedulable_cpus']} CPUs): "
            "absolute numbers are pessimistic and ratios noisy; PyTorch's OpenMP threads spin-wait and slow down "
            "far more than XLA's when CPUs are oversubscribed (OMP_WAIT_POLICY=PASSIVE makes the peer robust to that)"
        )
    if meta.get("persistent_compile_cache"):
        head.append(
            f"note        persistent compilation cache on ({meta['persistent_compile_cache']}): compile times may be cache loads"
        )
    parts = ["\n".join(head)]

    pub = ceil.get("published")
    pre = res["prefill"]
    if pre:
        rows = [
            [
                "jaxlab (jit)",
                fmt_summary(pre["ours_tokens_per_s"]),
                fmt_summary(pre["ours_s"], 1e3),
                fmt_pct(pre["matmul_ceiling_pct"]),
                fmt_ratio(pre["vs_peer"]),
            ]
        ]
        if pre["peer_s"]:
            rows.append(
                [
                    "transformers",
                    fmt_summary(pre["peer_tokens_per_s"]),
                    fmt_summary(pre["peer_s"], 1e3),
                    fmt_pct(pre["peer_matmul_ceiling_pct"]),
                    "1.00x",
                ]
            )
        headers = ["prefill", "tok/s", "ms", "% matmul ceiling", "vs transformers"]
        if pub:  # the peer runs on the CPU: no accelerator percentage for it
            headers.insert(4, f"% {pub['chip']} {pub['dtype']} peak")
            for r in rows:
                r.insert(4, fmt_pct(pre.get("published_flops_pct")) if r[0] == "jaxlab (jit)" else "-")
        parts.append(
            _table(
                rows,
                headers,
                f"Prefill: batch 1, {pre['prompt_len']}-token prompt, generate(max_new_tokens=1) wall time; "
                f"FLOPs = model count ({pre['flops_model'] / 1e9:.2f} GFLOP"
                + (
                    f"; XLA's cost analysis of the padded program: {pre['xla_flops'] / 1e9:.2f}"
                    if pre.get("xla_flops")
                    else ""
                )
                + ")",
            )
        )

    if res["decode"]:
        rows = []
        for d in res["decode"]:
            rows.append(
                [
                    f"decode b{d['batch']}",
                    fmt_summary(d["ours_tokens_per_s"]),
                    fmt_summary(d["peer_tokens_per_s"]),
                    fmt_ratio(d["vs_peer"]),
                    fmt_summary(d["ours_step_s"], 1e3),
                    fmt_bytes(d["bytes_per_step"]),
                    fmt_pct(d["bw_roofline_pct"]),
                    f"{fmt_pct(d['roofline_pct'])} {d['roofline_bound']}",
                    d["greedy_check"],
                ]
            )
            if pub:
                rows[-1].insert(7, fmt_pct(d.get("published_bw_pct")))
        headers = [
            "decode",
            "jaxlab tok/s",
            "transformers tok/s",
            "vs transformers",
            "step ms",
            "bytes/step",
            "% BW roofline",
            "% roofline (bound)",
            "greedy tokens vs transformers",
        ]
        if pub:
            headers.insert(7, f"% {pub['chip']} memory BW")
        parts.append(
            _table(
                rows,
                headers,
                f"Decode: {opts['new_tokens']} new tokens per row ({opts['new_tokens'] - 1} timed decode steps), "
                "tok/s = rows x steps / decode time; bytes/step = weights + K/V of the tokens so far",
            )
        )

    if res["stages"]:
        rows = []
        for s in res["stages"]:
            comp = _num(s["compile_s"]) if s["compile_s"] is not None else f"(first call {_num(s.get('first_call_s'))})"
            rows.append(
                [
                    s["stage"],
                    str(s["tokens_timed"]),
                    fmt_summary(s["tokens_per_s"]),
                    comp,
                    fmt_ratio(s["vs_peer"]),
                    s["tokens_match"],
                ]
            )
        parts.append(
            _table(
                rows,
                ["stage", "tokens timed", "tok/s", "compile s", "vs transformers b1", "tokens = jit + cache"],
                "Stages: decode at batch 1",
            )
        )

    if res.get("speculative"):
        rows = [
            [
                r["task"],
                r["method"],
                str(r["k"]),
                _num(r["acceptance"]),
                _num(r["tokens/call"]),
                fmt_ratio(r["speed-up"]),
                r["identical"],
            ]
            for r in res["speculative"]
        ]
        parts.append(
            _table(
                rows,
                ["task", "method", "k", "acceptance", "tokens/call", "vs plain greedy", "tokens identical"],
                "Speculative decoding: batch 1, greedy, EOS ignored, against plain greedy in the same run",
            )
        )

    if res.get("ttft"):
        t = res["ttft"]
        runs = t["runs"]

        def hits(kind):
            rs = [r for r in runs if r["kind"] == kind]
            return f"{statistics.median(r['compiles'] for r in rs):.0f} / {statistics.median(r['cache_hits'] for r in rs):.0f}"

        rows = [
            ["cold (empty cache)", fmt_summary(t["cold"]), hits("cold")],
            ["warm (cache filled)", fmt_summary(t["warm"]), hits("warm")],
        ]
        note = f" ({t['note']})" if t.get("note") else ""
        parts.append(
            _table(
                rows,
                ["time to first token", "seconds", "compiles / persistent-cache hits"],
                f"Time to first token{note}: fresh process on {t.get('backend', '?')}, model loaded, "
                f"Generator.generate([{opts['prompt_len']} tokens], 1)",
            )
        )

    if res.get("quant"):
        parts.append(render_quant(res["quant"]))
    if res.get("quality"):
        parts.append(render_quality(res["quality"]))

    rows = []
    for c in res["compile"]:
        shape = (f"tokens {c['batch']}x{c['tokens']}" if c.get("tokens") else f"batch {c['batch']}") + (
            f", cache {c['cache_len']}" if c.get("cache_len") else ""
        )
        rows.append([c["function"], c.get("dtype", ""), shape, _num(c["seconds"])])
    parts.append(
        _table(
            rows,
            ["jitted function", "dtype", "shapes", "compile s"],
            "Compile: lower + XLA compile per program (AOT; Generator programs for every batch size, then the "
            "stages, then the quantized decode rows)",
        )
    )

    mem = res["memory"]
    rows = [
        ["weights float32", fmt_bytes(mem["weights_float32_bytes"])],
        ["weights bfloat16", fmt_bytes(mem["weights_bfloat16_bytes"])],
    ]
    rows += [[f"weights {f} (jaxlab.quant)", fmt_bytes(n)] for f, n in mem.get("weights_quantized_bytes", {}).items()]
    for b, n in mem.get("kv_cache_bytes", {}).items():
        rows.append([f"KV cache b{b} ({mem['cache_len']} slots, float32)", fmt_bytes(n)])
    if "after_decode" in mem:
        rows.append(["largest XLA temp buffer (Generator programs)", fmt_bytes(mem["largest_xla_temp_bytes"])])
        rows.append(["live JAX arrays after decode", fmt_bytes(mem["after_decode"].get("live_arrays_bytes"))])
        rows.append(
            ["peak RSS, jaxlab only (after warm-up at all batch sizes)", fmt_bytes(mem["peak_rss_jaxlab_bytes"])]
        )
    rows.append(["peak RSS at the end (incl. peer, stages)", fmt_bytes(mem["final"].get("process_peak_rss_bytes"))])
    parts.append(_table(rows, ["memory", "bytes"], "Memory (profile.memory_stats)"))
    return "\n\n".join(parts) + "\n"


def published_line(pub: dict | None, ceil: dict, device_kind: str = "cpu") -> str:
    """The report's line on published peaks: the chip's, and the measured ceilings as % of them."""
    if not pub:
        if device_kind.lower() == "cpu":
            return "none for a CPU: the measured ceilings above are the roofline"
        return (
            f"none known for {device_kind} (jaxlab.tools.hardware.CHIPS): the measured ceilings above are the roofline"
        )
    per = f" per jax device (a chip is {pub['devices_per_chip']})" if pub.get("devices_per_chip", 1) > 1 else ""
    bf16 = ceil.get("matmul_bf16_flops_per_s")
    return (
        f"{pub['chip']}: {pub['flops_per_s'] / 1e12:,.0f} TFLOP/s {pub['dtype']} (dense), "
        f"{pub['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s{per} ({pub['source']}); measured bandwidth "
        f"{fmt_pct(100 * ceil['bandwidth_bytes_per_s'] / pub['bandwidth_bytes_per_s'])} of it, "
        + (f"bfloat16 matmul {fmt_pct(100 * bf16 / pub['flops_per_s'])}, " if bf16 else "")
        + f"float32 matmul {fmt_pct(100 * ceil['matmul_flops_per_s'] / pub['flops_per_s'])}"
    )


def render_quant(q: dict) -> str:
    """The quantized decode rows and, per variant, its ratio at each batch and where it pays."""

    def vs(r):
        p = r.get("vs_float32_per_rep") or {}
        if is_baseline(r):
            return "(baseline)"
        if p.get("n", 0) > 1:
            return f"{fmt_ratio(r['vs_float32'])} ({p['min']:.2f}–{p['max']:.2f})"
        return fmt_ratio(r["vs_float32"])

    rows = [
        [
            r["label"],
            f"b{r['batch']}",
            fmt_summary(r["step_s"], 1e3),
            fmt_summary(r["tokens_per_s"]),
            vs(r),
            fmt_bytes(r["bytes_per_step"]),
            fmt_pct(r.get("bw_roofline_pct")),
            _num(r["compile_s"]),
        ]
        for r in q["rows"]
    ]
    headers = ["variant", "batch", "step ms", "tok/s", "vs float32", "bytes/step", "% BW roofline", "compile s"]
    if any(r.get("published_bw_pct") is not None for r in q["rows"]):
        headers.insert(7, "% published memory BW")
        for row, r in zip(rows, q["rows"]):
            row.insert(7, fmt_pct(r.get("published_bw_pct")))
    steps = (
        f"Quantized decode: one decode step, {q['steps']} steps per measurement, median of {q['reps']} reps; every "
        f"variant compiled first, then alternated rep by rep in this process; cache of {q['cache_len']} slots with {q['prompt_len']} filled; "
        "vs float32 = median over reps of float32's step time / this one's in the same rep (> 1x: faster)"
    )
    batches = q["batch_sizes"]
    pays = [
        [c["label"], *(fmt_ratio(c["ratios"].get(b, c["ratios"].get(str(b)))) for b in batches), c["text"]]
        for c in q["crossover"]
    ]
    return "\n\n".join(
        [
            _table(rows, headers, steps),
            _table(
                pays,
                ["variant", *(f"b{b}" for b in batches), "pays (ratio > 1)"],
                "Where each quantized variant pays: its speed ratio over float32 at each batch size",
            ),
        ]
    )


def render_quality(q: dict) -> str:
    """The quality table (formats x KV cache against float32), what the reference is, and the per-matrix errors."""
    sz, kv = q["sizes"], q["kv_cache"]
    title = (
        f"Quality against float32: perplexity, KL and top-1 over {q['eval_tokens']:,} predicted tokens of "
        f"{q['eval_text']} ({sz['windows']} windows x {sz['window']}); greedy agreement over {sz['prompts']} chat "
        f"prompts x {sz['new_tokens']} tokens, EOS ignored: tokens = quantized argmax on float32's path (the "
        f"headline), identical = free-running continuations equal to float32's; KV cache at batch {kv['batch']}, "
        f"{kv['length']} slots; quality = ppl +<= {q['targets']['max_ppl_increase_pct']:g} % and greedy >= "
        f"{100 * q['targets']['min_greedy_agreement']:g} %"
    )
    rows = [
        [
            r["label"],
            fmt_bytes(r["weight_bytes"]),
            fmt_bytes(r["kv_cache_bytes"]),
            f"{r['perplexity']:.3f}",
            f"{r['ppl_increase_pct']:+.2f} %",
            f"{r['kl']:.4f}",
            f"{100 * r['top1_agreement']:.1f} %",
            f"{100 * r['greedy_agreement']:.1f} %",
            f"{r['identical']}/{r['prompts']}",
            r["status"],
        ]
        for r in q["rows"]
    ]
    table = _table(
        rows,
        [
            "variant",
            "weights",
            "KV cache",
            "perplexity",
            "ppl vs f32",
            "KL",
            "top-1",
            "greedy tokens",
            "identical",
            "quality",
        ],
        title,
    )
    notes = "\n".join(f"note        {n}" for n in q["notes"])
    kinds = list(dict.fromkeys(r["matrix"] for r in q["layer_errors"]))
    errs = {(r["format"], r["matrix"]): r for r in q["layer_errors"]}
    formats = list(dict.fromkeys(r["format"] for r in q["layer_errors"]))
    erows = [
        [
            f,
            *(f"{errs[f, k]['mean']:.2e}" if (f, k) in errs else "-" for k in kinds),
            f"{max(r['max'] for r in q['layer_errors'] if r['format'] == f):.2e}",
        ]
        for f in formats
    ]
    errors = _table(
        erows,
        ["format", *kinds, "max"],
        "Relative weight error |W_q - W| / |W| per matrix kind (mean over layers; max over all matrices)",
    )
    return "\n\n".join([table + "\n" + notes, errors]) if erows else table + "\n" + notes


#: Row labels the report always has (the smoke test checks them); decode rows are "decode b<batch>".
ALWAYS_ROWS = ("jaxlab (jit)", "weights float32", "peak RSS, jaxlab only")
STAGE_ROWS = (
    "eager (no jit)",
    "jit, no cache",
    "jit + KV cache (host loop)",
    "whole loop on device",
    "bfloat16 (jit + KV cache)",
)
TTFT_ROWS = ("cold (empty cache)", "warm (cache filled)")


def plot(res: dict, path: str) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    from jaxlab.tools import profile

    ceil = res["ceilings"]
    roof = profile.Roofline(ceil["bandwidth_bytes_per_s"], ceil["matmul_flops_per_s"])
    pre = res["prefill"]
    meta = res["meta"]
    points = {
        f"prefill b1 ({pre['prompt_len']} tok)": (pre["flops_model"], pre["bytes_model"], pre["ours_s"]["median"])
    }
    for d in res["decode"]:
        points[f"decode b{d['batch']}"] = (d["flops_per_step"], d["bytes_per_step"], d["ours_step_s"]["median"])
    fig = profile.plot_roofline(roof, points)
    fig.axes[0].set_title(
        f"jaxlab bench: SmolLM2-135M float32 on {meta['backend']} ({meta['threads']['schedulable_cpus']} CPUs)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def run_from_args(args: argparse.Namespace, out=None) -> int:
    """Entry point of ``jaxlab bench``."""
    out = out or sys.stdout
    opts = resolve_options(args)
    res = run_bench(opts)
    text = render(res)
    if opts["targets"]:
        text += "\nTargets (from the ratios above)\n" + "\n".join(target_lines(res["targets"])) + "\n"
    out.write(text)
    out.flush()
    if opts["json"]:
        Path(opts["json"]).parent.mkdir(parents=True, exist_ok=True)
        Path(opts["json"]).write_text(json.dumps(_jsonable(res), indent=1) + "\n")
    if opts["plot"]:
        Path(opts["plot"]).parent.mkdir(parents=True, exist_ok=True)
        plot(res, opts["plot"])
    return 0


def child_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxlab.bench")
    p.add_argument("--ttft-child", action="store_true", required=True, help="time to first token, in this process")
    p.add_argument("--prompt-len", type=int, default=DEFAULTS["prompt_len"])
    a = p.parse_args(argv)
    print(json.dumps(ttft_child(a.prompt_len)))
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
