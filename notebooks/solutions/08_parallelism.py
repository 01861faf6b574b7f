"""Solutions to notebook 08's exercises."""

import numpy as np
from jax.sharding import PartitionSpec as P


def my_partition_spec(logical_axes, rules):
    """Each logical axis becomes the mesh axis its rule names; an axis without a rule is replicated (None)."""
    return P(*(rules.get(axis) for axis in logical_axes))


def my_tp_mlp_partials(x, w_gate, w_up, w_down, n):
    """What each of n devices holds before the all-reduce: its block of hidden units, fully computed
    (column-parallel gate and up), times its rows of w_down (row-parallel) -> a partial sum [T, D]."""
    f = w_gate.shape[1] // n
    partials = []
    for s in range(n):
        block = slice(s * f, (s + 1) * f)
        gate, up = x @ w_gate[:, block], x @ w_up[:, block]
        hidden = gate / (1 + np.exp(-gate)) * up  # silu(gate) * up
        partials.append(hidden @ w_down[block])
    return np.stack(partials)  # summing over axis 0 is the all-reduce


def my_pad_heads(wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, model):
    """Zero KV heads until `model` divides them, each with its group of zero query heads."""
    group = n_heads // n_kv_heads
    kv_heads = -(-n_kv_heads // model) * model  # round up to a multiple of model
    extra_q = (group * kv_heads - n_heads) * head_dim
    extra_kv = (kv_heads - n_kv_heads) * head_dim
    return (np.pad(wq, ((0, 0), (0, extra_q))), np.pad(wk, ((0, 0), (0, extra_kv))),
            np.pad(wv, ((0, 0), (0, extra_kv))), np.pad(wo, ((0, extra_q), (0, 0))))
