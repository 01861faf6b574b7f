"""The memory part of the report: weights in each format, the KV caches of the measured batches (the
engine's :func:`~jaxlab.engine.kvcache.cache_bytes`), XLA's largest temporary buffer and the process's
resident memory at the points where it tells something (:func:`jaxlab.tools.profile.memory_stats`)."""

from __future__ import annotations

from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options
from jaxlab.engine.kvcache import cache_bytes

NOTE = (
    "peak_rss_jaxlab_bytes is the process peak RSS after jaxlab's compile + warm-up at every batch size "
    "(a real prefill of the largest batch, caches allocated), before the bandwidth copy and the peer; "
    "later snapshots include both"
)


def memory_section(opts: Options, setup: Setup, quantized: dict, after_warmup: dict, after_decode: dict) -> dict:
    """The ``"memory"`` part of the report (``"final"``, the snapshot at the end of the run, is added last).

    ``quantized``: {format: Params} of the quantized rows; ``after_warmup`` / ``after_decode``: memory
    snapshots taken after the compile warm-up and after the float32 decode rows."""
    weight_bytes = setup.params.nbytes()
    mem = {
        "weights_float32_bytes": weight_bytes,
        "weights_bfloat16_bytes": weight_bytes // 2,
        "weights_quantized_bytes": {f: q.nbytes() for f, q in quantized.items()},
        "cache_len": setup.cache_len,
    }
    if opts.float:
        cfg = setup.params.config
        temps = [c.get("temp_bytes") or 0 for c in setup.generator.programs.compile_log]
        mem.update(
            {
                "kv_cache_bytes": {str(b): float(cache_bytes(cfg, b, setup.cache_len)) for b in opts.batch_sizes},
                "largest_xla_temp_bytes": max(temps) if temps else None,
                "after_compile_warmup": after_warmup,
                "after_decode": after_decode,
                "peak_rss_jaxlab_bytes": after_warmup.get("process_peak_rss_bytes"),
                "note": NOTE,
            }
        )
    return mem
