"""Tests for jaxlab.tools.profile: timing, compile counting, cost analysis, memory, roofline, trace, HLO."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.tools import profile as prof


def _fresh_fn():
    """A new jitted function every call, so no test sees another's cache entries."""

    def f(x):
        return jnp.sin(x) * 2.0 + 1.0

    return jax.jit(f)


# ------------------------------------------------------------------------------------------ timing


def test_time_fn_jitted_separates_compile_and_run():
    f = _fresh_fn()
    x = jnp.ones((64, 64), jnp.float32)
    t = prof.time_fn(f, x, repeats=4, warmup=1)
    assert t.aot
    assert t.compile_s > 0
    assert t.compiles == 1
    assert len(t.times) == 4 and all(s > 0 for s in t.times)
    assert t.median > 0 and t.min > 0 and t.min <= t.median
    lo, hi = t.spread
    assert t.min <= lo <= hi <= t.max
    s = str(t)
    assert s.startswith("compile ") and "median of 4" in s and "run" in s


def test_time_fn_already_compiled_and_plain_fn():
    f = _fresh_fn()
    x = jnp.ones((8,), jnp.float32)
    f(x).block_until_ready()
    t = prof.time_fn(f, x, repeats=2)
    assert t.compiles == 0 and "already compiled" in str(t)

    t2 = prof.time_fn(lambda a: np.asarray(a) + 1, x, repeats=2)  # no .lower: first call timed
    assert not t2.aot and t2.compile_s > 0 and str(t2).startswith("first call ")


def test_time_fn_static_kwargs():
    f = jax.jit(lambda x, n: x * n, static_argnames="n")
    t = prof.time_fn(f, jnp.ones(4), n=3, repeats=2)
    assert t.median > 0


def test_timed_blocks_and_records():
    results: dict[str, float] = {}
    f = _fresh_fn()
    x = jnp.ones((16,))
    with prof.timed("blk", results=results) as t:
        y = t.keep(f(x))
    assert t.seconds is not None and t.seconds > 0
    assert results["blk"] == t.seconds
    assert "blk:" in str(t)
    np.testing.assert_allclose(np.asarray(y), np.sin(1.0) * 2 + 1, rtol=1e-6)


# ------------------------------------------------------------------------------- compile counting


def test_compile_counter_shape_repeat_dtype():
    f = _fresh_fn()
    x32 = jnp.ones((5, 3), jnp.float32)
    x32b = jnp.zeros((5, 3), jnp.float32)
    x16 = jnp.ones((5, 3), jnp.bfloat16)  # created outside: creating arrays compiles too

    with prof.CompileCounter() as cc:
        f(x32).block_until_ready()
    assert cc.count == 1, cc
    assert cc.traces == 1
    assert any("f" in n for n in cc.names)
    assert cc.compile_s > 0

    with prof.CompileCounter() as cc:
        f(x32b).block_until_ready()  # same shape/dtype, different values
    assert cc.count == 0, cc
    cc.assert_none()

    with prof.CompileCounter() as cc:
        f(x16).block_until_ready()
    assert cc.count == 1, cc


def test_compile_counters_nest_and_stop_counting_after_exit():
    f = _fresh_fn()
    a, b = jnp.ones((2,)), jnp.ones((3,))
    with prof.CompileCounter() as outer:
        f(a)
        with prof.CompileCounter() as inner:
            f(b)
    assert outer.count == 2 and inner.count == 1
    f(jnp.ones((4,)))  # after exit: not counted
    assert outer.count == 2 and inner.count == 1


def test_assert_none_message():
    f = _fresh_fn()
    x = jnp.ones((7,))
    with prof.CompileCounter() as cc:
        f(x)
    with pytest.raises(AssertionError, match=r"decode step: expected no compilation, but 1 compilation"):
        cc.assert_none("decode step")
    with pytest.raises(AssertionError, match=r"jit\(f\)"):
        cc.assert_none()


def test_compile_counter_counts_persistent_cache_hits(tmp_path):
    """A load from the persistent compilation cache counts in `count` and in `cache_hits`."""
    code = textwrap.dedent(
        f"""
        import jax, jax.numpy as jnp
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path)!r})
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        from jaxlab.tools.profile import CompileCounter
        f = jax.jit(lambda x: jnp.cos(x) @ x.T)
        x = jnp.ones((8, 8))
        with CompileCounter() as c1:
            f(x).block_until_ready()
        jax.clear_caches()
        with CompileCounter() as c2:
            f(x).block_until_ready()
        print(c1.count, c1.cache_hits, c2.count, c2.cache_hits, c2.xla_compiles)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0", "1", "1", "0"]


# --------------------------------------------------------------------------------- cost analysis


def test_cost_analysis_matmul_flops():
    f = jax.jit(lambda a, b: a @ b)
    a = jnp.ones((64, 128), jnp.float32)
    b = jnp.ones((128, 32), jnp.float32)
    c = prof.cost_analysis(f, a, b)
    assert c["flops"] == pytest.approx(2 * 64 * 128 * 32, rel=0.05)
    assert c["bytes_accessed"] is not None and c["bytes_accessed"] > 0
    assert isinstance(c["raw"], dict)
    # also accepts shape structs and plain functions
    c2 = prof.cost_analysis(
        lambda a, b: a @ b, jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(b.shape, b.dtype)
    )
    assert c2["flops"] == c["flops"]


class _Compiled:
    """What ``lower(...).compile()`` returns, reporting a given ``cost_analysis()``."""

    def __init__(self, raw):
        self.raw = raw

    def lower(self, *args, **kwargs):
        return self

    def compile(self):
        return self

    def cost_analysis(self):
        return self.raw

    def memory_analysis(self):
        return None


def test_cost_analysis_reads_every_format_of_the_backends_answer():
    """A dict (current jax), a list of dicts, one per device program (older jax: summed), or None."""
    assert prof.cost_analysis(_Compiled(None))["raw"] == {}
    assert prof.cost_analysis(_Compiled({"flops": 3.0}))["flops"] == 3.0
    summed = prof.cost_analysis(_Compiled([{"flops": 3.0}, {"flops": 1.0, "bytes accessed": 2.0}]))
    assert summed["raw"] == {"flops": 4.0, "bytes accessed": 2.0}
    assert (summed["flops"], summed["bytes_accessed"], summed["transcendentals"]) == (4.0, 2.0, None)


# ------------------------------------------------------------------------------------------ memory


def test_memory_stats_and_array_bytes():
    keep = jnp.ones((256, 256), jnp.float32)  # noqa: F841 - a live array of 256 KiB
    m = prof.memory_stats()
    for k in ("device", "platform", "live_arrays_bytes", "process_rss_bytes", "process_peak_rss_bytes"):
        assert k in m
    assert m["live_arrays_bytes"] >= 256 * 256 * 4
    assert m["process_peak_rss_bytes"] > 0
    if m["process_rss_bytes"] is not None:
        assert 0 < m["process_rss_bytes"] <= m["process_peak_rss_bytes"] * 1.01
    tree = {
        "a": jnp.ones((3, 4), jnp.float32),
        "b": [np.zeros(5, np.int8), jax.ShapeDtypeStruct((2,), jnp.bfloat16)],
        "c": 1,
    }
    assert prof.array_bytes(tree) == 48 + 5 + 4


# ---------------------------------------------------------------------------------------- roofline


def test_measure_ceilings_small():
    bw = prof.measure_bandwidth(nbytes=1 << 22, repeats=2)
    fl = prof.measure_matmul_flops(n=128, repeats=2)
    assert bw > 0 and np.isfinite(bw)
    assert fl > 0 and np.isfinite(fl)
    bf16 = prof.measure_matmul_flops(n=128, dtype=jnp.bfloat16, repeats=2)
    assert bf16 > 0 and np.isfinite(bf16)


def test_roofline_maths():
    r = prof.Roofline(bandwidth=100.0, peak_flops=1000.0)
    assert r.ridge == 10.0
    assert r.attainable(2.0) == 200.0
    assert r.attainable(50.0) == 1000.0
    assert r.attainable(10.0) == 1000.0
    # memory-bound: 100 flops over 50 bytes -> 0.5 s by bandwidth, 0.1 s by compute
    assert r.time_bound(100.0, 50.0) == 0.5
    assert r.bound(100.0, 50.0) == "memory"
    assert r.fraction(100.0, 50.0, 1.0) == 0.5
    # compute-bound: 5000 flops over 10 bytes -> 5 s by compute
    assert r.time_bound(5000.0, 10.0) == 5.0
    assert r.bound(5000.0, 10.0) == "compute"
    assert r.fraction(5000.0, 10.0, 5.0) == 1.0
    assert r.fraction(5000.0, 10.0, 20.0) == 0.25
    assert prof.Roofline.intensity(100.0, 50.0) == 2.0
    assert "ridge 10.0" in str(r)


def test_plot_roofline_returns_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    r = prof.Roofline(bandwidth=20e9, peak_flops=200e9)
    fig = prof.plot_roofline(r, {"decode": (2e9, 1e9, 0.1), "prefill": (4e11, 1e9, 4.0)})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    fig2, ax2 = plt.subplots()
    assert prof.plot_roofline(r, {}, ax=ax2) is fig2
    plt.close("all")


# ------------------------------------------------------------------------------------ trace / HLO


def test_trace_writes_files(tmp_path):
    f = _fresh_fn()
    x = jnp.ones((32,))
    out = prof.trace(f, x, logdir=tmp_path / "tb")
    assert out == str(tmp_path / "tb")
    files = [os.path.join(r, n) for r, _, ns in os.walk(out) for n in ns]
    assert files, "profiler wrote nothing"
    assert any(p.endswith(".xplane.pb") for p in files)


def test_hlo_text_and_count_ops():
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) + 1.0)
    a = jnp.ones((16, 8))
    b = jnp.ones((8, 4))
    hlo = prof.hlo_text(f, a, b)
    assert "dot" in hlo
    counts = prof.count_ops(hlo)
    assert counts["dot"] >= 1
    assert counts["all-reduce"] == 0
    raw = prof.hlo_text(f, a, b, optimized=False)
    assert prof.count_ops(raw, names=("dot", "tanh", "add")) == {"dot": 1, "tanh": 1, "add": 1}


def test_count_ops_synthetic():
    hlo = textwrap.dedent(
        """
        ENTRY %main {
          %p = f32[8]{0} parameter(0)
          %ar = f32[8]{0} all-reduce(%p), replica_groups={}, to_apply=%sum, metadata={op_name="jit(f)/all-reduce(x) dot(y)"}
          %ars = f32[8]{0} all-reduce-start(%ar), to_apply=%sum
          %ard = f32[8]{0} all-reduce-done(%ars)
          %ag = (f32[8]{0}, f32[16]{0}) all-gather(%ard), dimensions={0}
          %d = f32[8]{0} dot(%ag, %ag)
          ROOT %fu = f32[8]{0} fusion(%d), kind=kLoop, calls=%fused_dot
        }
        """
    )
    c = prof.count_ops(hlo)
    assert c["all-reduce"] == 2  # the sync one + the async pair counted once
    assert c["all-gather"] == 1
    assert c["dot"] == 1
    assert c["fusion"] == 1
    assert c["reduce-scatter"] == 0
