"""jaxlab.tools.torchax_bridge: transformers' SmolLM2 run as JAX through torchax, against transformers itself and
against jaxlab's own model, float32, CPU.

* the import shim maps away only named-tensor overloads, each truly absent from this torch, and restores torch;
* without torch the bridge says how to install it, in one line;
* the jitted forward's logits [T, V] are within 1e-4 of max|logit| of transformers' (the lab's float32 rule,
  ``AGREEMENT_RTOL``);
* greedy tokens through torchax (StaticCache, jitted prefill and decode) == transformers' generate == jaxlab's
  jitted steps (the loop the bench times, whose programs its test then reuses), on the two golden prompts of one
  length (one prefill and one decode program serve both);
* the HLO summary describes both decode programs' caches.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from jaxlab.bench.torchax import native_greedy  # jaxlab's jitted prefill and decode steps, the same shapes
from jaxlab.tools import torchax_bridge
from jaxlab.tools.reference import AGREEMENT_RTOL, reference_greedy, reference_logits

pytestmark = pytest.mark.reference

NEW_TOKENS = 4


@pytest.fixture(scope="module")
def tx(reference):
    return torchax_bridge.bridge(reference[0])


@pytest.fixture(scope="module")
def same_length(golden):
    """The golden prompts of the most common length (two of 40 tokens): one prefill program serves them all."""
    rows = golden["prompts"]
    lengths = [len(r["prompt_ids"]) for r in rows]
    common = max(set(lengths), key=lengths.count)
    return [r for r in rows if len(r["prompt_ids"]) == common]


def test_missing_torch_names_the_install_command():
    code = "import sys; sys.modules['torch'] = None\nfrom jaxlab.tools.torchax_bridge import import_torchax\nimport_torchax()"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "TorchaxMissingError" in last and 'pip install "jaxlab[test]"' in last


def test_prefill_logits_match_transformers(tx, reference, same_length, parity):
    ids = same_length[0]["prompt_ids"]
    ours, ref = torchax_bridge.prefill_logits(tx, ids), reference_logits(reference[0], ids)
    assert ours.shape == ref.shape == (len(ids), tx.config.vocab_size)
    err = float(np.abs(ours - ref).max())
    assert err <= AGREEMENT_RTOL["float32"] * float(np.abs(ref).max()), err
    parity(
        f"torchax forward vs transformers, {len(ids)} positions: max |diff| {err:.2e} (max |logit| {np.abs(ref).max():.1f})"
    )


def test_greedy_matches_transformers_and_jaxlab(tx, reference, smollm, same_length):
    for row in same_length:
        ids = row["prompt_ids"]
        run = torchax_bridge.greedy(tx, ids, NEW_TOKENS)
        assert all(type(t) is int for t in run.tokens)
        assert run.cache_len == torchax_bridge.cache_length(len(ids), NEW_TOKENS)
        hf = reference_greedy(reference[0], ids, NEW_TOKENS)
        ours = native_greedy(smollm.params, ids, NEW_TOKENS, run.cache_len)["tokens"]
        assert run.tokens == hf == ours == row["greedy_ids"][:NEW_TOKENS], row["prompt"]


def test_hlo_summary_describes_both_decode_steps(tx, smollm):
    s = torchax_bridge.hlo_summary(tx, smollm.params, cache_len=256)
    layers = smollm.params.config.n_layers
    assert s["torchax"]["cache"] == [
        f"keys: {layers} x float32[1, 3, 256, 64]",
        "length: int32[]",
        f"values: {layers} x float32[1, 3, 256, 64]",
    ]
    assert f"k: {layers} x float32[3, 256, 64]" in s["jaxlab"]["cache"]
    for road in s.values():
        assert road["donated"]
        assert road["ops"] > 1000 and road["chars"] > road["written_ops"]
        assert road["top_ops"]["stablehlo.dot_general"] >= 7 * layers  # q, k, v, o, gate, up, down, as run
    assert s["jaxlab"]["calls"] >= layers  # its block traced once, called per layer


def test_stablehlo_size_counts_a_function_once_per_call():
    import jax
    import jax.numpy as jnp

    inner = jax.jit(lambda x: jnp.sin(x) * 2.0)  # named @"<lambda>" in the module
    size = torchax_bridge.stablehlo_size(jax.jit(lambda x: inner(inner(x)) + 1.0).lower(jnp.ones(3)).as_text())
    assert (size["functions"], size["calls"]) == (2, 2)
    assert size["top_ops"]["stablehlo.sine"] == 2 and size["top_ops"]["stablehlo.add"] == 1
    assert (size["written_ops"], size["ops"]) == (7, 11)  # the callee's 4 ops written once, run twice


# Last on purpose: the tests above build the bridge first (the ``tx`` fixture), before anything imported torchax,
# so they also check that bridge() brings torchax in behind the shim.
def test_shim_maps_only_named_tensor_overloads():
    import torch

    names = torchax_bridge.missing_overloads()
    assert names, "torch 2.13 lacks the named-tensor overloads torchax 0.0.13 names"
    assert len(names) == len(set(names))
    for name in names:
        assert "dimname" in name.lower() or "names" in name, name
        packet, overload = name.removeprefix("aten::").split(".")
        # absent from torch, and torch's own lookup is back: asking raises again
        assert not hasattr(getattr(torch.ops.aten, packet), overload), name
    assert torch.ops.aten.add.Tensor is not None
