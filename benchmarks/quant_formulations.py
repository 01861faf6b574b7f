"""How XLA lowers each way of writing a quantized matmul: the evidence behind jaxlab.quant's choices.

Runs the bare chain of SmolLM2-135M's decode matmuls (30 layers x 7 projections + the tied head,
random weights of the real shapes, passed as arguments so XLA cannot constant-fold a conversion) in
several formulations, side by side in one process, alternating rep by rep, and prints the median
time per chain and the ratio to float32. Also times the decode attention (30 layers, one new token per
row against a 256-slot cache) as float32 and as int8 matmuls. See benchmarks/NOTES.md §5-§6.

    .venv/bin/python benchmarks/quant_formulations.py --batch 1,8,32
"""

from __future__ import annotations

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import quant
from jaxlab.lab.quantlab import interleaved_medians

HI = jax.lax.Precision.HIGHEST
D, F, KV, V, L = 576, 1536, 192, 49152, 30
SHAPES = dict(wq=(D, D), wk=(KV, D), wv=(KV, D), wo=(D, D), w_gate=(F, D), w_up=(F, D), w_down=(D, F))  # [out, in]


def dot_f32(x, w):  # w [out, in], contraction over its minor axis
    return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=HI)


def dot_convert(x, m):  # int8 weights converted to float32, then a float32 dot
    return dot_f32(x, m.q.astype(jnp.float32)) * m.scale


def dot_reduce(x, m):  # int8 weights as a broadcast multiply + reduction (one loop fusion)
    return jnp.sum(x[:, None, :] * m.q.astype(jnp.float32)[None], axis=-1) * m.scale


def int8_matmul(xq, q):  # [R, I] int8 x [O, I] int8 -> [R, O] float32, exact int32 accumulation (as jaxlab.quant)
    return jax.lax.dot_general(xq, q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32).astype(jnp.float32)


def dot_w8a8_one_row(x, m):  # W8A8 without jaxlab's two-row padding
    xq, s = quant.quantize_activations(x)
    return int8_matmul(xq, m.q) * s * m.scale


def dot_jaxlab(x, m):  # what jaxlab.quant runs for the matrix's format
    return m.dot(x)


def chain(dot, layers, head, x):
    for w in layers:
        q, k, v = dot(x, w["wq"]), dot(x, w["wk"]), dot(x, w["wv"])
        x = x + dot(q, w["wo"]) + 1e-3 * (k.sum(-1, keepdims=True) + v.sum(-1, keepdims=True))
        x = x + dot(jax.nn.silu(dot(x, w["w_gate"])) * dot(x, w["w_up"]), w["w_down"])
    return dot(x, head)


def attention(q, k, v, ks=None, vs=None):
    """q [N, G, Hd]; float k [N, S, Hd], v [N, Hd, S], or int8 with per-slot scales ks, vs [N, S]."""
    if ks is None:
        p = jax.nn.softmax(jnp.einsum("nqd,nsd->nqs", q, k, precision=HI), -1)
        return jnp.einsum("nqs,nds->nqd", p, v, precision=HI)
    p = jax.nn.softmax(int8_bmm(q, k, 2) * ks[:, None], -1)
    return int8_bmm(p * vs[:, None], v, 2)


def int8_bmm(x, m8, axis):
    """x [N, R, K] . m8 [N, *, K] contracting K (axis ``axis`` of m8) -> [N, R, M] float32: the int8 KV cache's
    attention matmul as jaxlab.engine.model writes it (x as two int8 rows, an int8 x int8 -> int32 dot)."""
    rows, s = quant.split_activations(x.astype(jnp.float32))
    acc = jax.lax.dot_general(rows, m8, (((2,), (axis,)), ((0,), (0,))), preferred_element_type=jnp.int32)
    return quant.join_split(acc.astype(jnp.float32), x.shape[1]) * s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    f32 = [{k: rng.standard_normal(s, np.float32) * 0.02 for k, s in SHAPES.items()} for _ in range(L)]
    head = rng.standard_normal((V, D), np.float32) * 0.02
    per_format = {
        fmt: (
            [{k: quant.quantize_matrix(w, fmt) for k, w in ly.items()} for ly in f32],
            quant.quantize_matrix(head, fmt),
        )
        for fmt in ("int8", "w8a8")
    }
    f32 = ([{k: jnp.asarray(w) for k, w in ly.items()} for ly in f32], jnp.asarray(head))
    variants = {
        "float32": (dot_f32, f32),
        "int8 convert-then-dot": (dot_convert, per_format["int8"]),
        "int8 multiply-reduce": (dot_reduce, per_format["int8"]),
        "w8a8, one row as is": (dot_w8a8_one_row, per_format["w8a8"]),
        "w8a8 (jaxlab)": (dot_jaxlab, per_format["w8a8"]),
        "int8 split rows (jaxlab)": (dot_jaxlab, per_format["int8"]),
    }
    for b in (int(x) for x in args.batch.split(",")):
        x = jnp.asarray(rng.standard_normal((b, D), np.float32))
        fns = {n: jax.jit(partial(chain, dot)) for n, (dot, _) in variants.items()}
        res = interleaved_medians(fns, {n: (*w, x) for n, (_, w) in variants.items()}, args.reps)
        for n, t in res.items():
            print(
                f"matmul chain  batch {b:3d}  {n:26s} {t * 1e3:8.1f} ms  {res['float32'] / t:5.2f}x float32", flush=True
            )
        n_kv, g, s, hd = b * 3, 3, 256, 64
        q = jnp.asarray(rng.standard_normal((n_kv, g, hd), np.float32))
        k = jnp.asarray(rng.standard_normal((n_kv, s, hd), np.float32))
        v = jnp.asarray(rng.standard_normal((n_kv, hd, s), np.float32))
        (k8, ks), (v8, vs) = quant_kv(k, 2), quant_kv(v, 1)

        def layers(q, *kv):
            for _ in range(L):
                q = q + 1e-3 * attention(q, *kv)
            return q

        res = interleaved_medians(
            {"float32": jax.jit(layers), "int8": jax.jit(layers)},
            {"float32": (q, k, v), "int8": (q, k8, v8, ks, vs)},
            args.reps,
        )
        for n, t in res.items():
            print(
                f"attention x30 batch {b:3d}  {n:26s} {t * 1e3:8.1f} ms  {res['float32'] / t:5.2f}x float32", flush=True
            )


def quant_kv(x, axis):
    from jaxlab.engine.kvcache import quantize_kv

    return quantize_kv(x, axis)


if __name__ == "__main__":
    main()
