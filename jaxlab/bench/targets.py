"""The issue's targets: the headline numbers of a run (:func:`headline_metrics`), each against its
threshold (:func:`evaluate_targets`), and whether the quantized format that meets a speed target also meets
the quality targets measured in the same run (:func:`speed_quality_targets`)."""

from __future__ import annotations

import math

from jaxlab.bench.quantrows import best_at_batch, is_baseline, quant_label
from jaxlab.bench.speculative import copy_heavy_speedup

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
    # the CPU-speed issue's, beside llama.cpp (--llama-bench) and against the read-bandwidth ceiling
    ("quant_b32_vs_llama", "quantized decode batch 32 >= 1.0x llama.cpp (fastest of each)", ">=", 1.0, "x"),
    ("int8_b1_vs_llama_q4_1", "int8 decode batch 1 >= 0.55x llama.cpp Q4_1", ">=", 0.55, "x"),
    ("int8_b1_read_pct", "int8 decode batch 1 >= 60 % of its read-bandwidth roofline", ">=", 60.0, "%"),
    ("quant_compile_max_s", "<= 3 s compile per quantized decode program", "<=", 3.0, "s"),
)
#: Speed targets whose format must also meet the quality targets: (batch, key of the speed target).
QUALITY_LINKED = ((32, "quant_b32_best"), (1, "quant_b1_best"))


def headline_metrics(res: dict) -> dict:
    """The numbers the targets read (None where not measured)."""
    dec = {d["batch"]: d for d in res.get("decode") or []}
    pre = res.get("prefill") or {}
    gen_compiles = [
        c["seconds"]
        for c in res.get("compile", [])
        if c["function"] in ("prefill", "first", "decode") and c.get("dtype") == "float32"
    ]
    quant_compiles = [c["seconds"] for c in res.get("compile", []) if c["function"] == "decode step (quant rows)"]
    ttft = res.get("ttft")
    qrows = (res.get("quant") or {}).get("rows", [])
    best = {b: best_at_batch(qrows, b) for b in (1, 32)}
    vs_llama = (res.get("quant") or {}).get("llama_cpp_vs_jaxlab") or {}
    b32 = (vs_llama.get("batched") or {}).get(32) or (vs_llama.get("batched") or {}).get("32")
    int8_b1 = next((r for r in qrows if (r["weights"], r["kv_cache"], r["batch"]) == ("int8", "float32", 1)), None)
    return {
        "decode_b1_vs_peer": dec[1]["vs_peer"] if 1 in dec else None,
        "decode_b1_bw_pct": dec[1]["bw_roofline_pct"] if 1 in dec else None,
        "decode_b32_vs_peer": dec[32]["vs_peer"] if 32 in dec else None,
        "prefill_vs_peer": pre.get("vs_peer"),
        "prefill_matmul_pct": pre.get("matmul_ceiling_pct"),
        "compile_max_s": max(gen_compiles) if gen_compiles else None,
        "ttft_warm_s": ttft["warm"]["median"] if ttft else None,
        "speculative_copy_speedup": copy_heavy_speedup(res.get("speculative") or []),
        "quant_b32_best": best[32]["vs_float32"] if best[32] else None,
        "quant_b32_best_label": best[32]["label"] if best[32] else None,
        "quant_b1_best": best[1]["vs_float32"] if best[1] else None,
        "quant_b1_best_label": best[1]["label"] if best[1] else None,
        "quant_b32_vs_llama": b32["ratio"] if b32 else None,
        "quant_b32_vs_llama_label": f"jaxlab {b32['best_jaxlab'][0]}, llama.cpp {b32['best_llama_cpp'][0]}"
        if b32
        else None,
        "int8_b1_vs_llama_q4_1": vs_llama.get("int8_vs_q4_1"),
        "int8_b1_read_pct": int8_b1.get("read_roofline_pct") if int8_b1 else None,
        "quant_compile_max_s": max(quant_compiles) if quant_compiles else None,
    }


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
