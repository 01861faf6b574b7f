"""Multi-device inference: a device mesh, logical-axis rules, and three ways to split generation.

* **Mesh.** Devices arranged in a grid with named axes ``data`` and ``model``
  (:func:`parse_mesh`, :func:`make_mesh`, :func:`fit_mesh`). Meshes are fitted to
  ``jax.device_count()``; a mesh larger than the machine raises :class:`~jaxlab.errors.ConfigError`
  with the ``XLA_FLAGS`` line that simulates more CPU devices.
* **Logical axes.** Every parameter and every KV-cache array names its axes (``PARAM_AXES``,
  ``CACHE_AXES``: ``"vocab"``, ``"embed"``, ``"q_heads"``, ``"kv_heads"``, ``"mlp"``, ``"batch"``...).
  A *strategy* is only a mapping from logical axes to mesh axes (``RULES``), so data parallel, tensor
  parallel and both at once are three dictionaries, not three models:

  - ``data``: batch -> data. Each device holds all the weights, and B / data rows with their cache.
  - ``tensor``: q_heads, kv_heads, mlp -> model. Each device holds H / model heads (wq, wk, wv split by
    columns, wo by rows), F / model MLP units (w_gate, w_up by columns, w_down by rows), the cache of
    its KV heads, and every row. Two all-reduces per layer add the row-split matmuls' partial sums.
  - ``data+tensor``: both, on a 2-D mesh: each device holds a block of rows x a block of heads.

* **Three implementations.** ``jit`` + ``NamedSharding`` (the strategies above: we say where inputs and
  outputs live, the XLA SPMD partitioner inserts the collectives); ``shard_map`` (tensor parallel, and
  data parallel on a 2-D mesh, written as the per-device program with its two ``psum`` per layer made
  explicit); ``pmap`` (data parallel, the legacy API: one program per local device, a leading device axis).
* **Heads that do not divide.** SmolLM2 has 9 query and 3 KV heads: :func:`pad_heads` adds zero KV
  heads (with their 3 zero query heads each, so the group size stays 3) and zero MLP units until
  ``model`` divides them. Zero heads attend uniformly over zero values and meet zero rows of ``wo``;
  zero MLP units give ``silu(0) * 0 = 0`` into zero rows of ``w_down``: the function is unchanged.
* **The KV cache's split view.** The model keeps K as ``[B * KVH, S, Hd]`` (batch-major): one axis
  mixes batch and heads. A ``NamedSharding`` on that axis cuts it into contiguous blocks, which are
  whole rows (fine for data parallel) but, once ``B / data > 1``, not whole heads (tensor parallel
  would need an all-to-all every step). So the sharded paths keep the cache *split*: K
  ``[B, KVH, S, Hd]``, V ``[B, KVH, Hd, S]``; ``jit`` strategies ``vmap`` :func:`jaxlab.engine.model.forward`
  over rows (each row's cache ``[KVH, S, Hd]`` is exactly the model's layout for batch 1), and
  ``shard_map`` merges the two axes *locally*, where it is free.

Entry points: :func:`shard` (params + mesh + strategy -> :class:`Sharded`, with ``generate``, ``logits``,
``prompt_logits``, ``decode_step_info``: the collectives in the compiled step, read from its HLO, and
``time_decode_step``) and :func:`shard_generate`; :func:`bytes_per_device` and :func:`time_all_reduce`
for the cost of communication. Generation here is greedy (the comparison with the single-device
:class:`~jaxlab.engine.generate.Generator` is exact token equality). The same code runs in one process or
many (:mod:`jaxlab.engine.distributed`): inputs are built with ``jax.make_array_from_callback`` when the mesh
spans processes, and outputs are gathered with ``multihost_utils.process_allgather``.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.engine.kvcache import KVCache, left_pad
from jaxlab.engine.model import Llama, Params, forward, params_from_flat, rope_cos_sin
from jaxlab.errors import ConfigError, InvalidRequestError

AXES = ("data", "model")
DEVICE_FLAG = "--xla_force_host_platform_device_count"

# --------------------------------------------------------------------------------------------------
# Logical axes: what each array's dimensions mean
# --------------------------------------------------------------------------------------------------

# Parameter name (without "layers.{i}.") -> logical axis per dimension.
PARAM_AXES: dict[str, tuple] = {
    "embed": ("vocab", "embed"),  # [V, D] (tied: also the output projection)
    "lm_head": ("embed", "vocab"),  # [D, V]
    "norm.weight": ("embed",),
    "attn_norm.weight": ("embed",),
    "mlp_norm.weight": ("embed",),
    "attn.wq": ("embed", "q_heads"),  # [D, H*Hd]   column-parallel: each device computes its heads
    "attn.wk": ("embed", "kv_heads"),  # [D, KVH*Hd]
    "attn.wv": ("embed", "kv_heads"),
    "attn.wo": ("q_heads", "embed"),  # [H*Hd, D]   row-parallel: partial sums, then an all-reduce
    "mlp.w_gate": ("embed", "mlp"),  # [D, F]      column-parallel
    "mlp.w_up": ("embed", "mlp"),
    "mlp.w_down": ("mlp", "embed"),  # [F, D]      row-parallel
}

# The KV cache in its split view (see the module docstring), and the step's inputs.
CACHE_AXES = {
    "k": ("batch", "kv_heads", "cache_len", "head_dim"),  # [B, KVH, S, Hd]
    "v": ("batch", "kv_heads", "head_dim", "cache_len"),  # [B, KVH, Hd, S]
    "pos": ("batch", "cache_len"),  # [B, S]
    "index": (),
}
TOKEN_AXES = ("batch", "seq")  # tokens, positions [B, T]
ROW_AXES = ("batch",)  # next tokens, decode positions [B]

RULES: dict[str, dict[str, str]] = {
    "data": {"batch": "data"},
    "tensor": {"q_heads": "model", "kv_heads": "model", "mlp": "model"},
    "data+tensor": {"batch": "data", "q_heads": "model", "kv_heads": "model", "mlp": "model"},
}
STRATEGIES = {
    "data": "jit + NamedSharding: rows split over `data`, weights replicated",
    "tensor": "jit + NamedSharding: heads and MLP units split over `model`, KV cache by KV head",
    "data+tensor": "jit + NamedSharding: rows over `data` and heads over `model` (2-D mesh)",
    "shard_map": "shard_map: the per-device program, heads over `model` with explicit psum (rows over `data`)",
    "pmap": "pmap (legacy): rows split over the local devices, one program per device",
}


def _base_name(name: str) -> str:
    return re.sub(r"^layers\.\d+\.", "", name)


def param_logical_axes(name: str) -> tuple:
    """Logical axes of the parameter called ``name`` (canonical name, e.g. ``layers.3.attn.wq``)."""
    try:
        return PARAM_AXES[_base_name(name)]
    except KeyError:
        raise ConfigError(f"no logical axes known for parameter {name!r}; add it to sharding.PARAM_AXES") from None


def rules_for(strategy: str, overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The logical-axis -> mesh-axis mapping of a strategy, with optional overrides
    (e.g. ``{"vocab": "model"}`` also splits the embedding)."""
    base = "data+tensor" if strategy == "shard_map" else "data" if strategy == "pmap" else strategy
    if base not in RULES:
        raise ConfigError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    rules = dict(RULES[base])
    for k, v in (overrides or {}).items():
        if v is not None and v not in AXES:
            raise ConfigError(f"rule {k!r} -> {v!r}: mesh axes are {AXES}")
        rules[k] = v
    return {k: v for k, v in rules.items() if v is not None}


def logical_to_spec(axes: Sequence[str | None], rules: Mapping[str, str], mesh: Mesh | None = None) -> P:
    """Logical axes -> ``PartitionSpec``: each logical axis becomes the mesh axis its rule names,
    or ``None`` (replicated). A mesh axis of size 1 is dropped, and a mesh axis is used at most once."""
    used: set[str] = set()
    out = []
    for a in axes:
        m = rules.get(a) if a is not None else None
        if m is not None and mesh is not None and mesh.shape.get(m, 1) == 1:
            m = None
        if m is not None and m in used:
            m = None
        if m is not None:
            used.add(m)
        out.append(m)
    while out and out[-1] is None:
        out.pop()
    return P(*out)


# --------------------------------------------------------------------------------------------------
# Meshes
# --------------------------------------------------------------------------------------------------


def parse_mesh(text: str | Mapping[str, int] | None) -> dict[str, int]:
    """``"data=2,model=4"`` -> ``{"data": 2, "model": 4}`` (a missing axis is 1)."""
    if text is None:
        return {"data": 1, "model": 1}
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in str(text).replace(" ", "").split(","):
            if not part:
                continue
            name, eq, size = part.partition("=")
            if not eq:
                raise ConfigError(f"mesh {text!r}: write axes as name=size, e.g. data=2,model=4")
            items.append((name, size))
    spec = {"data": 1, "model": 1}
    seen = set()
    for name, size in items:
        if name not in AXES:
            raise ConfigError(f"mesh axis {name!r} is unknown; the axes are {', '.join(AXES)} (e.g. data=2,model=4)")
        if name in seen:
            raise ConfigError(f"mesh axis {name!r} is given twice")
        seen.add(name)
        try:
            n = int(size)
        except (TypeError, ValueError):
            raise ConfigError(f"mesh axis {name}={size!r}: the size must be a whole number") from None
        if n < 1:
            raise ConfigError(f"mesh axis {name}={n}: the size must be at least 1")
        spec[name] = n
    return spec


def format_mesh(spec: Mapping[str, int]) -> str:
    return ",".join(f"{a}={spec.get(a, 1)}" for a in AXES)


def fit_mesh(strategy: str = "data+tensor", n_devices: int | None = None) -> dict[str, int]:
    """A mesh shape for ``strategy`` that uses the devices there are (never assumes 8):
    data -> data=n; tensor and shard_map -> model=n; data+tensor -> the most square split
    (8 -> data=2,model=4; 4 -> 2x2); pmap -> data=local device count."""
    if strategy == "pmap":
        return {"data": n_devices or jax.local_device_count(), "model": 1}
    n = n_devices or jax.device_count()
    if strategy == "data":
        return {"data": n, "model": 1}
    if strategy in ("tensor", "shard_map"):
        return {"data": 1, "model": n}
    if strategy == "data+tensor":
        d = max(k for k in range(1, int(math.isqrt(n)) + 1) if n % k == 0)
        return {"data": d, "model": n // d}
    raise ConfigError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def _too_few(need: int, have: int, what: str) -> ConfigError:
    backend, procs = jax.default_backend(), jax.process_count()
    if procs > 1:
        hint = (
            f" in {procs} processes of {jax.local_device_count()} local devices each; start more processes "
            "or give each more local devices"
        )
    elif backend == "cpu":
        hint = (
            f"; on a CPU, simulate {need} devices by setting XLA_FLAGS={DEVICE_FLAG}={need} before Python "
            f"starts (or before jax is imported), e.g. `XLA_FLAGS={DEVICE_FLAG}={need} jaxlab generate ...`"
        )
    else:
        hint = "; choose a smaller mesh"
    return ConfigError(f"{what} needs {need} devices, but jax sees {have} ({backend}){hint}")


def make_mesh(spec: str | Mapping[str, int] | None = None, devices: Sequence | None = None) -> Mesh:
    """A ``Mesh`` with axes (data, model). ``spec`` is ``"data=2,model=4"``, a dict, or None (all devices
    on ``data``). Uses the first data x model devices (all processes' devices in a multi-process run)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = parse_mesh(spec) if spec is not None else {"data": len(devices), "model": 1}
    need = shape["data"] * shape["model"]
    if need > len(devices):
        raise _too_few(need, len(devices), f"mesh {format_mesh(shape)}")
    return jax.make_mesh((shape["data"], shape["model"]), AXES, axis_types=(AxisType.Auto,) * 2, devices=devices[:need])


@dataclass(frozen=True)
class MeshDevices:
    """The devices to build meshes from (:func:`mesh_devices`), and what they are."""

    devices: tuple  # jax devices, all of one platform
    platform: str  # "cpu", "tpu", "gpu"
    simulated: bool  # CPU devices standing in for accelerators too few for the meshes
    note: str  # one sentence for the reader: which devices, and what can be measured on them

    @property
    def count(self) -> int:
        return len(self.devices)

    def measurable(self, need: int = 2) -> bool:
        """Whether a claim that needs ``need`` devices can be measured on these."""
        return self.count >= need


def mesh_devices(
    min_devices: int = 4, devices: Sequence | None = None, host_devices: Sequence | None = None
) -> MeshDevices:
    """The devices a lesson builds its meshes from: the accelerators when there are at least ``min_devices``
    of them, else the host's CPU devices when there are more of those (simulated with
    ``XLA_FLAGS=--xla_force_host_platform_device_count=8``, which must be set before jax starts).

    On a one-chip runtime (a free Colab TPU is one v5e chip) every mesh would otherwise be 1 x 1: each
    strategy would "split" nothing and every claim about communication would be vacuous. Simulated CPU
    devices run the real multi-device programs (same partitioning, same collectives), so correctness and
    the collectives can be checked there; speed cannot. ``devices`` / ``host_devices`` default to
    ``jax.devices()`` / ``jax.devices("cpu")`` (tests pass fakes with ``platform`` and ``device_kind``)."""
    devices = tuple(jax.devices() if devices is None else devices)
    platform = devices[0].platform
    kind = getattr(devices[0], "device_kind", platform)
    n = len(devices)
    if platform == "cpu":
        what = "simulated CPU devices" if n > 1 else "CPU device"
        note = f"Meshes use the {n} {what} jax sees: correctness and collectives can be checked, speed-ups cannot" + (
            "." if n >= min_devices else f"; set XLA_FLAGS={DEVICE_FLAG}=8 before jax starts for more."
        )
        return MeshDevices(devices, "cpu", n > 1, note)
    if n >= min_devices:
        return MeshDevices(devices, platform, False, f"Meshes use the {n} {kind} devices jax sees.")
    if host_devices is None:
        try:
            host_devices = jax.devices("cpu")
        except RuntimeError:  # no CPU backend (JAX_PLATFORMS excludes it)
            host_devices = ()
    host_devices = tuple(host_devices)
    if len(host_devices) > n:
        note = (
            f"jax sees {n} {kind} device{'s' if n != 1 else ''}, fewer than the {min_devices} these meshes need, "
            f"so the meshes are built from {len(host_devices)} simulated CPU devices: correctness and collectives "
            f"can be checked there, speed-ups cannot (for real chips use a Kaggle TPU v5e-8 or a TPU VM)."
        )
        return MeshDevices(host_devices, "cpu", True, note)
    note = (
        f"jax sees {n} {kind} device{'s' if n != 1 else ''} and no more CPU devices (set XLA_FLAGS={DEVICE_FLAG}=8 "
        f"before jax starts): claims that need more than one device are not measurable here."
    )
    return MeshDevices(devices, platform, False, note)


def mesh_shape(mesh: Mesh) -> dict[str, int]:
    return {a: int(mesh.shape.get(a, 1)) for a in AXES}


def describe_mesh(spec: str | Mapping[str, int] | None = None, devices: Sequence | None = None) -> str:
    """One line for ``jaxlab info``: the devices (``jax.devices()``, or ``devices``), processes, and the
    mesh ``spec`` (or the default one)."""
    if devices is None:
        n, backend = jax.device_count(), jax.default_backend()
    else:
        n, backend = len(devices), devices[0].platform
    procs = jax.process_count()
    where = f"{n} {backend} device{'s' if n != 1 else ''}" + (f" in {procs} processes" if procs > 1 else "")
    if spec is None:
        shape = fit_mesh("data+tensor", n)
        line = f"{where}; default 2-D mesh {format_mesh(shape)}"
    else:
        shape = parse_mesh(spec)
        need = shape["data"] * shape["model"]
        ok = "fits" if need <= n else f"needs {need} devices"
        line = f"{where}; mesh {format_mesh(shape)} ({ok})"
    if backend == "cpu" and n == 1:
        line += f"; simulate more with XLA_FLAGS={DEVICE_FLAG}=8"
    return line


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
    at the end and every real head keeps its KV head."""
    cfg = params.config
    sizes = padded_sizes(cfg, model)
    if (sizes["n_heads"], sizes["n_kv_heads"], sizes["ffn_dim"]) == (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim):
        return params
    hd = cfg.head_dim
    extra_q = (sizes["n_heads"] - cfg.n_heads) * hd
    extra_kv = (sizes["n_kv_heads"] - cfg.n_kv_heads) * hd
    extra_f = sizes["ffn_dim"] - cfg.ffn_dim
    pads = {
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
        rows, cols = pads.get(_base_name(name), (0, 0))
        flat[name] = jnp.pad(a, ((0, rows), (0, cols))) if rows or cols else a
    return params_from_flat(cfg.replace(**sizes), flat, params.policy, source="pad_heads")


# --------------------------------------------------------------------------------------------------
# Placing arrays
# --------------------------------------------------------------------------------------------------


def _map_params(params: Params, fn: Callable[[str, object], object]) -> Params:
    """A Params with every array replaced by ``fn(name, array)`` (shardings, specs, placed arrays)."""
    flat_state = nnx.to_flat_state(params.state)
    state = nnx.from_flat_state([(p, var.replace(fn(".".join(map(str, p)), var.get_value()))) for p, var in flat_state])
    return Params(params.graphdef, state)


def check_divisible(shape: Sequence[int], spec: P, mesh: Mesh, what: str) -> None:
    """A clear error when a sharded dimension is not a multiple of its mesh axis."""
    for dim, (size, axis) in enumerate(zip(shape, tuple(spec) + (None,) * len(shape))):
        if axis is None:
            continue
        names = axis if isinstance(axis, tuple) else (axis,)
        n = math.prod(mesh.shape[a] for a in names)
        if size % n:
            raise ConfigError(
                f"{what}: dimension {dim} has size {size}, which the mesh axis {axis}={n} "
                f"does not divide; choose {axis} among the divisors of {size} or change the rule"
            )


def param_specs(params: Params, rules: Mapping[str, str], mesh: Mesh | None = None) -> dict[str, P]:
    """{canonical name: PartitionSpec} that the rules give every parameter."""
    return {name: logical_to_spec(param_logical_axes(name), rules, mesh) for name in params.flat()}


def _put(x, sharding: NamedSharding):
    """device_put that also works when the mesh spans processes (every process holds the same x)."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard_params(params: Params, mesh: Mesh, rules: Mapping[str, str]) -> Params:
    """Place every parameter with the ``NamedSharding`` its logical axes and the rules give."""

    def place(name, a):
        spec = logical_to_spec(param_logical_axes(name), rules, mesh)
        check_divisible(a.shape, spec, mesh, f"parameter {name} {tuple(a.shape)}")
        return _put(a, NamedSharding(mesh, spec))

    return _map_params(params, place)


def replicate_for_pmap(tree, devices: Sequence | None = None):
    """Put a copy of every array on each of ``devices`` (default: the local devices), once.

    ``pmap(f, in_axes=None)`` broadcasts an argument to the devices on *every call* unless it already
    lives, replicated, on exactly those devices: for a model's weights that is a full copy per token."""
    devices = list(jax.local_devices() if devices is None else devices)
    return jax.device_put(tree, NamedSharding(Mesh(np.array(devices), ("devices",)), P()))


def _to_host(x) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def split_cache_shapes(cfg, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    """ShapeDtypeStructs of the cache in its split view: K [B, KVH, S, Hd], V [B, KVH, Hd, S]."""
    k = jax.ShapeDtypeStruct((batch, cfg.n_kv_heads, length, cfg.head_dim), dtype)
    v = jax.ShapeDtypeStruct((batch, cfg.n_kv_heads, cfg.head_dim, length), dtype)
    return KVCache(
        k=(k,) * cfg.n_layers,
        v=(v,) * cfg.n_layers,
        pos=jax.ShapeDtypeStruct((batch, length), jnp.int32),
        index=jax.ShapeDtypeStruct((), jnp.int32),
    )


def cache_specs(cfg, rules: Mapping[str, str], mesh: Mesh | None = None) -> KVCache:
    """PartitionSpecs of the split-view cache under ``rules`` (a KVCache of specs)."""
    k = logical_to_spec(CACHE_AXES["k"], rules, mesh)
    v = logical_to_spec(CACHE_AXES["v"], rules, mesh)
    return KVCache(
        k=(k,) * cfg.n_layers, v=(v,) * cfg.n_layers, pos=logical_to_spec(CACHE_AXES["pos"], rules, mesh), index=P()
    )


def _named(mesh, specs):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


# --------------------------------------------------------------------------------------------------
# The steps
# --------------------------------------------------------------------------------------------------


def _rows_forward(params: Params, tokens, positions, cache: KVCache, last_only: bool):
    """forward() mapped over rows, on the split-view cache: tokens, positions [B, T] ->
    (logits [B, T or 1, V], cache). Each row sees its cache as the model's layout for batch 1."""

    def row(tok, pos, k, v, kpos):
        c = KVCache(k=k, v=v, pos=kpos[None], index=cache.index)
        logits, c = forward(params, tok[None], pos[None], c, last_only=last_only)
        return logits[0], c.k, c.v, c.pos[0]

    logits, k, v, kpos = jax.vmap(row)(tokens, positions, cache.k, cache.v, cache.pos)
    return logits, KVCache(k=k, v=v, pos=kpos, index=cache.index + tokens.shape[1])


def _jit_prefill(params, tokens, positions, cache):
    """Prompt chunk [B, T] -> (next tokens [B], last-position logits [B, V], cache)."""
    logits, cache = _rows_forward(params, tokens, positions, cache, last_only=True)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], cache


def _jit_decode(params, tok, pos, cache):
    """tok, pos [B] -> (next tokens [B], their logits [B, V], pos + 1, cache)."""
    logits, cache = _rows_forward(params, tok[:, None], pos[:, None], cache, last_only=False)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], pos + 1, cache


def _jit_logits(params, tokens, positions):
    return forward(params, tokens, positions)[0]


def _local_config(cfg, mesh: Mesh):
    m = mesh.shape["model"]
    return cfg.replace(n_heads=cfg.n_heads // m, n_kv_heads=cfg.n_kv_heads // m, ffn_dim=cfg.ffn_dim // m)


def _tp_forward(params: Params, tokens, positions, cache: KVCache | None, last_only: bool, axis: str = "model"):
    """The per-device program of Megatron-style tensor parallelism (inside ``shard_map``).

    ``params`` holds this device's heads and MLP units (its graphdef describes the local sizes), the
    cache this device's KV heads in the split view [b, kvh, S, Hd]. Attention and the MLP each end in a
    row-parallel matmul whose outputs are partial sums: one ``psum`` over ``model`` each makes them whole.
    Softmax needs no communication: each head's softmax is local to the device that owns the head."""
    m = params.module()
    b, t = tokens.shape
    kvh = m.cfg.n_kv_heads
    x = jnp.take(m.embed[...], tokens, axis=0).astype(m.policy.jnp_dtype)  # [b, T, D]
    cos, sin = rope_cos_sin(positions, m.cfg.head_dim, m.cfg.rope_theta)
    if cache is not None:
        key_positions = jax.lax.dynamic_update_slice(cache.pos, positions.astype(cache.pos.dtype), (0, cache.index))
    else:
        key_positions = positions
    new_k, new_v = [], []
    for i, layer in enumerate(m.layers):
        with jax.named_scope(f"layer{i}"):
            kv = None
            if cache is not None:  # the split view merged locally: [b, kvh, S, Hd] -> [b*kvh, S, Hd]
                kv = (
                    cache.k[i].reshape(b * kvh, *cache.k[i].shape[2:]),
                    cache.v[i].reshape(b * kvh, *cache.v[i].shape[2:]),
                )
            h, kv = layer.attn(
                layer.attn_norm(x), positions, cos, sin, key_positions, kv, None if cache is None else cache.index
            )
            x = x + jax.lax.psum(h, axis)  # all-reduce #1: the row-parallel wo's partial sums
            x = x + jax.lax.psum(layer.mlp(layer.mlp_norm(x)), axis)  # all-reduce #2: w_down's
        if kv is not None:
            new_k.append(kv[0].reshape(cache.k[i].shape))
            new_v.append(kv[1].reshape(cache.v[i].shape))
    if last_only:
        x = x[:, -1:]
    x = m.norm(x)
    if m.cfg.tie_embeddings:
        logits = jnp.einsum("btd,vd->btv", x, m.embed[...].astype(x.dtype), precision=m.policy.lax_precision)
    else:
        logits = jnp.einsum("btd,dv->btv", x, m.lm_head[...].astype(x.dtype), precision=m.policy.lax_precision)
    logits = logits.astype(jnp.float32)
    if cache is None:
        return logits, None
    return logits, KVCache(k=tuple(new_k), v=tuple(new_v), pos=key_positions, index=cache.index + t)


def _with_graphdef(params: Params, graphdef) -> Params:
    return Params(graphdef, params.state)


# --------------------------------------------------------------------------------------------------
# The sharded model
# --------------------------------------------------------------------------------------------------


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ITEMSIZE = {
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
    from jaxlab.tools.profile import count_ops

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
            out[op] += n * _ITEMSIZE.get(dtype, 4)
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


class Sharded:
    """A model placed on a mesh with one strategy: ``generate`` (greedy), ``logits``, ``prompt_logits``,
    ``decode_step_info``, ``time_decode_step``. ``config`` is the (padded) config the devices run.

    Build it with :func:`shard`. Each program is compiled ahead of time on first use for a shape, and
    kept; ``compile_seconds`` adds up the time spent compiling."""

    def __init__(
        self, params: Params, mesh: Mesh, strategy: str = "auto", rules: Mapping[str, str | None] | None = None
    ):
        shape = mesh_shape(mesh)
        if strategy == "auto":
            strategy = "data" if shape["model"] == 1 else "tensor" if shape["data"] == 1 else "data+tensor"
        if strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {strategy!r}; choose one of auto, {', '.join(STRATEGIES)}")
        self.strategy, self.mesh, self.shape = strategy, mesh, shape
        self._compiled: dict[tuple, object] = {}
        self.compile_seconds = 0.0
        if rules and strategy in ("shard_map", "pmap"):
            raise ConfigError(f"rule overrides apply to the jit strategies; {strategy} is written for its own layout")
        self.rules = rules_for(strategy, rules)
        if strategy == "pmap":
            if shape["model"] != 1:
                raise ConfigError(f"pmap maps over one axis: use a mesh data=N,model=1 (got {format_mesh(shape)})")
            if jax.process_count() > 1:
                raise ConfigError("pmap maps over local devices only; use a jit or shard_map strategy across processes")
            self.devices = list(mesh.devices.flat)
            self.params = replicate_for_pmap(params, self.devices)
            self.config = params.config
            self._build_pmap()
            return
        uses_model = any(v == "model" for v in self.rules.values())
        if uses_model and shape["model"] > 1:
            params = pad_heads(params, shape["model"])
        self.config = params.config
        self.params = shard_params(params, mesh, self.rules)
        self.param_shardings = _map_params(self.params, lambda n, a: a.sharding)
        if strategy == "shard_map":
            self._build_shard_map()
        else:
            self._build_jit()

    # -- shardings ---------------------------------------------------------------------------

    def spec(self, logical_axes: Sequence[str | None]) -> P:
        return logical_to_spec(logical_axes, self.rules, self.mesh)

    def sharding(self, logical_axes: Sequence[str | None]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical_axes))

    @property
    def rows_multiple(self) -> int:
        """The batch is padded (with copies of the first prompt) to a multiple of this."""
        return self.shape["data"] if "batch" in self.rules else 1

    def _batch_put(self, x: np.ndarray, axes) -> jax.Array:
        return _put(x, self.sharding(axes))

    # -- jit + NamedSharding -------------------------------------------------------------------

    def _build_jit(self):
        cache_sh = _named(self.mesh, cache_specs(self.config, self.rules, self.mesh))
        tok, row = self.sharding(TOKEN_AXES), self.sharding(ROW_AXES)
        ps = self.param_shardings
        self._prefill = jax.jit(
            _jit_prefill, in_shardings=(ps, tok, tok, cache_sh), out_shardings=(row, row, cache_sh), donate_argnums=(3,)
        )
        self._decode = jax.jit(
            _jit_decode,
            in_shardings=(ps, row, row, cache_sh),
            out_shardings=(row, row, row, cache_sh),
            donate_argnums=(3,),
        )
        self._logits = jax.jit(_jit_logits, in_shardings=(ps, tok, tok), out_shardings=self.sharding(("batch",)))
        self._cache_sh = cache_sh

    def _init_cache(self, batch: int, length: int) -> KVCache:
        shapes = split_cache_shapes(self.config, batch, length, self.params.policy.jnp_dtype)

        def zeros():  # created in place, shard by shard: no device ever holds the whole cache
            return KVCache(
                k=tuple(jnp.zeros(s.shape, s.dtype) for s in shapes.k),
                v=tuple(jnp.zeros(s.shape, s.dtype) for s in shapes.v),
                pos=jnp.full(shapes.pos.shape, -1, jnp.int32),
                index=jnp.zeros((), jnp.int32),
            )

        return jax.jit(zeros, out_shardings=self._cache_sh)()

    # -- shard_map -----------------------------------------------------------------------------

    def _build_shard_map(self):
        local_cfg = _local_config(self.config, self.mesh)
        local_graphdef, _ = nnx.split(nnx.eval_shape(lambda: Llama(local_cfg, self.params.policy, rngs=nnx.Rngs(0))))
        pspecs = _map_params(self.params, lambda n, a: a.sharding.spec)
        cspecs = cache_specs(self.config, self.rules, self.mesh)
        tok, row = self.spec(TOKEN_AXES), self.spec(ROW_AXES)
        mesh = self.mesh

        def prefill(params, tokens, positions, cache):
            logits, cache = _tp_forward(_with_graphdef(params, local_graphdef), tokens, positions, cache, True)
            return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], cache

        def decode(params, tok_, pos, cache):
            local = _with_graphdef(params, local_graphdef)
            logits, cache = _tp_forward(local, tok_[:, None], pos[:, None], cache, False)
            return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], pos + 1, cache

        def logits_fn(params, tokens, positions):
            return _tp_forward(_with_graphdef(params, local_graphdef), tokens, positions, None, False)[0]

        sm = partial(jax.shard_map, mesh=mesh)
        self._prefill = jax.jit(
            sm(prefill, in_specs=(pspecs, tok, tok, cspecs), out_specs=(row, row, cspecs)), donate_argnums=(3,)
        )
        self._decode = jax.jit(
            sm(decode, in_specs=(pspecs, row, row, cspecs), out_specs=(row, row, row, cspecs)), donate_argnums=(3,)
        )
        self._logits = jax.jit(sm(logits_fn, in_specs=(pspecs, tok, tok), out_specs=self.spec(("batch",))))
        self._cache_sh = _named(mesh, cspecs)

    # -- pmap ----------------------------------------------------------------------------------

    def _build_pmap(self):
        n = len(self.devices)

        def prefill(params, tokens, positions, cache):
            logits, cache = forward(params, tokens, positions, cache, last_only=True)
            return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], cache

        def decode(params, tok, pos, cache):
            logits, cache = forward(params, tok[:, None], pos[:, None], cache)
            return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], pos + 1, cache

        def logits_fn(params, tokens, positions):
            return forward(params, tokens, positions)[0]

        # params: in_axes=None broadcasts them to every device (each device holds a full copy)
        pm = partial(jax.pmap, axis_name="data", devices=self.devices)
        self._prefill = pm(prefill, in_axes=(None, 0, 0, 0), donate_argnums=(3,))
        self._decode = pm(decode, in_axes=(None, 0, 0, 0), donate_argnums=(3,))
        self._logits = pm(logits_fn, in_axes=(None, 0, 0))
        self._n = n

    # -- running -------------------------------------------------------------------------------

    def _call(self, name: str, args: tuple):
        """Run program ``name`` on ``args``, compiling it ahead of time on first use for these shapes
        (so the compile time is measured, and :meth:`decode_step_info` reads the very program that ran)."""
        return self._program(name, args)(*args)

    def _program(self, name: str, args: tuple):
        key = (name, tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(args)))
        program = self._compiled.get(key)
        if program is None:
            t0 = time.perf_counter()
            program = getattr(self, "_" + name).lower(*args).compile()
            self.compile_seconds += time.perf_counter() - t0
            self._compiled[key] = program
        return program

    def _pmap_split(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self._n, x.shape[0] // self._n, *x.shape[1:])  # [B, ...] -> [n, B/n, ...]

    def logits(self, tokens, positions) -> np.ndarray:
        """Full forward without a cache: tokens, positions [B, T] -> logits [B, T, V] (on the host).
        B must be a multiple of the data axis for the data-parallel strategies."""
        tokens, positions = np.asarray(tokens, np.int32), np.asarray(positions, np.int32)
        self._check_rows(tokens.shape[0])
        if self.strategy == "pmap":
            out = self._call("logits", (self.params, self._pmap_split(tokens), self._pmap_split(positions)))
            return np.asarray(out).reshape(tokens.shape + (-1,))
        return _to_host(
            self._call(
                "logits", (self.params, self._batch_put(tokens, TOKEN_AXES), self._batch_put(positions, TOKEN_AXES))
            )
        )

    def _check_rows(self, b: int):
        if b % self.rows_multiple:
            raise InvalidRequestError(
                f"a batch of {b} rows cannot be split over data={self.rows_multiple}: "
                f"give a multiple of {self.rows_multiple} rows"
            )

    def _put_rows(self, x: np.ndarray):
        """Host rows [B, ...] -> the step's input: split over the devices as the rules say
        (``pmap``: reshaped to [devices, B / devices, ...])."""
        if self.strategy == "pmap":
            return self._pmap_split(x)
        return self._batch_put(x, TOKEN_AXES if x.ndim == 2 else ROW_AXES)

    def _host_rows(self, x) -> np.ndarray:
        if self.strategy == "pmap":
            a = np.asarray(x)
            return a.reshape(-1, *a.shape[2:])
        return _to_host(x)

    def _new_cache(self, batch: int, length: int) -> KVCache:
        if self.strategy == "pmap":
            from jaxlab.engine.kvcache import init_cache

            one = init_cache(self.config, batch // self._n, length, self.params.policy.jnp_dtype)
            return jax.tree.map(lambda a: jnp.stack([a] * self._n), one)  # [n, ...]: pmap puts slice i on device i
        return self._init_cache(batch, length)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        *,
        ignore_eos: bool = False,
        prefill: bool = True,
    ) -> list[list[int]]:
        """Greedy generation for prompts (lists of token ids) -> the new ids of each prompt.

        Same plan as :class:`~jaxlab.engine.generate.Generator` (prefill bucket, cache length), so the tokens
        can be compared with it exactly. Without ``ignore_eos`` each row ends before its first EOS.
        ``prefill=False`` feeds the prompt through the decode step one token per call: one compiled
        program instead of two (half the compile time, slower for long prompts)."""
        from jaxlab.engine.generate import Generator

        cfg = self.config
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts or any(not p for p in prompts):
            raise InvalidRequestError("give at least one prompt, each with at least one token")
        bad = [t for p in prompts for t in p if not 0 <= t < cfg.vocab_size]
        if bad:
            raise InvalidRequestError(f"token ids outside the vocabulary [0, {cfg.vocab_size}): {bad[:5]}")
        if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens}")
        n_real = len(prompts)
        k = self._n if self.strategy == "pmap" else self.rows_multiple
        prompts = prompts + [prompts[0]] * (-n_real % k)  # pad the batch with copies; dropped below
        lens = np.asarray([len(p) for p in prompts], np.int32)
        padded, chunk, cache_len = Generator(self.params).plan(lens.tolist(), max_new_tokens)
        cache = self._new_cache(len(prompts), cache_len)
        if prefill:
            tokens, positions = left_pad(prompts, cfg.pad_id, padded)
            for c in range(0, padded, chunk):
                nxt, last, cache = self._call(
                    "prefill",
                    (
                        self.params,
                        self._put_rows(tokens[:, c : c + chunk]),
                        self._put_rows(positions[:, c : c + chunk]),
                        cache,
                    ),
                )
        else:
            tokens, positions = left_pad(prompts, cfg.pad_id)  # no bucket: every column is a call
            for c in range(tokens.shape[1]):
                nxt, last, _, cache = self._call(
                    "decode", (self.params, self._put_rows(tokens[:, c]), self._put_rows(positions[:, c]), cache)
                )
        pos = self._put_rows(lens)
        steps = [nxt]
        for _ in range(max_new_tokens - 1):
            nxt, _, pos, cache = self._call("decode", (self.params, nxt, pos, cache))
            steps.append(nxt)
        out = np.stack([self._host_rows(s) for s in steps], axis=1)  # [B, new]
        self._last_logits = (last, n_real)
        result = []
        for row in out[:n_real].tolist():
            if not ignore_eos and cfg.eos_id in row:
                row = row[: row.index(cfg.eos_id)]
            result.append(row)
        return result

    def prompt_logits(self) -> np.ndarray:
        """Logits [B, V] at each prompt's last position in the latest :meth:`generate` call (the
        prefill's output, which chose the first new token): for parity checks without another program."""
        if getattr(self, "_last_logits", None) is None:
            raise InvalidRequestError("call generate() first")
        last, n = self._last_logits
        return self._host_rows(last)[:n]

    # -- looking inside ------------------------------------------------------------------------

    def _decode_args(self, batch: int, cache_len: int) -> tuple:
        """Abstract arguments of the decode step (the same key as a real call, so no second compile)."""
        if self.strategy == "pmap":
            from jaxlab.engine.kvcache import init_cache

            b_local = batch // self._n
            one = jax.eval_shape(lambda: init_cache(self.config, b_local, cache_len, self.params.policy.jnp_dtype))
            cache = jax.tree.map(lambda s: jax.ShapeDtypeStruct((self._n, *s.shape), s.dtype), one)
            row = jax.ShapeDtypeStruct((self._n, b_local), jnp.int32)
            return self.params, row, row, cache
        shapes = split_cache_shapes(self.config, batch, cache_len, self.params.policy.jnp_dtype)
        row = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=self.sharding(ROW_AXES))
        cache = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, self._cache_sh)
        return self.params, row, row, cache

    def _default_rows(self, batch: int | None) -> int:
        k = self._n if self.strategy == "pmap" else self.rows_multiple
        return batch or k

    def decode_step_info(self, batch: int | None = None, cache_len: int = 256) -> StepInfo:
        """The compiled decode step for ``batch`` rows and ``cache_len`` slots (the program
        :meth:`generate` runs for that shape): its optimized HLO, the collectives in it and their bytes."""
        batch = self._default_rows(batch)
        self._check_rows(batch)
        hlo = self._program("decode", self._decode_args(batch, cache_len)).as_text()
        return StepInfo(collectives=count_collectives(hlo), bytes=collective_bytes(hlo), hlo=hlo)

    def time_decode_step(self, batch: int | None = None, cache_len: int = 256, repeats: int = 5) -> list[float]:
        """Seconds of ``repeats`` synchronized decode steps (after one warm-up step) on a fresh cache."""
        batch = self._default_rows(batch)
        self._check_rows(batch)
        params, row, _, cache_abs = self._decode_args(batch, cache_len)
        program = self._program("decode", (params, row, row, cache_abs))
        if self.strategy == "pmap":
            tok = jnp.ones(row.shape, jnp.int32)
            cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_abs)
            pos = tok
        else:
            tok = self._batch_put(np.ones(batch, np.int32), ROW_AXES)
            pos = self._batch_put(np.ones(batch, np.int32), ROW_AXES)
            cache = self._init_cache(batch, cache_len)
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            tok, _, pos, cache = program(params, tok, pos, cache)
            jax.block_until_ready(tok)
            if i:
                times.append(time.perf_counter() - t0)
        return times

    def cache_shardings(self, batch: int, cache_len: int = 256) -> KVCache:
        """The shardings of a fresh split-view cache (what the rules say for K, V, pos, index)."""
        return jax.tree.map(lambda a: a.sharding, self._init_cache(batch, cache_len))

    def __repr__(self):
        return f"Sharded({self.config.name}, strategy={self.strategy}, mesh {format_mesh(self.shape)})"


def shard(
    params: Params,
    mesh: Mesh | str | Mapping[str, int] | None = None,
    strategy: str = "auto",
    rules: Mapping[str, str | None] | None = None,
    devices: Sequence | None = None,
) -> Sharded:
    """Place ``params`` on ``mesh`` (a Mesh, ``"data=2,model=4"``, a dict, or None: fitted to the devices
    for ``strategy``) with one strategy: auto, data, tensor, data+tensor, shard_map, pmap. A mesh that is
    not a ``Mesh`` is built from ``devices`` (default ``jax.devices()``, e.g. :func:`mesh_devices`' ones)."""
    if not isinstance(mesh, Mesh):
        if mesh is None:
            mesh = fit_mesh(
                "data+tensor" if strategy == "auto" else strategy, None if devices is None else len(devices)
            )
        mesh = make_mesh(mesh, devices)
    return Sharded(params, mesh, strategy, rules)


def shard_generate(
    params: Params,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 32,
    mesh: Mesh | str | Mapping[str, int] | None = None,
    strategy: str = "auto",
    *,
    ignore_eos: bool = False,
    prefill: bool = True,
) -> list[list[int]]:
    """Greedy generation on a mesh -> the new token ids of each prompt (see :meth:`Sharded.generate`)."""
    return shard(params, mesh, strategy).generate(prompts, max_new_tokens, ignore_eos=ignore_eos, prefill=prefill)


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
) -> dict[str, int]:
    """What one device holds, and moves per decode step, under a strategy: from shapes alone, no arrays.

    ``weights``: its share of the (padded) parameters; ``kv_cache``: its share of a ``batch`` x
    ``cache_len`` cache; ``all_reduce_per_step``: the activations it all-reduces per decode step
    (two [rows per device, 1, D] per layer when heads are split, none otherwise)."""
    from jaxlab.engine.model import param_shapes

    shape = parse_mesh(mesh)
    rules = rules_for(strategy, rules)
    heads_split = shape["model"] > 1 and any(v == "model" for v in rules.values())
    if heads_split:
        cfg = cfg.replace(**padded_sizes(cfg, shape["model"]))

    def share(axes, dims):
        spec = logical_to_spec(axes, rules)
        n = math.prod(shape[a] for a in spec if a is not None)
        return math.prod(dims) // n * itemsize

    weights = sum(share(param_logical_axes(name), dims) for name, dims in param_shapes(cfg).items())
    k_dims = (batch, cfg.n_kv_heads, cache_len, cfg.head_dim)
    cache = 2 * cfg.n_layers * share(CACHE_AXES["k"], k_dims)
    rows = batch // shape["data"] if "batch" in rules else batch
    reduce = 2 * cfg.n_layers * rows * cfg.dim * itemsize if heads_split else 0
    return {"weights": weights, "kv_cache": cache, "all_reduce_per_step": reduce}
