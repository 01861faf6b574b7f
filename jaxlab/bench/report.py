"""The plain-text report of a run: the header (device, versions, threads, ceilings, published peaks,
method, peer), then one table per measured part, in the order they were measured."""

from __future__ import annotations

import statistics

from jaxlab.bench.fmt import fmt_bytes, fmt_pct, fmt_ratio, fmt_summary, num, table
from jaxlab.bench.quantreport import render_quality, render_quant

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
        f"jaxlab bench - {meta['model']}, float32 unless noted, attention {res['options'].get('attention', 'xla')}",
        f"device      {meta['backend']} {meta['device']} ({meta['cpu']}; {th['os_cpu_count']} CPUs, "
        f"{th['schedulable_cpus']} schedulable; load average {la0:.1f} at start, {la1:.1f} at end)",
        "versions    "
        + ", ".join(
            f"{k} {v[k]}" for k in ("jaxlab", "jax", "jaxlib", "flax", "numpy", "torch", "transformers") if v.get(k)
        ),
        f"threads     XLA {xla_threads}; {torch_threads}",
        f"ceilings    bandwidth {ceil['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (read+write of a {fmt_bytes(ceil['bandwidth_copy_bytes'])} "
        f"copy; samples {', '.join(f'{x / 1e9:.1f}' for x in ceil['bandwidth_samples'])}"
        + (
            f"; a read {ceil['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, samples "
            f"{', '.join(f'{x / 1e9:.1f}' for x in ceil['read_bandwidth_samples'])}"
            if ceil.get("read_bandwidth_bytes_per_s")
            else ""
        )
        + "), matmul "
        + f"{ceil['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s ({ceil['matmul_n']}^2 float32; samples "
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
    if meta.get("cpu_kernels"):
        head.append(f"CPU kernels {meta['cpu_kernels']}")
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
            table(
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
            table(
                rows,
                headers,
                f"Decode: {opts['new_tokens']} new tokens per row ({opts['new_tokens'] - 1} timed decode steps), "
                "tok/s = rows x steps / decode time; bytes/step = weights + K/V of the tokens so far",
            )
        )

    if res["stages"]:
        rows = []
        for s in res["stages"]:
            comp = num(s["compile_s"]) if s["compile_s"] is not None else f"(first call {num(s.get('first_call_s'))})"
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
            table(
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
                num(r["acceptance"]),
                num(r["tokens/call"]),
                fmt_ratio(r["speed-up"]),
                r["identical"],
            ]
            for r in res["speculative"]
        ]
        parts.append(
            table(
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
            table(
                rows,
                ["time to first token", "seconds", "compiles / persistent-cache hits"],
                f"Time to first token{note}: fresh process on {t.get('backend', '?')}, model loaded, "
                f"Generator.generate([{opts['prompt_len']} tokens], 1)",
            )
        )

    if res.get("quant"):
        parts.append(render_quant(res["quant"]))
        if res["quant"].get("llama_cpp"):
            from jaxlab.bench.llamaquant import render as render_llama_quant

            parts.append(render_llama_quant(res["quant"]))
    if res.get("quality"):
        parts.append(render_quality(res["quality"]))

    rows = []
    for c in res["compile"]:
        shape = (f"tokens {c['batch']}x{c['tokens']}" if c.get("tokens") else f"batch {c['batch']}") + (
            f", cache {c['cache_len']}" if c.get("cache_len") else ""
        )
        rows.append([c["function"], c.get("dtype", ""), shape, num(c["seconds"])])
    parts.append(
        table(
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
    parts.append(table(rows, ["memory", "bytes"], "Memory (profile.memory_stats)"))
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
