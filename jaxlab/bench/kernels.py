"""``jaxlab bench --kernels``: the lab's Pallas attention kernels against XLA's attention and JAX's own kernels.

Shapes are SmolLM2's attention (9 query heads over 3 KV heads, head dimension 64), float32:

* **prefill** at each context C and batch B: causal self-attention of C tokens. Ours
  (:func:`~jaxlab.engine.kernels.flash_attention`) against the jitted ``jnp`` formulation of the model (scores,
  mask, softmax: the [C, C] scores exist in memory) and, on a GPU, JAX's ``pallas.ops.gpu.attention.mha``
  (causal, its K/V repeated to 9 heads: it has no grouped-query form);
* **decode** at each context and batch: one query per sequence over C cached positions. Ours
  (:func:`~jaxlab.engine.kernels.paged_attention`, pages of 16 scattered over a pool) against jitted attention
  over a contiguous cache, and on a GPU JAX's ``pallas.ops.gpu.paged_attention``.

Targets (GPU): prefill kernel >= 1.0x the jitted ``jnp`` attention at 8k context; decode over pages within 1.2x
of contiguous jitted attention. On a CPU the kernels run in interpret mode, a simulator: the command then runs a
small smoke size (``--quick`` sizes), checks every path computes the same numbers, and reports times only as what
they are (not kernel speed).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import flash_attention, paged_attention, variant_for
from jaxlab.engine.kernels.common import reference_attention
from jaxlab.tools.profile import time_fn

KVH, G, D, PAGE = 3, 3, 64, 16
CONTEXTS, BATCHES = (512, 2048, 8192), (1, 8, 32)
QUICK_CONTEXTS, QUICK_BATCHES = (64,), (1, 2)


def timed(fn: Callable, args: tuple, reps: int) -> tuple[float | None, str, object]:
    """(best seconds of ``reps`` calls after the one that compiles, "" or what went wrong in one line, the output)."""
    try:
        best = time_fn(fn, *args, repeats=reps, warmup=0).min
        return best, "", jax.block_until_ready(fn(*args))
    except Exception as e:  # noqa: BLE001 - an out-of-memory jnp attention at 8k is a result, not a crash
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", None


def prefill_case(rng, batch: int, ctx: int):
    n = batch * KVH
    q = jnp.asarray(rng.standard_normal((n, G * ctx, D)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((n, ctx, D)), jnp.float32) for _ in range(2))
    pos = jnp.arange(ctx, dtype=jnp.int32)
    return q, k, v, jnp.broadcast_to(jnp.tile(pos, G), (n, G * ctx)), jnp.broadcast_to(pos, (n, ctx))


def decode_case(rng, batch: int, ctx: int):
    per_row = ctx // PAGE
    pool = 1 + batch * per_row
    k_pages, v_pages = (jnp.asarray(rng.standard_normal((KVH, pool, PAGE, D)), jnp.float32) for _ in range(2))
    table = jnp.asarray(rng.permutation(np.arange(1, pool)).reshape(batch, per_row), jnp.int32)
    q = jnp.asarray(rng.standard_normal((batch, KVH, G, D)), jnp.float32)
    q_pos = jnp.full((batch, G), ctx - 1, jnp.int32)
    # the same keys contiguous: [B*KVH, ctx, D], as the model's contiguous cache rows
    k = jnp.moveaxis(k_pages[:, table], 0, 1).reshape(batch * KVH, ctx, D)
    v = jnp.moveaxis(v_pages[:, table], 0, 1).reshape(batch * KVH, ctx, D)
    return q, k_pages, v_pages, table, q_pos, k, v


def measure_kernels(quick: bool | None = None, reps: int = 5, log: Callable = print, seed: int = 0) -> dict:
    """Every (context, batch) case: seconds per call of each way, ratios, and the largest difference between ways."""
    variant, interpret = variant_for()
    quick = interpret if quick is None else quick
    contexts, batches = (QUICK_CONTEXTS, QUICK_BATCHES) if quick else (CONTEXTS, BATCHES)
    rng = np.random.default_rng(seed)
    gpu = jax.default_backend() == "gpu"
    rows = []
    for ctx in contexts:
        for b in batches:
            log(f"kernels: context {ctx}, batch {b}")
            row = {"context": ctx, "batch": b}
            q, k, v, qp, kp = prefill_case(rng, b, ctx)
            ours = jax.jit(lambda *a: flash_attention(*a, variant=variant, interpret=interpret))
            row["prefill_pallas_s"], row["prefill_pallas_error"], a = timed(ours, (q, k, v, qp, kp), reps)
            row["prefill_jnp_s"], row["prefill_jnp_error"], r = timed(
                jax.jit(reference_attention), (q, k, v, qp, kp), reps
            )
            if a is not None and r is not None:
                row["prefill_max_abs_diff"] = float(jnp.max(jnp.abs(a - r)))
            if gpu:
                row["prefill_jax_mha_s"], row["prefill_jax_mha_error"] = jax_mha(q, k, v, b, ctx, reps)
            del q, k, v, a, r
            q, kpg, vpg, table, qpos, kc, vc = decode_case(rng, b, ctx)
            paged = jax.jit(lambda *a: paged_attention(*a, variant=variant, interpret=interpret))
            row["decode_paged_s"], row["decode_paged_error"], a = timed(paged, (q, kpg, vpg, table, qpos), reps)
            qn = q.reshape(b * KVH, G, D)
            kpos = jnp.broadcast_to(jnp.arange(ctx, dtype=jnp.int32), (b * KVH, ctx))
            args = (qn, kc, vc, jnp.full((b * KVH, G), ctx - 1, jnp.int32), kpos)
            row["decode_contiguous_s"], row["decode_contiguous_error"], r = timed(
                jax.jit(reference_attention), args, reps
            )
            if a is not None and r is not None:
                row["decode_max_abs_diff"] = float(jnp.max(jnp.abs(a.reshape(r.shape) - r)))
            if gpu:
                row["decode_jax_paged_s"], row["decode_jax_paged_error"] = jax_paged(q, kpg, vpg, table, ctx, reps)
            for name, num, den in (
                ("prefill_speedup_vs_jnp", "prefill_jnp_s", "prefill_pallas_s"),
                ("decode_paged_over_contiguous", "decode_paged_s", "decode_contiguous_s"),
            ):
                if row.get(num) and row.get(den):
                    row[name] = row[num] / row[den]
            rows.append(row)
    return {"variant": variant, "interpret": interpret, "quick": quick, "rows": rows}


def jax_mha(q, k, v, batch: int, ctx: int, reps: int):
    """JAX's own Pallas GPU flash attention on the same problem ([B, C, heads, D]; K/V repeated to 9 heads)."""
    from jax.experimental.pallas.ops.gpu import attention

    qh = q.reshape(batch, KVH, G, ctx, D).transpose(0, 3, 1, 2, 4).reshape(batch, ctx, KVH * G, D)
    kh = jnp.repeat(k.reshape(batch, KVH, ctx, D).transpose(0, 2, 1, 3), G, axis=2)
    vh = jnp.repeat(v.reshape(batch, KVH, ctx, D).transpose(0, 2, 1, 3), G, axis=2)
    fn = jax.jit(lambda a, b_, c: attention.mha(a, b_, c, None, sm_scale=D**-0.5, causal=True))
    seconds, err, _ = timed(fn, (qh, kh, vh), reps)
    return seconds, err


def jax_paged(q, k_pages, v_pages, table, ctx: int, reps: int):
    """JAX's own Pallas GPU paged attention on the same cache (q [B, 9, D])."""
    from jax.experimental.pallas.ops.gpu import paged_attention as jpa

    b = q.shape[0]
    lengths = jnp.full((b,), ctx, jnp.int32)
    fn = jax.jit(lambda a, kk, vv, t, n: jpa.paged_attention(a, kk, vv, t, n, pages_per_compute_block=4))
    seconds, err, _ = timed(fn, (q.reshape(b, KVH * G, D), k_pages, v_pages, table, lengths), reps)
    return seconds, err


def kernel_targets(res: dict) -> list[tuple[str, bool | None, str]]:
    """(target, met or None when not measurable here, measured) for the two GPU targets."""
    if res["interpret"]:
        why = "interpret mode on this backend: a simulator, no kernel speed to compare"
        return [("prefill kernel >= 1.0x jnp at 8k", None, why), ("paged decode <= 1.2x contiguous", None, why)]
    at8k = [r for r in res["rows"] if r["context"] == 8192 and r.get("prefill_speedup_vs_jnp")]
    dec = [r["decode_paged_over_contiguous"] for r in res["rows"] if r.get("decode_paged_over_contiguous")]
    out = []
    if at8k:
        worst = min(r["prefill_speedup_vs_jnp"] for r in at8k)
        out.append(("prefill kernel >= 1.0x jnp at 8k", worst >= 1.0, f"{worst:.2f}x (worst batch)"))
    if dec:
        out.append(("paged decode <= 1.2x contiguous", max(dec) <= 1.2, f"{max(dec):.2f}x (worst case)"))
    return out


def render_kernels(res: dict) -> str:
    mode = "interpret mode (a simulator: times are not kernel speed)" if res["interpret"] else "compiled"
    lines = [f"Pallas kernels, {res['variant']} variant, {mode}"]
    lines.append(
        f"{'ctx':>6} {'batch':>5}  {'prefill ours':>12} {'jnp':>10} {'x':>6}  {'decode paged':>12} "
        f"{'contig.':>10} {'x':>6}  {'max diff':>9}"
    )

    def sec(r, key):
        v = r.get(key)
        return f"{v * 1e3:10.2f}ms"[-12:] if v else ("OOM/err" if r.get(key.replace("_s", "_error")) else "-")

    for r in res["rows"]:
        diff = max(r.get("prefill_max_abs_diff", 0.0), r.get("decode_max_abs_diff", 0.0))
        lines.append(
            f"{r['context']:>6} {r['batch']:>5}  {sec(r, 'prefill_pallas_s'):>12} {sec(r, 'prefill_jnp_s'):>10} "
            f"{r.get('prefill_speedup_vs_jnp', float('nan')):>5.2f}x  {sec(r, 'decode_paged_s'):>12} "
            f"{sec(r, 'decode_contiguous_s'):>10} {r.get('decode_paged_over_contiguous', float('nan')):>5.2f}x  "
            f"{diff:9.1e}"
        )
        for key in ("prefill_jax_mha_s", "decode_jax_paged_s"):
            if key in r:
                lines.append(
                    f"{'':>14}JAX's own {key.split('_')[0]} kernel: {sec(r, key)} {r.get(key[:-2] + '_error')}"
                )
    for name, met, measured in kernel_targets(res):
        word = "NOT MEASURABLE HERE" if met is None else ("PASS" if met else "MISS")
        lines.append(f"{word:<20} {name}: {measured}")
    return "\n".join(lines) + "\n"


def run_kernels(args, out) -> int:
    """``jaxlab bench --kernels [--quick] [--json F]``: measure, print, write."""
    import sys

    from jaxlab.bench.output import finish, host_meta

    res = measure_kernels(quick=True if getattr(args, "quick", False) else None,
                          log=lambda s: print(s, file=sys.stderr, flush=True))  # fmt: skip
    res["meta"] = host_meta(backend=jax.default_backend(), device=str(jax.devices()[0]))
    res["targets"] = [{"target": t, "met": met, "measured": m} for t, met, m in kernel_targets(res)]
    return finish({k: v for k, v in res.items() if k != "targets"} | {"kernel_targets": res["targets"]},
                  render_kernels(res), args, out)  # fmt: skip
