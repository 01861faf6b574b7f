"""The Gated DeltaNet kernel computes the engine's gated delta rule (both its forms), in chunks or not, from zeros or
a state; it lowers for a TPU from this CPU and refuses, in words, the sizes a compiled variant cannot take.

Small prime-ish head sizes (Dk=5, Dv=7) in interpret mode, so a transposed axis cannot hide; chunks of 16 so two or
three chunks (one padded) cost little there."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.deltanet import gated_delta_chunked, gated_delta_recurrent, l2norm
from jaxlab.engine.kernels import gated_delta_pallas, lower

B, H, DK, DV, CHUNK = 2, 2, 5, 7, 16


def inputs(t: int, seed: int = 0, *, b=B, h=H, dk=DK, dv=DV, shared_key: float = 0.0, beta_low: float = 0.0):
    """q, k (l2-normalised, q scaled), v, g (<= 0), beta in (beta_low, 1), and a random initial state. With
    ``shared_key`` every key leans that far towards one common direction (near-parallel keys)."""
    rng = np.random.default_rng(seed)
    q = l2norm(jnp.asarray(rng.normal(size=(b, t, h, dk)), jnp.float32)) * dk**-0.5
    k = rng.normal(size=(b, t, h, dk)) + shared_key * rng.normal(size=(1, 1, 1, dk))
    k = l2norm(jnp.asarray(k, jnp.float32))
    v = jnp.asarray(rng.normal(size=(b, t, h, dv)), jnp.float32)
    g = -jnp.asarray(rng.uniform(0.0, 0.5, size=(b, t, h)), jnp.float32)
    beta = jnp.asarray(rng.uniform(beta_low, 1.0, size=(b, t, h)), jnp.float32)
    state = jnp.asarray(rng.normal(size=(b, h, dk, dv)), jnp.float32)
    return q, k, v, g, beta, state


def max_error(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())


@pytest.mark.parametrize("variant", ["tpu", "gpu"])
@pytest.mark.parametrize("t", [32, 37], ids=["whole-chunks", "padded"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zeros", "state"])
def test_kernel_equals_the_recurrent_and_chunked_forms(variant, t, with_state):
    q, k, v, g, beta, state = inputs(t)
    state = state if with_state else None
    out, s = gated_delta_pallas(q, k, v, g, beta, state, chunk=CHUNK, variant=variant, interpret=True)
    assert out.shape == (B, t, H, DV) and s.shape == (B, H, DK, DV)
    assert out.dtype == s.dtype == jnp.float32
    for form in (gated_delta_recurrent(q, k, v, g, beta, state), gated_delta_chunked(q, k, v, g, beta, state)):
        assert max_error(out, form[0]) <= 1e-5 and max_error(s, form[1]) <= 1e-5


def test_near_parallel_keys_stay_exact():
    """Keys almost all one direction and beta near 1, in one chunk of 64: the UT system's inverse is tame, but a
    power series for it cancels terms of 1e18 (the module docstring); the block doubling stays within float32."""
    q, k, v, g, beta, _ = inputs(64, 1, b=1, h=1, dk=16, dv=16, shared_key=3.0, beta_low=0.9)
    out, s = gated_delta_pallas(q, k, v, g / 50, beta, chunk=64, interpret=True)  # little decay: the hard case
    want_out, want_s = gated_delta_recurrent(q, k, v, g / 50, beta)
    assert max_error(out, want_out) <= 1e-5 and max_error(s, want_s) <= 1e-5


def qwen35_shapes(t: int = 200, dtype=jnp.bfloat16):
    """Abstract inputs at Qwen3.5's head sizes (Dk = Dv = 128), T not a multiple of the chunk."""
    sds = jax.ShapeDtypeStruct
    qk = sds((2, t, 4, 128), dtype)
    return qk, qk, sds((2, t, 4, 128), dtype), sds((2, t, 4), jnp.float32), sds((2, t, 4), jnp.float32)


@pytest.mark.parametrize("platform,variant,call", [("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "triton")])
def test_the_kernel_lowers_for_a_chip_that_is_not_here(platform, variant, call):
    fn = lambda *a: gated_delta_pallas(*a, chunk=64, variant=variant, interpret=False)  # noqa: E731
    text = lower(fn, platform, *qwen35_shapes())
    assert call in text


@pytest.mark.parametrize(
    "variant,chunk,dk,match",
    [("tpu", 12, 128, "multiple of 8.*chunk = 12"), ("gpu", 64, 24, "powers of two.*Dk = 24")],
)
def test_sizes_a_compiled_variant_refuses_are_said_in_words(variant, chunk, dk, match):
    q, k, v, g, beta, _ = inputs(8, dk=dk)
    with pytest.raises(ValueError, match=match):
        gated_delta_pallas(q, k, v, g, beta, chunk=chunk, variant=variant, interpret=False)


def test_mosaic_compiles_the_kernel_for_a_tpu_that_is_not_here():
    """Beyond lowering: libtpu's compiler, Mosaic's checks included, builds a v5e executable (nothing runs), and
    the variant picked for a TPU target is the compiled kernel, not the interpreted one."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxlab.bench.chip_compile import compile_one, target

    tpu = target("v5e-1")
    one = NamedSharding(tpu.mesh(1), P())
    shapes = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one) for s in qwen35_shapes())
    compiled = compile_one("gated delta", jax.jit(gated_delta_pallas), shapes, None, tpu)
    assert compiled.ok, compiled.message
    assert compiled.custom_calls.get("tpu_custom_call") == 1
