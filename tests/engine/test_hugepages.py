"""The weights in 2 MB pages (jaxlab.engine.hugepages): views of one region, the same values, and the pages the
kernel gave them; device_put wherever it does not apply."""

import gc
import mmap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxlab.engine import hugepages

MB = 1 << 20


@pytest.fixture
def fresh_status(monkeypatch):
    hugepages.status.cache_clear()
    yield monkeypatch
    hugepages.status.cache_clear()


@pytest.fixture
def huge_on(fresh_status):
    """Huge pages as users get them (tests/conftest.py turns them off for every other test)."""
    fresh_status.setenv(hugepages.ENV, "1")
    return fresh_status


def test_status_names_the_reason_on_this_host(huge_on):
    st = hugepages.status()
    mode = hugepages.THP.read_text()
    # this project's hosts (Linux CPUs, THP "madvise" or "always") map the weights; another host says why not
    assert st.available == ("[never]" not in mode), (st, mode)
    assert ("2 MB pages" in st.reason) if st.available else ("never" in st.reason)


def test_host_arrays_become_views_of_one_region_in_huge_pages(huge_on):
    assert hugepages.status().available, hugepages.status().reason
    rng = np.random.default_rng(0)
    tree = {
        "a": rng.standard_normal((1024, 1536), dtype=np.float32),  # 6 MB, numpy
        "b": jnp.asarray(rng.integers(-128, 127, (4096, 4096), dtype=np.int8)),  # 16 MB, a jax array
        "c": rng.standard_normal((1000,), dtype=np.float32),  # under 4 KB: device_put
    }
    placed = hugepages.put(tree)
    for k in tree:
        assert isinstance(placed[k], jax.Array) and placed[k].dtype == tree[k].dtype
        np.testing.assert_array_equal(np.asarray(placed[k]), np.asarray(tree[k]))
    pa, pb = placed["a"].unsafe_buffer_pointer(), placed["b"].unsafe_buffer_pointer()
    assert pa % (2 * MB) == 0 and pb - pa == 6 * MB  # one region, 2 MB-aligned, the arrays in tree order
    assert not placed["a"].committed  # as device_put's: a program over several devices may move it
    region = hugepages.mapping_of(placed["b"])
    assert region == hugepages.mapping_of(placed["a"])
    # the region asked for 2 MB pages and got some (how many is the kernel's to grant: all 22 MB on a quiet machine,
    # part of them under memory pressure, NOTES 30)
    assert region["size"] == 22 * MB and region["advised"] and region["huge"] >= 2 * MB, region
    # the region lives as long as its arrays: the sources gone, a program on the views reads the same values
    want = tree["a"] * 2
    del tree
    gc.collect()
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: x * 2)(placed["a"])), want)


def test_device_put_where_it_does_not_apply(huge_on):
    small = {"w": np.ones((256, 1024), np.float32)}  # 1 MB: under MIN_BYTES
    bf16 = {"w": np.ones((2048, 2048), ml_dtypes.bfloat16)}  # another dtype: placed all the same
    for tree in (small, bf16):
        out = hugepages.put(tree)
        assert out["w"].dtype == tree["w"].dtype
        np.testing.assert_array_equal(np.asarray(out["w"]), tree["w"])
    huge_on.setenv(hugepages.ENV, "0")
    hugepages.status.cache_clear()
    assert hugepages.status() == hugepages.HugePageStatus(False, "JAXLAB_HUGE_PAGES=0")

    def no_region(*args, **kwargs):
        raise AssertionError("switched off, yet put mapped a region")

    huge_on.setattr(mmap, "mmap", no_region)
    big = {"w": np.ones((2048, 2048), np.float32)}
    out = hugepages.put(big)
    np.testing.assert_array_equal(np.asarray(out["w"]), big["w"])


def test_loaded_weights_lie_in_huge_pages(huge_on, converted_cache):
    """What `load` gives users on this host: every float32 matrix of the converted parameters a view into one region
    that asked for 2 MB pages (and the int8 ones that `load(quant="int8")` quantizes). On a quiet machine the kernel
    grants all of it (NOTES 30: 512 of 513 MiB); during `make test` it gave 243 of 538 MB once."""
    from jaxlab.engine import loading

    assert hugepages.status().available, hugepages.status().reason
    huge_on.setenv("JAXLAB_CACHE", str(converted_cache))  # the tests' cache: int8 quantized once, kept for others
    for quant in (None, "int8"):
        params, _, _ = loading.load_params(None, quant=quant)
        leaves = [x for x in jax.tree.leaves(params.state) if x.nbytes >= hugepages.ALIGN]
        start = min(x.unsafe_buffer_pointer() for x in leaves)
        end = max(x.unsafe_buffer_pointer() + x.nbytes for x in leaves)
        total = sum(-(-x.nbytes // hugepages.ALIGN) * hugepages.ALIGN for x in leaves)
        assert start % (2 * MB) == 0 and end - start <= total, quant  # one 2 MB-aligned region holds them, packed
        region = hugepages.mapping_of(leaves[0])
        assert region["size"] >= total and region["advised"] and region["huge"] >= 2 * MB, (quant, region, total)
