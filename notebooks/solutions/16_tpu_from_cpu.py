"""Solutions to notebook 16's exercises."""


def my_kv_bytes(n_layers, n_kv_heads, head_dim, batch, context, itemsize):
    """K and V (2) for every layer, KV head, head dimension, row and token, at itemsize bytes each."""
    return 2 * n_layers * n_kv_heads * head_dim * batch * context * itemsize


def my_max_batch(weights_bytes, kv_bytes_per_row, hbm_bytes, reserve=0.1):
    """What is left of the usable HBM after the weights, in whole rows; none when the weights alone do not fit."""
    free = hbm_bytes * (1 - reserve) - weights_bytes
    return max(0, int(free // kv_bytes_per_row))
