"""Looking inside the model and its KV cache: what notebooks 03 and 05 show, as tested functions.

* **Source and structure**: :func:`show_source` prints a module's code; :func:`tree_summary` prints the
  parameter tree as static text (the 30 identical blocks folded into one), for readers on GitHub where
  treescope's interactive view does not render.
* **Parameters and memory**: :func:`param_table` counts parameters per component and their bytes in
  float32, in bfloat16, and as stored in the GGUF file (Q4_1 / Q8_0 blocks).
* **RoPE**: :func:`rope_is_relative` measures that a rotated query-key dot product depends only on the
  distance between positions; :func:`plot_rope` draws the rotation frequencies and that dot product.
* **The KV cache**: :func:`cache_structure` prints the cache pytree; :func:`cache_memory_rows` compares the
  formula ``2 x layers x batch x slots x kv_heads x head_dim x itemsize`` with the bytes of a cache that is
  only shaped (``jax.eval_shape``, nothing allocated); :func:`live_growth` measures what creating one
  adds to the arrays alive on the device.
* **Prefill and decode**: :func:`prefill` and :func:`decode_step` are the engine's model step
  (:func:`model_step`, i.e. :func:`jaxlab.engine.steps.next_logits`, counting its traces in :data:`TRACES`)
  jitted with a *donated* cache, given a whole prompt or one token; :func:`greedy_with_cache` runs them, :func:`uncached_logits` is the reference they must equal; :func:`write_token` is the cache write (:func:`~jaxlab.engine.kvcache.write_slots`) on its own, to time donation
  (:func:`time_cache_write`). They find the slot axis with :func:`slot_axes` instead of assuming a layout.
* **Latency against context**: :func:`latency_vs_context` times one new token with the cache (one decode
  step) and without it (recompute the whole prefix), :func:`plot_latency` and :func:`plot_speedup` draw it.
* **Figures**: :func:`plot_cache_fill` (which slots hold a token after each step, and one layer's keys),
  :func:`plot_param_bytes` (where the parameters live).

Every function takes the parameters and config explicitly; nothing here changes the model.
"""

from __future__ import annotations

import functools
import gc
import re
import time
from collections import OrderedDict
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kvcache import KVCache, cache_bytes, init_cache, write_slots
from jaxlab.engine.model import Params, apply_rope, forward, rope_cos_sin
from jaxlab.engine.steps import next_logits
from jaxlab.io.config import LlamaConfig
from jaxlab.lab.notebook import show_source  # noqa: F401  (notebook 03 and its tests import it from here)

# --------------------------------------------------------------------------------------------------
# Source and parameter tree
# --------------------------------------------------------------------------------------------------


def _fold_layers(name: str) -> str:
    return re.sub(r"^layers\.\d+\.", "layers.*.", name)


def tree_summary(params: Params) -> str:
    """Print (and return) the parameter tree as text; the identical blocks are shown once, with ``x N``.

    Example line: ``    attn.wq          [576, 576]    float32       331,776``."""
    flat = params.flat()
    cfg = params.config
    groups: "OrderedDict[str, list]" = OrderedDict()
    for name, a in flat.items():
        groups.setdefault(_fold_layers(name), []).append(a)
    total = sum(int(a.size) for a in flat.values())
    width = max(len(n) for n in groups) + 2
    lines = [f"{type(params.module()).__name__} ({cfg.name}): {total:,} parameters in {len(flat)} arrays"]
    layer_lines, n_layers = [], cfg.n_layers
    per_block = 0
    for name, arrays in groups.items():
        a = arrays[0]
        row = f"{list(a.shape)!s:<16}{str(a.dtype):<10}{int(a.size):>12,}"
        if name.startswith("layers.*."):
            per_block += int(a.size)
            layer_lines.append(f"    {name[len('layers.*.') :]:<{width}}{row}")
        else:
            lines.append(f"  {name:<{width + 2}}{row}")
    if layer_lines:
        lines.append(f"  layers: {n_layers} x Block, {per_block:,} parameters each")
        lines.extend(layer_lines)
    if cfg.tie_embeddings:
        lines.append("  (output head = embed transposed: tied embeddings, no separate lm_head)")
    text = "\n".join(lines)
    print(text)
    return text


def component(name: str) -> str:
    """The component a canonical parameter name (``layers.3.attn.wq``) belongs to."""
    if name == "embed":
        return "embedding"
    if name == "lm_head":
        return "output head"
    if "norm" in name:
        return "norms"
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "MLP"
    return "other"


def gguf_component(name: str) -> str:
    """The component of a GGUF tensor name (``blk.3.attn_q.weight``), matching :func:`component`."""
    if name.startswith("token_embd"):
        return "embedding"
    if name.startswith("output."):
        return "output head"
    if "norm" in name:
        return "norms"
    if ".attn_" in name:
        return "attention"
    if ".ffn_" in name:
        return "MLP"
    return "other"


COMPONENTS = ("embedding", "attention", "MLP", "norms", "output head", "other")


def gguf_tensor_bytes(path) -> dict[str, tuple[int, str]]:
    """{component: (bytes on disk, tensor types)} of a GGUF file's tensors (read from its header)."""
    from jaxlab.io.gguf import open_gguf

    f = open_gguf(path)
    out: dict[str, list] = {}
    for t in f.reader.tensors:
        entry = out.setdefault(gguf_component(t.name), [0, set()])
        entry[0] += int(t.n_bytes)
        entry[1].add(t.tensor_type.name)
    return {k: (v[0], "+".join(sorted(v[1]))) for k, v in out.items()}


def param_table(params: Params, gguf_path=None, unit: float = 1e6) -> list[dict]:
    """Rows per component: parameter count and MB in float32, bfloat16 and (if given) the GGUF file.

    Counts come from the arrays themselves, so the total equals ``config.n_params()``."""
    counts: dict[str, int] = {}
    arrays: dict[str, int] = {}
    for name, a in params.flat().items():
        c = component(name)
        counts[c] = counts.get(c, 0) + int(a.size)
        arrays[c] = arrays.get(c, 0) + 1
    on_disk = gguf_tensor_bytes(gguf_path) if gguf_path is not None else {}
    rows = []
    for c in COMPONENTS:
        if c not in counts:
            continue
        row = {
            "component": c,
            "arrays": arrays[c],
            "parameters": counts[c],
            "float32 MB": counts[c] * 4 / unit,
            "bfloat16 MB": counts[c] * 2 / unit,
        }
        if gguf_path is not None:
            b, kinds = on_disk.get(c, (0, "-"))
            row["GGUF MB"] = b / unit
            row["GGUF type"] = kinds
        rows.append(row)
    total = {
        "component": "total",
        "arrays": sum(arrays.values()),
        "parameters": sum(counts.values()),
        "float32 MB": sum(counts.values()) * 4 / unit,
        "bfloat16 MB": sum(counts.values()) * 2 / unit,
    }
    if gguf_path is not None:
        total["GGUF MB"] = sum(b for b, _ in on_disk.values()) / unit
        total["GGUF type"] = ""
    rows.append(total)
    return rows


# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------


def _rotated_dots(q, k, m, n, head_dim, theta):
    # q, k [N, d]; m, n [N] positions -> dot(rope(q, m), rope(k, n)) [N]
    cq, sq = rope_cos_sin(jnp.asarray(m)[None], head_dim, theta)
    ck, sk = rope_cos_sin(jnp.asarray(n)[None], head_dim, theta)
    rq = apply_rope(jnp.asarray(q)[None], cq, sq)[0]
    rk = apply_rope(jnp.asarray(k)[None], ck, sk)[0]
    return jnp.sum(rq * rk, axis=-1)


def rope_is_relative(
    head_dim: int = 64, theta: float = 100000.0, shift: int = 1000, n: int = 64, seed: int = 0
) -> float:
    """Largest change of rope(q, m) . rope(k, n) when both positions move by ``shift``, relative to the
    largest dot product. RoPE rotates q and k by angles proportional to their positions, so the dot
    product depends only on ``m - n``: the result is float32 rounding, not signal."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, head_dim), np.float32)
    k = rng.standard_normal((n, head_dim), np.float32)
    m = rng.integers(0, 512, n)
    p = rng.integers(0, 512, n)
    a = _rotated_dots(q, k, m, p, head_dim, theta)
    b = _rotated_dots(q, k, m + shift, p + shift, head_dim, theta)
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))


def rope_similarity(
    distances: Sequence[int], head_dim: int = 64, theta: float = 100000.0, n: int = 256, seed: int = 0
) -> np.ndarray:
    """Mean of rope(q, d) . rope(q, 0) / |q|^2 over random vectors q, for each distance d: how much a
    key still 'looks like' the same query d positions away. Falls with distance (RoPE's decay)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, head_dim)).astype(np.float32) + 1.0  # a common direction, as real q/k have
    d = np.asarray(distances)
    out = []
    for dist in d:
        dots = _rotated_dots(q, q, np.full(n, dist), np.zeros(n, int), head_dim, theta)
        out.append(float(jnp.mean(dots / jnp.sum(q * q, -1))))
    return np.asarray(out)


def plot_rope(head_dim: int = 64, theta: float = 100000.0, max_position: int = 2048):
    """Two panels: cos(angle) of a few frequency pairs against position; similarity against distance."""
    import matplotlib.pyplot as plt

    from jaxlab.engine.model import rope_frequencies

    inv = rope_frequencies(head_dim, theta)
    pos = np.arange(0, 64)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    for i in np.unique(np.linspace(0, head_dim // 2 - 1, 5).astype(int)):
        a.plot(pos, np.cos(pos * inv[i]), label=f"pair {i}: period {2 * np.pi / inv[i]:,.0f}")
    a.set(title="RoPE: each pair of dimensions turns at its own speed", xlabel="position", ylabel="cos(angle)")
    a.legend(fontsize=7, loc="lower left", framealpha=0.9)
    dist = np.unique(np.geomspace(1, max_position, 48).astype(int))
    b.semilogx(dist, rope_similarity(dist, head_dim, theta))
    b.set(title="rotated q . k against distance", xlabel="distance between positions", ylabel="similarity")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------------
# The KV cache: structure and memory
# --------------------------------------------------------------------------------------------------


def _desc(a) -> str:
    return f"{a.dtype}{list(a.shape)}"


@functools.lru_cache(maxsize=None)
def slot_axes(cfg: LlamaConfig) -> tuple[int, int]:
    """(axis of the slots in a layer's K array, in its V array), read off :func:`init_cache`'s layout
    rather than assumed, so the tools here follow the cache if its layout changes."""
    a = jax.eval_shape(lambda: init_cache(cfg, 1, 5))
    b = jax.eval_shape(lambda: init_cache(cfg, 1, 7))

    def axis(x, y):
        return next(i for i, (m, n) in enumerate(zip(x.shape, y.shape)) if m != n)

    return axis(a.k[0], b.k[0]), axis(a.v[0], b.v[0])


def cache_structure(cache: KVCache, cfg: LlamaConfig | None = None) -> str:
    """Print (and return) the cache pytree as text: fields, shapes, dtypes, leaves and bytes."""
    k0, v0 = cache.k[0], cache.v[0]
    where = ""
    if cfg is not None:
        ka, va = slot_axes(cfg)
        where = f"  (slots on axis {ka} of K, axis {va} of V)"
    lines = [
        f"KVCache: {len(jax.tree.leaves(cache))} leaves, {cache.nbytes():,} bytes of keys and values",
        f"  k      tuple of {len(cache.k)} arrays (one per layer), each {_desc(k0)}",
        f"  v      tuple of {len(cache.v)} arrays (one per layer), each {_desc(v0)}{where}",
        f"  pos    {_desc(cache.pos)}  position of the token in each slot, -1 = empty or padding",
        f"  index  {_desc(cache.index)} = {int(cache.index)}  next slot to write",
    ]
    text = "\n".join(lines)
    print(text)
    return text


def cache_memory_rows(
    cfg: LlamaConfig, shapes: Sequence[tuple[int, int]], dtypes=("float32", "bfloat16"), unit: float = 1e6
) -> list[dict]:
    """For each (batch, slots) and dtype: the formula's bytes, the shaped cache's bytes, and what the
    same cache would take with one KV head per query head (multi-head attention, no grouping)."""
    mha = cfg.replace(n_kv_heads=cfg.n_heads)
    rows = []
    for b, s in shapes:
        for dt in dtypes:
            formula = cache_bytes(cfg, b, s, dt)  # 2 x layers x batch x slots x kv_heads x head_dim x itemsize
            shaped = jax.eval_shape(lambda: init_cache(cfg, b, s, dt)).nbytes()  # the real structure, unallocated
            rows.append(
                {
                    "batch": b,
                    "slots": s,
                    "dtype": dt,
                    "formula MB": formula / unit,
                    "KVCache.nbytes MB": shaped / unit,
                    "same": formula == shaped,
                    f"no GQA ({cfg.n_heads} KV heads) MB": cache_bytes(mha, b, s, dt) / unit,
                }
            )
    return rows


def live_bytes() -> int:
    """Bytes of every array alive on the devices (after a garbage collection)."""
    from jaxlab.tools.profile import memory_stats

    gc.collect()
    return int(memory_stats()["live_arrays_bytes"])


def live_growth(make: Callable[[], object]) -> tuple[object, int]:
    """Call ``make()`` and return (its result, how many bytes of live device arrays it added)."""
    before = live_bytes()
    out = jax.block_until_ready(make())
    return out, live_bytes() - before


# --------------------------------------------------------------------------------------------------
# Prefill, decode, and the reference they must equal
# --------------------------------------------------------------------------------------------------


#: How many times Python has run the body of :func:`model_step`. ``jax.jit`` runs a function's Python only
#: while it traces it (once per new input shape); later calls with new arrays of the same shapes (other
#: weights, the cache the last call returned) reuse the traced graph. Notebook 05 counts traces with it.
TRACES = {"model_step": 0}


def model_step(params: Params, tokens, positions, cache: KVCache):
    """Prefill and decode are this one function: tokens, positions [B, T] and the cache in -> (logits of the
    last position [B, V], the cache with these T tokens written) out. Nothing is kept between calls: the
    cache is an argument and a result, so ``jax.jit`` traces the step once per shape into one graph."""
    TRACES["model_step"] += 1  # plain Python: runs while jax.jit traces, never when the compiled program runs
    return next_logits(params, tokens, positions, cache)  # forward(..., last_only=True), the last logits


#: The model step with the cache donated (:func:`model_step`, i.e. :func:`jaxlab.engine.steps.next_logits`):
#: prefill gives it the whole prompt (T tokens in one call), decode one new token per row (T = 1): one
#: function, one compiled program per shape. The cache is donated: the caller must use the returned cache,
#: the one passed in is deleted.
prefill = decode_step = jax.jit(model_step, donate_argnums=(3,))


@jax.jit
def uncached_logits(params: Params, tokens, positions):
    """The reference: the full forward pass without a cache -> logits [B, T, V]."""
    return forward(params, tokens, positions)[0]


_next_logits_nocache = jax.jit(next_logits)  # the same step without a cache: recompute the whole prefix


def greedy_with_cache(
    params: Params,
    prompt: Sequence[int],
    n: int,
    slots: int,
    cache: KVCache | None = None,
    on_step: Callable[[KVCache], None] | None = None,
):
    """Greedy decoding of one prompt with the cache: a prefill, then ``n - 1`` decode steps.

    Returns (n new token ids, their logits [n, V] as numpy, the cache). With ``cache`` given, decoding
    continues from it (``prompt`` is then the tokens to feed, starting at ``cache.index``). ``on_step(cache)``
    is called after the prefill and after every decode step (to look at the cache as it fills)."""
    if cache is None:
        cache = init_cache(params.config, 1, slots, params.policy.jnp_dtype)
    start = int(cache.index)
    toks = jnp.asarray([list(prompt)], jnp.int32)
    pos = jnp.arange(start, start + toks.shape[1], dtype=jnp.int32)[None]
    last, cache = prefill(params, toks, pos, cache)  # the prompt in one call (one token: a decode step)
    if on_step is not None:
        on_step(cache)
    out, all_logits = [], []
    p = start + toks.shape[1]
    for i in range(n):
        all_logits.append(np.asarray(last[0]))
        nxt = int(jnp.argmax(last[0]))
        out.append(nxt)
        if i == n - 1:
            break
        last, cache = decode_step(params, jnp.asarray([[nxt]], jnp.int32), jnp.asarray([[p]], jnp.int32), cache)
        if on_step is not None:
            on_step(cache)
        p += 1
    return out, np.stack(all_logits), cache


def time_prefill_decode(params: Params, prompt: Sequence[int], slots: int, repeats: int = 3) -> list[dict]:
    """Best-of-``repeats`` seconds of a prefill of ``prompt`` (one call) and of one decode step after it,
    each on a fresh cache (the first round compiles and is not counted)."""
    cfg = params.config
    toks = jnp.asarray([list(prompt)], jnp.int32)
    pos = jnp.arange(toks.shape[1], dtype=jnp.int32)[None]
    nxt, nxt_pos = jnp.ones((1, 1), jnp.int32), jnp.full((1, 1), toks.shape[1], jnp.int32)
    t_pre, t_dec = [], []
    for r in range(repeats + 1):
        cache = jax.block_until_ready(init_cache(cfg, 1, slots, params.policy.jnp_dtype))
        t0 = time.perf_counter()
        logits, cache = prefill(params, toks, pos, cache)
        jax.block_until_ready(logits)
        t1 = time.perf_counter()
        logits, cache = decode_step(params, nxt, nxt_pos, cache)
        jax.block_until_ready(logits)
        t2 = time.perf_counter()
        if r:
            t_pre.append(t1 - t0)
            t_dec.append(t2 - t1)
    n = toks.shape[1]
    return [
        {"call": f"prefill: {n} tokens in one call", "ms": 1e3 * min(t_pre), "ms per token": 1e3 * min(t_pre) / n},
        {"call": "decode: 1 token", "ms": 1e3 * min(t_dec), "ms per token": 1e3 * min(t_dec)},
    ]


def max_logit_error(a, b) -> float:
    """max |a - b| relative to max |b|: the float32 mismatch between two logit tables."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# --------------------------------------------------------------------------------------------------
# Donation: the cache write on its own
# --------------------------------------------------------------------------------------------------


def one_token_kv(cfg: LlamaConfig, batch: int, dtype=jnp.float32, value: float = 1.0):
    """(K, V) of one token for one layer, shaped like a one-slot cache layer."""
    c = jax.eval_shape(lambda: init_cache(cfg, batch, 1, dtype))
    return jnp.full(c.k[0].shape, value, dtype), jnp.full(c.v[0].shape, value, dtype)


def _write_token(cache: KVCache, new_k, new_v, position, axes):
    i = cache.index
    k = tuple(write_slots(c, new_k, i, axes[0]) for c in cache.k)
    v = tuple(write_slots(c, new_v, i, axes[1]) for c in cache.v)
    pos = jax.lax.dynamic_update_slice(cache.pos, jnp.full((cache.batch, 1), position, cache.pos.dtype), (0, i))
    return KVCache(k, v, pos, i + 1)


_write_token_copied = jax.jit(_write_token, static_argnames=("axes",))
_write_token_donated = jax.jit(_write_token, static_argnames=("axes",), donate_argnums=(0,))


def write_token(cache: KVCache, new_k, new_v, position, cfg: LlamaConfig, donate: bool = False) -> KVCache:
    """Append one token's K and V (from :func:`one_token_kv`; the same for every layer here) at
    ``cache.index``: the cache traffic of one decode step without the model around it. With
    ``donate=True`` the cache passed in is given to XLA, which writes in place and deletes it."""
    fn = _write_token_donated if donate else _write_token_copied
    return fn(cache, new_k, new_v, position, axes=slot_axes(cfg))


def time_cache_write(
    cfg: LlamaConfig, batch: int, slots: int, donate: bool, steps: int = 5, dtype=jnp.float32
) -> list[float]:
    """Seconds per call of :func:`write_token` on a fresh cache, ``steps`` calls (the first is untimed
    compile + run). Without donation XLA must return a *new* cache, so every call copies all of it;
    with donation it writes the one token in place."""
    cache = init_cache(cfg, batch, slots, dtype)
    k, v = one_token_kv(cfg, batch, dtype)
    cache = jax.block_until_ready(write_token(cache, k, v, 0, cfg, donate))
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        cache = jax.block_until_ready(write_token(cache, k, v, s + 1, cfg, donate))
        times.append(time.perf_counter() - t0)
    del cache
    return times


# --------------------------------------------------------------------------------------------------
# Latency against context length
# --------------------------------------------------------------------------------------------------


def filled_cache(cfg: LlamaConfig, batch: int, slots: int, context: int, dtype=jnp.float32) -> KVCache:
    """A cache whose first ``context`` slots count as filled (positions 0..context-1). The keys and
    values are zeros: a step's cost does not depend on their values, only on the shapes."""
    c = init_cache(cfg, batch, slots, dtype)
    s = jnp.arange(slots, dtype=jnp.int32)
    pos = jnp.broadcast_to(jnp.where(s < context, s, -1), (batch, slots))
    return KVCache(c.k, c.v, pos, jnp.asarray(context, jnp.int32))


def latency_vs_context(params: Params, contexts: Sequence[int], slots: int, repeats: int = 3) -> list[dict]:
    """Seconds for the next token at each context length, best of ``repeats``:

    * without cache: one forward pass over all ``context + 1`` tokens (logits of the last only);
    * with cache: one :func:`decode_step` against a ``slots``-long cache holding ``context`` tokens
      (one compiled program for every context, as during a real generation).

    Everything is compiled before timing (the decode step also runs once); then ``repeats`` rounds time
    every context in turn, so a burst of load from elsewhere hits all contexts alike, not one of them."""
    cfg = params.config
    if max(contexts) + repeats + 2 > slots:
        raise ValueError(f"slots ({slots}) must exceed the longest context + repeats ({max(contexts) + repeats + 2})")
    one = jnp.ones((1, 1), jnp.int32)
    inputs, compiled, caches = {}, {}, {}
    for ctx in contexts:
        inputs[ctx] = (jnp.ones((1, ctx + 1), jnp.int32), jnp.arange(ctx + 1, dtype=jnp.int32)[None])
        compiled[ctx] = _next_logits_nocache.lower(params, *inputs[ctx], None).compile()  # compile only: runs cost
        cache = filled_cache(cfg, 1, slots, ctx, params.policy.jnp_dtype)
        logits, caches[ctx] = decode_step(params, one, jnp.full((1, 1), ctx, jnp.int32), cache)
        jax.block_until_ready(logits)
    nocache = {c: [] for c in contexts}
    cached = {c: [] for c in contexts}
    for r in range(repeats):
        for ctx in contexts:
            t0 = time.perf_counter()
            jax.block_until_ready(compiled[ctx](params, *inputs[ctx], None))
            nocache[ctx].append(time.perf_counter() - t0)
            pos = jnp.full((1, 1), ctx + 1 + r, jnp.int32)
            t0 = time.perf_counter()
            logits, caches[ctx] = decode_step(params, one, pos, caches[ctx])
            jax.block_until_ready(logits)
            cached[ctx].append(time.perf_counter() - t0)
    del caches
    return [
        {
            "context": c,
            "without cache ms": 1e3 * min(nocache[c]),
            "with cache ms": 1e3 * min(cached[c]),
            "speed-up": min(nocache[c]) / min(cached[c]),
        }
        for c in contexts
    ]


def cache_claim_holds(rows: list[dict], factor: float = 3.0) -> tuple[bool, str]:
    """The KV-cache claim on measured rows, judged on its robust part: at the longest context one cached
    step is more than ``factor`` x faster than recomputing the prefix, and the uncached cost grew more
    than ``factor`` x from the shortest context to the longest. Returns (holds, reason) in words only:
    the ratios themselves vary from run to run, so they belong in an unchecked cell."""
    first, last = rows[0], rows[-1]
    growth = last["without cache ms"] / first["without cache ms"]
    faster = last["speed-up"] > factor
    grows = growth > factor
    why = (
        f"at {last['context']} tokens of context a cached step is {'more' if faster else 'less'} than "
        f"{factor:g}x faster than recomputing, and recomputing grew {'more' if grows else 'less'} than "
        f"{factor:g}x from {first['context']} to {last['context']} tokens"
    )
    return faster and grows, why


def cached_growth(rows: list[dict]) -> float:
    """How much the cached step's time grew from the shortest context to the longest (ideally ~1)."""
    return rows[-1]["with cache ms"] / rows[0]["with cache ms"]


def plot_latency(rows: list[dict]):
    """Per-token latency against context, with and without the cache."""
    import matplotlib.pyplot as plt

    ctx = [r["context"] for r in rows]
    fig, ax = plt.subplots()
    ax.plot(ctx, [r["without cache ms"] for r in rows], "o-", label="without cache: recompute the prefix")
    ax.plot(ctx, [r["with cache ms"] for r in rows], "s-", label="with cache: one decode step")
    ax.set(
        xlabel="context length (tokens already seen)",
        ylabel="ms for the next token",
        title="Cost of one new token against context",
        yscale="log",
    )
    ax.legend()
    fig.tight_layout()
    return fig


def plot_speedup(rows: list[dict], factor: float = 3.0):
    """The cache's speed-up (recompute the prefix / one cached step) against context, with the claim's
    ``factor`` as a line."""
    import matplotlib.pyplot as plt

    ctx = [r["context"] for r in rows]
    fig, ax = plt.subplots()
    ax.plot(ctx, [r["speed-up"] for r in rows], "o-", label="measured speed-up")
    ax.axhline(factor, color="gray", ls="--", label=f"{factor:g}x: 'much cheaper'")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(
        xlabel="context length (tokens already seen)",
        ylabel="time without cache / with cache",
        title="What the KV cache saves grows with the context",
        xscale="log",
    )
    ax.set_xticks(ctx, [str(c) for c in ctx])
    ax.legend()
    fig.tight_layout()
    return fig


def plot_cache_fill(snapshots: Sequence[tuple[str, np.ndarray]], k_layer, cfg: LlamaConfig, show: int = 64):
    """Two panels on a batch-1 cache. Left: which of the first ``show`` slots hold a token after each step
    (``snapshots``: (label, ``cache.pos[0]``) pairs). Right: one layer's K array, |value| per slot and head
    dimension, the KV heads stacked: filled slots carry keys, empty ones are still zeros."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 1.3]})
    filled = np.stack([np.asarray(p)[:show] >= 0 for _, p in snapshots]).astype(float)
    a.imshow(filled, aspect="auto", cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
    a.set_yticks(range(len(snapshots)), [label for label, _ in snapshots], fontsize=8)
    a.set(title="Slots holding a token (pos >= 0)", xlabel="cache slot", ylabel="the cache ...")
    a.grid(False)
    k = np.asarray(k_layer)
    ka, _ = slot_axes(cfg)
    k = np.moveaxis(k, ka, -1)  # [..., slots]
    k = k.reshape(-1, cfg.head_dim, k.shape[-1])[: cfg.n_kv_heads]  # batch row 0: [KVH, Hd, slots]
    img = np.abs(k[:, :, :show]).reshape(cfg.n_kv_heads * cfg.head_dim, -1)
    b.imshow(img, aspect="auto", cmap="magma", interpolation="nearest")
    for h in range(1, cfg.n_kv_heads):
        b.axhline(h * cfg.head_dim - 0.5, color="w", lw=1)
    b.set_yticks([h * cfg.head_dim + cfg.head_dim // 2 for h in range(cfg.n_kv_heads)],
                 [f"KV head {h}" for h in range(cfg.n_kv_heads)])  # fmt: skip
    b.set(title=f"Layer 0's K, batch row 0: {cfg.n_kv_heads} heads x {cfg.head_dim} dims x slots", xlabel="cache slot")
    b.grid(False)
    fig.suptitle(
        f"The KV cache: {cfg.n_layers} layers x (K, V), each [batch x KV heads, slots, head dim]; one layer shown",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def plot_param_bytes(rows: list[dict]):
    """Bars per component of :func:`param_table` rows: MB as float32, bfloat16 and in the GGUF file."""
    import matplotlib.pyplot as plt

    parts = [r for r in rows if r["component"] != "total"]
    names = [r["component"] for r in parts]
    cols = [c for c in ("float32 MB", "bfloat16 MB", "GGUF MB") if c in parts[0]]
    x = np.arange(len(parts))
    width = 0.8 / len(cols)
    fig, ax = plt.subplots()
    for i, c in enumerate(cols):
        ax.bar(x + (i - (len(cols) - 1) / 2) * width, [r[c] for r in parts], width, label=c.replace(" MB", ""))
    ax.set_xticks(x, names)
    ax.set(title="Where the 135 M parameters live, and their bytes", xlabel="component", ylabel="MB (10^6 bytes)")
    ax.legend()
    fig.tight_layout()
    return fig
