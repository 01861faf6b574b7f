"""Where arrays live on a mesh: parameters padded and placed, and the KV cache in its split view.

* **Heads that do not divide.** SmolLM2 has 9 query and 3 KV heads: :func:`pad_heads` adds zero KV
  heads (with their 3 zero query heads each, so the group size stays 3) and zero MLP units until
  ``model`` divides them. Zero heads attend uniformly over zero values and meet zero rows of ``wo``;
  zero MLP units give ``silu(0) * 0 = 0`` into zero rows of ``w_down``: the function is unchanged.
  Quantized matrices are padded in their own format (:func:`pad_kernel`).
* **Placing parameters.** :func:`shard_params` puts each parameter where its logical axes and the rules
  say (:mod:`jaxlab.engine.mesh`), a quantized matrix leaf by leaf; :func:`put` and :func:`to_host` also
  work when the mesh spans processes; :func:`replicate_for_pmap` places a copy per device once.
* **The KV cache's split view.** The model keeps K as ``[B * KVH, S, Hd]`` (batch-major): one axis
  mixes batch and heads. A ``NamedSharding`` on that axis cuts it into contiguous blocks, which are
  whole rows (fine for data parallel) but, once ``B / data > 1``, not whole heads (tensor parallel
  would need an all-to-all every step). So the sharded paths keep the cache *split*: K
  ``[B, KVH, S, Hd]``, V ``[B, KVH, Hd, S]`` (:func:`split_cache_shapes`, :func:`cache_specs`), and
  :func:`merge_heads` / :func:`split_heads` convert where that is free (inside a device's program).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.engine.kvcache import KVCache
from jaxlab.engine.mesh import CACHE_AXES, base_name, check_divisible, logical_to_spec, value_specs
from jaxlab.engine.model import Params, params_from_flat
from jaxlab.errors import ConfigError
from jaxlab.quant.formats import QuantizedMatrix

# --------------------------------------------------------------------------------------------------
# Padding heads so that `model` divides them
# --------------------------------------------------------------------------------------------------


def padded_sizes(cfg, model: int) -> dict[str, int]:
    """n_heads, n_kv_heads, ffn_dim after padding for a ``model``-way split (group size kept)."""
    kvh = -(-cfg.n_kv_heads // model) * model
    return {"n_heads": cfg.q_per_kv * kvh, "n_kv_heads": kvh, "ffn_dim": -(-cfg.ffn_dim // model) * model}


def pad_heads(params: Params, model: int) -> Params:
    """The same function with zero KV heads (3 zero query heads each for SmolLM2) and zero MLP units
    appended, so that ``model`` divides n_kv_heads, n_heads and ffn_dim. Returns ``params`` itself when
    nothing needs padding. Query head ``kv * G + g`` reads KV head ``kv``, so whole groups are appended
    at the end and every real head keeps its KV head. Quantized matrices are padded in their own format."""
    cfg = params.config
    sizes = padded_sizes(cfg, model)
    if (sizes["n_heads"], sizes["n_kv_heads"], sizes["ffn_dim"]) == (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim):
        return params
    hd = cfg.head_dim
    extra_q = (sizes["n_heads"] - cfg.n_heads) * hd
    extra_kv = (sizes["n_kv_heads"] - cfg.n_kv_heads) * hd
    extra_f = sizes["ffn_dim"] - cfg.ffn_dim
    pads = {  # (inputs, outputs) appended to the float kernel [in, out]
        "attn.wq": (0, extra_q),
        "attn.wk": (0, extra_kv),
        "attn.wv": (0, extra_kv),
        "attn.wo": (extra_q, 0),
        "mlp.w_gate": (0, extra_f),
        "mlp.w_up": (0, extra_f),
        "mlp.w_down": (extra_f, 0),
    }
    flat = {}
    for name, a in params.flat().items():
        rows, cols = pads.get(base_name(name), (0, 0))
        flat[name] = pad_kernel(a, rows, cols, name) if rows or cols else a
    return params_from_flat(cfg.replace(**sizes), flat, params.policy, source="pad_heads")


def pad_kernel(a, inputs: int, outputs: int, name: str = "kernel"):
    """A kernel [in, out] with ``inputs`` zero rows and ``outputs`` zero columns appended. A
    :class:`~jaxlab.quant.QuantizedMatrix` (stored [out, in]) gets the stored values of a zero weight: code 0
    (int8, w8a8) or 8 (int4, whose weight is ``scale * (q - 8) + zero``), scale 1, zero 0, smoothing 1."""
    if not isinstance(a, QuantizedMatrix):
        return jnp.pad(a, ((0, inputs), (0, outputs)))
    int4 = a.fmt == "int4"
    if int4 and inputs % a.group:
        raise ConfigError(
            f"{name}: {inputs} padded inputs are not whole int4 groups of {a.group}; pad the float parameters "
            "first (quantize_params(pad_heads(params, model), fmt)) or choose a mesh whose model axis divides the heads"
        )
    groups = inputs // a.group if int4 else 0

    def pad(x, out_rows, in_cols, value):
        return jnp.pad(x, ((0, out_rows),) + (((0, in_cols),) if x.ndim == 2 else ()), constant_values=value)

    return dataclasses.replace(
        a,
        q=pad(a.q, outputs, inputs // 2 if int4 else inputs, 0x88 if int4 else 0),
        scale=pad(a.scale, outputs, groups, 1),
        zero=None if a.zero is None else pad(a.zero, outputs, groups, 0),
        smooth=None if a.smooth is None else jnp.pad(a.smooth, (0, inputs), constant_values=1),
    )


# --------------------------------------------------------------------------------------------------
# Placing arrays
# --------------------------------------------------------------------------------------------------


def map_params(params: Params, fn: Callable[[str, object], object]) -> Params:
    """A Params with every value replaced by ``fn(name, value)`` (shardings, specs, placed arrays)."""
    flat_state = nnx.to_flat_state(params.state)
    state = nnx.from_flat_state([(p, var.replace(fn(".".join(map(str, p)), var.get_value()))) for p, var in flat_state])
    return Params(params.graphdef, state)


def map_leaves(fn, value, *rest):
    """``fn`` on each array of a parameter's value (an array, or the arrays of a QuantizedMatrix); the
    matching entries of ``rest`` (specs, shardings) are passed whole."""
    return jax.tree.map(fn, value, *rest)


def param_specs(params: Params, rules: Mapping[str, str], mesh: Mesh | None = None) -> dict:
    """{canonical name: PartitionSpec} that the rules give every parameter (a QuantizedMatrix of specs
    for a quantized one)."""
    return {name: value_specs(name, v, rules, mesh) for name, v in params.flat().items()}


def put(x, sharding: NamedSharding):
    """device_put that also works when the mesh spans processes (every process holds the same x). A shape
    (``jax.ShapeDtypeStruct``) is placed as a shape: the abstract argument of a program compiled for devices that
    are not here (``jaxlab compile``)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def is_abstract(tree) -> bool:
    """Whether a tree holds shapes (``jax.eval_shape``'s ``ShapeDtypeStruct``) rather than arrays."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(a, jax.ShapeDtypeStruct) for a in leaves)


def shard_params(params: Params, mesh: Mesh, rules: Mapping[str, str]) -> Params:
    """Place every parameter with the ``NamedSharding`` its logical axes and the rules give."""

    def place(name, value):
        def one(a, spec):
            check_divisible(a.shape, spec, mesh, f"parameter {name} {tuple(a.shape)}")
            return put(a, NamedSharding(mesh, spec))

        return map_leaves(one, value, value_specs(name, value, rules, mesh))

    return map_params(params, place)


def replicate_for_pmap(tree, devices: Sequence | None = None):
    """Put a copy of every array on each of ``devices`` (default: the local devices), once.

    ``pmap(f, in_axes=None)`` broadcasts an argument to the devices on *every call* unless it already
    lives, replicated, on exactly those devices: for a model's weights that is a full copy per token."""
    devices = list(jax.local_devices() if devices is None else devices)
    return jax.device_put(tree, NamedSharding(Mesh(np.array(devices), ("devices",)), P()))


def to_host(x) -> np.ndarray:
    """A (possibly multi-process) array as one NumPy array on every process."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


# --------------------------------------------------------------------------------------------------
# The KV cache's split view
# --------------------------------------------------------------------------------------------------


def split_cache_shapes(cfg, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    """ShapeDtypeStructs of the cache in its split view: K [B, KVH, S, Hd], V [B, KVH, Hd, S]
    (and the int8 cache's scales [B, KVH, S])."""
    k = jax.ShapeDtypeStruct((batch, cfg.n_kv_heads, length, cfg.head_dim), dtype)
    v = jax.ShapeDtypeStruct((batch, cfg.n_kv_heads, cfg.head_dim, length), dtype)
    scales = {}
    if jnp.dtype(dtype) == jnp.int8:
        s = jax.ShapeDtypeStruct((batch, cfg.n_kv_heads, length), jnp.float32)
        scales = dict(k_scale=(s,) * cfg.n_layers, v_scale=(s,) * cfg.n_layers)
    return KVCache(
        k=(k,) * cfg.n_layers,
        v=(v,) * cfg.n_layers,
        pos=jax.ShapeDtypeStruct((batch, length), jnp.int32),
        index=jax.ShapeDtypeStruct((), jnp.int32),
        **scales,
    )


def cache_specs(cfg, rules: Mapping[str, str], mesh: Mesh | None = None, quantized: bool = False) -> KVCache:
    """PartitionSpecs of the split-view cache under ``rules`` (a KVCache of specs)."""
    spec = {name: logical_to_spec(axes, rules, mesh) for name, axes in CACHE_AXES.items()}
    n = cfg.n_layers
    scales = dict(k_scale=(spec["k_scale"],) * n, v_scale=(spec["v_scale"],) * n) if quantized else {}
    return KVCache(k=(spec["k"],) * n, v=(spec["v"],) * n, pos=spec["pos"], index=P(), **scales)


def map_kv(cache: KVCache, fn) -> KVCache:
    """The cache with ``fn`` applied to every per-layer array (K, V and, for int8, their scales); positions
    and the write index unchanged."""
    return dataclasses.replace(
        cache,
        **{name: tuple(map(fn, getattr(cache, name))) for name in ("k", "v", "k_scale", "v_scale")},
    )


def merge_heads(cache: KVCache) -> KVCache:
    """Split view -> the model's layout: K [B, KVH, S, Hd] -> [B*KVH, S, Hd] (V and the scales alike)."""

    def merge(a):
        return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])

    return map_kv(cache, merge)


def split_heads(cache: KVCache) -> KVCache:
    """The model's layout -> split view: [B*KVH, ...] -> [B, KVH, ...] (B read from ``cache.pos``)."""
    b = cache.pos.shape[0]

    def split(a):
        return a.reshape(b, a.shape[0] // b, *a.shape[1:])

    return map_kv(cache, split)
