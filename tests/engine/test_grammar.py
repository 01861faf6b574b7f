"""Structured output: a grammar's token mask inside the rows step, on a random tiny model that would never produce
valid output unaided. Every finished reply matches its grammar; free rows beside constrained ones keep their
tokens; nothing compiles after warm-up; errors are one line."""

from __future__ import annotations

import json
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import byte_tokenizer
from llguidance.numpy import apply_token_bitmask_inplace

from jaxlab.engine.continuous import Engine
from jaxlab.engine.grammar import Constraint, Matcher, allow_all, from_options, mask_logits, words
from jaxlab.engine.model import init_params
from jaxlab.engine.programs import Programs
from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import InvalidRequestError
from jaxlab.io.config import tiny
from jaxlab.tools.profile import CompileCounter


@pytest.fixture(scope="module")
def tiny_params():
    return init_params(tiny(), 7)


@pytest.fixture(scope="module")
def tok():
    t = byte_tokenizer()
    assert t.vocab_size <= tiny().vocab_size
    return t


PROGRAMS = Programs()  # one table for the tiny engines below: the tests check tokens, not what an engine compiles


def engine(params, tok, **kw):
    eng = Engine(params, tok, **dict(dict(slots=4, page_size=4, chunk=8, context=128), **kw))
    eng.programs = PROGRAMS
    return eng


SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["ok", "tag", "n"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},  # compact: a random model's reply stays short
}


def valid(text: str) -> bool:
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(v, dict)
        and set(v) == {"ok", "tag", "n"}
        and isinstance(v["ok"], bool)
        and v["tag"] in ("red", "green")
        and isinstance(v["n"], int)
        and 0 <= v["n"] <= 99
        and not isinstance(v["n"], bool)
    )


def test_the_mask_inside_the_step_equals_llguidances_own(tok):
    vocab = tiny().vocab_size
    rng = np.random.default_rng(0)
    bits = rng.integers(-(2**31), 2**31, size=(3, words(vocab)), dtype=np.int64).astype(np.int32)
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    want = logits.copy()
    apply_token_bitmask_inplace(want, bits)
    got = np.asarray(jax.jit(mask_logits)(jnp.asarray(logits), jnp.asarray(bits)))
    np.testing.assert_array_equal(got, want)
    free = np.asarray(mask_logits(jnp.asarray(logits), jnp.asarray(allow_all(3, vocab))))
    np.testing.assert_array_equal(free, logits)


def test_a_matcher_walks_a_valid_reply_and_forbids_a_breaking_token(tok):
    m = Matcher(Constraint.json_schema(SCHEMA), tok, tiny().vocab_size)
    row = allow_all(1, tiny().vocab_size)[0]
    reply = '{"ok":true,"tag":"red","n":12}'  # compact, as SCHEMA asks
    for t in tok.encode(reply):
        m.fill(row)
        assert (row[t // 32] >> (t % 32)) & 1, f"token {t} ({tok.decode([t])!r}) forbidden"
        m.advance(t)
    assert m.done
    m = Matcher(Constraint.json_schema(SCHEMA), tok, tiny().vocab_size)
    m.fill(row)
    x = tok.encode("x")[0]
    assert not (row[x // 32] >> (x % 32)) & 1  # a reply cannot start with "x"


def test_json_whitespace_is_bounded_unless_the_schema_says_otherwise(tok):
    space = tok.encode(" ")[0]

    def spaces_allowed(constraint):
        m, row = Matcher(constraint, tok, tiny().vocab_size), allow_all(1, tiny().vocab_size)[0]
        for t in tok.encode("{"):
            m.advance(t)
        n = 0
        while n < 40:
            m.fill(row)
            if not (row[space // 32] >> (space % 32)) & 1:
                return n
            m.advance(space)
            n += 1
        return n

    assert spaces_allowed(Constraint.json_object()) == 12
    free = Constraint.json_schema({"type": "object", "x-guidance": {"whitespace_flexible": True}})
    assert spaces_allowed(free) == 40


def test_a_random_model_answers_every_grammar_and_free_rows_keep_their_tokens(tiny_params, tok):
    """Greedy and sampled rows, free and constrained, in one crowded engine."""
    greedy, hot = SamplingParams(), SamplingParams(temperature=1.0)
    prompts = [
        [1] + list(range(40 + 30 * i, 40 + 30 * i + n)) for i, n in enumerate((3, 11, 6, 20, 9))
    ]  # no prefix shared
    free_alone = [engine(tiny_params, tok).generate([p], 12, sp, seed=3)[0] for p, sp in zip(prompts, (greedy, hot))]
    eng = engine(tiny_params, tok, num_pages=1 + 16)  # 16 pages of 4: the requests preempt each other
    free = [eng.add_request(p, sp, max_new_tokens=12, seed=3) for p, sp in zip(prompts, (greedy, hot))]
    schema = eng.add_request(prompts[2], hot, max_new_tokens=48, constraint=Constraint.json_schema(SCHEMA))
    regex = eng.add_request(prompts[3], greedy, max_new_tokens=20, constraint=Constraint.regex(r"[a-c]{3}-[0-9]{1,2}"))
    choice = eng.add_request(prompts[4], hot, max_new_tokens=20, constraint=Constraint.choice(["yes", "no", "okay"]))
    eng.run()
    assert [s.token_ids for s in free] == [r.generated_ids for r in free_alone]
    assert eng.scheduler.preemptions > 0  # the pool was small enough: matchers survived a preemption
    assert schema.finish_reason == "eos" and valid(schema.text), schema.text
    assert regex.finish_reason == "eos" and re.fullmatch(r"[a-c]{3}-[0-9]{1,2}", regex.text), regex.text
    assert choice.finish_reason == "eos" and choice.text in ("yes", "no", "okay"), choice.text
    assert eng.grammar_seconds > 0


def test_constrained_tokens_do_not_depend_on_the_rows_beside_them(tiny_params, tok):
    sp = SamplingParams(temperature=1.0)
    c = Constraint.json_schema(SCHEMA)
    alone = engine(tiny_params, tok).generate([[1, 50, 51]], 48, sp, seed=9, constraint=c)[0]
    eng = engine(tiny_params, tok, num_pages=1 + 20)  # 20 pages of 4: preemptions
    rng = random.Random(1)
    for i in range(5):
        eng.add_request(
            [1] + [rng.randrange(3, 259) for _ in range(rng.randrange(2, 25))], sp, seed=i, max_new_tokens=9
        )
    s = eng.add_request([1, 50, 51], sp, seed=9, max_new_tokens=48, constraint=c)
    eng.run()
    assert s.token_ids == alone.generated_ids and valid(s.text)
    assert eng.scheduler.preemptions > 0


def test_constrained_requests_read_a_shared_prefix_and_keep_their_tokens(tiny_params, tok):
    """Prefix reuse skips the shared prompt's prefill; the grammar starts after the prompt, so the tokens are the
    same with reuse on and off."""
    sp, c = SamplingParams(temperature=1.0), Constraint.json_schema(SCHEMA)
    shared = [1] + list(range(60, 76))  # four full pages of 4
    prompts = [shared + [100 + i, 120 + i] for i in range(3)]
    got = {}
    for reuse in (False, True):
        eng = engine(tiny_params, tok, prefix_reuse=reuse)
        first = eng.add_request(prompts[0], sp, seed=5, max_new_tokens=48, constraint=c)
        eng.run()  # the first registers the prefix; the others then read it
        rest = [
            eng.add_request(p, sp, seed=5 + i, max_new_tokens=48, constraint=c) for i, p in enumerate(prompts[1:], 1)
        ]
        eng.run()
        got[reuse] = [s.token_ids for s in (first, *rest)]
        assert all(valid(s.text) for s in (first, *rest)), [s.text for s in (first, *rest)]
        assert (eng.pool.reused_pages >= 2 * 4) == reuse, eng.pool.reused_pages
    assert got[True] == got[False]


def test_no_compilation_after_warmup_with_constrained_and_free_rows(tiny_params, tok):
    eng = engine(tiny_params, tok)  # the shared table: warm-up compiles what the tests before did not
    eng.warmup()
    with CompileCounter() as cc:
        eng.add_request([1, 7, 8], max_new_tokens=6)
        eng.add_request([1, 9], SamplingParams(temperature=0.8), max_new_tokens=40, constraint=Constraint.json_object())
        eng.add_request([1] * 20, max_new_tokens=10, constraint=Constraint.choice(["a", "b"]))
        eng.run()
    assert cc.count == 0, cc.names


def test_a_bad_grammar_is_one_line_that_names_it(tiny_params, tok):
    eng = engine(tiny_params, tok)
    cases = [
        (lambda: Constraint.regex("a(b"), "regex"),
        (lambda: Constraint.json_schema({"type": "objekt"}), "objekt"),
        (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
        (lambda: Constraint.json_schema([1]), "JSON object"),
        (lambda: Constraint.choice([]), "choice"),
        (lambda: Constraint("yaml"), "json_schema"),
    ]
    for make, says in cases:
        with pytest.raises(InvalidRequestError, match=re.escape(says)) as e:
            eng.add_request([1, 5], max_new_tokens=4, constraint=make())
        assert "\n" not in str(e.value)
    with pytest.raises(InvalidRequestError, match="ignore_eos"):
        eng.add_request([1, 5], max_new_tokens=4, ignore_eos=True, constraint=Constraint.json_object())
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        Engine(tiny_params, None, slots=1, context=32).add_request(
            [1], max_new_tokens=4, constraint=Constraint.json_object()
        )
    assert not eng.has_work  # nothing was queued


def test_command_line_constraints(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCHEMA))
    assert from_options(json_schema=str(path)) == Constraint.json_schema(SCHEMA)
    assert from_options(regex="[0-9]+") == Constraint.regex("[0-9]+")
    assert from_options(choice="yes, no") == Constraint.choice(["yes", "no"])
    assert from_options() is None
    with pytest.raises(InvalidRequestError, match="--regex and --choice"):
        from_options(regex="a", choice="b")
    with pytest.raises(InvalidRequestError, match="cannot read"):
        from_options(json_schema=str(tmp_path / "missing.json"))


def test_a_token_the_grammar_refuses_ends_that_request_not_the_engine(tiny_params, tok, monkeypatch):
    eng = engine(tiny_params, tok)
    monkeypatch.setattr(Matcher, "fill", lambda self, row: None)  # a mask that forbids nothing: a bug, simulated
    broken = eng.add_request([1, 7, 8], max_new_tokens=8, constraint=Constraint.regex("q{5}"))
    free = eng.add_request([1, 9], max_new_tokens=6, ignore_eos=True)
    eng.run()
    assert broken.finished and broken.finish_reason == "stop" and broken.token_ids == [], broken.text
    assert free.finish_reason == "length" and len(free.token_ids) == 6
