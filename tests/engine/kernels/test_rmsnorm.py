"""The first kernel: RMSNorm by blocks of rows equals the model's RMSNorm; where kernels run; lowering elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.kernels import lower, rms_norm, variant_for
from jaxlab.engine.model import Policy, RMSNorm


@pytest.mark.parametrize("variant", ["tpu", "gpu"])
def test_rms_norm_equals_the_models(variant):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
    norm = RMSNorm(40, 1e-5, Policy())
    norm.weight.set_value(jnp.asarray(rng.standard_normal(40), jnp.float32))
    got = rms_norm(x, norm.weight.get_value(), 1e-5, block_rows=8, variant=variant)
    np.testing.assert_allclose(np.asarray(got), np.asarray(norm(x)), atol=1e-6, rtol=0)


def test_rows_that_do_not_split_into_blocks_are_refused():
    with pytest.raises(ValueError, match="blocks of 8"):
        rms_norm(jnp.ones((10, 4)), jnp.ones(4), block_rows=8)


def test_where_kernels_run():
    assert variant_for("tpu") == ("tpu", False) and variant_for("gpu") == ("gpu", False)
    assert variant_for("cpu") == ("gpu", True)  # interpret mode: the loop-over-pages variant simulates faster


@pytest.mark.parametrize("platform,variant,call", [("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "triton")])
def test_lowers_for_tpu_and_cuda_from_a_cpu(platform, variant, call):
    shapes = (jax.ShapeDtypeStruct((64, 128), jnp.float32), jax.ShapeDtypeStruct((128,), jnp.float32))
    assert call in lower(lambda x, w: rms_norm(x, w, variant=variant, interpret=False), platform, *shapes)
