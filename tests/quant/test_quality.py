"""jaxlab.quant.quality: the maths on hand-made numbers, the measurements on a tiny random model (checked against
a direct forward pass and the Generator), the shipped evaluation data, and the whole report on a tiny
Hugging Face checkpoint (the non-GGUF path, offline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import hf_llama_tensors

from jaxlab import quant
from jaxlab.engine.generate import Generator
from jaxlab.engine.kvcache import cache_bytes
from jaxlab.engine.model import forward, init_params, params_from_flat
from jaxlab.io.config import tiny
from jaxlab.quant import quality

ROOT = Path(__file__).resolve().parents[2]
CFG = tiny()
RNG = np.random.default_rng(0)
WINDOWS = RNG.integers(0, CFG.vocab_size, (3, 9)).astype(np.int32)
PROMPTS = [RNG.integers(3, CFG.vocab_size, n).tolist() for n in (3, 7, 5, 6, 4)]


def random_model(seed: int):
    """Random tiny weights, matrices x 4: at the initial scale the residual stream is mostly the input
    token's embedding, so with tied embeddings any two random models predict the input token back and
    "agree"; scaled, the layers decide and different models really differ."""
    flat = {k: np.asarray(v) * (4.0 if np.ndim(v) == 2 else 1.0) for k, v in init_params(CFG, seed).flat().items()}
    return params_from_flat(CFG, flat)


@pytest.fixture(scope="module")
def params():
    return random_model(0)


# --------------------------------------------------------------------------------------------------
# The maths
# --------------------------------------------------------------------------------------------------


def test_kl_divergence_matches_its_definition():
    logits = RNG.normal(size=(2, 5, 11)) * 3
    p = np.exp(logits[0]) / np.exp(logits[0]).sum(-1, keepdims=True)
    q = np.exp(logits[1]) / np.exp(logits[1]).sum(-1, keepdims=True)
    expected = (p * np.log(p / q)).sum(-1)
    got = quality.kl_divergence(jnp.log(jnp.asarray(p)), jnp.log(jnp.asarray(q)))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert (np.asarray(got) > 0).all()
    np.testing.assert_allclose(quality.kl_divergence(jnp.log(jnp.asarray(p)), jnp.log(jnp.asarray(p))), 0, atol=1e-6)


def test_token_nll():
    logp = jnp.log(jnp.asarray([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    np.testing.assert_allclose(quality.token_nll(logp, jnp.asarray([1, 2])), [np.log(4), -np.log(0.8)], rtol=1e-6)


def test_eval_windows_evenly_spaced_and_disjoint():
    ids = np.arange(100)
    w = quality.eval_windows(ids, 10, 5)
    assert w.shape == (5, 10) and w.dtype == np.int32
    assert w[:, 0].tolist() == [0, 22, 44, 66, 88]  # stride (100 - 10) // 4
    assert len(set(w.ravel().tolist())) == w.size  # no token twice
    assert quality.eval_windows(ids, 10, 1).tolist() == [list(range(10))]
    assert quality.eval_windows(ids, 10, 10)[-1, -1] == 99  # exactly fills the text
    with pytest.raises(ValueError):
        quality.eval_windows(ids, 10, 11)


def test_kv_format_and_status():
    assert quality.kv_format(None) == quality.kv_format(jnp.float32) == "float32"
    assert quality.kv_format("int8") == quality.kv_format(jnp.int8) == "int8"
    with pytest.raises(ValueError):
        quality.kv_format(jnp.bfloat16)
    assert quality.quality_status(1.0, 0.90) == "PASS"  # both limits are inclusive
    assert quality.quality_status(1.01, 0.99) == "MISS"
    assert quality.quality_status(-0.5, 0.899) == "MISS"


def test_kv_cache_bytes():
    f32 = cache_bytes(CFG, 2, 16, jnp.float32)
    assert f32 == 2 * CFG.n_layers * 2 * 16 * CFG.n_kv_heads * CFG.head_dim * 4
    # int8: a byte per element plus a float32 scale per stored vector
    assert cache_bytes(CFG, 2, 16, "int8") == 2 * CFG.n_layers * 2 * 16 * CFG.n_kv_heads * (CFG.head_dim + 4)


# --------------------------------------------------------------------------------------------------
# Measurements on a tiny random model
# --------------------------------------------------------------------------------------------------


def test_perplexity_equals_a_direct_forward(params):
    t = WINDOWS.shape[1]
    logits, _ = jax.jit(forward)(params, jnp.asarray(WINDOWS), jnp.broadcast_to(jnp.arange(t), WINDOWS.shape))
    logp = np.asarray(jax.nn.log_softmax(logits[:, :-1], axis=-1))
    nll = -np.take_along_axis(logp, WINDOWS[:, 1:, None], axis=-1).mean()
    # batch 2 over 3 windows: the last batch is a single window, so the sums must combine across batches
    assert quality.perplexity(params, WINDOWS, batch=2) == pytest.approx(float(np.exp(nll)), rel=1e-5)


def test_next_token_stats_against_itself_and_through_the_int8_cache(params):
    same = quality.next_token_stats(params, params, WINDOWS)
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["top1_agreement"] == 1.0
    assert same["tokens"] == WINDOWS.shape[0] * (WINDOWS.shape[1] - 1)
    kv8 = quality.next_token_stats(params, params, WINDOWS, cache_dtype="int8")
    assert 0 < kv8["kl"] < 1e-2  # the int8 cache is really in the path, and close
    ppl, ppl8 = quality.perplexity(params, WINDOWS), quality.perplexity(params, WINDOWS, cache_dtype="int8")
    assert ppl8 != ppl and ppl8 == pytest.approx(ppl, rel=0.02)


def test_quantized_weights_score_close_and_a_different_model_far(params):
    q8 = quant.quantize_params(params, "int8")
    s = quality.next_token_stats(params, q8, WINDOWS)
    assert 0 < s["kl"] < 1e-2 and s["top1_agreement"] > 0.8
    other = quality.next_token_stats(params, random_model(1), WINDOWS)
    assert other["kl"] > 10 * s["kl"] and other["top1_agreement"] < 0.5


def test_greedy_continuations_equal_the_generator(params):
    ours = quality.greedy_continuations(params, PROMPTS, 6, batch=2)
    gen = Generator(params).generate(PROMPTS, 6, ignore_eos=True)
    assert ours.tolist() == [r.generated_ids for r in gen]


def test_greedy_agreement_against_itself_and_another_model(params):
    same = quality.greedy_agreement(params, params, None, PROMPTS, n_tokens=6, batch=2)
    assert same["token_agreement"] == 1.0 and same["identical"] == len(PROMPTS) == same["prompts"]
    assert same["first_divergence"] == [None] * len(PROMPTS) and same["tokens"] == 6 * len(PROMPTS)
    other = quality.greedy_agreement(params, random_model(1), None, PROMPTS, n_tokens=6, batch=2)
    assert other["token_agreement"] < 0.5 and other["identical"] < len(PROMPTS)
    assert all(d is None or 0 <= d < 6 for d in other["first_divergence"])
    kv8 = quality.greedy_agreement(params, params, None, PROMPTS, n_tokens=6, cache_dtype="int8", batch=2)
    assert kv8["token_agreement"] > 0.8


def _dequantized(qparams):
    """Float parameters holding exactly the values a quantized model computes with."""
    flat = {}
    for name, v in qparams.flat().items():
        if isinstance(v, quant.QuantizedMatrix):
            w = np.asarray(v.dequantize())
            v = w if name == "embed" else w.T
        flat[name] = np.asarray(v)
    return params_from_flat(qparams.config, flat)


def test_int4_lands_on_weights_that_are_already_on_its_grid(params):
    """Why int4 looks lossless on the embedded model: its weights came from a 4-bit group file (Q4_1)."""
    on_grid = _dequantized(quant.quantize_params(params, "int4", group=4, embed="float32"))
    rows = quality.layer_error_rows(on_grid, {"int4": quant.quantize_params(on_grid, "int4", group=4)})
    layers = [r for r in rows if r["matrix"] != "embed"]
    assert {r["matrix"] for r in layers} == {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}
    assert max(r["max"] for r in layers) < 1e-5
    assert any("lands on these weights" in n for n in quality.baseline_notes("x", "gguf", rows, 4))
    rows = quality.layer_error_rows(params, {"int4": quant.quantize_params(params, "int4", group=4)})
    assert min(r["mean"] for r in rows) > 1e-3  # random float weights: real rounding error
    assert not any("lands on" in n for n in quality.baseline_notes("x", "hf-folder", rows, 4))


def test_baseline_notes_say_what_float32_is():
    embedded = quality.baseline_notes("smollm2-135m", "gguf", [], 32)
    assert len(embedded) == 2 and "Q4_1" in embedded[1] and "not the original bf16 model" in embedded[1]
    other = quality.baseline_notes("my.gguf", "gguf", [], 32)
    assert len(other) == 2 and "as stored" in other[1]
    assert quality.baseline_notes("HuggingFaceTB/SmolLM2-135M-Instruct", "hub", [], 32) == [
        "reference: HuggingFaceTB/SmolLM2-135M-Instruct as loaded, computed in float32"
    ]


# --------------------------------------------------------------------------------------------------
# The shipped evaluation data
# --------------------------------------------------------------------------------------------------


def test_eval_text_is_shipped_small_and_matches_its_manifest():
    import hashlib

    text = quality.EVAL_TEXT.read_bytes()
    manifest = json.loads((quality.EVAL_DIR / "stdlib.json").read_text())
    assert len(text) < 60_000 and manifest["bytes"] == len(text)
    assert hashlib.sha256(text).hexdigest() == manifest["sha256"]
    kinds = {s["kind"] for s in manifest["sections"]}
    assert kinds == {"prose", "code"}
    prompts = quality.load_prompts()
    assert len(prompts) == 32 and len(set(prompts)) == 32


def test_eval_text_script_reproduces_the_file_on_its_python(tmp_path):
    manifest = json.loads((quality.EVAL_DIR / "stdlib.json").read_text())
    if f"{sys.version_info.major}.{sys.version_info.minor}" != manifest["python"].rsplit(".", 1)[0]:
        pytest.skip(f"the text was written by Python {manifest['python']}; docstrings differ between versions")
    code = "import sys; sys.path.insert(0, 'scripts'); import make_eval_text as m; sys.stdout.write(m.build()[0])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True).stdout
    assert out == quality.EVAL_TEXT.read_bytes()


def test_eval_text_token_count(smollm):
    """The README states ~9,900 tokens; the default report reads 16 windows of 128 of them."""
    ids = quality.eval_tokens(smollm.tokenizer)
    assert 9_000 < len(ids) < 11_000
    w = quality.eval_windows(ids, quality.DEFAULT.window, quality.DEFAULT.windows)
    assert w.shape == (16, 128)
    assert max(len(p) for p in quality.chat_ids(smollm.tokenizer, quality.load_prompts())) < 64


# --------------------------------------------------------------------------------------------------
# The whole report, offline, on a tiny Hugging Face checkpoint with the real tokenizer
# --------------------------------------------------------------------------------------------------


#: canonical name (the part after "layers.N.") -> (Hugging Face name after "model.layers.N.", stored transposed)
def write_tiny_checkpoint(folder: Path, tokenizer) -> None:
    """A random Llama in Hugging Face layout (config.json + model.safetensors + tokenizer files), small
    enough to evaluate in seconds; its vocabulary is the real tokenizer's, so the real prompts fit."""
    from safetensors.numpy import save_file

    hf = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
    )
    (folder / "config.json").write_text(json.dumps(hf))
    save_file(hf_llama_tensors(hf, np.random.default_rng(3)), str(folder / "model.safetensors"))
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": tokenizer.chat_template,
                "bos_token": tokenizer.bos_token,
                "eos_token": tokenizer.eos_token,
            }
        )
    )


def test_quality_report_on_a_hugging_face_folder(tmp_path, smollm):
    write_tiny_checkpoint(tmp_path, smollm.tokenizer)
    sizes = quality.Sizes(window=16, windows=2, batch=2, prompts=3, new_tokens=4, prompt_batch=3)
    r = quality.quality_report(str(tmp_path), formats=("int4",), kv_formats=("int8",), sizes=sizes)
    assert [row["label"] for row in r["rows"]] == ["float32", "float32 + int8 KV", "int4 + int8 KV"]
    ref = r["rows"][0]
    assert ref["status"] == "reference" and ref["ppl_increase_pct"] == 0.0
    assert ref["greedy_agreement"] == 1.0 and ref["identical"] == 3  # float32 against itself: the noise floor
    for row in r["rows"][1:]:
        assert row["status"] in ("PASS", "MISS") and np.isfinite(row["perplexity"])
        assert row["kl"] >= -1e-6  # 0 up to rounding
        assert row["status"] == quality.quality_status(row["ppl_increase_pct"], row["greedy_agreement"])
    f32, kv8, q4 = r["rows"]
    assert q4["weight_bytes"] < f32["weight_bytes"] / 3 and kv8["kv_cache_bytes"] < f32["kv_cache_bytes"] / 3
    assert r["eval_tokens"] == 2 * 15
    assert not any("GGUF" in n or "lands on" in n for n in r["notes"])  # random float weights, not a Q4_1 file
    assert {x["format"] for x in r["layer_errors"]} == {"int4"} and min(x["mean"] for x in r["layer_errors"]) > 1e-3
