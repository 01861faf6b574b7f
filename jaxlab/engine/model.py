"""The Llama-family decoder in Flax NNX, and the pure step built from it.

* RMSNorm (computed in float32, as the reference does)
* rotary position embeddings (RoPE), "rotate half" layout as in Hugging Face ``transformers``
* grouped-query attention: ``n_heads`` query heads share ``n_kv_heads`` key/value heads
* SwiGLU feed-forward
* tied input/output embeddings (SmolLM2), or a separate ``lm_head``

One implementation serves everything: the NNX modules below hold the computation, and
:func:`forward` is the pure function ``forward(params, tokens, positions, cache) -> (logits, cache)``
obtained from them by ``nnx.split``/``nnx.merge`` — usable under ``jit``, ``vmap``, sharding and export.

Two hooks change the pass without a second copy of the layer loop:

* ``upto=L`` runs only the first ``L`` layers, then the final norm and the output head: the model cut
  early, the draft of speculative decoding; ``upto=(L1, L2, ...)`` reads the head after each of those
  layers in one pass (the probe of :func:`jaxlab.lab.speculation.early_exit_agreement`);
* ``reduce`` is applied to the outputs of the two row-parallel matmuls of every block (attention's ``wo``,
  the MLP's ``w_down``) before they join the residual stream: a tensor-parallel ``shard_map`` passes
  ``lambda x: jax.lax.psum(x, "model")`` to add the devices' partial sums (:mod:`jaxlab.engine.sharding`).

Positions carry the padding: a token at position ``< 0`` is padding. Attention lets a query at
position ``p`` see every key whose position is in ``[0, p]``, so left-padded batches, chunked prefill
and cached decoding all use one rule (see :mod:`jaxlab.engine.kvcache`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.engine import hugepages
from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kernels.common import compute_capability, gpu_too_old, rows_alike
from jaxlab.engine.kvcache import KVCache, KVLayer
from jaxlab.engine.paged import PagedKVCache
from jaxlab.errors import ConfigError, FallbackWarning
from jaxlab.io.config import DTYPES, LlamaConfig
from jaxlab.quant.formats import QuantizedMatrix, params_format

Array = jax.Array
Reduce = Callable[[Array], Array]  # applied to the row-parallel matmuls' outputs [B, T, D]


# --------------------------------------------------------------------------------------------------
# dtype and matmul-precision policy
# --------------------------------------------------------------------------------------------------

PRECISIONS = {
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}
#: How attention is computed: "xla" (jnp operations XLA compiles) or "pallas" (the kernels of
#: :mod:`jaxlab.engine.kernels`: flash attention over the contiguous cache, ragged paged attention over pages)
ATTENTIONS = ("xla", "pallas")


@dataclass(frozen=True)
class Policy:
    """How the model stores and computes: parameter/activation dtype, matmul precision, attention kernel.

    ``dtype`` is what the weights are stored in and what every matmul takes as inputs; the matmuls sum
    and return float32 (``preferred_element_type``), and the residual stream, norms, RoPE, softmax and
    logits are float32 under every policy. ``precision`` is passed to every matmul explicitly,
    so results do not depend on a global flag: on TPU, "default" float32 matmuls run in bfloat16
    passes and on recent GPUs in TF32, either of which breaks float32 parity with the reference.
    ``attention`` is one of :data:`ATTENTIONS` (:func:`with_attention` switches a loaded model).
    """

    dtype: str = "float32"
    precision: str = "highest"
    attention: str = "xla"

    def __post_init__(self):
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise ConfigError('the "float64" policy needs 64-bit JAX: jax.config.update("jax_enable_x64", True) first')
        if self.dtype not in DTYPES and self.dtype != "float64":
            raise ConfigError(f"unknown dtype {self.dtype!r}; choose one of {sorted(DTYPES)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown matmul precision {self.precision!r}; choose one of {sorted(PRECISIONS)}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTIONS)}")

    @property
    def jnp_dtype(self):
        return jnp.float64 if self.dtype == "float64" else DTYPES[self.dtype]

    @property
    def lax_precision(self):
        return PRECISIONS[self.precision]

    @property
    def acc_dtype(self):
        """What matmuls sum in and what the residual stream, norms, RoPE, softmax and logits are computed in:
        float32, or float64 under the "float64" policy (gradient checks with ``jax_enable_x64``)."""
        return jnp.float64 if self.dtype == "float64" else jnp.float32

    def matmul(self, spec: str, a: Array, b: Array) -> Array:
        """:func:`matmul` under this policy: what the cache layers' attention calls (``KVLayer.attend``)."""
        return matmul(spec, a, b, self)


BF16_MIN_COMPUTE_CAPABILITY = (8, 0)  # Ampere (A100, sm 80) and later have bfloat16 tensor cores

#: ``JAXLAB_ACCELERATOR_PROXY=tpu`` on a CPU process: the accelerator proxy. Everything that follows the backend's
#: numerics (``dtype="auto"``, the golden criteria, the notebooks' backend-aware checks) acts as on a TPU, while
#: XLA:CPU computes: bfloat16 weights and activations, the statistical criteria. It runs a TPU's branch of every
#: notebook on a machine without one (``make test-proxy``); the speed of a TPU it cannot give. A real accelerator
#: outranks it (on a TPU or GPU backend the variable is ignored).
PROXY_ENV = "JAXLAB_ACCELERATOR_PROXY"
PROXIES = ("tpu",)


def proxy_backend() -> str | None:
    """The accelerator whose numerics this CPU process takes (:data:`PROXY_ENV`), or None."""
    value = os.environ.get(PROXY_ENV, "").strip().lower()
    if not value:
        return None
    if value not in PROXIES:
        raise ConfigError(f"{PROXY_ENV}={value!r} is not a proxy this lab has; set it to tpu, or unset it")
    return value if jax.default_backend() == "cpu" else None


def numerics_backend() -> str:
    """The backend whose numerics this process follows: the proxy's (:func:`proxy_backend`), else jax's."""
    return proxy_backend() or jax.default_backend()


def backend_numerics(backend: str | None = None, device: Any = None) -> dict:
    """The default numerics of a backend, and why: {"backend", "dtype", "precision", "reason"}.

    * cpu: float32 at "highest" precision, the parity path (logits within 1e-4 of the reference);
    * tpu: bfloat16 weights and activations (the MXU's native input; it accumulates in float32);
    * gpu: bfloat16 from compute capability 8.0 (A100, L4, H100: bfloat16 tensor cores), else float32.
      A T4 (sm 7.5) has float16 but no bfloat16 tensor cores; float16 might be faster there, but it is
      unmeasured in this lab and overflows more easily, so a T4 keeps float32 (parity) until measured.

    ``device`` (default ``jax.devices()[0]``) is read for its platform and compute capability;
    ``backend`` overrides the platform (tests pass fake devices and backends); with neither, the accelerator
    proxy (:data:`PROXY_ENV`) counts as its TPU."""
    proxy = proxy_backend() if backend is None and device is None else None
    if backend is None:
        backend = getattr(device, "platform", None) if device is not None else numerics_backend()
    backend = {"cuda": "gpu", "rocm": "gpu"}.get(str(backend).lower(), str(backend).lower())
    if backend == "tpu":
        dtype, reason = "bfloat16", "TPU: bfloat16 is the MXU's native input (float32 accumulation)"
        if proxy:
            reason += f"; the accelerator proxy on XLA:CPU ({PROXY_ENV}=tpu), not a TPU"
    elif backend == "gpu":
        if device is None:
            devices = jax.devices() if jax.default_backend() == "gpu" else []
            device = devices[0] if devices else None
        cc = compute_capability(device)
        if cc is not None and cc >= BF16_MIN_COMPUTE_CAPABILITY:
            dtype, reason = "bfloat16", f"GPU sm {cc[0]}{cc[1]}: bfloat16 tensor cores (float32 accumulation)"
        elif cc is not None:
            dtype, reason = (
                "float32",
                f"GPU sm {cc[0]}{cc[1]} < 80: no bfloat16 tensor cores; float32 (float16 unmeasured)",
            )
        else:
            dtype, reason = "float32", "GPU of unknown compute capability: float32 (the parity path)"
    else:
        dtype, reason = "float32", f"{backend}: float32 at highest precision (the parity path)"
    return {"backend": backend, "dtype": dtype, "precision": default_policy(dtype).precision, "reason": reason}


def backend_default_dtype(backend: str | None = None, device: Any = None) -> str:
    """What ``dtype="auto"`` means here: "float32" or "bfloat16" (see :func:`backend_numerics`)."""
    return backend_numerics(backend, device)["dtype"]


def default_policy(dtype: str = "float32", backend: str | None = None) -> Policy:
    """The per-backend default: float32 runs at "highest" precision everywhere (parity first);
    bfloat16 runs at "default" precision, which is already exact for bfloat16 inputs.
    ``dtype="auto"`` is the backend's default dtype (:func:`backend_default_dtype`)."""
    if dtype == "auto":
        dtype = backend_default_dtype(backend)
    if dtype == "float32":
        return Policy(dtype, "highest")
    return Policy(dtype, "default")


# --------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------


def matmul(spec: str, a: Array, b: Array, policy: Policy) -> Array:
    """``einsum(spec, a, b)`` as every float matmul of the model runs: the inputs in the policy's dtype, at its
    precision, the sums and the output in float32 (under bfloat16, 8-bit scores or logits would turn
    near-ties into coin flips)."""
    dt = policy.jnp_dtype
    return jnp.einsum(
        spec, a.astype(dt), b.astype(dt), precision=policy.lax_precision, preferred_element_type=policy.acc_dtype
    )


def dense(x: Array, kernel: Array | Any, policy: Policy) -> Array:
    """The linear layer: x [..., I] times a kernel [I, O] -> [..., O] float32 (float64 under that policy).

    The one hook of the model's linear layers: a kernel that is not an array is an object with
    ``dot(x, policy)``, which the layer calls instead of the matmul: a quantized matrix
    (:class:`jaxlab.quant.QuantizedMatrix`), or a frozen kernel with a low-rank adapter beside it
    (:class:`jaxlab.train.lora.LoraKernel`). A float32 decode step's few rows lowered for a CPU run on jaxlab's own
    kernel (:func:`jaxlab.engine.kernels.cpu.f32_matmul`: each row's sums in one order whatever the row count)."""
    if not isinstance(kernel, jax.Array):
        return kernel.dot(x, policy).astype(policy.acc_dtype)
    rows = math.prod(x.shape[:-1]) if all(isinstance(d, int) for d in x.shape) else None  # None: symbolic (export)
    if policy.dtype == "float32" and x.dtype == kernel.dtype == jnp.float32 and cpu_kernels.uses_f32_matmul(rows):
        xla = functools.partial(matmul, "ri,io->ro", policy=policy)
        y = cpu_kernels.on_cpu(cpu_kernels.f32_matmul, xla)(x.reshape(rows, x.shape[-1]), kernel)
        return y.reshape(*x.shape[:-1], kernel.shape[-1])
    return matmul("...i,io->...o", x, kernel, policy)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, policy: Policy):
        self.weight = nnx.Param(jnp.ones((dim,), policy.jnp_dtype))
        self.eps = eps
        self.policy = policy

    def __call__(self, x: Array) -> Array:  # [..., D] -> [..., D]
        x32 = x.astype(self.policy.acc_dtype)
        # the mean of squares as XLA:CPU computes a large array's rows, so a row's norm is the same in every batch
        ms = rows_alike(lambda r: jnp.mean(r * r, axis=-1, keepdims=True), x32)
        y = x32 * jax.lax.rsqrt(ms + self.eps)
        return self.weight.astype(x.dtype) * y.astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """Inverse frequencies 1 / theta^(2i/d), i = 0 .. d/2-1."""
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def rope_cos_sin(positions: Array, head_dim: int, theta: float, dtype=jnp.float32) -> tuple[Array, Array]:
    """cos and sin tables for integer positions [B, T] -> two [B, T, head_dim] float32 (or ``dtype``) arrays."""
    inv_freq = jnp.asarray(rope_frequencies(head_dim, theta), dtype)
    angles = positions.astype(dtype)[..., None] * inv_freq  # [B, T, d/2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [B, T, d]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate x [B, T, ..., d] by position: x*cos + rotate_half(x)*sin ("rotate half" layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    extra = x.ndim - cos.ndim  # broadcast over head axes
    cos = cos.reshape(cos.shape[:2] + (1,) * extra + cos.shape[2:])
    sin = sin.reshape(sin.shape[:2] + (1,) * extra + sin.shape[2:])
    x32 = x.astype(cos.dtype)
    return (x32 * cos + rotated.astype(cos.dtype) * sin).astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with an optional KV cache."""

    def __init__(self, cfg: LlamaConfig, policy: Policy, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        d, h, kvh, hd = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        dt = policy.jnp_dtype
        self.wq = nnx.Param(init(rngs.params(), (d, h * hd), dt))
        self.wk = nnx.Param(init(rngs.params(), (d, kvh * hd), dt))
        self.wv = nnx.Param(init(rngs.params(), (d, kvh * hd), dt))
        self.wo = nnx.Param(init(rngs.params(), (h * hd, d), dt))
        self.cfg = cfg
        self.policy = policy

    def __call__(self, x, positions, cos, sin, cache=None):
        # x [B, T, D]; positions [B, T]; cache: this layer's KV cache (KVCache.layer(i): float or int8;
        # PagedKVCache.layer(i): pages) or None -> (output [B, T, D], the layer's cache after the write, or None)
        cfg, pol = self.cfg, self.policy
        b, t, _ = x.shape
        q = dense(x, self.wq.get_value(), pol).reshape(b, t, cfg.n_kv_heads, cfg.q_per_kv, cfg.head_dim)
        k = dense(x, self.wk.get_value(), pol).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        v = dense(x, self.wv.get_value(), pol).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # one path for every cache kind: the layer holds the "int8 or not", "paged or not", "XLA or Pallas" choice
        layer = KVLayer.of(k, v, positions) if cache is None else cache.write(k, v, positions)
        out = layer.attend(q, positions, pol)  # [B, T, H*Hd]
        return dense(out.astype(x.dtype), self.wo.get_value(), pol), (None if cache is None else layer)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig, policy: Policy, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        dt = policy.jnp_dtype
        self.w_gate = nnx.Param(init(rngs.params(), (cfg.dim, cfg.ffn_dim), dt))
        self.w_up = nnx.Param(init(rngs.params(), (cfg.dim, cfg.ffn_dim), dt))
        self.w_down = nnx.Param(init(rngs.params(), (cfg.ffn_dim, cfg.dim), dt))
        self.policy = policy

    def __call__(self, x: Array) -> Array:  # [B, T, D] -> [B, T, D]
        pol = self.policy
        gate = dense(x, self.w_gate.get_value(), pol)
        up = dense(x, self.w_up.get_value(), pol)
        return dense(jax.nn.silu(gate) * up, self.w_down.get_value(), pol)


class Block(nnx.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig, policy: Policy, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, policy)
        self.attn = Attention(cfg, policy, rngs)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps, policy)
        self.mlp = MLP(cfg, policy, rngs)

    def __call__(self, x, positions, cos, sin, cache=None, reduce: Reduce | None = None):
        # reduce: what joins the row-parallel outputs before the residual add (psum under tensor parallelism)
        # named scopes: a profile (tools.profile) and the compiled program's op names read
        # layerN/jit(block)/attention/... (a traced pass calls each block through block_program)
        reduce = reduce or _identity
        with jax.named_scope("attention"):
            h, cache = self.attn(self.attn_norm(x), positions, cos, sin, cache)
            x = x + reduce(h)
        with jax.named_scope("mlp"):
            x = x + reduce(self.mlp(self.mlp_norm(x)))
        return x, cache


def _identity(x: Array) -> Array:
    return x


def block_program() -> Callable:
    """A decoder block as a nested ``jit``, for one traced pass. The blocks of a model share one structure and
    one set of shapes, so the pass's 30 calls share one trace and one lowered function (a ``call`` per layer, which
    XLA inlines: the compiled program is the same as a Python loop's), traced and lowered in a fraction of the time.
    Made anew for each pass, so nothing is cached across passes: a new trace reads the module's globals afresh, as
    the loop does. An eager pass keeps the loop (one operation at a time, as eager code runs)."""

    def block(graphdef, state, x, positions, cos, sin, kv, reduce):
        return nnx.merge(graphdef, state)(x, positions, cos, sin, kv, reduce)

    return jax.jit(block, static_argnames=("graphdef", "reduce"))


class Llama(nnx.Module):
    def __init__(self, cfg: LlamaConfig, policy: Policy | None = None, *, rngs: nnx.Rngs):
        policy = policy or default_policy()
        self.cfg = cfg
        self.policy = policy
        self.embed = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (cfg.vocab_size, cfg.dim), policy.jnp_dtype)
        )
        self.layers = nnx.List([Block(cfg, policy, rngs) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, policy)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Param(
                nnx.initializers.normal(0.02)(rngs.params(), (cfg.dim, cfg.vocab_size), policy.jnp_dtype)
            )

    def __call__(
        self,
        tokens: Array,
        positions: Array,
        cache: KVCache | PagedKVCache | None = None,
        *,
        last_only: bool = False,
        upto: int | tuple[int, ...] | None = None,
        reduce: Reduce | None = None,
        remat: bool = False,
        at: Array | None = None,
    ):
        """tokens, positions [B, T] int -> logits [B, T or 1, V] float32, updated cache.

        With a cache, the T new tokens are written at slots ``cache.index .. cache.index+T-1``; with a paged cache
        (:class:`~jaxlab.engine.paged.PagedKVCache`) each token at its own position, in its row's pages.
        ``last_only`` computes logits for the last position only (what prefill needs: with left padding
        the last position is every row's last real token). ``upto``, ``reduce``, ``remat`` and ``at``: see :func:`forward`."""
        cfg = self.cfg
        exits = check_upto(upto, cfg.n_layers)
        layers = list(self.layers)[: exits[-1]]
        if remat and cache is not None:
            raise ConfigError("remat is for training passes (no KV cache): call forward without a cache")
        if cache is not None and len(cache.k) != len(layers):
            raise ConfigError(
                f"the KV cache holds {len(cache.k)} layers but the pass runs {len(layers)}: "
                f"a cache for upto={len(layers)} is init_cache(config.replace(n_layers={len(layers)}), ...)"
            )
        dt, acc = self.policy.jnp_dtype, self.policy.acc_dtype
        embed = self.embed.get_value()
        # The residual stream, norms and element-wise work are float32 under every policy; only the matmul
        # inputs take the policy's dtype (dense). Under bfloat16 this keeps teacher-forced top-1 agreement
        # with the float32 reference at 192/192 golden positions instead of 189/192 (tests/engine/test_backend_numerics.py).
        if not isinstance(embed, jax.Array):  # quantized (jaxlab.quant)
            x = embed.rows(tokens).astype(dt).astype(acc)  # [B, T, D]
        else:
            x = jnp.take(embed, tokens, axis=0).astype(dt).astype(acc)  # [B, T, D]
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, acc)
        new_layers, early = [], []
        block = block_program() if isinstance(x, jax.core.Tracer) and not remat else None  # traced: one block trace
        for i, layer in enumerate(layers):
            with jax.named_scope(f"layer{i}"):
                kv = None if cache is None else cache.layer(i)  # a KVLayer or a PagedLayer: write, then attend
                if remat:  # keep only each layer's input for the backward pass; recompute the inside
                    x, kv = jax.checkpoint(lambda h, lyr=layer: lyr(h, positions, cos, sin, reduce=reduce))(x)
                elif block is not None:
                    x, kv = block(*nnx.split(layer), x, positions, cos, sin, kv, reduce)
                else:
                    x, kv = layer(x, positions, cos, sin, kv, reduce)
            new_layers.append(kv)
            if i + 1 in exits[:-1]:  # an early exit: this layer's output read by the final norm and head
                early.append(self.head(x, last_only, at))
        logits = self.head(x, last_only, at)
        if isinstance(upto, tuple):
            logits = (*early, logits)  # one [B, T or 1, V] per exit
        return logits, (None if cache is None else cache.with_layers(new_layers))

    def head(self, x: Array, last_only: bool = False, at: Array | None = None) -> Array:
        """The residual stream [B, T, D] -> logits [B, T (or 1 with ``last_only``, or A with ``at`` [B, A]), V] float32:
        the final norm, then the output projection (the tied embedding, or ``lm_head``)."""
        if last_only:
            x = x[:, -1:]
        elif at is not None:
            x = jnp.take_along_axis(x, at[..., None].astype(jnp.int32), axis=1)  # [B, A, D]
        x = self.norm(x)
        embed = self.embed.get_value()
        if self.cfg.tie_embeddings:
            # contract over the embedding's own minor axis: writing embed.T here made XLA transpose
            # (copy) the whole [V, D] matrix on every decode step
            if not isinstance(embed, jax.Array):
                logits = embed.dot(x)
            else:
                logits = matmul("btd,vd->btv", x, embed, self.policy)
        else:
            logits = dense(x, self.lm_head.get_value(), self.policy)
        return logits.astype(self.policy.acc_dtype)


def check_upto(upto, n_layers: int) -> tuple[int, ...]:
    """The layer counts after which a pass reads logits: ``(n_layers,)`` for None, ``(L,)`` for an int,
    the tuple itself for a tuple (strictly increasing, each in 1..n_layers); else a ConfigError."""
    if upto is None:
        return (n_layers,)
    exits = upto if isinstance(upto, tuple) else (upto,)
    ok = bool(exits) and all(not isinstance(n, bool) and int(n) == n and 1 <= n <= n_layers for n in exits)
    if not ok or list(exits) != sorted(set(exits)):
        raise ConfigError(
            f"upto={upto!r}: give a number of layers in 1..{n_layers}, or a tuple of them in increasing order"
        )
    return tuple(int(n) for n in exits)


# --------------------------------------------------------------------------------------------------
# Parameters as a pytree, and the pure step
# --------------------------------------------------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class Params:
    """The model's weights as a pytree: ``state`` (the arrays) plus the static ``graphdef`` that
    ``nnx.merge`` needs to rebuild the modules. Pass it to :func:`forward`, ``jit``, ``vmap``..."""

    def __init__(self, graphdef: Any, state: nnx.State):
        self.graphdef = graphdef
        self.state = state

    def tree_flatten(self):
        return (self.state,), self.graphdef

    @classmethod
    def tree_unflatten(cls, graphdef, children):
        return cls(graphdef, children[0])

    @property
    def config(self) -> LlamaConfig:
        return self.module().cfg

    @property
    def policy(self) -> Policy:
        return self.module().policy

    def module(self) -> Llama:
        return nnx.merge(self.graphdef, self.state)

    def flat(self) -> dict[str, Array]:
        """{"layers.0.attn.wq": array, ...}: canonical names used by the loaders and the param cache."""
        return {param_name(path): var.get_value() for path, var in nnx.to_flat_state(self.state)}

    def nbytes(self) -> int:
        return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(self.state))

    @property
    def quant(self) -> str | None:
        """The quantization format of the matrices (``jaxlab.quant``), or None for float parameters."""
        return params_format(self)

    def __repr__(self):
        cfg = self.config
        q = f", quant={self.quant}" if self.quant else ""
        return f"Params({cfg.name}, {cfg.n_params() / 1e6:.1f}M, dtype={self.policy.dtype}{q})"


def param_name(path) -> str:
    """An NNX state path -> the canonical parameter name ("layers.0.attn.wq")."""
    return ".".join(str(p) for p in path)


def init_params(cfg: LlamaConfig, key: Array | int = 0, policy: Policy | None = None, *, module=None) -> Params:
    """Random weights (for tests, exercises and cost measurements) of ``module``, one of the lab's NNX decoders built
    as ``module(cfg, policy, rngs=...)``: :class:`Llama` by default, ``jaxlab.engine.qwen35.Qwen35`` for its
    config."""
    key = jax.random.key(key) if isinstance(key, int) else key
    graphdef, state = nnx.split((module or Llama)(cfg, policy, rngs=nnx.Rngs(params=key)))
    return Params(graphdef, state)


@functools.lru_cache(maxsize=16)
def _abstract_model(module, cfg: LlamaConfig, policy: Policy) -> tuple[Any, list]:
    """The model's graphdef and its flat state of shapes (no arrays), once per module, config and policy: tracing
    the modules' initializers for the 30-layer model takes about a second (each random key drawn is a traced update
    of the generator's counter), and a process builds parameters for one config many times (casts, the draft's
    cut, attention switches). The caller replaces every variable, so the cached list is never changed."""
    abstract = nnx.eval_shape(lambda: module(cfg, policy, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    return graphdef, list(nnx.to_flat_state(state))


def params_from_flat(
    cfg: LlamaConfig, flat: dict[str, Any], policy: Policy | None = None, source: str = "weights", *, module=None
) -> Params:
    """Build :class:`Params` of ``module`` (default :class:`Llama`) from ``{canonical name: array}``, checking every
    name and shape. Each array takes its parameter's dtype (the policy's, except what a module keeps in float32,
    such as Qwen3.5's decay parameters). A value may be a :class:`~jaxlab.quant.QuantizedMatrix` (stored
    ``[out, in]``: a kernel's transpose, the embedding as it is); it is placed as it is."""
    policy = policy or default_policy()
    graphdef, flat_state = _abstract_model(module or Llama, cfg, policy)
    expected = {param_name(p) for p, _ in flat_state}
    missing = sorted(expected - set(flat))
    extra = sorted(set(flat) - expected)
    if missing or extra:
        raise ConfigError(
            f"{source}: parameter names do not match the model config {cfg.name!r}"
            + (f"; missing {missing[:5]}{'...' if len(missing) > 5 else ''}" if missing else "")
            + (f"; unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}" if extra else "")
        )
    arrays = []
    for path, var in flat_state:
        name = param_name(path)
        want = tuple(var.get_value().shape)
        arr = flat[name]
        shape = arr.shape if not isinstance(arr, QuantizedMatrix) or name == "embed" else arr.shape[::-1]
        if tuple(shape) != want:
            raise ConfigError(f"{source}: tensor {name} has shape {tuple(shape)}, the config needs {want}")
        dtype = var.get_value().dtype  # the policy's (a no-op there; cast_params relies on it otherwise)
        if isinstance(arr, jax.Array):
            arr = arr.astype(dtype)
        elif not isinstance(arr, QuantizedMatrix):
            arr = np.asarray(arr, dtype=dtype)
        arrays.append(arr)
    arrays = hugepages.put(arrays)  # one transfer for the whole tree, the host's weights in 2 MB pages
    state = nnx.from_flat_state([(p, var.replace(a)) for (p, var), a in zip(flat_state, arrays)])
    return Params(graphdef, state)


def forward(
    params: Params,
    tokens: Array,
    positions: Array,
    cache: KVCache | None = None,
    *,
    last_only: bool = False,
    upto: int | tuple[int, ...] | None = None,
    reduce: Reduce | None = None,
    remat: bool = False,
    at: Array | None = None,
):
    """The pure step: ``(params, tokens [B, T], positions [B, T], cache) -> (logits [B, T or 1, V], cache)``.

    Built from the NNX modules by ``nnx.merge``; ``jit`` it with ``last_only``, ``upto`` and ``reduce`` static.

    * ``upto=L`` (1..n_layers; None = all): run the first ``L`` layers, then the final norm and the output
      head, i.e. the model cut after layer ``L`` (an early-exit draft). A cache then holds exactly those
      ``L`` layers (``init_cache(config.replace(n_layers=L), ...)``: the draft's own cache) and comes back
      with ``L`` layers; a cache of any other depth raises :class:`~jaxlab.errors.ConfigError`.
      ``upto=(L1, L2, ...)`` (increasing) reads the logits after each of those layers in one pass:
      a tuple of logits [B, T or 1, V], one per exit, the cache holding the last exit's layers (the early-exit
      probe).
    * ``reduce``: a function applied to the outputs of the row-parallel matmuls (``wo`` and ``w_down``,
      each [B, T, D]) before the residual add; None is the identity. Inside a tensor-parallel ``shard_map``
      it is ``lambda x: jax.lax.psum(x, "model")``: each device holds some heads and MLP units, so those
      outputs are partial sums, and the all-reduce makes them whole.
    * ``remat`` (training passes, no cache): each layer under ``jax.checkpoint``, so the backward pass keeps
      only the layers' inputs and recomputes the rest (less memory, about one more forward pass of time).
    * ``at`` [B, A] int: logits only at these positions of each row, [B, A, V] (training scores the answer's
      tokens only: the output head, a fifth of the model's work, then runs on A positions instead of T)."""
    return params.module()(tokens, positions, cache, last_only=last_only, upto=upto, reduce=reduce, remat=remat, at=at)


def cast_params(params: Params, policy: Policy) -> Params:
    """The same weights under another dtype/precision policy."""
    return params_from_flat(params.config, params.flat(), policy)


def with_attention(params: Params, attention: str, device: Any = None) -> Params:
    """The same weights computing attention with ``attention`` ("xla" or "pallas"; see :data:`ATTENTIONS`).
    "pallas" on a GPU older than the Triton path's compute capability 8.0 (Colab's T4) keeps XLA's attention,
    the same tokens, with one sentence (a :class:`~jaxlab.errors.FallbackWarning`) instead of failing."""
    if attention == "pallas":
        why = gpu_too_old(device if device is not None else jax.devices()[0])
        if why is not None:
            warnings.warn(
                f"--attention pallas: {why}; attention runs through XLA instead", FallbackWarning, stacklevel=2
            )
            attention = "xla"
    if attention == params.policy.attention:
        return params
    return params_from_flat(params.config, params.flat(), dataclasses.replace(params.policy, attention=attention))


def replace_config(params: Params, **changes) -> Params:
    cfg = dataclasses.replace(params.config, **changes)
    return params_from_flat(cfg, params.flat(), params.policy)
