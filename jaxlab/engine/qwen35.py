"""Qwen3.5's hybrid decoder in Flax NNX, beside the Llama model and built from its pieces.

* most layers are **Gated DeltaNet** (linear attention): a short causal convolution over q, k, v, then the gated
  delta rule (:mod:`jaxlab.engine.deltanet`) on a matrix state per value head, a gated RMSNorm and an output
  projection; the state has a fixed size, whatever the context;
* every few layers (``cfg.layer_types``) a **gated full attention**: grouped-query attention whose ``q_proj`` also
  gives a sigmoid gate on the output, an RMSNorm over each query and key head, and RoPE on the first
  ``head_dim * partial_rotary_factor`` dims only (for text, Qwen3.5's multimodal RoPE has equal positions in all
  its sections, which is plain RoPE); its keys and values live in the house's KV cache
  (:class:`~jaxlab.engine.kvcache.KVCache`, written and read through ``KVLayer.write`` / ``attend``);
* SwiGLU, the dense layer, the matmul policy and RoPE are :mod:`jaxlab.engine.model`'s; the RMSNorms are
  zero-centred (``x * (1 + w)``), except the DeltaNet's gated one (``w * x * silu(z)``).

The pure step is ``forward(params, tokens, positions, cache) -> (logits, cache)``, as for Llama, with a
:class:`HybridCache`: the KV cache of the attention layers plus each DeltaNet layer's convolution inputs and
recurrent state. Positions carry the padding as in the house: a token at position < 0 is padding; it is masked out
of the convolution and given g = 0, beta = 0, so it leaves every state as if it were not there.

**What a recurrent state changes in serving.** A KV cache is a list of per-token entries: a prefix's entries can be
shared (pages with a hash), and preemption or speculative rollback is dropping entries. A DeltaNet state is one
matrix summing the whole history: it cannot be cut back to an earlier token. So

* a prefix can be reused only from a *snapshot* of every layer's state taken exactly at the prefix's end (the
  prompt's cached pages of the attention layers alone are not enough); this engine keeps no snapshots, so
  :func:`can_reuse_prefix` says no and every request prefills from the start;
* a preempted sequence cannot be rolled back or resumed from pages: it is recomputed from its prompt plus the
  tokens it had generated (:func:`resume_tokens`), from a fresh state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.engine import model
from jaxlab.engine.deltanet import causal_conv1d, gated_delta_chunked, gated_delta_recurrent, l2norm
from jaxlab.engine.kvcache import KVCache, KVLayer, init_cache, left_pad
from jaxlab.engine.model import MLP, Params, Policy, apply_rope, default_policy, dense, matmul, rope_cos_sin
from jaxlab.errors import ConfigError
from jaxlab.io.config import Qwen35Config

Array = jax.Array
#: How a DeltaNet layer runs its rule: None picks "chunked" for T > 1 (prefill) and "recurrent" for T = 1 (decode);
#: "pallas" is :func:`jaxlab.engine.kernels.deltanet.gated_delta_pallas` (the same contract)
FORMS = ("recurrent", "chunked", "pallas")


def can_reuse_prefix(cfg: Qwen35Config) -> bool:
    """False for a model with DeltaNet layers: their state at a prefix's end is a snapshot this engine does not keep,
    and the attention layers' cached entries alone do not give it back (see the module docstring)."""
    return cfg.n_deltanet_layers == 0


def resume_tokens(prompt: Sequence[int], generated: Sequence[int]) -> list[int]:
    """What a preempted sequence prefills again, from a fresh state: its prompt and every token it had generated
    (a recurrent state cannot be rolled back to where the sequence stopped, nor rebuilt from pages)."""
    return [*prompt, *generated]


# --------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------


def rms(x: Array, eps: float) -> Array:
    """x [..., D] / sqrt(mean(x^2) + eps), in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


class ZeroCenteredRMSNorm(nnx.Module):
    """Qwen3.5's RMSNorm: ``rms(x) * (1 + w)``, the weight stored as an offset from 1 (initialised to 0)."""

    def __init__(self, dim: int, eps: float, policy: Policy):
        self.weight = nnx.Param(jnp.zeros((dim,), policy.jnp_dtype))
        self.eps = eps

    def __call__(self, x: Array) -> Array:  # [..., D] -> [..., D] float32
        return rms(x, self.eps) * (1.0 + self.weight.get_value().astype(jnp.float32))


class GatedRMSNorm(nnx.Module):
    """The DeltaNet's output norm: ``w * rms(x) * silu(z)``, per value head (norm first, then the gate)."""

    def __init__(self, dim: int, eps: float, policy: Policy):
        self.weight = nnx.Param(jnp.ones((dim,), policy.jnp_dtype))
        self.eps = eps

    def __call__(self, x: Array, z: Array) -> Array:  # x, z [..., Dv] -> [..., Dv] float32
        w = self.weight.get_value().astype(jnp.float32)
        return w * rms(x, self.eps) * jax.nn.silu(z.astype(jnp.float32))


def rope_partial(x: Array, cos: Array, sin: Array) -> Array:
    """RoPE on the first R dims of x [B, T, H, Hd] (cos, sin [B, T, R]); the other Hd - R dims pass through."""
    r = cos.shape[-1]
    return jnp.concatenate([apply_rope(x[..., :r], cos, sin), x[..., r:]], axis=-1)


def delta_rule(form: str, q, k, v, g, beta, state):
    """One of :data:`FORMS` on the rule's contract (q, k [B, T, H, Dk]; v [B, T, H, Dv]; g, beta [B, T, H]; state
    [B, H, Dk, Dv]) -> (out [B, T, H, Dv], state)."""
    if form == "recurrent":
        return gated_delta_recurrent(q, k, v, g, beta, state)
    if form == "chunked":
        return gated_delta_chunked(q, k, v, g, beta, state)
    if form == "pallas":  # imported here: the kernel is optional, and the XLA forms must not depend on it
        from jaxlab.engine.kernels.deltanet import gated_delta_pallas

        return gated_delta_pallas(q, k, v, g, beta, state)
    raise ConfigError(f"unknown DeltaNet form {form!r}; choose one of {', '.join(FORMS)}")


class GatedDeltaNet(nnx.Module):
    """Linear attention with the gated delta rule: in_proj_qkv -> causal conv (SiLU) -> q, k l2-normalised ->
    the rule on [Hv, Dk, Dv] states -> gated RMSNorm with z -> out_proj."""

    def __init__(self, cfg: Qwen35Config, policy: Policy, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        d, dt = cfg.dim, policy.jnp_dtype
        hv, vd = cfg.linear_v_heads, cfg.linear_v_heads * cfg.linear_v_dim
        self.w_qkv = nnx.Param(init(rngs.params(), (d, cfg.conv_dim), dt))  # queries, keys, values side by side
        self.w_z = nnx.Param(init(rngs.params(), (d, vd), dt))  # the output gate
        self.w_b = nnx.Param(init(rngs.params(), (d, hv), dt))  # beta = sigmoid(x w_b)
        self.w_a = nnx.Param(init(rngs.params(), (d, hv), dt))  # g = -exp(A_log) softplus(x w_a + dt_bias)
        self.conv = nnx.Param(init(rngs.params(), (cfg.conv_dim, cfg.conv_kernel), dt))  # depthwise [C, K]
        # float32 whatever the policy: exp(A_log) in 16 bits may overflow to inf (the reference upcasts too)
        a = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 0.01, 16.0)
        self.A_log = nnx.Param(jnp.log(a))
        self.dt_bias = nnx.Param(jnp.ones((hv,), jnp.float32))
        self.norm = GatedRMSNorm(cfg.linear_v_dim, cfg.norm_eps, policy)
        self.w_out = nnx.Param(init(rngs.params(), (vd, d), dt))
        self.cfg = cfg
        self.policy = policy

    def __call__(self, x, positions, conv_state, state, form: str | None = None):
        # x [B, T, D]; positions [B, T] (< 0: padding); conv_state [B, K-1, C]; state [B, Hv, Dk, Dv]
        # -> (out [B, T, D] float32, conv_state, state)
        cfg, pol = self.cfg, self.policy
        b, t, _ = x.shape
        real = positions >= 0  # [B, T]
        kd = cfg.linear_k_heads * cfg.linear_k_dim
        qkv, conv_state = causal_conv1d(dense(x, self.w_qkv.get_value(), pol), self.conv.get_value(), conv_state, real)
        q = qkv[..., :kd].reshape(b, t, cfg.linear_k_heads, cfg.linear_k_dim)
        k = qkv[..., kd : 2 * kd].reshape(b, t, cfg.linear_k_heads, cfg.linear_k_dim)
        v = qkv[..., 2 * kd :].reshape(b, t, cfg.linear_v_heads, cfg.linear_v_dim)
        # each key head serves consecutive value heads (the reference's repeat_interleave)
        rep = cfg.linear_v_heads // cfg.linear_k_heads
        q = jnp.repeat(l2norm(q), rep, axis=2) * cfg.linear_k_dim**-0.5
        k = jnp.repeat(l2norm(k), rep, axis=2)
        a = dense(x, self.w_a.get_value(), pol) + self.dt_bias.get_value()  # [B, T, Hv]
        g = -jnp.exp(self.A_log.get_value()) * jax.nn.softplus(a)  # log decay <= 0
        beta = jax.nn.sigmoid(dense(x, self.w_b.get_value(), pol))
        g, beta = g * real[..., None], beta * real[..., None]  # padding: no decay, no write
        form = form or ("chunked" if t > 1 else "recurrent")
        out, state = delta_rule(form, q, k, v, g, beta, state)  # [B, T, Hv, Dv]
        z = dense(x, self.w_z.get_value(), pol).reshape(b, t, cfg.linear_v_heads, cfg.linear_v_dim)
        out = self.norm(out, z).reshape(b, t, -1)
        return dense(out, self.w_out.get_value(), pol), conv_state, state


class GatedAttention(nnx.Module):
    """Grouped-query attention with a sigmoid output gate, per-head q/k RMSNorms and partial RoPE, over the house's
    KV cache layer."""

    def __init__(self, cfg: Qwen35Config, policy: Policy, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        d, h, kvh, hd, dt = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, policy.jnp_dtype
        self.wq = nnx.Param(init(rngs.params(), (d, h * hd * 2), dt))  # per head: its query, then its gate
        self.wk = nnx.Param(init(rngs.params(), (d, kvh * hd), dt))
        self.wv = nnx.Param(init(rngs.params(), (d, kvh * hd), dt))
        self.wo = nnx.Param(init(rngs.params(), (h * hd, d), dt))
        self.q_norm = ZeroCenteredRMSNorm(hd, cfg.norm_eps, policy)
        self.k_norm = ZeroCenteredRMSNorm(hd, cfg.norm_eps, policy)
        self.cfg = cfg
        self.policy = policy

    def __call__(self, x, positions, cos, sin, cache: KVLayer | None = None):
        # x [B, T, D]; positions [B, T]; cos, sin [B, T, R]; cache: this layer's KVLayer or None
        # -> (out [B, T, D] float32, the layer after the write, or None)
        cfg, pol = self.cfg, self.policy
        b, t, _ = x.shape
        h, kvh, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qg = dense(x, self.wq.get_value(), pol).reshape(b, t, h, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(b, t, h * hd)
        q = rope_partial(self.q_norm(q), cos, sin).reshape(b, t, kvh, cfg.q_per_kv, hd)
        k = rope_partial(self.k_norm(dense(x, self.wk.get_value(), pol).reshape(b, t, kvh, hd)), cos, sin)
        v = dense(x, self.wv.get_value(), pol).reshape(b, t, kvh, hd)
        layer = KVLayer.of(k, v, positions) if cache is None else cache.write(k, v, positions)
        out = layer.attend(q, positions, pol) * jax.nn.sigmoid(gate)  # [B, T, H*Hd]
        return dense(out, self.wo.get_value(), pol), (None if cache is None else layer)


class HybridBlock(nnx.Module):
    """Pre-norm block: x + mixer(norm(x)) (a DeltaNet or a gated attention), then x + mlp(norm(x))."""

    def __init__(self, cfg: Qwen35Config, kind: str, policy: Policy, rngs: nnx.Rngs):
        self.kind = kind
        self.attn_norm = ZeroCenteredRMSNorm(cfg.dim, cfg.norm_eps, policy)
        if kind == "linear_attention":
            self.deltanet = GatedDeltaNet(cfg, policy, rngs)
        else:
            self.attn = GatedAttention(cfg, policy, rngs)
        self.mlp_norm = ZeroCenteredRMSNorm(cfg.dim, cfg.norm_eps, policy)
        self.mlp = MLP(cfg, policy, rngs)  # reads cfg.dim and cfg.ffn_dim only: Llama's SwiGLU

    def __call__(self, x, positions, cos, sin, kv=None, conv=None, state=None, form=None):
        # x [B, T, D] -> (x, kv, conv, state): the DeltaNet's (conv, state) or the attention's kv, the others as given
        if self.kind == "linear_attention":
            with jax.named_scope("deltanet"):
                h, conv, state = self.deltanet(self.attn_norm(x), positions, conv, state, form)
        else:
            with jax.named_scope("attention"):
                h, kv = self.attn(self.attn_norm(x), positions, cos, sin, kv)
        x = x + h
        with jax.named_scope("mlp"):
            x = x + self.mlp(self.mlp_norm(x))
        return x, kv, conv, state


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class HybridCache:
    """Everything a Qwen3.5 sequence carries between steps, per row of the batch."""

    kv: KVCache  # the full-attention layers' KV cache (the house's; its slots and positions)
    conv: tuple  # per DeltaNet layer [B, K-1, C] float32: the last K-1 inputs of its convolution
    state: tuple  # per DeltaNet layer [B, Hv, Dk, Dv] float32: its recurrent state

    def nbytes(self) -> int:
        """Bytes held: the KV cache grows with the slots, the DeltaNet states do not."""
        return self.kv.nbytes() + sum(a.size * a.dtype.itemsize for a in (*self.conv, *self.state))


def zero_states(cfg: Qwen35Config, batch: int) -> tuple[Array, Array]:
    """One DeltaNet layer's states before any token: (conv inputs [B, K-1, C], recurrent state [B, Hv, Dk, Dv])."""
    return (
        jnp.zeros((batch, cfg.conv_kernel - 1, cfg.conv_dim), jnp.float32),
        jnp.zeros((batch, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim), jnp.float32),
    )


def init_hybrid_cache(cfg: Qwen35Config, batch: int, length: int, dtype=jnp.float32) -> HybridCache:
    """An empty cache for ``batch`` rows: ``length`` KV slots per attention layer (``dtype``: float or "int8", as
    :func:`~jaxlab.engine.kvcache.init_cache`) and zero DeltaNet states."""
    states = [zero_states(cfg, batch) for _ in range(cfg.n_deltanet_layers)]
    return HybridCache(
        # a model of DeltaNet layers only reads no KV cache: one slot keeps the record's shape without its memory
        kv=init_cache(cfg.attention_config(), batch, length if cfg.n_attention_layers else 1, dtype),
        conv=tuple(c for c, _ in states),
        state=tuple(s for _, s in states),
    )


class Qwen35(nnx.Module):
    def __init__(self, cfg: Qwen35Config, policy: Policy | None = None, *, rngs: nnx.Rngs):
        policy = policy or default_policy()
        self.cfg = cfg
        self.policy = policy
        init = nnx.initializers.normal(0.02)
        self.embed = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.dim), policy.jnp_dtype))
        self.layers = nnx.List([HybridBlock(cfg, kind, policy, rngs) for kind in cfg.layer_types])
        self.norm = ZeroCenteredRMSNorm(cfg.dim, cfg.norm_eps, policy)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Param(init(rngs.params(), (cfg.dim, cfg.vocab_size), policy.jnp_dtype))

    def __call__(
        self, tokens: Array, positions: Array, cache: HybridCache | None = None, *, last_only=False, form=None
    ):
        """tokens, positions [B, T] int -> (logits [B, T or 1, V] float32, the cache after the T tokens or None)."""
        cfg, acc = self.cfg, self.policy.acc_dtype
        if form is not None and form not in FORMS:
            raise ConfigError(f"unknown DeltaNet form {form!r}; choose one of {', '.join(FORMS)}")
        b = tokens.shape[0]
        x = jnp.take(self.embed.get_value(), tokens, axis=0).astype(acc)  # [B, T, D]
        cos, sin = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, acc)  # [B, T, R]
        kvs, convs, states = [], [], []
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer{i}"):
                if layer.kind == "linear_attention":
                    j = len(convs)
                    # a pass without a cache starts every DeltaNet from zeros
                    conv, state = zero_states(cfg, b) if cache is None else (cache.conv[j], cache.state[j])
                    x, _, conv, state = layer(x, positions, cos, sin, conv=conv, state=state, form=form)
                    convs.append(conv)
                    states.append(state)
                else:
                    kv = None if cache is None else cache.kv.layer(len(kvs))
                    x, kv, _, _ = layer(x, positions, cos, sin, kv=kv)
                    kvs.append(kv)
        logits = self.head(x[:, -1:] if last_only else x)
        if cache is None:
            return logits, None
        kv = cache.kv.with_layers(kvs) if kvs else cache.kv
        return logits, HybridCache(kv, tuple(convs), tuple(states))

    def head(self, x: Array) -> Array:
        """[B, T, D] -> logits [B, T, V] float32: the final norm, then the tied embedding or ``lm_head``."""
        x = self.norm(x)
        if self.cfg.tie_embeddings:
            return matmul("btd,vd->btv", x, self.embed.get_value(), self.policy)
        return dense(x, self.lm_head.get_value(), self.policy)


# --------------------------------------------------------------------------------------------------
# Parameters and the pure step
# --------------------------------------------------------------------------------------------------


def init_params(cfg: Qwen35Config, key: Array | int = 0, policy: Policy | None = None) -> Params:
    """Random weights (tests, cost measurements) as the house's :class:`~jaxlab.engine.model.Params`."""
    return model.init_params(cfg, key, policy, module=Qwen35)


def params_from_flat(cfg: Qwen35Config, flat: Mapping[str, Any], policy: Policy | None = None) -> Params:
    """:class:`Params` from ``{canonical name: array}`` ("layers.0.deltanet.w_qkv", ...), every name and shape
    checked (:func:`jaxlab.engine.model.params_from_flat`; A_log and dt_bias stay float32)."""
    return model.params_from_flat(cfg, dict(flat), policy, "Qwen3.5 parameters", module=Qwen35)


#: transformers' name (after ``model.layers.{i}.``) -> (ours after ``layers.{i}.``, transpose): Linear weights are
#: stored [out, in], ours [in, out]
LAYER_NAMES = {
    "input_layernorm.weight": ("attn_norm.weight", False),
    "post_attention_layernorm.weight": ("mlp_norm.weight", False),
    "linear_attn.in_proj_qkv.weight": ("deltanet.w_qkv", True),
    "linear_attn.in_proj_z.weight": ("deltanet.w_z", True),
    "linear_attn.in_proj_b.weight": ("deltanet.w_b", True),
    "linear_attn.in_proj_a.weight": ("deltanet.w_a", True),
    "linear_attn.conv1d.weight": ("deltanet.conv", False),  # [C, 1, K], squeezed to [C, K]
    "linear_attn.A_log": ("deltanet.A_log", False),
    "linear_attn.dt_bias": ("deltanet.dt_bias", False),
    "linear_attn.norm.weight": ("deltanet.norm.weight", False),
    "linear_attn.out_proj.weight": ("deltanet.w_out", True),
    "self_attn.q_proj.weight": ("attn.wq", True),
    "self_attn.k_proj.weight": ("attn.wk", True),
    "self_attn.v_proj.weight": ("attn.wv", True),
    "self_attn.o_proj.weight": ("attn.wo", True),
    "self_attn.q_norm.weight": ("attn.q_norm.weight", False),
    "self_attn.k_norm.weight": ("attn.k_norm.weight", False),
    "mlp.gate_proj.weight": ("mlp.w_gate", True),
    "mlp.up_proj.weight": ("mlp.w_up", True),
    "mlp.down_proj.weight": ("mlp.w_down", True),
}


def params_from_torch(cfg: Qwen35Config, state_dict: Mapping[str, Any], policy: Policy | None = None) -> Params:
    """Params from ``transformers``' ``Qwen3_5ForCausalLM`` state dict (numpy arrays, or anything ``np.asarray``
    reads): kernels transposed to [in, out], the conv weight [C, 1, K] squeezed to [C, K]; ``lm_head.weight`` is
    skipped when the embeddings are tied."""
    flat = {}
    for name, value in state_dict.items():
        arr = np.asarray(value, np.float32)
        if name == "model.embed_tokens.weight":
            flat["embed"] = arr
        elif name == "model.norm.weight":
            flat["norm.weight"] = arr
        elif name == "lm_head.weight":
            if not cfg.tie_embeddings:
                flat["lm_head"] = arr.T
        elif name.startswith("model.layers."):
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            if rest not in LAYER_NAMES:
                raise ConfigError(f"unexpected Qwen3.5 tensor {name}")
            ours, transpose = LAYER_NAMES[rest]
            if rest == "linear_attn.conv1d.weight":
                arr = arr.reshape(arr.shape[0], arr.shape[-1])  # [C, 1, K] -> [C, K]
            flat[f"layers.{i}.{ours}"] = arr.T if transpose else arr
        else:
            raise ConfigError(f"unexpected Qwen3.5 tensor {name}")
    return params_from_flat(cfg, flat, policy)


def forward(
    params: Params, tokens: Array, positions: Array, cache: HybridCache | None = None, *, last_only=False, form=None
):
    """The pure step: ``(params, tokens [B, T], positions [B, T], cache) -> (logits [B, T or 1, V], cache)``.

    ``form`` (static under ``jit``): how the DeltaNet layers run the rule, one of :data:`FORMS`; None is "chunked"
    for T > 1 and "recurrent" for T = 1. Every form gives the same logits (tests/engine/test_qwen35.py)."""
    return params.module()(tokens, positions, cache, last_only=last_only, form=form)


def next_tokens(params: Params, tokens: Array, positions: Array, cache: HybridCache, form: str | None = None):
    """One greedy step: the T tokens in -> (ids [B] int32: the argmax after the last token, its logits [B, V],
    cache)."""
    logits, cache = forward(params, tokens, positions, cache, last_only=True, form=form)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), logits[:, -1], cache


#: the two compiled steps of :func:`greedy` (one program per prompt shape and per form); decode donates the cache
jit_prefill = jax.jit(next_tokens, static_argnames="form")
jit_decode = jax.jit(next_tokens, donate_argnums=(3,), static_argnames="form")


def greedy(
    params: Params, cfg: Qwen35Config, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, form: str | None = None
) -> list[list[int]]:
    """Greedy continuations of a batch of prompts (token ids) -> ``max_new_tokens`` ids per prompt (fewer when
    ``cfg.eos_id`` ends a row: the ids through the eos).

    Left padding (:func:`~jaxlab.engine.kvcache.left_pad`), one prefill of the whole batch, then one decode step per
    token; each row's DeltaNet states and KV entries are its own, and padding leaves them untouched, so a row's
    tokens equal those of the prompt alone."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("greedy needs at least one prompt, each of at least one token")
    tokens, positions = left_pad(prompts, cfg.pad_id)
    cache = init_hybrid_cache(cfg, len(prompts), tokens.shape[1] + max_new_tokens)
    ids, _, cache = jit_prefill(params, jnp.asarray(tokens), jnp.asarray(positions), cache, form)
    pos = np.array([len(p) for p in prompts], np.int32)[:, None]  # [B, 1]: each row's next position
    out = [ids]
    for step in range(max_new_tokens - 1):
        ids, _, cache = jit_decode(params, ids[:, None], jnp.asarray(pos + step), cache, form)
        out.append(ids)
    rows = np.stack([np.asarray(x) for x in out], axis=1).tolist() if max_new_tokens > 0 else [[] for _ in prompts]
    if cfg.eos_id is not None:
        rows = [r[: r.index(cfg.eos_id) + 1] if cfg.eos_id in r else r for r in rows]
    return rows
