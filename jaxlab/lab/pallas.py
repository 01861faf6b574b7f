"""What notebook 13 needs beside the kernels (:mod:`jaxlab.engine.kernels`): the production kernel JAX ships, met
on our cache.

JAX ships the ragged paged attention kernel that vLLM-TPU and SGLang-JAX run
(``jax.experimental.pallas.ops.tpu.ragged_paged_attention``). Feeding it the engine's paged cache shows what a
production kernel demands, measured here rather than read off its source:

* queries of every sequence concatenated into one [tokens, q_heads, D] array, with cumulative query lengths
  (``cu_q_lens``), each sequence's length (``kv_lens``) and a dynamic sequence count (``num_seqs``);
* keys and values *interleaved* in one page array [pages, page_size, 2 x KV heads, D] (k0, v0, k1, v1, ...);
* shapes the TPU tiles: 3 KV heads (6 combined) do not tile (padded to 4, and the 9 query heads to 12), and a
  head dimension of 64 fails an assertion (padded to 128);
* explicit block sizes (``num_kv_pages_per_block``, ``num_queries_per_block``) and no ``interpret`` argument.

:func:`jax_ragged_args` builds its inputs from ours; :func:`jax_ragged_reference` runs the pure-JAX reference that
ships beside it (comparable with our kernel); :func:`jax_ragged_lowering` tries to lower the kernel itself for a
TPU from this machine; :func:`jax_ragged_interpret` tries to run it in TPU interpret mode.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxlab.engine.kernels.common import lower

#: The padding the shipped kernel needs on SmolLM2's attention (3 KV heads, head dimension 64), found by lowering it
PAD_KV_HEADS, PAD_HEAD_DIM = 1, 64


def jax_ragged_args(
    q, k_pages, v_pages, page_table, lengths, pad_kv_heads: int = PAD_KV_HEADS, pad_head_dim: int = PAD_HEAD_DIM
) -> tuple:
    """The shipped kernel's inputs for one decode query per sequence: q [B, KVH, G, D] (our kernel's layout with
    T = 1), pages [KVH, N, ps, D], page_table [B, P], lengths [B] (tokens in each sequence, the query the last)
    -> (q [B, (KVH+pad) x G, D+pad], kv_pages [N, ps, 2 (KVH+pad), D+pad], kv_lens, page_indices, cu_q_lens, num_seqs)."""
    b, kvh, g, d = q.shape
    n, ps = k_pages.shape[1], k_pages.shape[2]
    pad = ((0, pad_kv_heads), (0, 0), (0, 0), (0, pad_head_dim))
    kvp, dp = kvh + pad_kv_heads, d + pad_head_dim
    kv = jnp.stack([jnp.pad(k_pages, pad), jnp.pad(v_pages, pad)], axis=1)  # [KVH+, 2, N, ps, D+]: k then v per head
    kv = kv.reshape(2 * kvp, n, ps, dp).transpose(1, 2, 0, 3)  # [N, ps, 2 (KVH+), D+], interleaved k0 v0 k1 v1 ...
    qq = jnp.pad(q, ((0, 0), (0, pad_kv_heads), (0, 0), (0, pad_head_dim))).reshape(b, kvp * g, dp)
    lens = jnp.asarray(lengths, jnp.int32)
    return (
        qq,
        kv,
        lens,
        jnp.asarray(page_table, jnp.int32),
        jnp.arange(b + 1, dtype=jnp.int32),
        jnp.asarray([b], jnp.int32),
    )


def from_jax_ragged(out, kvh: int, g: int, d: int):
    """The shipped kernel's output [B, (KVH+pad) x G, D+pad] back to ours [B, KVH, G, D] (the padding dropped)."""
    b, heads, dp = out.shape
    return out.reshape(b, heads // g, g, dp)[:, :kvh, :, :d]


def jax_ragged_reference(q, k_pages, v_pages, page_table, lengths, **pads):
    """The reference shipped beside the kernel (pure JAX, any backend), on our cache -> [B, KVH, G, D]."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

    args = jax_ragged_args(q, k_pages, v_pages, page_table, lengths, **pads)
    out = ref_ragged_paged_attention(*args, sm_scale=q.shape[-1] ** -0.5)
    return from_jax_ragged(out, q.shape[1], q.shape[2], q.shape[3])


def _kernel(pages_per_block: int, queries_per_block: int, scale: float):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    return functools.partial(
        ragged_paged_attention,
        sm_scale=scale,
        num_kv_pages_per_block=pages_per_block,
        num_queries_per_block=queries_per_block,
    )


def jax_ragged_lowering(
    q, k_pages, v_pages, page_table, lengths, pages_per_block: int = 2, queries_per_block: int = 8, **pads
) -> str:
    """Lower the shipped kernel for a TPU from here: "lowers" or the first line of the error it raised."""
    args = jax_ragged_args(q, k_pages, v_pages, page_table, lengths, **pads)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    try:
        text = lower(_kernel(pages_per_block, queries_per_block, q.shape[-1] ** -0.5), "tpu", *shapes)
    except Exception as e:  # noqa: BLE001 - what the kernel demands is the lesson: report it, whatever it is
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else '(no message: an assert in the kernel)'}"
    return "lowers" if "tpu_custom_call" in text else "lowered, but no TPU kernel in the program"


def jax_ragged_interpret(
    q, k_pages, v_pages, page_table, lengths, pages_per_block: int = 2, queries_per_block: int = 8, **pads
):
    """Run the shipped kernel in TPU interpret mode on this machine -> (output [B, KVH, G, D] or None, what
    happened in one line)."""
    from jax.experimental.pallas import tpu as pltpu

    args = jax_ragged_args(q, k_pages, v_pages, page_table, lengths, **pads)
    try:
        with pltpu.force_tpu_interpret_mode():
            out = _kernel(pages_per_block, queries_per_block, q.shape[-1] ** -0.5)(*args)
            out = jax.block_until_ready(out)
    except Exception as e:  # noqa: BLE001 - reported, not hidden: the interpreter's own limits are part of the lesson
        last = [line for line in str(e).splitlines() if line.strip()]
        return None, f"{type(e).__name__}: {last[-1] if last else ''}"[:300]
    return from_jax_ragged(out, q.shape[1], q.shape[2], q.shape[3]), "ran"


# --- notebook 13: the blocks drawn, the online softmax step by step, the block-size rules -----------------------


def visited_key_blocks(q_pos, k_pos, block_q: int, block_k: int):
    """[query blocks, key blocks] bool for one sequence (q_pos [Q], k_pos [S], lengths multiples of the blocks):
    which key blocks each query block's loop visits in :func:`~jaxlab.engine.kernels.flash.flash_attention`
    (from :func:`~jaxlab.engine.kernels.flash.key_block_bounds`)."""
    import numpy as np

    from jaxlab.engine.kernels.flash import key_block_bounds

    bounds = np.asarray(key_block_bounds(jnp.asarray(q_pos)[None], jnp.asarray(k_pos)[None], block_q, block_k))[0]
    nq, nk = len(q_pos) // block_q, len(k_pos) // block_k
    lo, hi = bounds[0::2], bounds[1::2]
    return (np.arange(nk)[None, :] >= lo[:, None]) & (np.arange(nk)[None, :] < hi[:, None]) & (nq > 0)


def plot_flash_blocks(q_pos, k_pos, block_q: int, block_k: int, title: str = "", ax=None):
    """The token-level mask (grey: a visible key) under the grid of query blocks x key blocks, each block the
    kernel visits outlined: what causal skipping and left padding save."""
    import matplotlib.pyplot as plt
    import numpy as np

    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    visited = visited_key_blocks(q_pos, k_pos, block_q, block_k)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 4.2))
    mask = (k_pos[None, :] >= 0) & (k_pos[None, :] <= q_pos[:, None])
    ax.imshow(mask, cmap="Greys", vmin=0, vmax=2.5, interpolation="nearest", aspect="auto")
    for i, j in zip(*np.nonzero(visited)):
        ax.add_patch(
            plt.Rectangle((j * block_k - 0.5, i * block_q - 0.5), block_k, block_q, fill=False, ec="tab:blue", lw=2)
        )
    ax.set_xticks(np.arange(0, len(k_pos) + 1, block_k) - 0.5, labels=np.arange(0, len(k_pos) + 1, block_k))
    ax.set_yticks(np.arange(0, len(q_pos) + 1, block_q) - 0.5, labels=np.arange(0, len(q_pos) + 1, block_q))
    ax.grid(color="tab:red", lw=0.6, alpha=0.5)
    ax.set_xlabel("key (cache slot)")
    ax.set_ylabel("query")
    ax.set_title(title or f"{int(visited.sum())} of {visited.size} blocks visited", fontsize=10)
    return ax.figure


def paged_reads(page_table, q_pos, page_size: int) -> list[list[int]]:
    """The pages each row of :func:`~jaxlab.engine.kernels.paged_attention.paged_attention` reads, in order."""
    import numpy as np

    from jaxlab.engine.kernels.paged_attention import page_counts

    table = np.asarray(page_table)
    counts = np.asarray(page_counts(jnp.asarray(q_pos), page_size, table.shape[1]))
    return [[int(p) for p in table[b, : counts[b]]] for b in range(table.shape[0])]


def plot_paged_reads(page_table, q_pos, page_size: int, num_pages: int, ax=None):
    """One row per sequence, one column per page of the pool: the pages the row reads, numbered in the order it
    reads them; its table's other entries (unread) in grey."""
    import matplotlib.pyplot as plt
    import numpy as np

    table = np.asarray(page_table)
    reads = paged_reads(table, q_pos, page_size)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(reads)))
    grid = np.zeros((len(reads), num_pages))
    for b, row in enumerate(reads):
        for p in table[b]:
            grid[b, p] = max(grid[b, p], 0.3)
        for j, p in enumerate(row):
            grid[b, p] = 1.0
            ax.text(p, b, str(j), ha="center", va="center", color="white", fontsize=9)
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=1.2, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(reads)), labels=[f"row {b}: {len(r)} page(s)" for b, r in enumerate(reads)])
    ax.set_xticks(range(num_pages))
    ax.set_xlabel("page of the pool")
    ax.set_title("What each row reads (number: order of reading; pale: in its table, not read)", fontsize=10)
    return ax.figure


def online_softmax_steps(q, k, v, block: int, scale: float | None = None):
    """Fold one query's keys into the online softmax ``block`` keys at a time, with
    :func:`~jaxlab.engine.kernels.common.online_update`: q [D], k, v [S, D] -> (rows, output), one row per block
    (the running max, sum, and how far ``acc / total`` still is from the softmax over the keys seen so far)."""
    import numpy as np

    from jaxlab.engine.kernels.common import MASK_VALUE, finish, online_update

    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    m, total, acc = np.full((1, 1), MASK_VALUE, np.float32), np.zeros((1, 1), np.float32), np.zeros((1, len(q)))
    rows = []
    for start in range(0, len(k), block):
        kb, vb = k[start : start + block], v[start : start + block]
        m, total, acc = online_update(
            m, total, acc, q[None], kb, vb, np.ones((1, len(kb)), bool), scale=scale, dtype=jnp.float32,
            precision=jax.lax.Precision.HIGHEST,
        )  # fmt: skip
        s = k[: start + len(kb)] @ q * scale
        p = np.exp(s - s.max())
        exact = (p / p.sum()) @ v[: start + len(kb)]
        got = np.asarray(finish(total, acc))[0]
        rows.append(
            {
                "keys seen": start + len(kb),
                "running max m": float(m[0, 0]),
                "max score so far": float(s.max()),
                "running sum": float(total[0, 0]),
                "sum of exp(s - m)": float(np.exp(s - float(m[0, 0])).sum()),
                "|acc/sum - softmax·v|": float(np.abs(got - exact).max()),
            }
        )
    return rows, np.asarray(finish(total, acc))[0]


def block_problems(q_len: int, s_len: int, block_q, block_k, chip: str) -> list[str]:
    """What is wrong with blocks (block_q, block_k) of a [q_len, D] x [s_len, D] attention on ``chip`` ("tpu" or
    "gpu"); empty when nothing is. TPU (Mosaic): a block's dimension is a multiple of its tile (8 rows of
    queries, 128 lanes of keys: the scores block [bq, bk] is tiled (8, 128)) or the whole dimension, and the
    blocks tile the arrays exactly (no padding). GPU (Triton): powers of two, at least 16 (``tl.dot``'s
    smallest), no bigger than the padded length needs. Both: at most 128 queries and 512 keys a block (the
    block and its [bq, bk] scores must fit in VMEM / shared memory and registers)."""
    out = []
    for name, b, n, tile, cap in (("block_q", block_q, q_len, 8, 128), ("block_k", block_k, s_len, 128, 512)):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            out.append(f"{name}={b!r} is not a positive int")
            continue
        if b > cap:
            out.append(f"{name}={b} is over {cap}: too big for on-chip memory")
        if chip == "tpu":
            if b % tile and b != n:
                out.append(f"{name}={b} is neither a multiple of {tile} nor the whole dimension ({n})")
            if n % b:
                out.append(f"{name}={b} does not divide {n}: the last block would be partial")
        else:
            if b & (b - 1):
                out.append(f"{name}={b} is not a power of two")
            if b < 16:
                out.append(f"{name}={b} is under 16, the smallest tl.dot")
            if b > max(16, 1 << (n - 1).bit_length()):
                out.append(f"{name}={b} is bigger than {n} padded to a power of two: pure padding")
    return out
