"""jaxlab.io.export: float parameters and the tokenizer written as a Hugging Face folder or a GGUF file.

* Round trips on a small untied model (rows a multiple of Q8_0's 32-value block, so every type applies): a
  float32 Hugging Face folder reads back bit for bit (equal logits), float16/bfloat16 ones as the rounded weights;
  GGUF F32 reads back bit for bit, F16 as the float16-rounded weights, Q8_0 within its block rounding, and the
  logits within the stated tolerances.
* The tokenizer: the GGUF fields derived from jaxlab's tokenizer equal the embedded file's own (tokens, types,
  merges, pre-tokenizer, chat template), and both exports read back (``Tokenizer.from_gguf``/``from_hf``) encode
  as the original does.
* The reference (marked): on the embedded model's first two layers (``small_model``: its real weights, norm, head and
  tokenizer), ``transformers`` loads the exported folder and the exported GGUF alone and gives the greedy tokens
  jaxlab gives on the same files; ``AutoTokenizer`` on the folder encodes as jaxlab. Every layer is written by the
  same loop, so two layers show what thirty would, at a fraction of the compile and load time.
* Bad requests: each a :class:`ExportError` (or ``ConfigError``) naming the problem and what to do.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jit_forward

from jaxlab.cli import build_parser, main
from jaxlab.engine.model import params_from_flat
from jaxlab.errors import ConfigError, ExportError
from jaxlab.io.config import param_shapes, tiny
from jaxlab.io.export import GGUF_QTYPES, HF_DTYPES, export, export_gguf, export_hf, gguf_tokenizer_metadata
from jaxlab.io.gguf import load_gguf
from jaxlab.io.hf import load_hf
from jaxlab.io.tokenizer import Tokenizer, read_gguf_metadata

CFG = tiny().replace(dim=64, ffn_dim=96, head_dim=16, tie_embeddings=False, name="tiny-export")
# The largest logit difference allowed after each GGUF type, for the small random model (|logits| up to about 3;
# measured: F16 0.003, Q8_0 0.08). The weights themselves are checked exactly, or within Q8_0's rounding.
LOGIT_TOL = {"F32": 0.0, "F16": 0.01, "Q8_0": 0.2}
TEXTS = [
    "12345 + 0.5 = 2024, or 3.14159?",
    "naïve café — Straße ½ 東京",
    "emoji 🦙👍🏽 and ❤️",
    "  leading   spaces\n\n\ttab end ",
    "<|im_start|>user\nhi<|im_end|>\n",
]
# A short system message keeps the prompt short (the default one is 30 tokens), and so the greedy runs quick.
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 17 times 23?"}]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def params():
    rng = np.random.default_rng(0)
    flat = {
        name: (1.0 + 0.2 * rng.standard_normal(shape) if len(shape) == 1 else 0.1 * rng.standard_normal(shape))
        for name, shape in param_shapes(CFG).items()
    }  # norms around 1, so a swapped or missing norm shows
    return params_from_flat(CFG, {k: v.astype(np.float32) for k, v in flat.items()})


def logits(params):
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, params.config.vocab_size, (2, 9)), jnp.int32)
    return np.asarray(jit_forward(params, tokens, jnp.broadcast_to(jnp.arange(9, dtype=jnp.int32), (2, 9)))[0])


def numpy_flat(params):
    return {k: np.asarray(v) for k, v in params.flat().items()}


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("dtype", HF_DTYPES)
def test_hf_round_trip(params, tmp_path, dtype):
    folder = export_hf(params, None, tmp_path / "hf", dtype=dtype)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    cfg, flat = load_hf(folder)
    assert cfg == CFG.replace(name="hf")
    rounding = {"float32": np.float32, "float16": np.float16, "bfloat16": jnp.bfloat16}[dtype]
    for name, w in numpy_flat(params).items():
        np.testing.assert_array_equal(flat[name], w.astype(rounding).astype(np.float32), err_msg=name)
    if dtype == "float32":  # the same weights: the same logits, bit for bit
        np.testing.assert_array_equal(logits(params_from_flat(cfg, flat)), logits(params))


@pytest.mark.parametrize("qtype", GGUF_QTYPES)
def test_gguf_round_trip(params, tmp_path, qtype):
    path = export_gguf(params, None, tmp_path / "m.gguf", qtype=qtype)
    cfg, flat = load_gguf(path)
    assert cfg.replace(norm_eps=CFG.norm_eps) == CFG and np.float32(cfg.norm_eps) == np.float32(CFG.norm_eps)
    for name, w in numpy_flat(params).items():
        if w.ndim == 1 or qtype == "F32":  # norms stay F32
            np.testing.assert_array_equal(flat[name], w, err_msg=name)
        elif qtype == "F16":
            np.testing.assert_array_equal(flat[name], w.astype(np.float16).astype(np.float32), err_msg=name)
        else:  # Q8_0: one scale per 32 values (max / 127, stored as float16): |error| about half a step
            stored = w if name == "embed" else w.T  # GGUF rows (along which the blocks run)
            blocks = np.abs(stored).reshape(stored.shape[0], -1, 32).max(-1, keepdims=True)
            err = np.abs((flat[name] if name == "embed" else flat[name].T) - stored).reshape(blocks.shape[:2] + (32,))
            assert (err <= blocks / 127 * 0.6).all(), name
    diff = np.abs(logits(params_from_flat(cfg, flat)) - logits(params)).max()
    assert diff <= LOGIT_TOL[qtype], (qtype, diff)


def test_gguf_metadata_and_file_type(params, tmp_path):
    meta = read_gguf_metadata(export_gguf(params, None, tmp_path / "m.gguf", qtype="Q8_0"))
    assert meta["general.file_type"] == 7 and meta["llama.vocab_size"] == CFG.vocab_size  # MOSTLY_Q8_0
    assert "tokenizer.ggml.model" not in meta  # no tokenizer given, none written


# ------------------------------------------------------------------------------------------ the tokenizer


@pytest.fixture(scope="module")
def tok(gguf_path):
    return Tokenizer.from_gguf(gguf_path)


def test_gguf_tokenizer_fields_equal_the_source_files(tok, gguf_path):
    """Derived from the tokenizer alone (no source metadata but the pre-tokenizer's name, read off its structure):
    the fields llama.cpp's converter wrote into the embedded file."""
    source = read_gguf_metadata(gguf_path)
    meta = gguf_tokenizer_metadata(tok, 49152)
    for key, value in meta.items():
        assert value == source[key], key
    padded = gguf_tokenizer_metadata(tok, 49152 + 3, source)  # an embedding with spare rows: unused tokens
    assert padded["tokenizer.ggml.tokens"][-3:] == ["[PAD49152]", "[PAD49153]", "[PAD49154]"]
    assert padded["tokenizer.ggml.token_type"][-3:] == [5, 5, 5]
    assert padded["tokenizer.ggml.unknown_token_id"] == 0
    with pytest.raises(ExportError, match="49152 tokens, the model's embedding only 263 rows; export with the"):
        gguf_tokenizer_metadata(tok, 263)


def small_model():
    """A one-layer model with SmolLM2's vocabulary, to carry its tokenizer."""
    cfg = CFG.replace(vocab_size=49152, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, head_dim=16)
    return params_from_flat(cfg, {n: np.full(s, 0.01, np.float32) for n, s in param_shapes(cfg).items()})


def test_exported_tokenizers_encode_as_the_original(tok, gguf_path, tmp_path):
    small = small_model()
    from_gguf = Tokenizer.from_gguf(export_gguf(small, tok, tmp_path / "t.gguf", source=gguf_path))
    from_hf = Tokenizer.from_hf(export_hf(small, tok, tmp_path / "hf", source=gguf_path))
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>",
    )  # fmt: skip
    for other in (from_gguf, from_hf):
        assert [other.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
        assert (other.bos_id, other.eos_id, other.pad_id, other.special_ids) == (
            tok.bos_id, tok.eos_id, tok.pad_id, tok.special_ids,
        )  # fmt: skip
        assert other.apply_chat_template(MESSAGES, tokenize=True) == tok.apply_chat_template(MESSAGES, tokenize=True)


def test_cli_exports_a_folder_as_a_gguf(tok, tmp_path, capsys, monkeypatch):
    """``jaxlab export`` end to end, from a Hugging Face folder that jaxlab exported (no source GGUF: the
    pre-tokenizer's name is read off tokenizer.json) to a Q8_0 GGUF that carries the tokenizer."""
    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path / "cache"))  # nothing of the user's cache is touched
    src = export_hf(small_model(), tok, tmp_path / "small-hf")
    out = tmp_path / "small.gguf"
    assert main(["export", "--model", str(src), "--format", "gguf", "--qtype", "Q8_0", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {out} (gguf, Q8_0, ") and " MB) in " in line
    meta = read_gguf_metadata(out)
    assert (meta["general.file_type"], meta["tokenizer.ggml.pre"]) == (7, "smollm")
    assert Tokenizer.from_gguf(out).encode(TEXTS[0]) == tok.encode(TEXTS[0])


# ------------------------------------------------------------------------------------------ bad requests


def test_quantized_params_are_refused(params, tmp_path):
    from jaxlab.quant import quantize_model

    with pytest.raises(ExportError, match="quantized \\(int8\\); export float parameters: load without --quant"):
        export_gguf(quantize_model(params, None, "int8"), None, tmp_path / "q.gguf")
    assert not (tmp_path / "q.gguf").exists()


@pytest.mark.parametrize(
    "fmt,kw,message",
    [
        ("gguf", {"qtype": "Q4_K"}, "GGUF tensor type 'Q4_K' cannot be exported; choose one of F32, F16, Q8_0"),
        ("hf", {"dtype": "int8"}, "checkpoint dtype 'int8' cannot be exported; choose one of float32"),
        ("hf", {"qtype": "F16"}, "a tensor type \\(F16\\) is for --format gguf"),
        ("gguf", {"dtype": "float16"}, "a dtype \\(float16\\) is for --format hf"),
        ("onnx", {}, "unknown export format 'onnx'; choose one of hf, gguf"),
    ],
)
def test_bad_requests(params, tmp_path, fmt, kw, message):
    with pytest.raises(ExportError, match=message):
        export(fmt, params, None, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_outputs_in_the_way(params, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "old-model.safetensors").write_bytes(b"x")
    with pytest.raises(ExportError, match="exists and is not empty; pass overwrite=True \\(--overwrite\\)"):
        export_hf(params, None, full)
    export_hf(params, None, full, overwrite=True)  # replaces the checkpoint it would be read with
    assert not (full / "old-model.safetensors").exists() and load_hf(full)[0].n_layers == CFG.n_layers
    with pytest.raises(ExportError, match="is a folder; a GGUF export is one file"):
        export_gguf(params, None, full)
    with pytest.raises(ExportError, match="is a file; a Hugging Face export is a folder"):
        export_hf(params, None, full / "config.json")
    export_gguf(params, None, tmp_path / "m.gguf", qtype="F32")
    with pytest.raises(ExportError, match="m.gguf exists; pass overwrite=True"):
        export_gguf(params, None, tmp_path / "m.gguf")


def test_a_tokenizer_bigger_than_the_embedding(params, tok, tmp_path):
    for write in (export_hf, export_gguf):
        with pytest.raises(ExportError, match="the tokenizer has 49152 tokens, the model's embedding only 263 rows"):
            write(params, tok, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_rows_that_q8_0_cannot_block(tmp_path):
    odd = params_from_flat(tiny(), {n: np.zeros(s, np.float32) for n, s in param_shapes(tiny()).items()})
    with pytest.raises(ConfigError, match="rows of 40 values, not a multiple of Q8_0's block of 32; write this model"):
        export_gguf(odd, None, tmp_path / "odd.gguf", qtype="Q8_0")
    assert list(tmp_path.iterdir()) == []  # no half-written file left behind


def test_cli_choices_are_the_exports():
    parse = build_parser().parse_args
    for flag, values in (("--qtype", GGUF_QTYPES), ("--dtype", HF_DTYPES)):
        for value in values:
            assert getattr(parse(["export", "--format", "hf", "--out", "x", flag, value]), flag[2:]) == value
        with pytest.raises(SystemExit):  # a usage error, before anything is loaded
            parse(["export", "--format", "hf", "--out", "x", flag, "Q4_K"])


def test_cli_refuses_before_loading(tmp_path, capsys, monkeypatch):
    from jaxlab.engine import loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "m.gguf").write_bytes(b"x")
    assert main(["export", "--format", "gguf", "--out", str(tmp_path / "m.gguf")]) == 1
    assert "m.gguf exists; pass overwrite=True (--overwrite)" in capsys.readouterr().err
    assert main(["export", "--format", "hf", "--qtype", "F16", "--out", str(tmp_path / "x")]) == 1
    assert "a tensor type (F16) is for --format gguf" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the reference


def jaxlab_greedy(params, ids: list[int], n: int = NEW_TOKENS) -> list[int]:
    """Greedy tokens of jaxlab's forward pass, EOS ignored, without a cache: the sequence is left-padded to one
    length (padding at position -1 is masked), so one compiled program (cheaper to compile than the engine's
    prefill and decode pair) serves every step."""
    seq, width = list(ids), len(ids) + n - 1
    for _ in range(n):
        pad = width - len(seq)
        tokens = np.asarray([[params.config.pad_id] * pad + seq], np.int32)
        positions = np.asarray([[-1] * pad + list(range(len(seq)))], np.int32)
        out, _ = jit_forward(params, tokens, positions, last_only=True)
        seq.append(int(np.argmax(np.asarray(out).reshape(-1))))
    return seq[len(ids) :]


def same_model(cfg, other) -> bool:
    """The same model, whatever its name; the norm's epsilon equal in float32 (GGUF stores it as one). The greedy
    runs then use one config, so the forward pass compiled for the first serves the second."""
    return cfg.replace(name=other.name, norm_eps=other.norm_eps) == other and np.float32(cfg.norm_eps) == np.float32(
        other.norm_eps
    )


@pytest.fixture(scope="module")
def exported(small_model, tmp_path_factory):
    """The embedded model's first two layers (float32) exported as a Hugging Face folder (float32) and an F16 GGUF
    beside it."""
    root = tmp_path_factory.mktemp("export")
    export_hf(small_model.params, small_model.tokenizer, root / "hf", source=small_model.path)
    export_gguf(small_model.params, small_model.tokenizer, root / "m.gguf", qtype="F16", source=small_model.path)
    return root


@pytest.fixture(scope="module")
def transformers_quietly():
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)  # see conftest's `reference`: one thread decodes a small model fastest on 2 cores


@pytest.mark.reference
def test_transformers_runs_the_exported_folder(exported, small_model, tok, transformers_quietly):
    from transformers import AutoTokenizer

    from jaxlab.tools.reference import hf_model, reference_greedy

    folder = exported / "hf"
    auto = AutoTokenizer.from_pretrained(folder)
    assert [auto.encode(t, add_special_tokens=True) for t in TEXTS] == [tok.encode(t, True) for t in TEXTS]
    ids = tok.apply_chat_template(MESSAGES, tokenize=True)
    assert list(auto.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]) == ids
    cfg, flat = load_hf(folder)
    assert same_model(cfg, small_model.config)
    for name, w in small_model.params.flat().items():  # float32: the very weights
        np.testing.assert_array_equal(flat[name], np.asarray(w), err_msg=name)
    ours = jaxlab_greedy(params_from_flat(small_model.config, flat), ids)
    model = hf_model(folder)  # transformers' AutoModelForCausalLM, float32
    assert reference_greedy(model, ids, NEW_TOKENS) == ours


@pytest.mark.reference
def test_transformers_runs_the_exported_gguf(exported, small_model, tok, transformers_quietly):
    from jaxlab.tools.reference import hf_model, reference_greedy

    ids = tok.apply_chat_template(MESSAGES, tokenize=True)
    cfg, flat = load_gguf(exported / "m.gguf")
    assert same_model(cfg, small_model.config)
    ours = jaxlab_greedy(params_from_flat(small_model.config, flat), ids)
    model = hf_model(exported / "m.gguf")  # transformers' AutoModelForCausalLM on the file, float32
    assert reference_greedy(model, ids, NEW_TOKENS) == ours
