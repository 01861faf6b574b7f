"""What parallelism costs, measured (notebook 08): the collectives in a compiled step, step and all-reduce
times, and the bytes each device holds and moves.

* :func:`count_collectives`, :func:`collective_bytes` — read from a compiled program's HLO text;
* :func:`decode_step_info` — both, for the decode step a :class:`~jaxlab.engine.sharding.Sharded` runs
  (the very program :meth:`~jaxlab.engine.sharding.Sharded.generate` ran for that shape);
* :func:`time_decode_step`, :func:`time_all_reduce` — seconds, synchronized;
* :func:`bytes_per_device` — from shapes alone: the share of weights and KV cache one device holds
  (the cache through :func:`jaxlab.engine.kvcache.cache_bytes`, the one formula), and what it all-reduces;
* :func:`attention_collectives`, :func:`all_reduce_ops` — one softmax attention compiled with its heads or its
  sequence split over a mesh axis: which collectives its softmax needs, and what each all-reduce computes;
* :func:`owners`, :func:`plot_sharding`, :func:`plot_tensor_parallel` — figures: which device holds which
  block of an array, and tensor parallelism's column and row splits with their all-reduces.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.engine.kvcache import cache_bytes
from jaxlab.engine.mesh import CACHE_AXES, logical_to_spec, param_logical_axes, parse_mesh, rules_for
from jaxlab.engine.placement import padded_sizes
from jaxlab.engine.sharding import Sharded
from jaxlab.io.config import param_shapes
from jaxlab.tools.profile import COLLECTIVES, count_ops

ITEMSIZE = {  # bytes per element of an HLO element type
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "s64": 8,
    "u64": 8,
    "s32": 4,
    "u32": 4,
    "s16": 2,
    "u16": 2,
    "s8": 1,
    "u8": 1,
    "pred": 1,
}


def count_collectives(hlo: str) -> dict[str, int]:
    """How many of each collective the HLO text holds (see :func:`jaxlab.tools.profile.count_ops`)."""
    return count_ops(hlo, COLLECTIVES)


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes each kind of collective produces per device, summed over the program, from the result
    shapes in the HLO text (``%x = f32[2,1,576]{...} all-reduce(...)``). For an asynchronous
    ``-start`` whose result is a tuple, the last element (the output buffer) is counted."""
    text = re.sub(r'"[^"\n]*"', '""', hlo)
    out = {c: 0 for c in COLLECTIVES}
    result = r"(\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)"  # a shape, or a tuple of shapes
    pat = re.compile(r"=\s*" + result + r"\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
    for result, op, start in pat.findall(text):
        shapes = re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", result)
        if start and len(shapes) > 1:
            shapes = shapes[-1:]
        for dtype, dims in shapes:
            n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
            out[op] += n * ITEMSIZE.get(dtype, 4)
    return out


@dataclass
class StepInfo:
    """What a compiled step looks like, read from its optimized HLO: how many collectives of each kind,
    how many bytes they produce per device, and the HLO text itself."""

    collectives: dict[str, int]
    bytes: dict[str, int]
    hlo: str

    @property
    def total_collectives(self) -> int:
        return sum(self.collectives.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def decode_step_info(sm: Sharded, batch: int | None = None, cache_len: int = 256) -> StepInfo:
    """The compiled decode step of ``sm`` for ``batch`` rows and ``cache_len`` slots (the program
    :meth:`~jaxlab.engine.sharding.Sharded.generate` runs for that shape): the collectives in it and their bytes."""
    hlo = sm.decode_program(batch, cache_len).as_text()
    return StepInfo(collectives=count_collectives(hlo), bytes=collective_bytes(hlo), hlo=hlo)


def time_decode_step(sm: Sharded, batch: int | None = None, cache_len: int = 256, repeats: int = 5) -> list[float]:
    """Seconds of ``repeats`` synchronized decode steps of ``sm`` (after one warm-up step) on a fresh cache."""
    program = sm.decode_program(batch, cache_len)
    params, tokens, positions, cache = sm.decode_inputs(batch, cache_len)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        tokens, _, cache = program(params, tokens, positions, cache)
        jax.block_until_ready(tokens)
        if i:
            times.append(time.perf_counter() - t0)
    return times


def data_parallel_gain(
    params, devices: Sequence, batch: int = 8, cache_len: int = 256, repeats: int = 5, strategy: str = "pmap"
) -> float:
    """Decode throughput of data parallelism (``pmap`` by default, as the article names it; or ``data``: jit
    with the batch sharded) over all ``devices`` against one of them, on the same ``batch``: the median step time
    on one device over the median on all (both steps produce ``batch`` tokens). Only meaningful on real
    devices: simulated CPU devices share the same cores."""
    from jaxlab.engine.sharding import shard

    one = shard(params, {"data": 1, "model": 1}, strategy, devices=list(devices)[:1])
    every = shard(params, {"data": len(devices), "model": 1}, strategy, devices=list(devices))
    t_one = sorted(time_decode_step(one, batch, cache_len, repeats))[repeats // 2]
    t_all = sorted(time_decode_step(every, batch, cache_len, repeats))[repeats // 2]
    return t_one / t_all


def time_all_reduce(
    mesh: Mesh, shape: Sequence[int] = (1, 576), axis: str = "model", repeats: int = 20, dtype=jnp.float32
) -> list[float]:
    """Seconds of ``repeats`` all-reduces (``psum`` over ``axis``) of a ``shape`` array held by each
    device: the collective tensor parallelism runs twice per layer (decode: shape [B, 1, D])."""
    n = mesh.shape[axis]
    f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, axis), mesh=mesh, in_specs=P(axis), out_specs=P()))
    x = jax.device_put(jnp.ones((n * shape[0], *shape[1:]), dtype), NamedSharding(mesh, P(axis)))
    program = f.lower(x).compile()
    jax.block_until_ready(program(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(program(x))
        times.append(time.perf_counter() - t0)
    return times


def all_reduce_share(sm: Sharded, batch: int, cache_len: int = 256, repeats: int = 7) -> dict:
    """How much of ``sm``'s decode step its all-reduces take: their number in the compiled step (its HLO), one
    of them (the same bytes, over ``model``) timed alone, and the step timed whole (the best of ``repeats`` each:
    the least disturbed by other work on the machine).
    Returns ``{"all_reduces", "all_reduce_s", "step_s", "share"}`` with ``share = all_reduces * all_reduce_s /
    step_s`` (0 when the step has none). An estimate from two measurements: inside the step an all-reduce may
    overlap other work, or wait on a slower device."""
    info = decode_step_info(sm, batch, cache_len)
    n = info.collectives["all-reduce"]
    step_s = min(time_decode_step(sm, batch, cache_len, repeats))
    if n == 0:
        return {"all_reduces": 0, "all_reduce_s": 0.0, "step_s": step_s, "share": 0.0}
    elements = info.bytes["all-reduce"] // n // 4  # float32 activations: [rows on the device, 1, dim]
    ar = min(time_all_reduce(sm.mesh, shape=(1, elements), axis="model", repeats=repeats))
    return {"all_reduces": n, "all_reduce_s": ar, "step_s": step_s, "share": n * ar / step_s}


def bytes_per_device(
    cfg,
    mesh: str | Mapping[str, int],
    strategy: str,
    batch: int,
    cache_len: int,
    rules: Mapping[str, str | None] | None = None,
    itemsize: int = 4,
    cache_dtype=None,
) -> dict[str, int]:
    """What one device holds, and moves per decode step, under a strategy: from shapes alone, no arrays.

    ``weights``: its share of the (padded) parameters at ``itemsize`` bytes each; ``kv_cache``: its share of
    a ``batch`` x ``cache_len`` cache of ``cache_dtype`` (default: the float type of ``itemsize`` bytes;
    ``"int8"`` counts the scales too); ``all_reduce_per_step``: the activations it all-reduces per decode
    step (two [rows per device, 1, D] per layer when heads are split, none otherwise)."""
    shape = parse_mesh(mesh)
    rules = rules_for(strategy, rules)
    heads_split = shape["model"] > 1 and any(v == "model" for v in rules.values())
    if heads_split:
        cfg = cfg.replace(**padded_sizes(cfg, shape["model"]))

    def devices_splitting(axes) -> int:
        return math.prod(shape[a] for a in logical_to_spec(axes, rules) if a is not None)

    weights = sum(
        math.prod(dims) // devices_splitting(param_logical_axes(name)) * itemsize
        for name, dims in param_shapes(cfg).items()
    )
    cache_dtype = cache_dtype or f"float{8 * itemsize}"  # a float of that size: only its bytes count
    cache = cache_bytes(cfg, batch, cache_len, cache_dtype) // devices_splitting(CACHE_AXES["k"])
    rows = batch // shape["data"] if "batch" in rules else batch
    reduce = 2 * cfg.n_layers * rows * cfg.dim * itemsize if heads_split else 0
    return {"weights": weights, "kv_cache": cache, "all_reduce_per_step": reduce}


# --------------------------------------------------------------------------------------------------
# The softmax under two splits: whole heads per device, or one softmax row across devices
# --------------------------------------------------------------------------------------------------


def softmax_attention(q, k, v):
    """One decode step of attention: q [H, 1, Hd] against the cache k, v [H, S, Hd] -> [H, 1, Hd]. The softmax
    runs over S: its max and its sum are reductions along the cache axis."""
    scores = jnp.einsum("hqd,hsd->hqs", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("hqs,hsd->hqd", jax.nn.softmax(scores, axis=-1), v)


def attention_collectives(
    mesh: Mesh, split: str, heads: int = 8, seq: int = 256, head_dim: int = 64, axis: str = "model"
) -> StepInfo:
    """:func:`softmax_attention` compiled with the cache split over ``axis``: ``split="heads"`` gives each
    device whole heads (tensor parallelism: the output stays split by heads, as it enters ``wo``);
    ``split="sequence"`` gives each device a block of the cache slots of every head (one softmax row spans
    the devices; the output is whole on every device). The collectives the partitioner had to insert."""
    spec = {"heads": P(axis), "sequence": P(None, axis)}[split]
    kv = NamedSharding(mesh, spec)
    out = NamedSharding(mesh, P(axis) if split == "heads" else P())
    f = jax.jit(softmax_attention, in_shardings=(NamedSharding(mesh, P()), kv, kv), out_shardings=out)
    q = jax.ShapeDtypeStruct((heads, 1, head_dim), jnp.float32)
    c = jax.ShapeDtypeStruct((heads, seq, head_dim), jnp.float32)
    hlo = f.lower(q, c, c).compile().as_text()
    return StepInfo(collectives=count_collectives(hlo), bytes=collective_bytes(hlo), hlo=hlo)


def all_reduce_ops(hlo: str) -> list[tuple[str, str]]:
    """Each all-reduce of the HLO text: (its result shape, the operation it reduces with: the root opcode of
    its ``to_apply`` computation, e.g. ``maximum`` or ``add``)."""
    text = re.sub(r'"[^"\n]*"', '""', hlo)
    bodies = {}
    for name, body in re.findall(r"^\s*%?([\w.\-]+)\s*\([^\n]*\{\n(.*?)\n\s*\}", text, re.M | re.S):
        root = re.search(r"ROOT\s+%?[\w.\-]+\s*=\s*\S+\s+([a-z\-]+)\(", body)
        if root:
            bodies[name] = root.group(1)
    out = []
    for shape, comp in re.findall(
        r"=\s*([a-z0-9]+\[[0-9,]*\])\S*\s+all-reduce(?:-start)?\(.*?to_apply=%?([\w.\-]+)", text
    ):
        out.append((shape, bodies.get(comp, "?")))
    return out


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------


def owners(x: jax.Array) -> list[tuple[tuple[slice, ...], list[int]]]:
    """The blocks of a sharded 2-D array and the ids of the devices holding each: [(index, [device ids])],
    one entry per distinct block (a replicated block lists every device that holds a copy)."""
    blocks: dict = {}
    for shard in x.addressable_shards:
        idx = tuple(slice(*s.indices(n)[:2]) for s, n in zip(shard.index, x.shape))
        key = tuple((s.start, s.stop) for s in idx)
        blocks.setdefault(key, (idx, []))[1].append(shard.device.id)
    return [(idx, sorted(ids)) for idx, ids in blocks.values()]


def plot_sharding(arrays: Mapping[str, jax.Array]):
    """One panel per 2-D array: its blocks drawn to scale, coloured by the first device that holds each,
    labelled with every device id holding a copy. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, len(arrays), figsize=(5 * len(arrays), 3.6), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, (title, x) in zip(axes[0], arrays.items()):
        rows, cols = x.shape
        for idx, ids in owners(x):
            r, c = idx
            ax.add_patch(
                Rectangle((c.start, r.start), c.stop - c.start, r.stop - r.start, facecolor=colors[ids[0] % 10],
                          alpha=0.55, edgecolor="black")
            )  # fmt: skip
            label = "device " + ", ".join(map(str, ids)) if len(ids) == 1 else "devices\n" + ", ".join(map(str, ids))
            ax.text((c.start + c.stop) / 2, (r.start + r.stop) / 2, label, ha="center", va="center", fontsize=8)
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_title(f"{title}: {rows} x {cols}", fontsize=9)
        ax.set_xlabel("column")
        ax.set_ylabel("row")
        ax.grid(False)
    fig.suptitle("Which device holds which block", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tensor_parallel(n: int, per_layer: float, n_layers: int, total: int):
    """A decoder layer under tensor parallelism on ``n`` devices: the column-parallel matrices (wq, wk, wv;
    w_gate, w_up) cut into ``n`` column blocks, the row-parallel ones (wo, w_down) into ``n`` row blocks, one
    colour per device, and an all-reduce after each row-parallel matmul. ``per_layer``, ``n_layers`` and
    ``total``: the all-reduces counted in the compiled program, written on the figure. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyArrowPatch, Rectangle

    colors = [plt.get_cmap("tab10").colors[i % 10] for i in range(n)]
    fig, ax = plt.subplots(figsize=(11, 3.8))

    def matrix(x0, w, h, name, split):
        for i in range(n):
            if split == "columns":
                rect = (x0 + i * w / n, 0.5, w / n, h)
            else:
                rect = (x0, 0.5 + h - (i + 1) * h / n, w, h / n)
            ax.add_patch(Rectangle(rect[:2], rect[2], rect[3], facecolor=colors[i], alpha=0.6, edgecolor="white"))
        ax.add_patch(Rectangle((x0, 0.5), w, h, fill=False, edgecolor="black"))
        ax.text(x0 + w / 2, 0.5 + h + 0.15, name, ha="center", va="bottom", fontsize=9)
        ax.text(x0 + w / 2, 0.3, f"split by {split}", ha="center", va="top", fontsize=7, color="dimgray")

    def arrow(x0, x1, y=1.5):
        ax.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="->", mutation_scale=12, color="black"))

    def all_reduce(x, k):
        ax.add_patch(Circle((x, 1.5), 0.38, facecolor="#f4cccc", edgecolor="firebrick", lw=1.5))
        ax.text(x, 1.5, "+", ha="center", va="center", fontsize=16, color="firebrick")
        ax.text(x, 2.05, f"all-reduce {k}", ha="center", va="bottom", fontsize=8, color="firebrick")

    ax.text(0.3, 1.5, "x", ha="center", va="center", fontsize=12)
    arrow(0.5, 1.0)
    matrix(1.0, 1.6, 2.0, "wq | wk | wv", "columns")
    arrow(2.6, 3.1)
    ax.text(3.6, 1.5, "attention\n(own heads)", ha="center", va="center", fontsize=8)
    arrow(4.1, 4.5)
    matrix(4.5, 1.2, 2.0, "wo", "rows")
    arrow(5.7, 6.1)
    all_reduce(6.5, 1)
    arrow(6.9, 7.4)
    matrix(7.4, 1.6, 2.0, "w_gate | w_up", "columns")
    arrow(9.0, 9.4)
    ax.text(9.8, 1.5, "silu(g) * u\n(own units)", ha="center", va="center", fontsize=8)
    arrow(10.2, 10.6)
    matrix(10.6, 1.2, 2.0, "w_down", "rows")
    arrow(11.8, 12.2)
    all_reduce(12.6, 2)
    arrow(13.0, 13.5)
    ax.text(13.7, 1.5, "x", ha="center", va="center", fontsize=12)
    for i in range(n):
        ax.add_patch(Rectangle((0.2 + i * 0.35, -0.55), 0.3, 0.3, facecolor=colors[i], alpha=0.6))
        ax.text(0.35 + i * 0.35, -0.7, str(i), ha="center", va="top", fontsize=7)
    ax.text(0.2 + n * 0.35 + 0.1, -0.4, "device", va="center", fontsize=8)
    ax.set_xlim(0, 14)
    ax.set_ylim(-1.1, 2.9)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.set_xlabel("one decoder layer, left to right (residual adds and norms not drawn)")
    ax.set_ylabel(f"{n} devices")
    ax.set_title(
        f"Tensor parallelism on {n} devices: compiled decode step has {per_layer:g} all-reduces per layer "
        f"({total} for {n_layers} layers)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
