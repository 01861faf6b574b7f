"""jaxlab against the reference implementation (transformers on the same GGUF), float32, CPU.

* last-position logits: max|ours - ref| / max|ref| <= 1e-4 (matmul precision "highest")
* cached step-by-step decode and chunked cached prefill == uncached forward at every position
* prompts of different lengths batched together == each run alone (wiring: on the first two layers; on the whole
  model the greedy tests below run ragged batches against transformers on each prompt alone)
* greedy 32-token continuations and prompt ids == transformers' (EOS ignored)
* the golden files in data/reference/ are what the reference produces now
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import forward
from jaxlab.tools import reference as ref_lib

pytestmark = pytest.mark.reference

# Given as token ids, so these tests do not depend on the tokenizer.
ID_PROMPTS = {
    "chat": [
        1,
        9690,
        198,
        2683,
        359,
        253,
        5356,
        5646,
        11173,
        3365,
        3511,
        308,
        34519,
        28,
        7018,
        411,
        407,
        19712,
        8182,
        2,
        198,
        1,
        4093,
        198,
        1780,
        314,
        260,
        3575,
        282,
        4649,
        47,
        2,
        198,
        1,
        520,
        9531,
        198,
    ],
    "one token": [504],
    "text": [504, 3575, 282, 4649, 314, 7042, 30, 339, 3543, 260, 2655, 282],
    "rare ids": [49151, 12, 40000, 7, 3, 25000, 18000, 77, 1000, 2],
}
RTOL = 1e-4


def rel_err(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def fwd():
    return jax.jit(forward, static_argnames=("last_only",))


_REFERENCE_LOGITS, _REFERENCE_GREEDY = ref_lib.reference_logits, ref_lib.reference_greedy


@pytest.fixture(scope="module")
def reference_runs(reference):
    """(logits, greedy): ``reference_logits`` and ``reference_greedy`` of ``jaxlab.tools.reference``, each distinct
    request run once in this module. The "chat" prompt of ``ID_PROMPTS`` is the first golden prompt, and the first of
    ``GREEDY_PROMPTS`` too: the tests below and ``make_golden`` (``test_golden_files_are_fresh``) share its runs."""
    model, _ = reference
    runs: dict = {}

    def logits(m, ids):
        assert m is model
        key = ("logits", tuple(ids))
        if key not in runs:
            runs[key] = _REFERENCE_LOGITS(m, ids)
        return runs[key].copy()

    def greedy(m, ids, n=ref_lib.GREEDY_TOKENS):
        assert m is model
        key = ("greedy", tuple(ids), n)
        if key not in runs:
            runs[key] = _REFERENCE_GREEDY(m, ids, n)
        return list(runs[key])

    return logits, greedy


@pytest.mark.parametrize("name", list(ID_PROMPTS))
def test_last_logits_match_reference(name, smollm, reference, reference_runs, fwd, parity):
    ids = ID_PROMPTS[name]
    model, _ = reference
    ref = reference_runs[0](model, ids)
    ours, _ = fwd(smollm.params, jnp.asarray([ids]), jnp.arange(len(ids))[None])
    ours = np.asarray(ours[0])
    err_last = rel_err(ours[-1], ref[-1])
    err_all = rel_err(ours, ref)
    parity(
        f"logits  {name!r:12} ({len(ids):2d} tokens): rel. error last {err_last:.2e}, all positions {err_all:.2e} (limit {RTOL:g})"
    )
    assert err_last <= RTOL
    assert err_all <= RTOL
    assert ours[-1].argmax() == ref[-1].argmax()


#: Cache slots of the cached passes below: room for the whole "chat" prompt.
CACHE_SLOTS = 48


def test_cached_decode_equals_uncached(smollm, fwd, parity):
    """Step by step through the cache == one uncached pass, at every position of the "chat" prompt (whose uncached
    pass ``test_last_logits_match_reference`` compiled; the one-token step serves the chunked prefill below)."""
    ids = ID_PROMPTS["chat"]
    full, _ = fwd(smollm.params, jnp.asarray([ids]), jnp.arange(len(ids))[None])
    cache = init_cache(smollm.config, 1, CACHE_SLOTS)
    steps = []
    for t, tok in enumerate(ids):
        logits, cache = fwd(smollm.params, jnp.asarray([[tok]]), jnp.asarray([[t]]), cache)
        steps.append(np.asarray(logits[0, 0]))
    err = rel_err(np.stack(steps), full[0])
    parity(f"cached step-by-step vs uncached forward, {len(ids)} positions: rel. error {err:.2e}")
    assert err <= 1e-5


def test_chunked_cached_prefill_equals_uncached(smollm, fwd):
    """Prefill in chunks through the cache (three of 12 tokens, then the 37th alone, by the one-token step of
    ``test_cached_decode_equals_uncached``) == one uncached pass."""
    ids = ID_PROMPTS["chat"]
    assert len(ids) == 37
    full, _ = fwd(smollm.params, jnp.asarray([ids]), jnp.arange(len(ids))[None])
    cache = init_cache(smollm.config, 1, CACHE_SLOTS)
    chunks = []
    for start, end in ((0, 12), (12, 24), (24, 36), (36, 37)):
        logits, cache = fwd(smollm.params, jnp.asarray([ids[start:end]]), jnp.arange(start, end)[None], cache)
        chunks.append(np.asarray(logits[0]))
    assert rel_err(np.concatenate(chunks), full[0]) <= 1e-5


@pytest.fixture(scope="module")
def small_generator(small_model):
    from jaxlab.engine.generate import Generator

    return Generator(small_model.params, small_model.tokenizer)


def test_batched_ragged_equals_alone(small_generator, parity):
    """Wiring (padding, masks, per-row positions), on the embedded model's first two layers. On the whole model,
    ragged batches are checked against transformers run on each prompt alone: the golden prompts (35 to 41 tokens,
    one batch: ``test_our_outputs_match_golden``) and ``GREEDY_PROMPTS`` (one batch)."""
    prompts = [ID_PROMPTS["chat"], ID_PROMPTS["text"], ID_PROMPTS["one token"]]
    together = small_generator.generate(prompts, 12, ignore_eos=True, logprobs=True)
    assert len({tuple(r.generated_ids) for r in together}) == len(prompts), "the rows should differ"
    for p, r in zip(prompts, together):
        alone = small_generator.generate([p], 12, ignore_eos=True, logprobs=True)[0]
        assert r.generated_ids == alone.generated_ids
        np.testing.assert_allclose(r.logprobs, alone.logprobs, atol=1e-4)
    parity(
        f"batched ragged prompts (lengths {[len(p) for p in prompts]}) == each alone: 12 greedy tokens each "
        "(the first two layers)"
    )


GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Give me one tip for learning to code.",
    "def fibonacci(n):",
]


def test_greedy_and_prompt_ids_match_transformers_generate(smollm, generator, reference, reference_runs, parity):
    model, ref_tok = reference
    tok = smollm.tokenizer
    ours_ids = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in GREEDY_PROMPTS
    ]
    ref_ids = [ref_lib.chat_ids(ref_tok, p) for p in GREEDY_PROMPTS]
    assert ours_ids == ref_ids
    n = 32
    results = generator.generate(ours_ids, n, ignore_eos=True)
    for p, ids, r in zip(GREEDY_PROMPTS, ours_ids, results):
        assert r.generated_ids == reference_runs[1](model, ids, n), f"greedy tokens differ for {p!r}"
    parity(
        f"greedy {n}-token continuations identical to transformers.generate for {len(GREEDY_PROMPTS)} chat prompts (one batch)"
    )


def test_golden_files_are_fresh(gguf_path, reference, reference_runs, monkeypatch):
    """Regenerate the golden data with the reference; the stored file must be identical. ``make_golden`` runs
    transformers through ``reference_runs``: the first golden prompt's runs are the ones the tests above made."""
    stored = ref_lib.load_golden()
    monkeypatch.setattr(ref_lib, "reference_logits", reference_runs[0])
    monkeypatch.setattr(ref_lib, "reference_greedy", reference_runs[1])
    fresh = ref_lib.make_golden(gguf_path, reference=reference)
    assert stored["model_sha256"] == fresh["model_sha256"]
    for s, f in zip(stored["prompts"], fresh["prompts"]):
        assert s["prompt_ids"] == f["prompt_ids"], s["prompt"]
        assert s["greedy_ids"] == f["greedy_ids"], s["prompt"]
        assert s["last_logits"]["top_ids"] == f["last_logits"]["top_ids"], s["prompt"]
        np.testing.assert_allclose(s["last_logits"]["top_logits"], f["last_logits"]["top_logits"], atol=2e-3)
    assert [s["prompt"] for s in stored["prompts"]] == [f["prompt"] for f in fresh["prompts"]], (
        "data/reference is stale: run `make reference`"
    )


def test_our_outputs_match_golden(smollm, golden, golden_measured, parity):
    """What the notebooks check, without torch: our prompt ids, greedy tokens and last logits against the golden
    file, under the CPU's exact criteria (the measurement, ``golden_measured``, is made once per session)."""
    for row in golden["prompts"]:
        ids = smollm.tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=True
        )
        assert ids == row["prompt_ids"], row["prompt"]
    r = ref_lib.judge_golden(golden, backend="cpu", **golden_measured)
    n = len(golden["prompts"])
    assert r.ok and (r.greedy_identical, r.logits_ok) == (n, n), r.verdict + "\n" + "\n".join(r.lines)
    parity(f"golden file: {r.verdict}")


def test_gguf_read_once_parses_each_file_once_and_restores_gguf(small_gguf):
    import gguf

    real = gguf.GGUFReader
    with ref_lib.gguf_read_once():
        first = gguf.GGUFReader(str(small_gguf))
        assert gguf.GGUFReader(str(small_gguf)) is first  # transformers asks three times: one parse
        assert isinstance(first, real)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert gguf.GGUFReader is real
