"""Measuring parallelism without running it: collectives read from HLO text, and the bytes one device holds
and moves under each strategy (from shapes alone). The compiled programs' collectives are checked on 8
devices in tests/engine/test_sharding.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxlab
from jaxlab.engine.kvcache import cache_bytes
from jaxlab.engine.placement import padded_sizes
from jaxlab.io.config import smollm2_135m
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


def test_all_reduce_ops_names_each_reduction():
    hlo = """
%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(f32[] %a, f32[] %b)
}

%add.2 (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %x, f32[] %y)
}

ENTRY %main (p: f32[8,1]) -> f32[8,1] {
  %all-reduce = f32[8,1]{1,0} all-reduce(%p), channel_id=1, to_apply=%region_0.1
  ROOT %all-reduce.1 = f32[8,1]{1,0} all-reduce(%all-reduce), channel_id=2, to_apply=%add.2
}
"""
    assert parallel.all_reduce_ops(hlo) == [("f32[8,1]", "maximum"), ("f32[8,1]", "add")]


def test_owners_and_figures_on_one_device():
    import matplotlib

    matplotlib.use("Agg")
    x = jnp.zeros((4, 6))
    ((idx, ids),) = parallel.owners(x)
    assert ids == [x.devices().pop().id] and (idx[0].start, idx[0].stop, idx[1].stop) == (0, 4, 6)
    fig = parallel.plot_sharding({"x": x})
    assert fig.axes[0].get_title() and fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
    fig = parallel.plot_tensor_parallel(4, 2, 30, 60)
    ax = fig.axes[0]
    assert "2 all-reduces per layer (60 for 30 layers)" in ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


def test_softmax_needs_collectives_only_when_its_row_is_split():
    """On the tests' 8 simulated devices (tests/conftest.py): whole heads per device need no collective; the cache's
    sequence axis split needs the softmax's max and sum and the weighted values' sum all-reduced."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxlab.engine.mesh import make_mesh
    from jaxlab.engine.model import init_params
    from jaxlab.io.config import tiny

    mesh = make_mesh({"data": 1, "model": 8}, jax.devices())
    heads = parallel.attention_collectives(mesh, "heads")
    seq = parallel.attention_collectives(mesh, "sequence")
    assert heads.total_collectives == 0, heads.collectives
    assert seq.collectives["all-reduce"] == seq.total_collectives == 3, seq.collectives
    assert sorted(op for _, op in parallel.all_reduce_ops(seq.hlo)) == ["add", "add", "maximum"]
    grid = make_mesh({"data": 2, "model": 4}, jax.devices())
    w = jax.device_put(jax.numpy.zeros((8, 12)), NamedSharding(grid, P(None, "model")))
    assert [ids for _, ids in parallel.owners(w)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    params = init_params(tiny(), 0)
    assert parallel.data_parallel_gain(params, jax.devices(), batch=8, repeats=1) > 0  # pmap, as the article says
    from jaxlab.engine.sharding import shard

    tp = parallel.all_reduce_share(
        shard(params, {"data": 2, "model": 4}, "data+tensor", devices=jax.devices()), 2, 64, 2
    )
    assert tp["all_reduces"] == 2 * params.config.n_layers and tp["all_reduce_s"] > 0 and tp["step_s"] > 0
    assert tp["share"] == pytest.approx(tp["all_reduces"] * tp["all_reduce_s"] / tp["step_s"])
    dp = parallel.all_reduce_share(shard(params, {"data": 8, "model": 1}, "data", devices=jax.devices()), 8, 64, 2)
    assert dp["all_reduces"] == 0 and dp["share"] == 0.0
