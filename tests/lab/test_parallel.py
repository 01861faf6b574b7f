"""Measuring parallelism without running it: collectives read from HLO text, and the bytes one device holds
and moves under each strategy (from shapes alone). The compiled programs' collectives are checked on 8
devices in tests/engine/test_sharding.py."""

from __future__ import annotations

import jax.numpy as jnp

import jaxlab
from jaxlab.engine.config import smollm2_135m
from jaxlab.engine.kvcache import cache_bytes
from jaxlab.engine.placement import padded_sizes
from jaxlab.lab import parallel


def test_collective_bytes_reads_hlo_shapes():
    hlo = """
  %all-reduce.1 = f32[2,1,40]{2,1,0} all-reduce(f32[2,1,40]{2,1,0} %fusion), channel_id=1, to_apply=%add
  %ag = (bf16[4,8]{1,0}, bf16[16,8]{1,0}) all-gather-start(bf16[4,8]{1,0} %p), dimensions={0}
  %x = f32[3]{0} add(f32[3]{0} %a, f32[3]{0} %b), metadata={op_name="all-reduce(fake)"}
"""
    got = parallel.collective_bytes(hlo)
    assert got["all-reduce"] == 2 * 40 * 4 and got["all-gather"] == 16 * 8 * 2
    assert parallel.count_collectives(hlo)["all-reduce"] == 1


def test_bytes_per_device_of_smollm2():
    cfg = smollm2_135m()
    one = parallel.bytes_per_device(cfg, "data=1", "data", batch=8, cache_len=256)
    assert one["kv_cache"] == cache_bytes(cfg, 8, 256) and one["all_reduce_per_step"] == 0
    assert one["weights"] == 4 * cfg.n_params()
    dp = parallel.bytes_per_device(cfg, "data=8", "data", batch=8, cache_len=256)
    assert dp["weights"] == one["weights"] and dp["kv_cache"] == one["kv_cache"] // 8
    # model=8: 3 KV heads padded to 8, one per device; two all-reduces of [8, 1, D] float32 per layer
    tp = parallel.bytes_per_device(cfg, "model=8", "tensor", batch=8, cache_len=256)
    assert tp["kv_cache"] == cache_bytes(cfg.replace(**padded_sizes(cfg, 8)), 8, 256) // 8
    assert tp["all_reduce_per_step"] == 2 * cfg.n_layers * 8 * cfg.dim * 4
    assert tp["weights"] < one["weights"] / 2
    both = parallel.bytes_per_device(cfg, "data=2,model=4", "data+tensor", batch=8, cache_len=256)
    assert both["all_reduce_per_step"] == tp["all_reduce_per_step"] // 2  # half the rows per device


def test_bytes_per_device_counts_the_cache_with_the_one_formula():
    cfg = jaxlab.tiny()
    int8 = parallel.bytes_per_device(cfg, "model=2", "tensor", batch=4, cache_len=64, cache_dtype="int8")
    assert int8["kv_cache"] == cache_bytes(cfg, 4, 64, jnp.int8) // 2  # int8 values plus a float32 scale each
    half = parallel.bytes_per_device(cfg, "model=2", "tensor", batch=4, cache_len=64, itemsize=2)
    assert half["kv_cache"] == cache_bytes(cfg, 4, 64, jnp.bfloat16) // 2
