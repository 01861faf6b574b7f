"""jaxlab.io.hf: Hugging Face safetensors checkpoints, checked against transformers' LlamaForCausalLM.

Everything is offline: the checkpoints are tiny random models saved in the test with ``save_pretrained``.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.model import forward, params_from_flat
from jaxlab.errors import ModelFileError
from jaxlab.io.hf import load_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import save_file  # noqa: E402

pytestmark = pytest.mark.reference

# head_dim 10 with hidden 60 and 6 query / 2 KV heads: grouped-query attention with odd sizes
HF_KW = dict(
    vocab_size=263,
    hidden_size=60,
    intermediate_size=84,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
    rope_theta=10000.0,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
)
TOKENS = np.random.default_rng(0).integers(0, HF_KW["vocab_size"], (2, 11))


def make_model(tie: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**HF_KW, tie_word_embeddings=tie)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # every weight random and distinct, norms around 1
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def torch_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model.float()(torch.as_tensor(TOKENS)).logits.float().numpy()


_fwd = jax.jit(lambda params, tokens, positions: forward(params, tokens, positions)[0])


def our_logits(cfg, flat) -> np.ndarray:
    positions = jnp.broadcast_to(jnp.arange(TOKENS.shape[1], dtype=jnp.int32), TOKENS.shape)
    return np.asarray(_fwd(params_from_flat(cfg, flat, source="hf"), jnp.asarray(TOKENS, jnp.int32), positions))


def rel_err(ours, ref) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{kind: (folder, torch model in float32 with the saved weights)}."""
    out = {}
    for kind, tie in (("tied", True), ("untied", False)):
        model = make_model(tie, seed=len(out))
        folder = tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder)
        out[kind] = (folder, model)
    folder = tmp_path_factory.mktemp("bf16")
    make_model(True, seed=7).to(torch.bfloat16).save_pretrained(folder)
    # the reference: the bf16 weights computed in float32. Not `bf16_model.float()`: .to(bfloat16) also
    # rounds the RoPE inv_freq buffer, which would make the reference itself ~5e-4 off.
    ref = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert ref.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32
    out["bf16"] = (folder, ref)
    model = make_model(False, seed=8)
    folder = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(folder, max_shard_size="40KB")
    out["sharded"] = (folder, model)
    return out


# --------------------------------------------------------------------------------------------------
# Parity with transformers
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tied", "untied", "bf16", "sharded"])
def test_logits_match_transformers(checkpoints, kind):
    folder, model = checkpoints[kind]
    cfg, flat = load_hf(folder)
    assert cfg.tie_embeddings == model.config.tie_word_embeddings
    assert ("lm_head" in flat) == (not cfg.tie_embeddings)
    assert all(a.dtype == np.float32 for a in flat.values())
    ours, ref = our_logits(cfg, flat), torch_logits(model)
    assert ours.shape == ref.shape
    assert rel_err(ours[:, -1], ref[:, -1]) <= 1e-4
    assert rel_err(ours, ref) <= 1e-4


def test_config_from_config_json(checkpoints):
    folder, _ = checkpoints["tied"]
    cfg, _ = load_hf(folder)
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim) == (
        263,
        60,
        2,
        6,
        2,
        10,
        84,
    )
    assert cfg.rope_theta == 10000.0 and cfg.norm_eps == 1e-6 and cfg.max_seq_len == 128
    assert cfg.name == folder.name


def test_weights_are_transposed_not_permuted(checkpoints):
    """HF checkpoints are already in the rotate-half layout: q_proj is only transposed."""
    folder, model = checkpoints["untied"]
    _, flat = load_hf(folder)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    np.testing.assert_array_equal(flat["layers.1.attn.wq"], sd["model.layers.1.self_attn.q_proj.weight"].T)
    np.testing.assert_array_equal(flat["layers.0.attn.wk"], sd["model.layers.0.self_attn.k_proj.weight"].T)
    np.testing.assert_array_equal(
        flat["layers.0.mlp_norm.weight"], sd["model.layers.0.post_attention_layernorm.weight"]
    )
    np.testing.assert_array_equal(flat["lm_head"], sd["lm_head.weight"].T)
    np.testing.assert_array_equal(flat["embed"], sd["model.embed_tokens.weight"])


def test_bf16_checkpoint_holds_bf16(checkpoints):
    from safetensors import safe_open

    folder, _ = checkpoints["bf16"]
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        assert f.get_slice("model.layers.0.self_attn.q_proj.weight").get_dtype() == "BF16"


def test_sharded_checkpoint_has_several_files(checkpoints):
    folder, _ = checkpoints["sharded"]
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1


def test_tied_checkpoint_with_equal_lm_head(checkpoints, tmp_path):
    """Some tied checkpoints also store lm_head.weight (a copy of the embedding): accepted."""
    folder, model = checkpoints["tied"]
    target = copy_checkpoint(folder, tmp_path)
    tensors = read_tensors(target)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, str(target / "model.safetensors"))
    cfg, flat = load_hf(target)
    assert cfg.tie_embeddings and "lm_head" not in flat


def test_given_config(checkpoints):
    folder, _ = checkpoints["untied"]
    cfg, _ = load_hf(folder)
    cfg2, flat = load_hf(folder, config=cfg.replace(name="mine"))
    assert cfg2.name == "mine" and set(flat) == set(load_hf(folder)[1])


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def copy_checkpoint(src, dst):
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def read_tensors(folder):
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def raises(arg, *needles, **kw):
    with pytest.raises(ModelFileError) as e:
        load_hf(arg, **kw)
    msg = str(e.value)
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_folder_without_config_json(tmp_path):
    raises(tmp_path, str(tmp_path), "config.json")


def test_folder_without_safetensors(checkpoints, tmp_path):
    folder, _ = checkpoints["tied"]
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    raises(tmp_path, str(tmp_path), "safetensors")


def test_missing_local_folder(tmp_path):
    raises(tmp_path / "no" / "such" / "folder", "not found", str(tmp_path / "no"))


def test_a_file_is_not_a_folder(checkpoints):
    folder, _ = checkpoints["tied"]
    raises(folder / "model.safetensors", "folder")


def test_missing_tensor(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    tensors = read_tensors(target)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(target / "model.safetensors"))
    raises(target, str(target), "model.layers.1.mlp.up_proj.weight", "missing")


def test_shape_mismatch(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    cfg = json.loads((target / "config.json").read_text())
    cfg["intermediate_size"] = 90
    (target / "config.json").write_text(json.dumps(cfg))
    msg = raises(target, "model.layers.0.mlp.gate_proj.weight", "(84, 60)", "(90, 60)")
    assert str(target) in msg


def test_shape_mismatch_with_given_config(checkpoints):
    folder, _ = checkpoints["untied"]
    cfg, _ = load_hf(folder)
    raises(folder, "model.embed_tokens.weight", "(263, 60)", "(300, 60)", config=cfg.replace(vocab_size=300))


def test_tie_mismatch_with_given_config(checkpoints):
    folder, _ = checkpoints["untied"]
    cfg, _ = load_hf(folder)
    raises(folder, str(folder), "tie", config=cfg.replace(tie_embeddings=True))


def test_non_llama_model(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    cfg = json.loads((target / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (target / "config.json").write_text(json.dumps(cfg))
    raises(target, str(target / "config.json"), "gpt2", "Llama")


def test_bias_model_is_refused(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    cfg = json.loads((target / "config.json").read_text())
    cfg["attention_bias"] = True
    (target / "config.json").write_text(json.dumps(cfg))
    raises(target, "attention_bias", "bias")


def test_unexpected_tensors_are_refused(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    tensors = read_tensors(target)
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(60, np.float32)
    save_file(tensors, str(target / "model.safetensors"))
    raises(target, "model.layers.0.self_attn.q_proj.bias")


def test_tied_checkpoint_with_different_lm_head(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    tensors = read_tensors(target)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0
    save_file(tensors, str(target / "model.safetensors"))
    raises(target, "lm_head.weight", "tie")


def test_corrupt_config_json(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    (target / "config.json").write_text("{not json")
    raises(target, str(target / "config.json"), "JSON")


def test_corrupt_safetensors(checkpoints, tmp_path):
    target = copy_checkpoint(checkpoints["tied"][0], tmp_path)
    (target / "model.safetensors").write_bytes(b"\x00" * 100)
    raises(target, str(target / "model.safetensors"))


@pytest.mark.parametrize("repo_id", ["jaxlab-tests/no-such-model", "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_hub_offline_is_a_clear_error(monkeypatch, tmp_path, repo_id):
    """With no network (HF_HUB_OFFLINE=1, empty cache) a repo id gives a ModelFileError, not a
    huggingface_hub traceback, and the message points offline users to the embedded model."""
    import huggingface_hub.constants as hub_constants

    monkeypatch.chdir(tmp_path)  # so the repo id is not a local folder by accident
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # read once at import time
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    msg = raises(repo_id, repr(repo_id), "hub", "embedded model")
    assert "\n" not in msg
