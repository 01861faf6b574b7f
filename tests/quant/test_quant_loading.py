"""Quantized parameters through ``jaxlab.engine.loading``: quantized once, then read from the cache folder; a
broken cache file, or a request that cannot run, is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import hf_llama_tensors

from jaxlab import quant
from jaxlab.cli import main
from jaxlab.engine import loading
from jaxlab.errors import ConfigError, ModelFileError
from jaxlab.io import assets, param_cache
from jaxlab.quant import QuantizedMatrix
from jaxlab.tools import compile_cache


@pytest.fixture(scope="module")
def module_cache(converted_cache):
    return converted_cache


@pytest.fixture
def cache(module_cache, monkeypatch):
    # compiled programs stay in the usual folder: only parameter files go to the temporary cache
    monkeypatch.setenv("JAXLAB_COMPILE_CACHE", str(compile_cache.default_dir()))
    monkeypatch.setenv("JAXLAB_CACHE", str(module_cache))
    return module_cache


def quant_file(fmt, group=quant.DEFAULT_GROUP, model=None):
    """Where the quantized parameters of ``model`` (default: the embedded model) are cached."""
    source = Path(model) if model else assets.model_path()
    return param_cache.params_file(assets.cache_dir(), source, extra=loading.quant_cache_key(fmt, group))


def refuse(what):
    def fail(*a, **k):
        raise AssertionError(f"{what} ran again instead of the quantized parameter file being read")

    return fail


def test_quantized_once_then_read_from_the_cache(cache, monkeypatch):
    f = quant_file("int8")
    f.unlink(missing_ok=True)
    first, kind, _ = loading.load_params(quant="int8")
    assert kind == "gguf" and first.quant == "int8"
    assert f.parent == cache / "params" and f.exists()

    from jaxlab.io import gguf

    monkeypatch.setattr(quant, "quantize_model", refuse("quantization"))
    monkeypatch.setattr(quant, "quantize_params", refuse("quantization"))
    monkeypatch.setattr(gguf, "load_gguf", refuse("GGUF conversion"))
    monkeypatch.setattr(param_cache, "load", refuse("reading the float parameters"))
    second, _, _ = loading.load_params(quant="int8")
    assert second.quant == "int8"
    a, b = first.flat(), second.flat()
    assert a.keys() == b.keys()
    for name in ("embed", "layers.0.attn.wq", "layers.29.mlp.w_down", "norm.weight"):
        x, y = a[name], b[name]
        if isinstance(x, QuantizedMatrix):
            assert (x.fmt, x.group) == (y.fmt, y.group)
            np.testing.assert_array_equal(np.asarray(x.q), np.asarray(y.q))
            np.testing.assert_array_equal(np.asarray(x.scale), np.asarray(y.scale))
        else:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # int8 is per channel: another group size is the same file
    again, _, _ = loading.load_params(quant="int8", group_size=64)
    assert again.quant == "int8"


@pytest.mark.parametrize("fmt", ["int8", "int4", "w8a8"])
def test_cached_model_computes_what_the_fresh_one_does(cache, small, capsys, fmt):
    """The file holds everything the quantized model computes with (scales, offsets, smoothing factors); and
    quantizing shows no progress bar unless asked (``test_progress_bar_when_asked``). On the embedded model's first
    two layers: the same file format, a fraction of the quantizing."""
    import jax
    import jax.numpy as jnp

    from jaxlab.engine.model import forward

    tokens = jnp.asarray([[1, 9690, 198, 2683, 359, 253, 5356]])
    positions = jnp.arange(tokens.shape[1])[None]
    logits = jax.jit(lambda p: forward(p, tokens, positions)[0])
    quant_file(fmt, model=small).unlink(missing_ok=True)
    fresh, _, _ = loading.load_params(small, quant=fmt)
    assert quant_file(fmt, model=small).exists()
    assert "quantizing" not in capsys.readouterr().err
    cached, _, _ = loading.load_params(small, quant=fmt)
    np.testing.assert_array_equal(np.asarray(logits(cached)), np.asarray(logits(fresh)))


def test_cache_keys():
    key = loading.quant_cache_key
    assert key("int8", 32) == key("int8", 64) != key("w8a8", 32) == key("w8a8", 64)
    assert key("int4", 32) != key("int4", 64)
    assert len({key("int8"), key("int4"), key("w8a8")}) == 3
    assert all(f"v{quant.STORE_VERSION}" in key(f) for f in quant.FORMATS)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_cache_file_says_delete_it(cache, small, capsys, damage):
    """On the embedded model's first two layers (the same file format; each case quantizes again, as the file it
    damaged is deleted)."""
    f = quant_file("int8", model=small)
    if not f.exists():
        loading.load_params(small, quant="int8")
    data = f.read_bytes()
    f.write_bytes(
        {"garbage": b"not a safetensors file " * 20, "truncated": data[: len(data) // 2], "empty": b""}[damage]
    )
    try:
        with pytest.raises(ModelFileError) as e:
            loading.load_params(small, quant="int8")
        msg = str(e.value)
        assert "\n" not in msg and str(f) in msg and "delete it" in msg
        # the command says the same, on one line
        assert main(["generate", "--model", small, "--quant", "int8", "--max-new-tokens", "2", "hi"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "delete it" in err and "Traceback" not in err
    finally:
        f.unlink()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(quant="int9"), "unknown quantization format 'int9'; choose one of int8, int4, w8a8"),
        (dict(quant="int4", group_size=7), "even integer >= 2, got 7"),
        (dict(quant="int4", group_size=0), "even integer >= 2, got 0"),
        (dict(quant="int8", dtype="bfloat16"), r"load with dtype='float32' \(drop dtype='bfloat16'\)"),
    ],
)
def test_requests_that_cannot_run(kwargs, match):
    # checked before the model is even looked for
    with pytest.raises(ConfigError, match=match):
        loading.load_params("/nonexistent/model.gguf", **kwargs)


def test_group_size_must_divide_the_matrices(cache, small):
    """On the embedded model's first two layers: its matrix shapes (576 is not a multiple of 128)."""
    with pytest.raises(ConfigError, match="not a multiple of the int4 group size 128; choose a group size"):
        loading.load_params(small, quant="int4", group_size=128)
    assert not quant_file("int4", 128, model=small).exists()


def test_progress_bar_when_asked(cache, small, capsys):
    quant_file("int8", model=small).unlink(missing_ok=True)
    loading.load_params(small, quant="int8", progress=True)
    assert "quantizing to int8" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# A local Hugging Face folder: cached too, and a changed checkpoint is quantized again
# --------------------------------------------------------------------------------------------------

HF_CONFIG = dict(
    model_type="llama",
    vocab_size=131,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def write_checkpoint(folder, seed):
    from safetensors.numpy import save_file

    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    save_file(hf_llama_tensors(HF_CONFIG, np.random.default_rng(seed)), str(folder / "model.safetensors"))


def test_hf_folder_quantized_once_and_rebuilt_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tiny-hf"
    write_checkpoint(folder, seed=0)
    first, kind, _ = loading.load_params(folder, quant="int8")
    assert kind == "hf-folder" and first.quant == "int8"
    assert len(list((tmp_path / "cache" / "params").glob("tiny-hf-*.safetensors"))) == 1

    from jaxlab.io import hf

    real_load_hf = hf.load_hf
    monkeypatch.setattr(hf, "load_hf", refuse("reading the checkpoint"))
    second, _, _ = loading.load_params(folder, quant="int8")
    np.testing.assert_array_equal(
        np.asarray(first.flat()["layers.1.mlp.w_up"].q), np.asarray(second.flat()["layers.1.mlp.w_up"].q)
    )

    monkeypatch.setattr(hf, "load_hf", real_load_hf)
    # new weights written over the old file in place (as `cp` does): the folder's own mtime stays, the
    # file's changes, and the stale quantized file must not be served
    write_checkpoint(tmp_path / "new", seed=1)
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.write((tmp_path / "new" / "model.safetensors").read_bytes())
    third, _, _ = loading.load_params(folder, quant="int8")
    assert not np.array_equal(
        np.asarray(first.flat()["layers.1.mlp.w_up"].q), np.asarray(third.flat()["layers.1.mlp.w_up"].q)
    )
    assert len(list((tmp_path / "cache" / "params").glob("tiny-hf-*.safetensors"))) == 2
