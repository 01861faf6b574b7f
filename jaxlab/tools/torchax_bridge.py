"""The first road of bringing a model up on JAX: the PyTorch model itself, run as JAX through torchax.

torchax gives every ``torch`` operation a JAX implementation, so a ``torch.nn.Module`` called on torchax tensors
*traces* into a JAX program: ``jax.jit`` compiles it like any JAX function. Here the model is ``transformers``'
SmolLM2 loaded from the lab's GGUF (:func:`jaxlab.tools.reference.load_reference`), unchanged:

* :func:`import_torchax` imports torchax 0.0.13 under torch 2.13. torchax still names about twenty named-tensor
  overloads (``aten.prod.dim_Dimname``, ``aten.unbind.Dimname``, ...) that torch 2.13 removed, and its import fails
  on the first; while it imports and builds its environment, a missing overload whose name marks it as named-tensor
  comes back as a placeholder no dispatch ever matches (:func:`missing_overloads` lists them). Any other missing
  overload still raises, so a real incompatibility is not hidden.
* :func:`bridge` wraps the model once: its weights become a dict of JAX arrays (``torchax.interop.JittableModule``,
  the tied embedding kept once) and its forward a pure function of (weights, inputs), jitted.
* :func:`prefill_logits` is the plain forward pass, jitted: logits [T, V] of a prompt (the parity check).
* :func:`greedy` is jitted greedy generation with ``transformers``' own ``StaticCache``: its per-layer key and value
  tensors [B, KVH, S, Hd] are passed in and returned as JAX arrays (the cache donated), so the cache has a fixed
  shape and one decode program serves every token, as jaxlab's own decode step does.
* :func:`hlo_summary` lowers torchax's decode step and jaxlab's (:data:`jaxlab.engine.steps.jit_decode`) for the
  same cache length and reports each StableHLO program's size and cache argument: what each hands XLA to compile.

torch, transformers and torchax are imported only inside the functions (``pip install "jaxlab[test]"``). Importing
torchax changes two of torch's process-wide settings: the ``privateuse1`` device is renamed "jax" and
``nn.MultiheadAttention``'s fast path is switched off.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from jaxlab.errors import JaxlabError

#: What marks an overload as named-tensor (dimension names): the only kind :func:`import_torchax` maps away.
NAMED_TENSOR = re.compile(r"dimname|names", re.IGNORECASE)

INSTALL = 'pip install "jaxlab[test]" (make test installs it; it pins torch==2.13.0 and torchax==0.0.13)'


class TorchaxMissingError(JaxlabError, ImportError):
    """torch or torchax is not installed; the message says how to install them."""


class _AbsentOverload:
    """Stands for an overload torch no longer has: torchax may register it, nothing ever dispatches to it."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<overload {self.name} absent from this torch>"

    def __eq__(self, other) -> bool:
        return isinstance(other, _AbsentOverload) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("absent overload", self.name))


_LOCK = threading.Lock()
_IMPORTED: dict[str, Any] = {}  # "torchax": the module, "env": its default environment, "missing": [names]


def import_torchax():
    """(torchax, its default environment), imported once per process; see the module docstring for the shim.

    Raises :class:`TorchaxMissingError` naming the install command when torch or torchax is absent."""
    with _LOCK:
        if not _IMPORTED:
            _IMPORTED.update(_import_with_shim())
        return _IMPORTED["torchax"], _IMPORTED["env"]


def missing_overloads() -> list[str]:
    """The overloads torchax named that this torch lacks, each once, in the order asked ("aten::unbind.Dimname")."""
    import_torchax()
    return list(_IMPORTED["missing"])


def _import_with_shim() -> dict:
    try:
        import torch
    except ImportError as e:
        if e.name != "torch":  # torch is there, something it needs is not: its own error says what
            raise
        raise TorchaxMissingError(f"jaxlab's torchax bridge needs torch, which is not installed: {INSTALL}") from e
    packet = type(torch.ops.aten.add)  # torch._ops.OpOverloadPacket, reached without a private name
    original = packet.__getattr__
    missing: list[str] = []

    def getattr_or_absent(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if key.startswith("__") or not NAMED_TENSOR.search(key):
                raise
            name = f"{str(self).replace('.', '::', 1)}.{key}"
            if name not in missing:
                missing.append(name)
            return _AbsentOverload(name)

    packet.__getattr__ = getattr_or_absent
    try:
        import torchax
    except ImportError as e:
        if e.name != "torchax":
            raise
        raise TorchaxMissingError(f"jaxlab's torchax bridge needs torchax, which is not installed: {INSTALL}") from e
    else:
        env = torchax.default_env()  # builds the op table: the rest of the missing names are asked here
    finally:
        packet.__getattr__ = original
    return {"torchax": torchax, "env": env, "missing": missing}


# --------------------------------------------------------------------------------------------------
# The transformers model as a JAX function
# --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class TorchaxModel:
    """A ``transformers`` causal LM made JAX by torchax: its weights as JAX arrays and its jitted programs.

    Made by :func:`bridge` (once per model). The torch model keeps its own weights; ``weights`` is a copy."""

    model: Any  # the transformers model (torch, CPU), never changed
    env: Any  # torchax's environment
    module: Any  # torchax.interop.JittableModule of the model: functional calls with given weights
    weights: tuple[dict, dict]  # (parameters, buffers): name -> jax.Array, the tied embedding once
    forward: Any  # jitted (weights, ids [B, T]) -> logits [B, T, V]
    step: Any  # jitted (weights, ids [B, T], cache) -> (next [B] int32, logits [B, V], cache); the cache donated
    config: Any = field(init=False)

    def __post_init__(self):
        self.config = self.model.config

    @property
    def head_dim(self) -> int:
        cfg = self.config
        return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


#: model -> its TorchaxModel, for the life of the process (the bridge holds the model, so it would outlive a weak key)
_BRIDGES: dict = {}


def bridge(model) -> TorchaxModel:
    """The :class:`TorchaxModel` of a ``transformers`` model (from :func:`jaxlab.tools.reference.load_reference`),
    built once per model and kept: the weights are copied once and each program compiled once per shape."""
    if model not in _BRIDGES:
        _BRIDGES[model] = _build(model)
    return _BRIDGES[model]


def _build(model) -> TorchaxModel:
    _, env = import_torchax()  # first: torchax's own modules import only behind the shim
    import jax
    import torch
    from torchax import interop
    from transformers import StaticCache

    with warnings.catch_warnings():  # JittableModule reads every attribute, deprecated properties included
        warnings.simplefilter("ignore", FutureWarning)
        module = interop.JittableModule(model)
    weights = (env.t2j_copy(module.params), env.t2j_copy(module.buffers))

    def forward(weights, ids):
        params, buffers, ids = env.j2t_iso((*weights, ids))
        with env, torch.no_grad():
            out = module.functional_call("forward", params, buffers, input_ids=ids, use_cache=False)
        return env.t2j_iso(out.logits)

    def cached(model, ids, keys, values, length):
        """``model`` on ids [B, T] at positions length .. length + T - 1, with a StaticCache holding ``keys``,
        ``values`` (per layer [B, KVH, S, Hd]) and ``length`` tokens; the layers update them in place."""
        cache = StaticCache(config=model.config, max_cache_len=keys[0].shape[2])
        for layer, k, v in zip(cache.layers, keys, values):
            layer.keys, layer.values = k, v
            layer.cumulative_length = length.clone()  # each layer adds T to its own count
            layer.device, (layer.batch_size, layer.num_heads) = k.device, k.shape[:2]
            layer.k_head_dim = layer.v_head_dim = k.shape[-1]
            layer.is_initialized = True
        positions = (torch.arange(ids.shape[1], device=ids.device) + length)[None].expand(ids.shape[0], -1)
        out = model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True)
        logits = out.logits[:, -1]  # [B, V]
        new = {
            "keys": tuple(layer.keys for layer in cache.layers),
            "values": tuple(layer.values for layer in cache.layers),
            "length": cache.layers[0].cumulative_length,
        }
        return logits.argmax(-1).to(torch.int32), logits, new

    def step(weights, ids, cache):
        params, buffers, ids, cache = env.j2t_iso((*weights, ids, cache))
        with env, torch.no_grad():
            out = module.functional_call(cached, params, buffers, ids, cache["keys"], cache["values"], cache["length"])
        return env.t2j_iso(out)

    return TorchaxModel(
        model=model,
        env=env,
        module=module,
        weights=weights,
        forward=jax.jit(forward),
        step=jax.jit(step, donate_argnums=(2,)),
    )


def init_cache(tx: TorchaxModel, batch: int, length: int) -> dict:
    """An empty StaticCache state: {"keys", "values": per layer [B, KVH, S, Hd] float32, "length": int32 []}."""
    import jax.numpy as jnp

    cfg = tx.config
    shape = (batch, cfg.num_key_value_heads, length, tx.head_dim)
    layers = range(cfg.num_hidden_layers)
    return {
        "keys": tuple(jnp.zeros(shape, jnp.float32) for _ in layers),
        "values": tuple(jnp.zeros(shape, jnp.float32) for _ in layers),
        "length": jnp.zeros((), jnp.int32),
    }


def prefill_logits(tx: TorchaxModel, ids: Sequence[int]) -> np.ndarray:
    """Logits [T, V] float32 of one prompt, the model's forward pass jitted through torchax (no cache)."""
    import jax.numpy as jnp

    return np.asarray(tx.forward(tx.weights, jnp.asarray([list(ids)], jnp.int32))[0])


def cache_length(prompt_len: int, new_tokens: int) -> int:
    """The cache length jaxlab's generator would choose (:func:`jaxlab.engine.plan.bucket` of
    :data:`~jaxlab.engine.plan.CACHE_BUCKETS`): both roads then run the same shapes."""
    from jaxlab.engine.plan import CACHE_BUCKETS, bucket

    return bucket(prompt_len + new_tokens, CACHE_BUCKETS)


@dataclass
class TorchaxRun:
    """One greedy generation through torchax, timed as :class:`~jaxlab.engine.generate.Generator` times its own:
    the host reads every token, so each step ends synchronized."""

    tokens: list[int]  # the new tokens (EOS ignored)
    prefill_s: float  # the prompt in, the first token on the host
    decode_s: float  # the remaining len(tokens) - 1 steps
    cache_len: int

    @property
    def decode_s_per_token(self) -> float:
        return self.decode_s / max(len(self.tokens) - 1, 1)


def greedy(tx: TorchaxModel, prompt_ids: Sequence[int], new_tokens: int, cache_len: int | None = None) -> TorchaxRun:
    """``new_tokens`` greedy tokens after one prompt (EOS ignored): the prompt in one prefill program ([1, T]), then
    one decode program ([1, 1]) per token, the StaticCache carried between them as JAX arrays.

    The first call for a prompt length (and the first decode) compiles; :class:`TorchaxRun` times only the run
    when the programs are known (call twice to time a warmed-up run)."""
    import jax.numpy as jnp

    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1, got {new_tokens}")
    cache_len = cache_len or cache_length(len(prompt_ids), new_tokens)
    cache = init_cache(tx, 1, cache_len)
    ids = jnp.asarray([list(prompt_ids)], jnp.int32)
    t0 = time.perf_counter()
    nxt, _, cache = tx.step(tx.weights, ids, cache)
    tokens = [int(nxt[0])]
    t1 = time.perf_counter()
    for _ in range(new_tokens - 1):
        nxt, _, cache = tx.step(tx.weights, nxt[:, None], cache)
        tokens.append(int(nxt[0]))  # the host reads each token, as a streaming loop must
    t2 = time.perf_counter()
    return TorchaxRun(tokens, t1 - t0, t2 - t1, cache_len)


# --------------------------------------------------------------------------------------------------
# What each road compiles
# --------------------------------------------------------------------------------------------------


_OP = re.compile(r"(?<![\w.@])((?:stablehlo|chlo)\.[a-z_]+)(?=[ (<{])")
_NAME = r'@("[^"\n]*"|[\w.$-]+)'  # a symbol: @main, @block, @"<lambda>"
_FUNC = re.compile(r"^\s*func\.func\s+(?:(?:public|private)\s+)?" + _NAME)
_CALL = re.compile(r"(?<![\w.])(?:func\.)?call\s+" + _NAME)


def stablehlo_size(text: str) -> dict:
    """Size of a StableHLO module: ``ops``, the ops its program runs (``stablehlo.*``, ``chlo.*``; a function called
    n times counts n times, as XLA inlines its calls: a model whose 30 blocks are one traced function, called 30
    times, counts its block 30 times), ``written_ops`` as they stand in the text, its functions and calls, characters
    and lines, and the most frequent op kinds (as run)."""
    own: dict[str, Counter] = {}
    calls: dict[str, Counter] = {}
    name = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            name = m.group(1)
            own[name], calls[name] = Counter(), Counter()
        elif name is not None:
            own[name].update(_OP.findall(re.sub(r'"[^"\n]*"', '""', line)))  # names and metadata in quotes: no ops
            calls[name].update(_CALL.findall(line))
    runs: dict[str, Counter] = {}

    def run(f: str) -> Counter:  # the ops one call of f runs, its callees expanded
        if f not in runs:
            total = Counter(own[f])
            for g, n in calls[f].items():
                for op, k in run(g).items():
                    total[op] += n * k
            runs[f] = total
        return runs[f]

    ran = run("main" if "main" in own else next(iter(own))) if own else Counter()
    return {
        "ops": sum(ran.values()),
        "written_ops": sum(sum(c.values()) for c in own.values()),
        "functions": len(own),
        "calls": sum(sum(c.values()) for c in calls.values()),
        "chars": len(text),
        "lines": text.count("\n") + 1,
        "top_ops": dict(ran.most_common(8)),
    }


def describe_leaves(tree) -> list[str]:
    """One line per group of same-named, same-shaped leaves of a pytree: "keys: 30 x float32[1, 3, 256, 64]"."""
    import jax

    groups: Counter = Counter()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = re.sub(r"\[\d+\]", "", jax.tree_util.keystr(path)).strip(".[]'\"") or "value"
        groups[(name, f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}")] += 1
    return [f"{name}: {n} x {shape}" if n > 1 else f"{name}: {shape}" for (name, shape), n in groups.items()]


def hlo_summary(tx: TorchaxModel, params, cache_len: int = 256) -> dict:
    """The decode step of each road lowered to StableHLO for one row and ``cache_len`` slots: torchax's
    (``tx.step``, ids [1, 1]) and jaxlab's (:data:`~jaxlab.engine.steps.jit_decode`, greedy, with ``params`` of
    the same model). -> {"torchax": ..., "jaxlab": ...}, each {"ops", "functions", "chars", "lines", "top_ops"
    (:func:`stablehlo_size`), "cache": :func:`describe_leaves` of its cache argument, "donated": whether the
    cache's buffers are donated (updated in place)}. Both are XLA's programs: jaxlab's is lowered without its CPU
    kernels (:func:`~jaxlab.engine.kernels.cpu.xla_only`), whose calls would stand for its matmuls and attention.
    Lowering traces; it compiles nothing."""
    import jax.numpy as jnp

    from jaxlab.engine.kernels import cpu as cpu_kernels
    from jaxlab.engine.kvcache import init_cache as jaxlab_cache
    from jaxlab.engine.steps import GREEDY, jit_decode

    out = {}
    cache = init_cache(tx, 1, cache_len)
    lowered = tx.step.lower(tx.weights, jnp.zeros((1, 1), jnp.int32), cache)
    out["torchax"] = _program(lowered, cache, lowered.args_info[0][2])

    native = jaxlab_cache(params.config, 1, cache_len, params.policy.jnp_dtype)
    one = jnp.zeros((1,), jnp.int32)
    with cpu_kernels.xla_only():
        lowered = jit_decode.lower(params, one, one, native, None, GREEDY)
    out["jaxlab"] = _program(lowered, native, lowered.args_info[0][3])
    return out


def _program(lowered, cache, cache_info) -> dict:
    import jax

    donated = [info.donated for info in jax.tree_util.tree_leaves(cache_info)]
    return {
        **stablehlo_size(lowered.as_text()),
        "cache": describe_leaves(cache),
        "donated": bool(donated) and all(donated),
    }
