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
