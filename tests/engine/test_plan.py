"""The one check of a request (``check_generation``): every rule names the field at fault and says what to do, and
the engine takes its result without checking again."""

from __future__ import annotations

import pytest

from jaxlab.engine import plan
from jaxlab.engine.grammar import Constraint
from jaxlab.engine.plan import GenerationRequest, check_generation, check_request
from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import InvalidRequestError, PromptTooLongError
from jaxlab.io.config import tiny

VOCAB, CONTEXT = 263, 64


def check(prompt=(1, 5), n=4, **kw):
    return check_generation(prompt, n, vocab_size=VOCAB, context=CONTEXT, **kw)


def test_a_checked_request_is_what_the_engine_runs():
    r = check([1, 5, 9], 8, seed=-1, stop="x", top_logprobs=3, sampling=SamplingParams(temperature=0.5))
    assert r == GenerationRequest((1, 5, 9), 8, SamplingParams(temperature=0.5), 2**32 - 1, ("x",), False, True, 3)
    assert check().logprobs is False and check(logprobs=True).logprobs is True
    assert check(n=CONTEXT - 2).max_new_tokens == CONTEXT - 2  # exactly the context: fits


@pytest.mark.parametrize(
    "kw, param, words",
    [
        (dict(prompt=[]), "prompt", "empty"),
        (dict(prompt=[1, 263]), "prompt", "outside the vocabulary"),
        (dict(prompt=["a"]), "prompt", "token ids"),
        (dict(n=0), "max_new_tokens", ">= 1"),
        (dict(n=2.5), "max_new_tokens", "whole number"),
        (dict(n=True), "max_new_tokens", "whole number"),
        (dict(prompt=[1] * CONTEXT), "prompt", "shorten the prompt by at least 1"),
        (dict(n=CONTEXT), "max_new_tokens", "ask for at most 62 new tokens"),
        (dict(seed=1.5), "seed", "whole number"),
        (dict(stop=[""]), "stop", "non-empty"),
        (dict(top_logprobs=21), "top_logprobs", "[0, 20]"),
        (dict(top_logprobs=True), "top_logprobs", "whole number"),
        (dict(ignore_eos=True, constraint=Constraint.json_object()), "ignore_eos", "grammar"),
        (dict(sampling={"temperature": 1}), "sampling", "SamplingParams"),
    ],
)
def test_each_rule_names_its_field_and_the_fix(kw, param, words):
    with pytest.raises(InvalidRequestError) as e:
        check(**kw)
    assert e.value.param == param and words in str(e.value), str(e.value)


def test_too_long_is_a_prompt_too_long_error_a_server_reports_as_such():
    with pytest.raises(PromptTooLongError) as e:
        check(n=CONTEXT)
    assert e.value.code == "context_length_exceeded" and "context is 64" in str(e.value)


def test_a_batch_is_checked_by_the_same_rules():
    cfg = tiny()
    assert check_request(cfg, [(1, 2), [3]], 4) == [[1, 2], [3]]
    with pytest.raises(InvalidRequestError, match="prompt 1 is empty"):
        check_request(cfg, [[1], []], 4)
    with pytest.raises(InvalidRequestError, match="whole number"):
        check_request(cfg, [[1]], 0)
    with pytest.raises(PromptTooLongError, match=f"context is {cfg.max_seq_len}"):
        plan.plan(cfg, [cfg.max_seq_len], 1)


def test_the_engine_takes_a_checked_request_as_it_is(monkeypatch):
    """Validated once: a face's checked request goes into the engine without a second check; prompt ids given to
    ``add_request`` are checked there, once."""
    from jaxlab.engine import continuous
    from jaxlab.engine.model import init_params

    calls = []
    real = continuous.check_generation
    monkeypatch.setattr(continuous, "check_generation", lambda *a, **k: calls.append(1) or real(*a, **k))
    eng = continuous.Engine(init_params(tiny(), 0), slots=2, page_size=4, chunk=8, context=CONTEXT)
    checked = check([1, 5, 9], 3)
    a = eng.add_request(checked, request_id="a")
    assert calls == [] and a.request is checked
    b = eng.add_request([1, 5, 9], max_new_tokens=3, request_id="b")
    assert calls == [1] and b.request == checked
    with pytest.raises(InvalidRequestError, match="carries its own settings: drop max_new_tokens"):
        eng.add_request(checked, max_new_tokens=5)  # never silently dropped
