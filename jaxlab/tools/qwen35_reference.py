"""The reference for jaxlab's Qwen3.5 model: ``transformers``' ``Qwen3_5ForCausalLM`` on a tiny random configuration.

No Qwen3.5 weights are downloaded: :func:`build_reference_model` builds the model of :func:`~jaxlab.io.config.
qwen35_tiny` in PyTorch from a fixed seed (float32, eager attention), with its norm weights moved off their
initial values (zeros and ones) so that the zero-centred ``x * (1 + w)`` convention is actually exercised.
:func:`write_golden` stores what the reference computes (the config, a few token prompts, their full prefill
logits, greedy continuations from ``model.generate(do_sample=False)``) in ``data/reference/qwen35_tiny.json``
and the tiny weights, under ``transformers``' names, in ``data/reference/qwen35_tiny.safetensors`` (~0.45 MB), so
a notebook runs the parity with :func:`load_tiny` and no torch. tests/engine/test_qwen35.py regenerates the golden
numbers and fails when the stored files are stale.

torch and transformers are imported only inside the functions that need them.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from jaxlab.engine.model import Params
from jaxlab.engine.qwen35 import params_from_torch
from jaxlab.io.assets import data_dir
from jaxlab.io.config import Qwen35Config, qwen35_tiny

GOLDEN_FILE = data_dir() / "reference" / "qwen35_tiny.json"
WEIGHTS_FILE = data_dir() / "reference" / "qwen35_tiny.safetensors"
SEED = 0
#: token prompts of different lengths (one longer than the DeltaNet's convolution, one shorter than it)
PROMPTS = ((5, 17, 42, 99, 3, 250, 7), (11, 2), (101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111))
GREEDY_TOKENS = 10
NORM_JITTER = 0.1  # std of the noise added to every norm weight (their initial zeros and ones would hide a convention)


def hf_config(cfg: Qwen35Config):
    """``transformers``' ``Qwen3_5TextConfig`` for a :class:`Qwen35Config` (eager attention: the plain softmax)."""
    from transformers import Qwen3_5TextConfig

    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor}
    return Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        rope_parameters=rope,
        rms_norm_eps=cfg.norm_eps,
        linear_conv_kernel_dim=cfg.conv_kernel,
        linear_key_head_dim=cfg.linear_k_dim,
        linear_value_head_dim=cfg.linear_v_dim,
        linear_num_key_heads=cfg.linear_k_heads,
        linear_num_value_heads=cfg.linear_v_heads,
        layer_types=list(cfg.layer_types),
        tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=cfg.max_seq_len,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id,
        attn_implementation="eager",
    )


def build_reference_model(cfg: Qwen35Config | None = None):
    """The tiny ``Qwen3_5ForCausalLM`` in float32, eval mode, from ``torch.manual_seed(SEED)``, its norm weights
    jittered (:data:`NORM_JITTER`)."""
    import torch
    from transformers import Qwen3_5ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cfg = cfg or qwen35_tiny()
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(hf_config(cfg)).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(NORM_JITTER * torch.randn_like(p))
    return model


def state_dict_numpy(model) -> dict[str, np.ndarray]:
    """The model's weights as numpy arrays under ``transformers``' names (what :func:`params_from_torch` reads)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def make_golden(model=None, cfg: Qwen35Config | None = None) -> dict[str, Any]:
    """What the reference computes on :data:`PROMPTS`: for each prompt alone (no padding), the full prefill logits
    [T, V] and ``GREEDY_TOKENS`` greedy tokens from ``model.generate(do_sample=False)`` (its own cache: chunked
    rule for the prompt, recurrent rule per new token)."""
    import torch

    cfg = cfg or qwen35_tiny()
    model = model if model is not None else build_reference_model(cfg)
    logits, greedy = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            logits.append(model(ids).logits[0].numpy().astype(np.float32).tolist())
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=GREEDY_TOKENS,
                min_new_tokens=GREEDY_TOKENS,
                pad_token_id=cfg.pad_id,
            )
            greedy.append(out[0, len(prompt) :].tolist())
    return {
        "config": dataclasses.asdict(cfg),
        "seed": SEED,
        "norm_jitter": NORM_JITTER,
        "prompts": [list(p) for p in PROMPTS],
        "logits": logits,
        "greedy": greedy,
        "versions": {name: metadata.version(name) for name in ("torch", "transformers")},
    }


def write_golden(golden_file: Path = GOLDEN_FILE, weights_file: Path = WEIGHTS_FILE) -> dict[str, Any]:
    """Build the reference, write the golden JSON and the tiny weights (safetensors), and return the golden data."""
    from safetensors.numpy import save_file

    model = build_reference_model()
    golden = make_golden(model)
    Path(golden_file).parent.mkdir(parents=True, exist_ok=True)
    Path(golden_file).write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    save_file(state_dict_numpy(model), str(weights_file))
    return golden


def load_tiny(golden_file: Path = GOLDEN_FILE, weights_file: Path = WEIGHTS_FILE) -> tuple[Params, dict[str, Any]]:
    """(params, golden data) from the stored files, without torch: the tiny model's weights converted as the live
    reference's are (:func:`~jaxlab.engine.qwen35.params_from_torch`), and the reference's logits and tokens."""
    from safetensors.numpy import load_file

    golden = json.loads(Path(golden_file).read_text())
    cfg = Qwen35Config(**golden["config"])
    return params_from_torch(cfg, load_file(str(weights_file))), golden
