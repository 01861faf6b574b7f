"""jaxlab.lab.profiling (notebook 07): a jax.profiler trace read as a timeline of ops, and its figures."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from jaxlab.lab import profiling
from jaxlab.tools.profile import trace


def _write_trace(folder, events):
    path = folder / "plugins" / "profile" / "run" / "host.trace.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_op_timeline_orders_ops_and_names_threads_and_kinds(tmp_path, monkeypatch):
    meta = [
        {"ph": "M", "pid": 1, "tid": t, "name": "thread_name", "args": {"name": n}} for t, n in ((7, "a"), (8, "b"))
    ]
    ops = [
        {"ph": "X", "pid": 1, "tid": 8, "ts": 1500.0, "dur": 500.0, "name": "dot.2", "args": {"hlo_op": "dot.2"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 1000.0, "dur": 250.0, "name": "dot.1", "args": {"hlo_op": "dot.1"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 1300.0, "dur": 250.0, "name": "copy.3", "args": {"hlo_op": "copy.3"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 900.0, "dur": 5.0, "name": "python call", "args": {}},  # not an op
    ]
    _write_trace(tmp_path, meta + ops)
    reads = {"dot.1": ["embed"], "dot.2": ["layers.3.mlp.w_up"]}
    monkeypatch.setattr(profiling, "weights_read", lambda hlo: reads)
    tl = profiling.op_timeline(tmp_path, hlo="(hlo text)")
    assert [r["op"] for r in tl] == ["dot.1", "copy.3", "dot.2"]
    assert [r["thread"] for r in tl] == ["a", "a", "b"]
    assert [r["start_ms"] for r in tl] == [0.0, 0.3, 0.5] and [r["ms"] for r in tl] == [0.25, 0.25, 0.5]
    assert [r["kind"] for r in tl] == ["embedding (lookup, output head)", "copies (cache not donated)", "MLP matmuls"]
    assert profiling.weight_share(tl) == pytest.approx(0.75)
    assert profiling.weight_share([]) == 0.0
    assert profiling.reads_share(tl, "embed") == pytest.approx(0.25)
    assert profiling.reads_share(tl, "layers.3.mlp.w_up") == pytest.approx(0.5)
    assert profiling.reads_share(tl, "w_up") == 0.0  # a whole name, not a part of one
    assert profiling.reads_share([], "embed") == 0.0


def test_time_output_head_times_the_tied_head_or_lm_head():
    from jaxlab.engine.model import init_params
    from jaxlab.io.config import tiny

    params = init_params(tiny(), jax.random.key(0))
    name, seconds = profiling.time_output_head(params, repeats=2)
    assert name == ("lm_head" if "lm_head" in params.flat() else "embed") and 0 < seconds < 1


def test_op_kind():
    reads = {"a": ["layers.1.attn.wq"], "b": ["layers.1.attn.wv"], "c": ["layers.0.mlp.w_down"]}
    kinds = [profiling.op_kind(op, reads) for op in ("a", "b", "c", "fusion.4", "copy")]
    assert kinds == [
        "attention q, o",
        "attention k, v",
        "MLP matmuls",
        "other (attention, norms, RoPE)",
        "copies (cache not donated)",
    ]
    assert set(kinds) <= set(profiling.KINDS)


def test_op_timeline_of_a_real_trace(tmp_path):
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) + 1.0)
    a = jnp.ones((64, 64))
    jax.block_until_ready(f(a, a))
    tl = profiling.op_timeline(trace(f, a, a, logdir=tmp_path))
    assert tl and all(r["ms"] >= 0 and r["start_ms"] >= 0 for r in tl)
    assert min(r["start_ms"] for r in tl) == 0.0


def test_op_timeline_needs_a_trace(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace.json.gz"):
        profiling.op_timeline(tmp_path)


def test_figures_have_titles_and_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = [
        {"op": "dot.1", "thread": "t/1", "start_ms": 0.0, "ms": 1.0, "kind": "MLP matmuls", "reads": "w"},
        {
            "op": "fusion",
            "thread": "t/2",
            "start_ms": 1.0,
            "ms": 0.5,
            "kind": "other (attention, norms, RoPE)",
            "reads": "",
        },
    ]
    try:
        fig = profiling.plot_timeline(tl)
        assert fig.axes[0].get_title() and fig.axes[0].get_xlabel() and fig.axes[1].get_xlabel()
        fig = profiling.plot_ttft(
            {"cold": {"ttft_s": 2.0, "compile_s": 1.5}, "warm": {"ttft_s": 0.1, "compile_s": 0.0}}
        )
        assert fig.axes[0].get_title() and fig.axes[0].get_xlabel()
    finally:
        plt.close("all")
