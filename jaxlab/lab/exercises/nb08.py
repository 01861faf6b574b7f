"""Checks for notebook 08's exercises: logical axes to a PartitionSpec, tensor-parallel MLP partial sums,
and padding attention heads.

* :func:`check_partition_spec` compares ``fn(logical_axes, rules) -> PartitionSpec`` with
  :func:`jaxlab.engine.mesh.logical_to_spec` on a fixed list of cases (trailing ``None`` entries do not matter).
* :func:`check_tp_mlp_partials` compares ``fn(x, w_gate, w_up, w_down, n) -> [n, T, D]`` (what each of ``n``
  devices holds before the all-reduce, when the MLP's hidden units are split into ``n`` contiguous blocks)
  with :func:`tp_mlp_partials`; their sum is the whole SwiGLU MLP.
* :func:`check_pad_heads` compares ``fn(wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, model)`` ->
  ``(wq, wk, wv, wo)`` padded with zero heads with :func:`pad_attention`.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function, report


def _strip(spec) -> tuple:
    t = tuple(spec)
    while t and t[-1] is None:
        t = t[:-1]
    return t


PARTITION_CASES = (
    (("embed", "q_heads"), {"q_heads": "model", "kv_heads": "model", "mlp": "model"}),
    (("q_heads", "embed"), {"q_heads": "model"}),
    (("vocab", "embed"), {"batch": "data", "q_heads": "model"}),
    (("batch", "seq"), {"batch": "data"}),
    (("batch", "kv_heads", "cache_len", "head_dim"), {"batch": "data", "kv_heads": "model"}),
    (("batch", "kv_heads", "head_dim", "cache_len"), {"kv_heads": "model"}),
    (("embed",), {}),
    (("embed", "mlp"), {"mlp": "model", "embed": None}),
)


def check_partition_spec(fn) -> bool:
    """``fn(logical_axes, rules)``: each logical axis becomes ``rules.get(axis)`` (a mesh axis, or None)."""
    from jaxlab.engine.mesh import logical_to_spec

    name = "logical axes -> PartitionSpec"
    for i, (axes, rules) in enumerate(PARTITION_CASES):
        try:
            got = fn(axes, dict(rules))
        except NotImplementedError:
            return report(False, name, "not implemented yet", False)
        except Exception as e:
            return report(False, name, f"case {i}: raised {type(e).__name__}: {e}", False)
        want = logical_to_spec(axes, {k: v for k, v in rules.items() if v is not None})
        try:
            same = _strip(got) == _strip(want)
        except TypeError:
            same = False
        if not same:
            return report(False, name, f"case {i} axes={axes} rules={rules}: got {got!r}, expected {want!r}", False)
    return report(True, name, f"{len(PARTITION_CASES)} cases match", False)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def tp_mlp_partials(x, w_gate, w_up, w_down, n):
    """x [T, D]; w_gate, w_up [D, F]; w_down [F, D] -> [n, T, D]: device s holds hidden units
    s*F/n .. (s+1)*F/n (columns of gate/up, rows of down) and computes its partial sum."""
    f = w_gate.shape[1] // n
    out = []
    for s in range(n):
        cols = slice(s * f, (s + 1) * f)
        h = _silu(x @ w_gate[:, cols]) * (x @ w_up[:, cols])  # column-parallel: no communication
        out.append(h @ w_down[cols])  # row-parallel: a partial sum of the output
    return np.stack(out)


def check_tp_mlp_partials(fn, trials: int = 5) -> bool:
    def make_inputs(rng):
        t, d, n = int(rng.integers(1, 4)), int(rng.integers(3, 7)), int(rng.choice([2, 4]))
        f = n * int(rng.integers(1, 4))
        g = lambda *s: rng.normal(size=s)  # noqa: E731
        return g(t, d), g(d, f), g(d, f), g(f, d), n

    return check_function(
        fn, tp_mlp_partials, make_inputs, name="tensor-parallel MLP partial sums", trials=trials, atol=1e-9, rtol=1e-9
    )


def pad_attention(wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, model):
    """Append zero KV heads until ``model`` divides their count, with ``n_heads // n_kv_heads`` zero
    query heads each (columns of wq/wk/wv, rows of wo), as :func:`jaxlab.engine.sharding.pad_heads` does."""
    g = n_heads // n_kv_heads
    kvh = -(-n_kv_heads // model) * model
    extra_q, extra_kv = (g * kvh - n_heads) * head_dim, (kvh - n_kv_heads) * head_dim
    cols = lambda w, e: np.pad(w, ((0, 0), (0, e)))  # noqa: E731
    return cols(wq, extra_q), cols(wk, extra_kv), cols(wv, extra_kv), np.pad(wo, ((0, extra_q), (0, 0)))


def check_pad_heads(fn, trials: int = 6) -> bool:
    def make_inputs(rng):
        kvh, g, hd = int(rng.choice([1, 2, 3, 5])), int(rng.choice([1, 2, 3])), int(rng.choice([2, 4]))
        d, model = int(rng.integers(3, 6)), int(rng.choice([2, 4, 8]))
        h = g * kvh
        r = lambda *s: rng.normal(size=s)  # noqa: E731
        return r(d, h * hd), r(d, kvh * hd), r(d, kvh * hd), r(h * hd, d), h, kvh, hd, model

    return check_function(fn, pad_attention, make_inputs, name="pad attention heads", trials=trials, atol=0, rtol=0)
