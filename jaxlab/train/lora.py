"""Low-rank adapters (LoRA) on the model's linear layers, through the same hook quantization uses.

A frozen kernel ``W [in, out]`` gets two small trainable matrices beside it, ``A [in, r]`` and ``B [r, out]``, and
the layer computes ``x W + (alpha / r) (x A) B`` (Hu et al., 2021, https://arxiv.org/abs/2106.09685). ``B`` starts
at zero, so a fresh adapter leaves the model's output unchanged, and only ``A`` and ``B`` are trained:
``r (in + out)`` numbers per matrix instead of ``in * out``.

There is no second model: :class:`LoraKernel` is a pytree that sits where the kernel sits in the parameter tree,
and :func:`jaxlab.engine.model.dense` (the linear-layer hook) calls its :meth:`LoraKernel.dot` instead of the
matmul, as it does for a :class:`~jaxlab.quant.QuantizedMatrix`. :func:`apply` puts the adapters into the tree
(under ``jit`` and ``grad``: the gradient reaches ``A`` and ``B`` only, because only they are the argument being
differentiated); :func:`merge` folds them into the kernels (``W + (alpha / r) A B``) for generation and export at
the base model's speed. The base may be quantized (QLoRA's idea: a quantized frozen base, float adapters):
:func:`apply` works over a :class:`~jaxlab.quant.QuantizedMatrix`, :func:`merge` needs float kernels.

An adapter on disk (:func:`save` / :func:`load`): ``adapter.safetensors`` (``{name}.a``, ``{name}.b``) and
``adapter.json`` (:class:`LoraConfig`, the base model's name and the shapes).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.engine.model import Params, Policy, dense, param_name
from jaxlab.errors import ConfigError, ModelFileError

Array = jax.Array
Adapter = dict[str, dict[str, Array]]  # {"layers.0.attn.wq": {"a": [in, r], "b": [r, out]}, ...}
TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # every projection of attention and the MLP
ATTENTION = ("wq", "wk", "wv", "wo")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 8  # r: the adapter's inner width
    alpha: float = 16.0  # the update is scaled by alpha / r, so changing r keeps the update's size
    targets: tuple[str, ...] = TARGETS  # which kernels of every layer get an adapter

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ConfigError(f"LoRA rank must be a positive integer, got {self.rank!r} (try 8)")
        if not self.alpha > 0:
            raise ConfigError(f"LoRA alpha must be positive, got {self.alpha!r} (try 2 x rank)")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ConfigError(f"LoRA targets {unknown or '(none)'}: choose among {', '.join(TARGETS)}")
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in self.targets))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoraKernel:
    """A frozen kernel ``base [in, out]`` (an array or a QuantizedMatrix) with an adapter: ``x base + scale (x a) b``."""

    base: Any
    a: Array  # [in, r]
    b: Array  # [r, out]
    scale: float = field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.a.shape[0], self.b.shape[1])

    def dot(self, x: Array, policy: Policy) -> Array:  # x [..., in] -> [..., out]
        low = dense(x, self.a, policy)  # [..., r]
        return dense(x, self.base, policy) + self.scale * dense(low, self.b, policy)


def targeted(params: Params, config: LoraConfig) -> dict[str, tuple[int, int]]:
    """{canonical name: (in, out)} of the kernels that get an adapter."""
    shapes = {}
    for path, var in nnx.to_flat_state(params.state):
        name = param_name(path)
        if name.startswith("layers.") and name.rsplit(".", 1)[-1] in config.targets:
            w = var.get_value()
            shapes[name] = tuple(w.shape) if isinstance(w, jax.Array) else tuple(w.shape[::-1])
    return shapes


def init_adapter(params: Params, config: LoraConfig, key: Array | int = 0, dtype=jnp.float32) -> Adapter:
    """A fresh adapter: ``a`` random (Kaiming-uniform, as in the paper's code), ``b`` zero, so the model is unchanged."""
    key = jax.random.key(key) if isinstance(key, int) else key
    adapter = {}
    for i, (name, (n_in, n_out)) in enumerate(sorted(targeted(params, config).items())):
        bound = 1.0 / np.sqrt(n_in)
        a = jax.random.uniform(jax.random.fold_in(key, i), (n_in, config.rank), dtype, -bound, bound)
        adapter[name] = {"a": a, "b": jnp.zeros((config.rank, n_out), dtype)}
    return adapter


def check_adapter(params: Params, adapter: Adapter, config: LoraConfig, source: str = "adapter") -> None:
    """Every adapted kernel exists in the model with matching shapes, else a ConfigError naming it."""
    shapes = targeted(params, config)
    missing, extra = sorted(set(shapes) - set(adapter)), sorted(set(adapter) - set(shapes))
    if missing or extra:
        raise ConfigError(
            f"{source} does not fit {params.config.name}: "
            + (f"no adapter for {missing[:3]}... " if missing else "")
            + (f"adapters for kernels the model lacks {extra[:3]}... " if extra else "")
            + "(was it trained on another model, or with other --targets?)"
        )
    for name, (n_in, n_out) in shapes.items():
        a, b = adapter[name]["a"], adapter[name]["b"]
        if tuple(a.shape) != (n_in, config.rank) or tuple(b.shape) != (config.rank, n_out):
            raise ConfigError(
                f"{source}: {name} has a {tuple(a.shape)} and b {tuple(b.shape)}; "
                f"{params.config.name} with rank {config.rank} needs {(n_in, config.rank)} and {(config.rank, n_out)}"
            )


def _replace_kernels(params: Params, fn) -> Params:
    flat = [(p, var.replace(fn(param_name(p), var.get_value()))) for p, var in nnx.to_flat_state(params.state)]
    return Params(params.graphdef, nnx.from_flat_state(flat))


def apply(params: Params, adapter: Adapter, config: LoraConfig) -> Params:
    """The parameter tree with every targeted kernel wrapped in a :class:`LoraKernel` (traceable: use under jit/grad)."""
    return _replace_kernels(
        params,
        lambda name, w: LoraKernel(w, adapter[name]["a"], adapter[name]["b"], config.scale) if name in adapter else w,
    )


def merge(params: Params, adapter: Adapter, config: LoraConfig) -> Params:
    """Float parameters with the adapters folded in: ``W + scale * a @ b`` (same outputs, the base model's speed)."""
    if params.quant:
        raise ConfigError(
            f"cannot merge an adapter into {params.quant}-quantized weights: load the float model (without --quant), "
            "merge, then quantize the merged model if you want it smaller"
        )
    check_adapter(params, adapter, config)

    def fold(name, w):
        if name not in adapter:
            return w
        delta = jnp.matmul(adapter[name]["a"], adapter[name]["b"], precision=jax.lax.Precision.HIGHEST)
        return (w.astype(jnp.float32) + config.scale * delta.astype(jnp.float32)).astype(w.dtype)

    return _replace_kernels(params, fold)


def n_trainable(adapter: Adapter) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(adapter))


# --------------------------------------------------------------------------------------------------
# On disk
# --------------------------------------------------------------------------------------------------


def save(folder: str | os.PathLike, adapter: Adapter, config: LoraConfig, base: str = "", extra: dict | None = None):
    """Write ``adapter.safetensors`` and ``adapter.json`` into ``folder`` (created)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{name}.{part}": np.asarray(m[part]) for name, m in adapter.items() for part in ("a", "b")}
    save_file(tensors, str(folder / "adapter.safetensors"))
    meta = {"format": "jaxlab-lora", "version": FORMAT_VERSION, "base": base, **asdict(config), **(extra or {})}
    (folder / "adapter.json").write_text(json.dumps(meta, indent=1))


def load(folder: str | os.PathLike) -> tuple[Adapter, LoraConfig, dict]:
    """(adapter, config, metadata) from a folder written by :func:`save`; a clear error if it is not one."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    meta_file, weights = folder / "adapter.json", folder / "adapter.safetensors"
    if not meta_file.is_file() or not weights.is_file():
        raise ModelFileError(
            f"{folder} is not a LoRA adapter folder (it needs adapter.json and adapter.safetensors, "
            "as written by `jaxlab finetune --out DIR`)"
        )
    try:
        meta = json.loads(meta_file.read_text())
        config = LoraConfig(rank=int(meta["rank"]), alpha=float(meta["alpha"]), targets=tuple(meta["targets"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{meta_file}: not a jaxlab adapter description ({e}); write it with `jaxlab finetune`")
    if meta.get("format") != "jaxlab-lora" or meta.get("version") != FORMAT_VERSION:
        raise ModelFileError(
            f"{meta_file}: format {meta.get('format')} v{meta.get('version')}, jaxlab reads "
            f"jaxlab-lora v{FORMAT_VERSION}"
        )
    adapter: Adapter = {}
    for key, value in load_file(str(weights)).items():
        name, part = key.rsplit(".", 1)
        adapter.setdefault(name, {})[part] = jnp.asarray(value)
    return adapter, config, meta


def merge_folder(params: Params, folder: str | os.PathLike) -> Params:
    """``params`` with the adapter saved in ``folder`` merged in; a clear error if it was trained on another model."""
    adapter, config, meta = load(folder)
    if meta.get("base") and meta["base"] != params.config.name:
        raise ConfigError(f"{folder} was trained on {meta['base']}, not {params.config.name}: load that model")
    check_adapter(params, adapter, config, source=str(folder))
    return merge(params, adapter, config)
