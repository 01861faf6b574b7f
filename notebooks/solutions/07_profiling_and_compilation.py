"""Solutions to notebook 07's exercises."""

import time

import jax


def my_matmul_intensity(m, k, n, itemsize):
    """FLOP/byte of [m, k] @ [k, n]: 2mkn multiply-adds over reading A and B and writing C once."""
    flops = 2 * m * k * n
    nbytes = (m * k + k * n + m * n) * itemsize
    return flops / nbytes


def my_time_bound(bandwidth, peak_flops, flops, nbytes):
    """The roofline's lower bound on seconds: the slower of moving the bytes and doing the FLOPs."""
    return max(flops / peak_flops, nbytes / bandwidth)


def my_compile_then_run(jitted, *args):
    """Compile ahead of time (no execution), then run the compiled program once -> (compile_s, run_s, out)."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    t1 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, out
