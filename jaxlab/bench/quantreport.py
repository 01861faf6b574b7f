"""The report's quantization parts: the quantized decode rows with where each variant pays, and the
quality table (formats x KV cache against float32) with the per-matrix weight errors."""

from __future__ import annotations

from jaxlab.bench.fmt import fmt_bytes, fmt_pct, fmt_ratio, fmt_summary, num, table
from jaxlab.bench.quantrows import is_baseline


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
            num(r["compile_s"]),
        ]
        for r in q["rows"]
    ]
    headers = ["variant", "batch", "step ms", "tok/s", "vs float32", "bytes/step", "% BW roofline", "compile s"]
    if any(r.get("read_roofline_pct") is not None for r in q["rows"]):  # a read's ceiling: the step only reads
        headers.insert(7, "% read roofline")
        for row, r in zip(rows, q["rows"]):
            row.insert(7, fmt_pct(r.get("read_roofline_pct")))
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
            table(rows, headers, steps),
            table(
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
    main = table(
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
    errors = table(
        erows,
        ["format", *kinds, "max"],
        "Relative weight error |W_q - W| / |W| per matrix kind (mean over layers; max over all matrices)",
    )
    return "\n\n".join([main + "\n" + notes, errors]) if erows else main + "\n" + notes
