"""The float32 headline rows: prefill at batch 1 and decode at each batch size, ours (the library's
:class:`~jaxlab.engine.generate.Generator`) against the peer, in the same repetition, with the greedy
tokens compared row by row and the model's FLOPs and bytes beside each row."""

from __future__ import annotations

import statistics
import time

from jaxlab.bench.costmodel import decode_context, decode_step_bytes, decode_step_flops, prefill_bytes, prefill_flops
from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options
from jaxlab.bench.peer import peer_generate
from jaxlab.bench.stats import divergence_text, first_divergence, ratio, summarize, summary_map
from jaxlab.engine.kvcache import cache_bytes


def measure_prefill(opts: Options, setup: Setup) -> dict:
    """Batch 1: wall time of ``generate([prompt], 1)`` (prefill + first token), ours and the peer's,
    max(reps, 5) times (short measurements: more repetitions)."""
    P, gen, peer, row0 = opts.prompt_len, setup.generator, setup.peer, setup.rows[0]
    cfg = setup.params.config
    pre_ours, pre_peer, pre_ratio = [], [], []
    pre_reps = max(opts.reps, 5)
    for rep in range(pre_reps):
        setup.log(f"prefill ({P} tokens, batch 1): rep {rep + 1}/{pre_reps}")
        t0 = time.perf_counter()
        gen.generate([row0], 1)
        t_ours = time.perf_counter() - t0
        pre_ours.append(t_ours)
        if peer is not None:
            pr = peer_generate(peer, [row0], 1)
            pre_peer.append(pr["total_s"])
            pre_ratio.append(pr["total_s"] / t_ours)
    s_ours = summarize(pre_ours)
    xla_pre = [c for c in gen.programs.compile_log if c["function"] == "prefill" and c["batch"] == 1]
    return {
        "batch": 1,
        "prompt_len": P,
        "what": "wall time of generate([prompt], max_new_tokens=1): prefill + first token (both implementations)",
        "ours_s": s_ours,
        "ours_tokens_per_s": summary_map(s_ours, lambda t: P / t),
        "peer_s": summarize(pre_peer) if pre_peer else None,
        "peer_tokens_per_s": summary_map(summarize(pre_peer), lambda t: P / t) if pre_peer else None,
        "vs_peer": ratio(statistics.median(pre_peer), s_ours["median"]) if pre_peer else None,
        "vs_peer_per_rep": summarize(pre_ratio) if pre_ratio else None,
        "flops_model": prefill_flops(cfg, 1, P),
        "bytes_model": prefill_bytes(setup.params.nbytes(), cfg, 1, P),
        "flops_source": "model: 2 x layer weights x tokens + causal attention + head (last position)",
        "xla_flops": xla_pre[0]["xla_flops"] if xla_pre else None,
        "xla_flops_note": "XLA's cost analysis of the compiled prefill program (prompt padded to its bucket; attention "
        "over every cache slot, masked ones included), for comparison with the model count",
    }


def measure_decode(opts: Options, setup: Setup) -> tuple[list[dict], list[int] | None]:
    """One row per batch size: decode time of ``new_tokens`` per row, ours and the peer's in each
    repetition, and whether the greedy tokens agree. Returns (rows, our batch-1 tokens or None)."""
    P, N, reps = opts.prompt_len, opts.new_tokens, opts.reps
    gen, peer, log = setup.generator, setup.peer, setup.log
    cfg = setup.params.config
    weight_bytes = setup.params.nbytes()
    context = decode_context(P, N)
    decode_rows = []
    ours_tokens_b1 = None
    for b in opts.batch_sizes:
        rows = setup.rows[:b]
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
                pr = peer_generate(peer, rows, N)
                peer_t.append(pr["decode_s"])
                peer_ids = pr["tokens"]
                ratios.append(pr["decode_s"] / results[0].decode_seconds)
        if b == 1:
            ours_tokens_b1 = ours_ids[0]
        so = summarize(ours_t)
        nbytes = decode_step_bytes(weight_bytes, cfg, b, context)
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
                "kv_bytes_allocated": float(cache_bytes(cfg, b, setup.cache_len)),
                "mean_context": context,
                "flops_per_step": decode_step_flops(cfg, b, context),
                "tokens_identical": (div is None) if peer_ids is not None else None,
                "first_divergence": None if div is None else {"row": div[0], "token": div[1]},
                "greedy_check": divergence_text(div, b) if peer_ids is not None else "no peer",
                "recompiled_reps": recompiles,
            }
        )
    return decode_rows, ours_tokens_b1
