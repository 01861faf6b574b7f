"""The numbers behind benchmarks/NOTES.md §8: perplexity, KL and top-1 agreement vs float32 for each
weight format, W8A8 with and without SmoothQuant (several alphas), and the int8 KV cache.

8 windows x 256 tokens from the start of data/eval/stdlib.txt; SmoothQuant calibrated either on the
last 4 windows of that file (held out from the 8 scored ones) or on jaxlab's shipped calibration text.

    .venv/bin/python benchmarks/w8a8_alpha_sweep.py int8,int4,w8a8,w8a8:0.5,w8a8:cal,f32+int8
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import forward, init_cache, quant
from jaxlab.engine import loading

W, N = 256, 8


def main(specs: str):
    m = loading.load()
    p = m.params
    ids = m.tokenizer.encode((Path(__file__).parents[1] / "data/eval/stdlib.txt").read_text())
    win = np.array([ids[i * W : (i + 1) * W] for i in range(N)], np.int32)
    pos = np.broadcast_to(np.arange(W, dtype=np.int32), win.shape)
    held_out = np.array([ids[len(ids) - (i + 1) * W : len(ids) - i * W] for i in range(4)], np.int32)
    f = jax.jit(forward)

    def logp(params, kv):
        cache = init_cache(p.config, N, W, kv) if kv else None
        return jax.nn.log_softmax(f(params, win, pos, cache)[0][:, :-1], -1)

    def nll(lp):
        return -float(jnp.mean(jnp.take_along_axis(lp, win[:, 1:, None], -1)))

    ref = logp(p, None)
    print(f"float32 perplexity {np.exp(nll(ref)):.4f} over {N} x {W} tokens")
    for spec in specs.split(","):
        fmt, _, kv = spec.partition("+")
        name, _, alpha = fmt.partition(":")
        if name == "f32":
            qp = p
        elif alpha == "cal":
            qp = quant.quantize_model(p, m.tokenizer, name)
        elif alpha:
            stats = quant.activation_stats(p, held_out, np.broadcast_to(np.arange(W, dtype=np.int32), held_out.shape))
            qp = quant.quantize_params(p, name, calibration=stats, alpha=float(alpha))
        else:
            qp = quant.quantize_params(p, name)
        lp = logp(qp, kv or None)
        kl = float(jnp.mean(jnp.sum(jnp.exp(ref) * (ref - lp), -1)))
        top1 = float(jnp.mean(jnp.argmax(lp, -1) == jnp.argmax(ref, -1)))
        print(
            f"{spec:14s} ppl {(np.exp(nll(lp) - nll(ref)) - 1) * 100:+.2f} %  KL {kl:.4f}  top-1 {top1:.3f}", flush=True
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "int8,int4,w8a8,w8a8:0.5,w8a8:cal,f32+int8,int8+int8,w8a8:cal+int8")
