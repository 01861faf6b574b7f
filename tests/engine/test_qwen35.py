"""jaxlab's Qwen3.5 (Gated DeltaNet + gated attention) against ``transformers``' PyTorch model on the tiny config.

The reference is built live (torch, seed 0, float32, eager attention): prefill logits and step-by-step decoding
with the states carried in the cache within 1e-5 (relative to the largest logit), greedy tokens identical to
``model.generate``; a row's tokens do not depend on the rows beside it; a preempted sequence that re-prefills its
prompt and generated tokens continues as before; the stored golden file and weights are what the reference
computes today. Every batch here is the three prompts' shape (3 rows of 11 tokens), so the compiled programs are
shared between the tests."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxlab.engine import qwen35
from jaxlab.engine.kvcache import left_pad
from jaxlab.io.config import qwen35_tiny
from jaxlab.tools import qwen35_reference as reference

CFG = qwen35_tiny()
PROMPTS = [list(p) for p in reference.PROMPTS]
forward = jax.jit(qwen35.forward, static_argnames=("last_only", "form"))


@pytest.fixture(scope="module")
def live():
    """(the torch model, what it computes now: :func:`make_golden`'s data)."""
    model = reference.build_reference_model()
    return model, reference.make_golden(model)


@pytest.fixture(scope="module")
def params(live):
    return qwen35.params_from_torch(CFG, reference.state_dict_numpy(live[0]))


def rel(ours, theirs) -> float:
    """max |ours - theirs| / max |theirs|."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def padded():
    tokens, positions = left_pad(PROMPTS, CFG.pad_id)
    return tokens, positions


def test_prefill_logits_match_transformers(params, live, parity):
    """The three prompts left-padded in one batch, through the cache (chunked rule): each row's real positions
    equal the reference's logits of that prompt alone."""
    tokens, positions = padded()
    cache = qwen35.init_hybrid_cache(CFG, len(PROMPTS), tokens.shape[1])
    logits, cache = forward(params, tokens, positions, cache)
    errors = [rel(logits[i, -len(p) :], want) for i, (p, want) in enumerate(zip(PROMPTS, live[1]["logits"]))]
    parity(f"qwen3.5 tiny prefill logits (chunked, left-padded batch): max relative error {max(errors):.1e}")
    assert max(errors) <= 1e-5, errors
    assert int(cache.kv.index) == tokens.shape[1]


def test_decode_step_by_step_matches_transformers(params, live, parity):
    """One token per step (recurrent rule, the padding columns included), the DeltaNet states and the KV entries
    carried in the cache: every real position's logits equal the reference's."""
    tokens, positions = padded()
    cache = qwen35.init_hybrid_cache(CFG, len(PROMPTS), tokens.shape[1])
    steps = []
    for j in range(tokens.shape[1]):  # greedy's own compiled decode step (its logits beside its argmax)
        _, logits, cache = qwen35.jit_decode(params, tokens[:, j : j + 1], positions[:, j : j + 1], cache)
        steps.append(np.asarray(logits))
    steps = np.stack(steps, axis=1)  # [B, T, V]
    errors = [rel(steps[i, -len(p) :], want) for i, (p, want) in enumerate(zip(PROMPTS, live[1]["logits"]))]
    parity(f"qwen3.5 tiny decode, state carried in the cache: max relative error {max(errors):.1e}")
    assert max(errors) <= 1e-5, errors


@pytest.mark.parametrize("form", ["recurrent", "pallas"])
def test_every_form_through_the_model_equals_chunked(params, parity, form):
    """The form switch: the whole prefill with the one-token-at-a-time rule, or with the Pallas kernel (interpreted
    on a CPU), gives the chunked form's logits and DeltaNet states."""
    tokens, positions = padded()
    fresh = lambda: qwen35.init_hybrid_cache(CFG, len(PROMPTS), tokens.shape[1])  # noqa: E731
    chunked, c_cache = forward(params, tokens, positions, fresh(), form="chunked")
    other, o_cache = forward(params, tokens, positions, fresh(), form=form)
    real = positions >= 0
    error = rel(np.asarray(other)[real], np.asarray(chunked)[real])
    parity(f"qwen3.5 tiny prefill, {form} vs chunked form: max relative error {error:.1e}")
    assert error <= 1e-5
    assert max(rel(o, c) for o, c in zip(o_cache.state, c_cache.state)) <= 1e-5


def test_greedy_equals_transformers_generate(params, live):
    """The batch, ragged and left-padded, gives each prompt the tokens ``generate`` gives it alone."""
    assert qwen35.greedy(params, CFG, PROMPTS, reference.GREEDY_TOKENS) == live[1]["greedy"]


def test_a_row_is_independent_of_its_batch_and_a_preempted_row_resumes(params, live):
    """Row 1 (the shortest prompt) beside other prompts gives the same tokens; a sequence preempted after 4 tokens
    re-prefills its prompt and those tokens (:func:`resume_tokens`: its state cannot be rolled back) and continues
    exactly as it would have. Same batch shape as the other tests: no new program."""
    greedy = live[1]["greedy"]
    resumed = qwen35.resume_tokens(PROMPTS[0], greedy[0][:4])  # 7 + 4 = 11 tokens
    batch = [resumed, PROMPTS[1], [9, 8, 7, 6, 5]]
    out = qwen35.greedy(params, CFG, batch, reference.GREEDY_TOKENS)
    assert out[1] == greedy[1]
    assert out[0][: reference.GREEDY_TOKENS - 4] == greedy[0][4:]
    assert not qwen35.can_reuse_prefix(CFG)


def test_the_golden_file_is_fresh(live):
    """Regenerating the golden data gives the stored numbers (``python -c 'from jaxlab.tools.qwen35_reference
    import write_golden; write_golden()'`` rewrites it when this fails)."""
    stored = json.loads(reference.GOLDEN_FILE.read_text())
    now = live[1]
    assert stored["config"] == json.loads(json.dumps(now["config"]))
    assert stored["prompts"] == now["prompts"] and stored["greedy"] == now["greedy"]
    for a, b in zip(stored["logits"], now["logits"]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6, atol=1e-7)


def test_load_tiny_gives_the_live_params_and_their_logits(params, live):
    """The stored safetensors equal the live model's weights (converted), and the stored logits are reproduced from
    them without torch."""
    stored, golden = reference.load_tiny()
    assert stored.config == CFG
    live_flat, stored_flat = params.flat(), stored.flat()
    assert live_flat.keys() == stored_flat.keys()
    for name in live_flat:
        # within one unit in the last place, not bit for bit: torch initializes A_log = log(uniform), and its
        # vectorized log differs in the last bit between CPUs (the file was written on an AMD EPYC; an Intel Xeon
        # with AVX-512 gives one element 1 ulp away)
        a, b = np.asarray(stored_flat[name]), np.asarray(live_flat[name])
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_array_max_ulp(a, b, maxulp=1)
    tokens, positions = padded()
    logits, _ = forward(stored, tokens, positions, qwen35.init_hybrid_cache(CFG, len(PROMPTS), tokens.shape[1]))
    assert max(rel(logits[i, -len(p) :], want) for i, (p, want) in enumerate(zip(PROMPTS, golden["logits"]))) <= 1e-5
    assert reference.WEIGHTS_FILE.stat().st_size < 1_000_000
