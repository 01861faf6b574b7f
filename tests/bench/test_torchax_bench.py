"""jaxlab.bench.torchax: one run times both roads (torchax and jaxlab's own) on the same prompt and cache length,
and their greedy tokens agree with transformers' generate."""

from __future__ import annotations

import pytest

from jaxlab.bench.torchax import measure_torchax, render

pytestmark = pytest.mark.reference


def test_measure_torchax_fields_and_tokens(gguf_path, reference, smollm, golden, measured):
    lengths = [len(r["prompt_ids"]) for r in golden["prompts"]]
    row = golden["prompts"][lengths.index(max(lengths, key=lengths.count))]  # the length the bridge's tests compile
    res = measure_torchax(gguf_path, row["prompt_ids"], new_tokens=3, reps=1, reference=reference, params=smollm.params)
    assert res["tokens_agree"]
    assert res["torchax"]["tokens"] == res["native"]["tokens"] == res["transformers_tokens"] == row["greedy_ids"][:3]
    for road in ("torchax", "native"):
        assert res[road]["prefill_s"] > 0 and res[road]["decode_s_per_token"] > 0
        assert res[road]["first_run_s"] >= res[road]["prefill_s"]
    for phase in ("prefill", "decode"):
        want = res["native"][f"{phase}_s" if phase == "prefill" else "decode_s_per_token"]
        got = res["torchax"][f"{phase}_s" if phase == "prefill" else "decode_s_per_token"]
        assert res["native_over_torchax"][phase] == pytest.approx(want / got)
    assert res["prompt_len"] == len(row["prompt_ids"]) and res["cache_len"] == 256 and res["dtype"] == "float32"
    assert res["host"]["cpu"] and res["host"]["torchax"] == "0.0.13"
    text = render(res)
    assert "jaxlab / torchax" in text and "agree" in text
    measured(text.splitlines()[-2])


def test_measure_torchax_refuses_a_run_without_decode_steps(gguf_path):
    with pytest.raises(ValueError, match="at least 2"):
        measure_torchax(gguf_path, [1, 2], new_tokens=1)
