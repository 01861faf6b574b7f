"""Device meshes and logical axes: where each array's dimensions go on a grid of devices.

* **Mesh.** Devices arranged in a grid with named axes ``data`` and ``model`` (:func:`parse_mesh`,
  :func:`make_mesh`, :func:`fit_mesh`, :func:`mesh_devices`, :func:`describe_mesh`). Meshes are fitted to
  ``jax.device_count()``; a mesh larger than the machine raises :class:`~jaxlab.errors.ConfigError` with
  the ``XLA_FLAGS`` line that simulates more CPU devices.
* **Logical axes.** Every parameter and every KV-cache array names its axes (``PARAM_AXES``,
  ``CACHE_AXES``: ``"vocab"``, ``"embed"``, ``"q_heads"``, ``"kv_heads"``, ``"mlp"``, ``"batch"``...).
  A *strategy* is only a mapping from logical axes to mesh axes (``RULES``), so data parallel, tensor
  parallel and both at once are three dictionaries, not three models (:func:`rules_for`,
  :func:`logical_to_spec`). A quantized matrix (:class:`~jaxlab.quant.QuantizedMatrix`) takes the axes of
  the float matrix it stands for, leaf by leaf (:func:`value_specs`).

What is placed where, and the programs that run there, are in :mod:`jaxlab.engine.sharding`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from jaxlab.errors import ConfigError
from jaxlab.quant.formats import QuantizedMatrix

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

# The KV cache in its split view (jaxlab.engine.sharding: K [B, KVH, S, Hd], not the model's [B*KVH, S, Hd]),
# and the steps' inputs.
CACHE_AXES = {
    "k": ("batch", "kv_heads", "cache_len", "head_dim"),  # [B, KVH, S, Hd]
    "v": ("batch", "kv_heads", "head_dim", "cache_len"),  # [B, KVH, Hd, S]
    "pos": ("batch", "cache_len"),  # [B, S]
    "index": (),
    "k_scale": ("batch", "kv_heads", "cache_len"),  # int8 cache only: [B, KVH, S]
    "v_scale": ("batch", "kv_heads", "cache_len"),
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


def base_name(name: str) -> str:
    """A parameter's name without its layer: ``layers.3.attn.wq`` -> ``attn.wq``."""
    return re.sub(r"^layers\.\d+\.", "", name)


def param_logical_axes(name: str) -> tuple:
    """Logical axes of the parameter called ``name`` (canonical name, e.g. ``layers.3.attn.wq``)."""
    try:
        return PARAM_AXES[base_name(name)]
    except KeyError:
        raise ConfigError(f"no logical axes known for parameter {name!r}; add it to mesh.PARAM_AXES") from None


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


def value_specs(name: str, value, rules: Mapping[str, str], mesh: Mesh | None = None):
    """The ``PartitionSpec`` of parameter ``name``'s value: one spec for a float array; for a
    :class:`~jaxlab.quant.QuantizedMatrix` (stored ``[out, in]``: a kernel's transpose, the embedding as it
    is) a QuantizedMatrix of specs, each leaf split like the rows/columns of the matrix it belongs to
    (``q`` [out, in], per-row ``scale`` [out] or per-group ``scale``/``zero`` [out, groups], ``smooth`` [in])."""
    axes = param_logical_axes(name)
    if not isinstance(value, QuantizedMatrix):
        return logical_to_spec(axes, rules, mesh)
    out_ax, in_ax = axes if base_name(name) == "embed" else axes[::-1]

    def spec(leaf_axes):
        return logical_to_spec(leaf_axes, rules, mesh)

    return QuantizedMatrix(
        q=spec((out_ax, in_ax)),
        scale=spec((out_ax,) if value.scale.ndim == 1 else (out_ax, in_ax)),
        zero=None if value.zero is None else spec((out_ax, in_ax)),
        fmt=value.fmt,
        group=value.group,
        smooth=None if value.smooth is None else spec((in_ax,)),
    )
