"""One run, start to end: load the model and the prompts once (:class:`~jaxlab.bench.harness.Setup`), sample
the ceilings, measure every section the options ask for, then the targets (:func:`run_bench`); and the
``jaxlab bench`` command around it (:func:`run_from_args`)."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from jaxlab.bench.costmodel import Ceilings, add_quant_rooflines, add_rooflines, estimate_seconds
from jaxlab.bench.harness import Progress, Setup, cpu_name, threads_info, timed_generator, versions
from jaxlab.bench.memory import memory_section
from jaxlab.bench.options import Options, resolve_options
from jaxlab.bench.output import plot, write_json
from jaxlab.bench.peer import WHAT as PEER_WHAT
from jaxlab.bench.peer import start_peer
from jaxlab.bench.prompts import TEXT, make_prompts
from jaxlab.bench.quantrows import measure_quant
from jaxlab.bench.report import render
from jaxlab.bench.speculative import measure_speculative
from jaxlab.bench.speed import measure_decode, measure_prefill
from jaxlab.bench.stages import measure_stages
from jaxlab.bench.stats import ratio
from jaxlab.bench.targets import evaluate_targets, headline_metrics, speed_quality_targets, target_lines
from jaxlab.bench.ttft import measure_ttft


def run_bench(opts: Options, log=None) -> dict:
    """Measure everything ``opts`` asks for; returns the results dict (what ``--json`` writes)."""
    log = log or Progress()
    t_run = time.perf_counter()
    import jax

    from jaxlab import __version__
    from jaxlab.engine import hugepages
    from jaxlab.engine.kernels import cpu as cpu_kernels
    from jaxlab.engine.loading import load_model
    from jaxlab.engine.plan import CACHE_BUCKETS, bucket
    from jaxlab.errors import InvalidRequestError
    from jaxlab.tools import hardware, profile

    P, N = opts.prompt_len, opts.new_tokens
    res: dict[str, Any] = {"options": opts.as_json()}
    ttft_first = opts.ttft and not hardware.backend_started()
    if ttft_first:  # before this process takes the accelerator: the children measure it, not the CPU
        res["ttft"] = measure_ttft(P, opts.reps, log)

    log(f"loading the model ({opts.model or 'embedded SmolLM2-135M'}, float32)")
    m = load_model(opts.model_options)  # float32 on every backend (bfloat16 is its own stage), opts.attention
    cfg = m.params.config
    if P + N > cfg.max_seq_len:
        raise InvalidRequestError(
            f"--prompt-len + --new-tokens = {P + N} exceeds the model's context {cfg.max_seq_len}"
        )
    setup = Setup(
        params=m.params,
        tokenizer=m.tokenizer,
        rows=make_prompts(m.tokenizer.encode(TEXT), max(opts.batch_sizes + opts.quant_batch_sizes + (1,)), P),
        cache_len=bucket(P + N, CACHE_BUCKETS),
        log=log,
    )
    weight_bytes, n_params = m.params.nbytes(), cfg.n_params()
    dev = jax.devices()[0]
    chip = hardware.chip_for(dev.device_kind)  # None on a CPU or a chip without published peaks

    log(f"compute ceiling: {opts.matmul_n}x{opts.matmul_n} float32 matmul")
    ceilings = Ceilings(opts)
    est = estimate_seconds(opts, ceilings.sample_matmul(), weight_bytes, n_params)
    log(
        f"rough estimate of the whole run: ~{est / 60:.0f} min (machine: {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f})"
    )

    # ---- compile (warm-up) everything jaxlab will time ------------------------------------------
    mem_after = {}
    if opts.float:
        setup.generator = timed_generator(m.params, m.tokenizer)
        for b in sorted(set(opts.batch_sizes) | {1}):
            log(f"compile + warm-up: Generator batch {b} (prefill for the prompt bucket, decode step)")
            with profile.CompileCounter() as cc:
                setup.generator.warmup(batch_sizes=[b], prompt_lens=[P], max_new_tokens=N)
            res["compile_cache_hits"] = res.get("compile_cache_hits", 0) + cc.cache_hits
        mem_after = profile.memory_stats()

    log(f"ceilings: copy of {opts.bandwidth_mib} MiB, {opts.matmul_n}^2 matmul")
    ceilings.sample_all()

    setup.peer, peer_reason = start_peer(opts, setup.rows[0], log)
    res["peer"] = {"enabled": setup.peer is not None, "reason": peer_reason, "what": PEER_WHAT}
    threads = threads_info(setup.peer is not None)
    res["meta"] = {
        "jaxlab": __version__,
        "versions": versions(),
        "backend": jax.default_backend(),
        "device": str(dev),
        "device_kind": dev.device_kind,
        "cpu": cpu_name(),
        "cpus": threads["schedulable_cpus"],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "chip": hardware.describe_peaks(chip, dev.device_kind),
        "threads": threads,
        "load_average_start": os.getloadavg(),
        "persistent_compile_cache": jax.config.jax_compilation_cache_dir,
        "cpu_kernels": cpu_kernels.status().reason,  # whether jaxlab's own CPU kernels ran the few-row steps
        "huge_pages": hugepages.status().reason,  # whether the weights lie in 2 MB pages
        "huge_page_mib": round((hugepages.huge_page_bytes() or 0) / 2**20),  # this process's, after loading
        "model": "SmolLM2-135M-Instruct (embedded GGUF, Q4_1 dequantized)"
        if opts.model is None
        else f"{m.source} (float32)",
        "params": n_params,
        "weight_bytes": weight_bytes,
        "prompt_source": "windows of a fixed English text (jaxlab.bench.prompts.TEXT)",
    }

    # ---- float32: prefill, decode, stages, speculative --------------------------------------------
    res.update(prefill=None, decode=[], stages=[], speculative=[])
    mem_decode = measure_float(opts, setup, res) if opts.float else {}

    # ---- quantized decode rows, then the quality report (which reuses the quantized weights) -------
    quantized: dict[str, Any] = {}
    res["quant"] = measure_quant(opts, setup, quantized) if opts.quant else None
    if res["quant"] and opts.llama_bench:
        from jaxlab.bench import llamaquant
        from jaxlab.io.assets import model_path

        res["quant"]["llama_cpp"] = peer = llamaquant.measure_llama_quant(
            opts.llama_bench,
            setup.params,
            setup.tokenizer,
            Path(opts.model) if opts.model and opts.model.endswith(".gguf") else model_path(),
            new_tokens=opts.quant_steps * 4,
            reps=max(opts.reps, 5),
            threads=res["meta"]["cpus"],
            log=log,
            batch_sizes=opts.quant_batch_sizes,
            prompt_len=opts.prompt_len,
        )
        res["quant"]["llama_cpp_vs_jaxlab"] = llamaquant.compare(res["quant"]["rows"], peer)
    res["quality"] = None
    if opts.quality:
        from jaxlab.quant import quality

        res["quality"] = quality.quality_report(
            loaded=m,
            formats=opts.quant_formats,
            kv_formats=opts.quant_kv,
            sizes=quality.SMALL if opts.quick else quality.DEFAULT,
            quantized=quantized,
            kv_batch=max(opts.quant_batch_sizes),
            kv_len=setup.cache_len,
            log=log,
        )

    # ---- ceilings again (the best the machine showed during the run is the ceiling) ----------------
    log("ceilings again, at the end")
    ceilings.sample_all()
    res["ceilings"] = ceil = ceilings.result(chip)
    if opts.float:
        add_rooflines(res, ceil)
    if res["quant"]:
        add_quant_rooflines(res["quant"]["rows"], ceil)

    res["compile"] = (
        (setup.generator.programs.compile_log if setup.generator else [])
        + [c for s in res["stages"] for c in s.pop("_compile_log", [])]
        + (res["quant"]["compile"] if res["quant"] else [])
    )
    res["memory"] = memory_section(opts, setup, quantized, mem_after, mem_decode)

    # ---- time to first token (here only if this process already held its device at the start) -------
    if opts.ttft and not ttft_first:
        res["ttft"] = measure_ttft(P, opts.reps, log)
    elif not opts.ttft:
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


def measure_float(opts: Options, setup: Setup, res: dict) -> dict:
    """The float32 rows: prefill and decode against the peer, the stages and speculative decoding (filled
    into ``res``); returns the memory snapshot taken after decode."""
    from jaxlab.tools import profile

    res["prefill"] = measure_prefill(opts, setup)
    res["decode"], tokens_b1 = measure_decode(opts, setup)
    mem_decode = profile.memory_stats()

    stages = []
    if opts.stages:
        if tokens_b1 is None:  # batch 1 not among the decode batch sizes: run it for the stages
            tokens_b1 = setup.generator.generate([setup.rows[0]], opts.new_tokens, ignore_eos=True)[0].generated_ids
        stages = measure_stages(opts, setup, tokens_b1)
    peer_b1 = next((d for d in res["decode"] if d["batch"] == 1 and d["peer_tokens_per_s"]), None)
    for s in stages:
        s["vs_peer"] = ratio(s["tokens_per_s"]["median"], peer_b1["peer_tokens_per_s"]["median"]) if peer_b1 else None
    res["stages"] = stages

    res["speculative"] = measure_speculative(opts, setup) if opts.speculative else []
    return mem_decode


def run_from_args(args: argparse.Namespace, out=None) -> int:
    """Entry point of ``jaxlab bench``: measure, print the report (and the targets), write the files."""
    out = out or sys.stdout
    if getattr(args, "trace", False):
        from jaxlab.bench.trace import run_trace

        return run_trace(args, out)
    if getattr(args, "train", False):
        from jaxlab.bench.training import run_training

        return run_training(args, out)
    if getattr(args, "structured", False):
        from jaxlab.bench.structured import run_structured

        return run_structured(args, out)
    if getattr(args, "retrieval", False):
        from jaxlab.bench.retrieval import run_retrieval

        return run_retrieval(args, out)
    if getattr(args, "encoder", False):
        from jaxlab.bench.encoder import run_encoder

        return run_encoder(args, out)
    if getattr(args, "kernels", False):
        from jaxlab.bench.kernels import run_kernels

        return run_kernels(args, out)
    if getattr(args, "serve", False):
        from jaxlab.bench.serving import run_serve

        return run_serve(args, out)
    opts = resolve_options(args)
    res = run_bench(opts)
    text = render(res)
    if opts.targets:
        text += "\nTargets (from the ratios above)\n" + "\n".join(target_lines(res["targets"])) + "\n"
    out.write(text)
    out.flush()
    if opts.json:
        write_json(res, opts.json)
    if opts.plot:
        plot(res, opts.plot)
    return 0
