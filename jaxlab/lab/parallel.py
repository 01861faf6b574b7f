"""What parallelism costs, measured (notebook 08): the collectives in a compiled step, step and all-reduce
times, and the bytes each device holds and moves.

* :func:`count_collectives`, :func:`collective_bytes` — read from a compiled program's HLO text;
* :func:`decode_step_info` — both, for the decode step a :class:`~jaxlab.engine.sharding.Sharded` runs
  (the very program :meth:`~jaxlab.engine.sharding.Sharded.generate` ran for that shape);
* :func:`time_decode_step`, :func:`time_all_reduce` — seconds, synchronized;
* :func:`bytes_per_device` — from shapes alone: the share of weights and KV cache one device holds
  (the cache through :func:`jaxlab.engine.kvcache.cache_bytes`, the one formula), and what it all-reduces.
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
from jaxlab.engine.model import param_shapes
from jaxlab.engine.placement import padded_sizes
from jaxlab.engine.sharding import Sharded
from jaxlab.tools.profile import count_ops

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
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
