"""Model configuration: a frozen dataclass with presets.

* ``smollm2_135m()`` — SmolLM2-135M-Instruct, the lab's embedded model (Llama architecture).
* ``smollm2_360m()`` — its larger sibling (hub only).
* ``tiny()`` — odd, prime-ish sizes so shape bugs surface in tests; random weights.

``from_gguf_metadata`` and ``from_hf_config`` build a config from a model file's own description, so a
file never has to agree with a preset by luck; a preset mismatch is reported by the loaders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import jax.numpy as jnp

from jaxlab.errors import ConfigError

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 49152
    dim: int = 576  # model width (hidden size)
    n_layers: int = 30
    n_heads: int = 9  # query heads
    n_kv_heads: int = 3  # key/value heads; n_heads // n_kv_heads queries share one (grouped-query attention)
    head_dim: int = 64
    ffn_dim: int = 1536  # SwiGLU hidden units
    rope_theta: float = 100000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 8192  # context length the model was trained for
    tie_embeddings: bool = True  # output projection = embedding matrix transposed
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = 2
    name: str = "smollm2-135m"

    def __post_init__(self):
        for field in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"config field {field} must be positive, got {getattr(self, field)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}) "
                "for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def q_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    def replace(self, **changes: Any) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)

    def n_params(self) -> int:
        """Parameter count (tied embedding counted once)."""
        attn = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.dim * self.ffn_dim
        per_layer = attn + mlp + 2 * self.dim
        out = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.vocab_size * self.dim + self.n_layers * per_layer + self.dim + out


def smollm2_135m() -> LlamaConfig:
    return LlamaConfig()


def smollm2_360m() -> LlamaConfig:
    return LlamaConfig(dim=960, n_layers=32, n_heads=15, n_kv_heads=5, head_dim=64, ffn_dim=2560, name="smollm2-360m")


def tiny() -> LlamaConfig:
    """A 3-layer model with odd sizes (for tests): shape bugs cannot hide behind equal dimensions."""
    return LlamaConfig(
        vocab_size=263,
        dim=40,
        n_layers=3,
        n_heads=6,
        n_kv_heads=2,
        head_dim=10,
        ffn_dim=84,
        rope_theta=10000.0,
        max_seq_len=512,
        bos_id=1,
        eos_id=2,
        pad_id=2,
        name="tiny",
    )


PRESETS = {"smollm2_135m": smollm2_135m, "smollm2_360m": smollm2_360m, "tiny": tiny}


def preset(name: str) -> LlamaConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown config preset {name!r}; choose one of {sorted(PRESETS)}") from None


def from_gguf_metadata(meta: Mapping[str, Any], vocab_size: int, name: str = "gguf") -> LlamaConfig:
    """Config from GGUF key/values (``llama.*`` keys); ``vocab_size`` from the embedding tensor."""
    arch = meta.get("general.architecture")
    p = f"{arch}."

    def get(key, default=None):
        value = meta.get(p + key, default)
        if value is None:
            raise ConfigError(f"GGUF metadata lacks {p + key}")
        return value

    dim = int(get("embedding_length"))
    n_heads = int(get("attention.head_count"))
    return LlamaConfig(
        vocab_size=int(vocab_size),
        dim=dim,
        n_layers=int(get("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=int(meta.get(p + "attention.key_length", dim // n_heads)),
        ffn_dim=int(get("feed_forward_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        max_seq_len=int(get("context_length", 2048)),
        tie_embeddings=True,  # corrected by the loader when an output.weight tensor exists
        bos_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        eos_id=int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        pad_id=int(meta.get("tokenizer.ggml.padding_token_id", meta.get("tokenizer.ggml.eos_token_id", 2))),
        name=name,
    )


def from_hf_config(cfg: Mapping[str, Any], name: str = "hf") -> LlamaConfig:
    """Config from a Hugging Face ``config.json`` of a Llama-family model."""
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in archs:
        raise ConfigError(
            f"config.json describes model_type={cfg.get('model_type')!r}; jaxlab runs Llama-family models only"
        )
    rope_theta = cfg.get("rope_theta")
    if rope_theta is None:
        rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise ConfigError(f"rope_scaling {scaling} is not supported by jaxlab's model")
    n_heads = int(cfg["num_attention_heads"])
    dim = int(cfg["hidden_size"])
    eos = cfg.get("eos_token_id", 2)
    if isinstance(eos, list):
        eos = eos[0]
    return LlamaConfig(
        vocab_size=int(cfg["vocab_size"]),
        dim=dim,
        n_layers=int(cfg["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads", n_heads)),
        head_dim=int(cfg.get("head_dim") or dim // n_heads),
        ffn_dim=int(cfg["intermediate_size"]),
        rope_theta=float(rope_theta),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_id=int(cfg.get("bos_token_id", 1) or 1),
        eos_id=int(eos),
        pad_id=int(cfg.get("pad_token_id") if cfg.get("pad_token_id") is not None else eos),
        name=name,
    )


def param_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Canonical parameter name -> shape: the names and shapes a model file must provide, and what the readers
    (:mod:`jaxlab.io.gguf`, :mod:`jaxlab.io.hf`) check a checkpoint against. Kernels are stored ``[in, out]``
    (``x @ w``); the model's modules hold exactly these (tests/engine/test_model.py)."""
    d, hd, f = cfg.dim, cfg.head_dim, cfg.ffn_dim
    shapes = {"embed": (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attn_norm.weight": (d,),
            p + "attn.wq": (d, cfg.n_heads * hd),
            p + "attn.wk": (d, cfg.n_kv_heads * hd),
            p + "attn.wv": (d, cfg.n_kv_heads * hd),
            p + "attn.wo": (cfg.n_heads * hd, d),
            p + "mlp_norm.weight": (d,),
            p + "mlp.w_gate": (d, f),
            p + "mlp.w_up": (d, f),
            p + "mlp.w_down": (f, d),
        }
    shapes["norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (d, cfg.vocab_size)
    # in the model's own order (its state's keys sorted level by level, layer numbers as numbers): code that draws
    # random weights name by name gets the same weights as before
    return dict(
        sorted(shapes.items(), key=lambda kv: [(0, int(p)) if p.isdigit() else (1, p) for p in kv[0].split(".")])
    )


# --------------------------------------------------------------------------------------------------
# Qwen3.5's hybrid decoder: Gated DeltaNet layers with a gated full-attention layer every few
# --------------------------------------------------------------------------------------------------

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen35Config:
    """Qwen3.5's text decoder (``transformers``' ``Qwen3_5TextConfig``): most layers are Gated DeltaNet (linear
    attention with a matrix state per head), every few a gated full-attention layer with a KV cache. The defaults
    are ``Qwen3_5TextConfig()``'s."""

    vocab_size: int = 248320
    dim: int = 4096  # model width (hidden size)
    n_layers: int = 32
    layer_types: tuple[str, ...] = ()  # one of LAYER_TYPES per layer; () = three linear then one full, repeated
    n_heads: int = 16  # full attention: query heads (each also has a sigmoid output gate)
    n_kv_heads: int = 4  # full attention: key/value heads (grouped-query attention)
    head_dim: int = 256  # full attention: per-head size of queries, keys and values
    partial_rotary_factor: float = 0.25  # RoPE rotates only the first head_dim * this dims of q and k
    rope_theta: float = 10000.0
    ffn_dim: int = 12288  # SwiGLU hidden units
    norm_eps: float = 1e-6
    conv_kernel: int = 4  # DeltaNet: taps of the depthwise causal convolution over q, k, v
    linear_k_heads: int = 16  # DeltaNet: query/key heads (each serves linear_v_heads // linear_k_heads value heads)
    linear_v_heads: int = 32  # DeltaNet: value heads = recurrent states per layer
    linear_k_dim: int = 128  # DeltaNet: query/key head size (rows of the state)
    linear_v_dim: int = 128  # DeltaNet: value head size (columns of the state)
    tie_embeddings: bool = False  # True: output projection = embedding matrix transposed
    max_seq_len: int = 32768  # context length the model was trained for
    eos_id: int | None = None  # greedy generation stops a row after this token (None: never)
    pad_id: int = 0  # the id left padding carries (never seen by the model: its position is -1)
    name: str = "qwen3.5"

    def __post_init__(self):
        for field in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "conv_kernel"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"config field {field} must be positive, got {getattr(self, field)}")
        for field in ("linear_k_heads", "linear_v_heads", "linear_k_dim", "linear_v_dim"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"config field {field} must be positive, got {getattr(self, field)}")
        if not self.layer_types:  # frozen: set through object.__setattr__, as dataclasses do
            object.__setattr__(self, "layer_types", hybrid_pattern(self.n_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.n_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ConfigError(
                f"layer_types must name one of {LAYER_TYPES} per layer ({self.n_layers}), got {self.layer_types}"
            )
        if self.n_heads % self.n_kv_heads or self.linear_v_heads % self.linear_k_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}), and linear_v_heads "
                f"({self.linear_v_heads}) of linear_k_heads ({self.linear_k_heads})"
            )
        if self.rotary_dim % 2 or self.rotary_dim <= 0:
            raise ConfigError(
                f"head_dim * partial_rotary_factor = {self.head_dim} * {self.partial_rotary_factor} must be a positive "
                "even number of rotated dims"
            )

    @property
    def q_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def rotary_dim(self) -> int:
        """How many leading dims of each query/key head RoPE rotates (the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of the DeltaNet convolution: queries, keys and values side by side."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @property
    def n_attention_layers(self) -> int:
        return self.layer_types.count("full_attention")

    @property
    def n_deltanet_layers(self) -> int:
        return self.layer_types.count("linear_attention")

    def attention_config(self) -> LlamaConfig:
        """The full-attention layers as a :class:`LlamaConfig` (n_layers = how many there are): the shape the KV
        cache (``jaxlab.engine.kvcache.init_cache``) and the shared SwiGLU read."""
        return LlamaConfig(
            vocab_size=self.vocab_size,
            dim=self.dim,
            n_layers=max(self.n_attention_layers, 1),
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            ffn_dim=self.ffn_dim,
            rope_theta=self.rope_theta,
            norm_eps=self.norm_eps,
            max_seq_len=self.max_seq_len,
            tie_embeddings=self.tie_embeddings,
            name=f"{self.name}-attention",
        )

    def replace(self, **changes: Any) -> "Qwen35Config":
        return dataclasses.replace(self, **changes)

    def n_params(self) -> int:
        """Parameter count (tied embedding counted once)."""
        d, f = self.dim, self.ffn_dim
        hd, h, kvh = self.head_dim, self.n_heads, self.n_kv_heads
        attn = d * hd * (2 * h + 2 * kvh) + h * hd * d + 2 * hd  # q (with its gate), k, v, o, q_norm, k_norm
        vd = self.linear_v_heads * self.linear_v_dim
        delta = d * (self.conv_dim + vd + 2 * self.linear_v_heads)  # in_proj_qkv, z, b, a
        delta += self.conv_dim * self.conv_kernel + 2 * self.linear_v_heads + self.linear_v_dim + vd * d
        common = 3 * d * f + 2 * d
        layers = self.n_attention_layers * attn + self.n_deltanet_layers * delta + self.n_layers * common
        out = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + layers + d + out


def hybrid_pattern(n_layers: int, interval: int = 4) -> tuple[str, ...]:
    """Qwen3.5's layer pattern: every ``interval``-th layer full attention, the others DeltaNet (transformers'
    ``full_attention_interval``)."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers))


def qwen35_tiny() -> Qwen35Config:
    """A 4-layer Qwen3.5 (three DeltaNet layers, then one full attention) with odd sizes, for tests and the golden
    file: key and value heads, key and value head sizes all differ, so a swapped axis cannot hide."""
    return Qwen35Config(
        vocab_size=263,
        dim=40,
        n_layers=4,
        n_heads=6,
        n_kv_heads=2,
        head_dim=12,
        partial_rotary_factor=0.5,  # 6 rotated dims: 0.25 of 12 would be 3, and RoPE rotates pairs
        rope_theta=10000.0,
        ffn_dim=84,
        norm_eps=1e-6,
        conv_kernel=4,
        linear_k_heads=2,
        linear_v_heads=6,
        linear_k_dim=10,
        linear_v_dim=14,
        tie_embeddings=False,
        max_seq_len=512,
        name="qwen3.5-tiny",
    )


def qwen35_smollm2_width() -> Qwen35Config:
    """Qwen3.5's layers at SmolLM2-135M's width (dim 576, SwiGLU 1536, 30 layers, 9 query / 3 KV heads of 64, tied
    49152-token vocabulary): random weights, to compare the hybrid's cost with the Llama model of the same size."""
    return Qwen35Config(
        vocab_size=49152,
        dim=576,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        partial_rotary_factor=0.25,
        rope_theta=100000.0,
        ffn_dim=1536,
        norm_eps=1e-5,
        linear_k_heads=3,
        linear_v_heads=9,
        linear_k_dim=64,
        linear_v_dim=64,
        tie_embeddings=True,
        max_seq_len=8192,
        name="qwen3.5-smollm2-width",
    )


def qwen35_from_hf_config(cfg: Mapping[str, Any], name: str = "hf") -> Qwen35Config:
    """Config from a ``transformers`` ``Qwen3_5TextConfig`` as a dict (``config.to_dict()``, or a checkpoint's
    ``config.json``: a full ``Qwen3_5Config``'s ``text_config`` is read)."""
    if "text_config" in cfg:
        cfg = cfg["text_config"]
    if cfg.get("model_type") not in (None, "qwen3_5_text", "qwen3_5"):
        raise ConfigError(f"config describes model_type={cfg.get('model_type')!r}, not Qwen3.5's text model")
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"rope_parameters {rope} are not supported: jaxlab's Qwen3.5 runs the default RoPE")
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    n_heads = int(cfg["num_attention_heads"])
    n_layers = int(cfg["num_hidden_layers"])
    layer_types = cfg.get("layer_types") or hybrid_pattern(n_layers, int(cfg.get("full_attention_interval", 4)))
    return Qwen35Config(
        vocab_size=int(cfg["vocab_size"]),
        dim=int(cfg["hidden_size"]),
        n_layers=n_layers,
        layer_types=tuple(layer_types),
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads", n_heads)),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        ffn_dim=int(cfg["intermediate_size"]),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        linear_k_heads=int(cfg.get("linear_num_key_heads", 16)),
        linear_v_heads=int(cfg.get("linear_num_value_heads", 32)),
        linear_k_dim=int(cfg.get("linear_key_head_dim", 128)),
        linear_v_dim=int(cfg.get("linear_value_head_dim", 128)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=int(cfg.get("max_position_embeddings", 32768)),
        eos_id=None if eos is None else int(eos),
        pad_id=int(cfg.get("pad_token_id") or 0),
        name=name,
    )
