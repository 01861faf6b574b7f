"""Request validation in OpenAI's shapes: every implemented field checked, unimplemented ones only at their
default, unknown ones refused; no model needed."""

from __future__ import annotations

import pytest
from conftest import byte_tokenizer

from jaxlab.serve import protocol
from jaxlab.serve.app import RateLimiter
from jaxlab.serve.protocol import ApiError, parse_json, parse_request


class FakeTokenizer:
    bos_id = 1

    def encode(self, text):
        return [3 + (ord(c) % 50) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [1] + [t for m in messages for t in self.encode(m["role"] + ":" + m["content"])] + [2]


def parse(body, kind="chat", context=64):
    return parse_request(body, kind, model_name="m", tokenizer=FakeTokenizer(), context=context, vocab_size=100)


MSG = [{"role": "user", "content": "hi"}]


def test_defaults_and_fields():
    r = parse({"messages": MSG})
    assert (
        r.generation.sampling.temperature == 1.0
        and not r.stream
        and r.generation.stop == ()
        and r.generation.max_new_tokens == 64 - len(r.generation.prompt_ids)
    )
    r = parse(
        {
            "model": "m",
            "messages": MSG,
            "max_completion_tokens": 5,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "seed": -1,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "n": 1,
            "presence_penalty": 0,
            "user": "someone",
        }
    )
    assert (
        r.generation.max_new_tokens,
        r.generation.sampling.greedy,
        r.generation.sampling.top_k,
        r.generation.stop,
        r.include_usage,
        r.generation.logprobs,
    ) == (
        5,
        True,
        3,
        ("x",),
        True,
        True,
    )
    assert r.generation.seed == 2**32 - 1  # any 64-bit seed maps to the engine's 32-bit one
    c = parse({"prompt": "abc"}, "completion")
    assert c.generation.max_new_tokens == protocol.DEFAULT_COMPLETION_TOKENS and list(
        c.generation.prompt_ids
    ) == FakeTokenizer().encode("abc")
    assert list(parse({"prompt": [5, 6]}, "completion").generation.prompt_ids) == [5, 6]
    c = parse({"prompt": "a", "logprobs": 5}, "completion")
    assert c.generation.logprobs and c.generation.top_logprobs == 5
    r = parse({"messages": MSG, "logprobs": True, "top_logprobs": 2})
    assert r.generation.top_logprobs == 2
    lp = protocol.response(r, "ab", "stop", 2, ["a", "b"], [-0.1, -0.2], [[("a", -0.1), ("c", -2.0)], [("b", -0.2)]])
    alts = lp["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert [a["token"] for a in alts] == ["a", "c"] and alts[1]["logprob"] == -2.0


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        ({"messages": MSG, "temperature": 3}, 400, "temperature", "[0, 2]"),
        ({"messages": MSG, "temperature": "hot"}, 400, "temperature", "a number"),
        ({"messages": MSG, "top_p": 0}, 400, "top_p", "(0, 1]"),
        ({"messages": MSG, "max_tokens": 0}, 400, "max_tokens", ">="),
        ({"messages": MSG, "max_tokens": 2.5}, 400, "max_tokens", "whole number"),
        ({"messages": MSG, "max_tokens": True}, 400, "max_tokens", "whole number"),
        ({"messages": MSG, "max_tokens": 1000}, 400, "max_tokens", "context"),
        ({"messages": [{"role": "user", "content": "x" * 100}]}, 400, "messages", "shorten"),
        ({"messages": MSG, "n": 2}, 400, "n", "not supported"),
        ({"messages": MSG, "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
        ({"messages": MSG, "tools": [{"type": "function"}]}, 400, "tools", "not supported"),
        ({"messages": MSG, "frobnicate": 1}, 400, "frobnicate", "unknown field"),
        ({"messages": MSG, "top_logprobs": 3}, 400, "top_logprobs", "logprobs: true"),
        ({"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "[0, 20]"),
        ({"messages": MSG, "stop": ["a"] * 5}, 400, "stop", "at most 4"),
        ({"messages": MSG, "stop": [""]}, 400, "stop", "non-empty"),
        ({"messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream: true"),
        ({"messages": []}, 400, "messages", "non-empty"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages", "role"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages", "string"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages", "text parts"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, 400, "messages", "last message"),
        ({"messages": MSG, "model": "gpt-4"}, 404, "model", "does not exist"),
        ({"messages": MSG, "model": 3}, 400, "model", "string"),
    ],
)
def test_bad_chat_requests_name_the_field(body, status, param, words):
    with pytest.raises(ApiError) as e:
        parse(body)
    assert (e.value.status, e.value.param) == (status, param)
    assert words in e.value.message
    assert e.value.body()["error"]["type"]


@pytest.mark.parametrize(
    "body, words",
    [
        ({"prompt": ""}, None),  # an empty prompt starts from BOS (as jaxlab generate --raw)
        ({"prompt": []}, "non-empty list"),
        ({"prompt": [5, 500]}, "outside the vocabulary"),
        ({"prompt": ["a", "b"]}, "one prompt per request"),
        ({"prompt": "a", "echo": True}, "not supported"),
        ({"prompt": "a", "logprobs": 6}, "logprobs"),
    ],
)
def test_completion_requests(body, words):
    if words is None:
        assert list(parse(body, "completion").generation.prompt_ids) == [1]
        return
    with pytest.raises(ApiError, match=words):
        parse(body, "completion")


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff\xfe", b"null"])
def test_bodies_that_are_not_a_json_object(raw):
    with pytest.raises(ApiError) as e:
        parse_json(raw)
    assert e.value.status == 400


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"[" * 10_000 + b"]" * 10_000, "nests arrays or objects too deeply"),
        (b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "nests arrays or objects too deeply"),
        (b'{"seed": ' + b"9" * 5_000 + b"}", "a number of thousands of digits"),
    ],
)
def test_hostile_bodies_are_a_400_that_says_why(raw, words):
    with pytest.raises(ApiError, match=words) as e:
        parse_json(raw)
    assert e.value.status == 400


@pytest.mark.parametrize("name", ["max_tokens", "temperature", "seed", "top_k"])
def test_an_integer_of_hundreds_of_digits_is_out_of_range_not_an_overflow(name):
    body = parse_json(b'{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (name.encode(), b"7" * 400))
    with pytest.raises(ApiError, match=rf"{name} must be .*got 7{{40}}\.\.\. \(400 digits\)") as e:
        parse(body)
    assert e.value.status == 400 and len(e.value.message) < 200


def test_quoted_values_are_short_and_never_raise():
    assert protocol.shown("x" * 1000).endswith("(1002 characters)") and len(protocol.shown("x" * 1000)) < 80
    deep = []
    for _ in range(5000):
        deep = [deep]
    assert protocol.shown(deep) == "a value nested too deeply to show"
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(ApiError, match="messages.0..content must be a string, got a value nested too deeply"):
        parse({"messages": [{"role": "user", "content": deep}]})


def test_a_lone_surrogate_in_a_completion_prompt_is_sanitized():
    assert list(parse({"prompt": "a\ud800b"}, "completion").generation.prompt_ids) == FakeTokenizer().encode("a\ufffdb")


def test_rate_limiter_refills_over_time(monkeypatch):
    import jaxlab.serve.app as app

    now = [100.0]
    monkeypatch.setattr(app.time, "monotonic", lambda: now[0])  # the limiter's clock
    lim = RateLimiter(2)  # 2 a minute, bursts of 2
    assert lim.take("a") == 0 and lim.take("a") == 0
    wait = lim.take("a")
    assert wait == pytest.approx(30.0)
    assert lim.take("b") == 0  # per key
    now[0] += 30.0
    assert lim.take("a") == 0


def test_rate_limiter_keeps_bounded_state(monkeypatch):
    import jaxlab.serve.app as app

    now = [0.0]
    monkeypatch.setattr(app.time, "monotonic", lambda: now[0])
    limiter = RateLimiter(1, max_keys=3)
    assert limiter.take("a") == 0 and limiter.take("a") > 0  # "a" is throttled
    for i in range(50):
        limiter.take(f"new{i}")
        assert len(limiter.buckets) <= 3
    now[0] = 120.0  # every bucket has refilled: the next new client drops all the full ones
    limiter.take("late")
    assert list(limiter.buckets) == ["late"]


def test_response_shapes():
    r = parse({"messages": MSG, "logprobs": True, "stream": True, "stream_options": {"include_usage": True}})
    full = protocol.response(r, "hello", "stop", 2, ["hel", "lo"], [-0.1, -0.2])
    assert full["object"] == "chat.completion" and full["choices"][0]["message"]["content"] == "hello"
    assert full["usage"]["completion_tokens"] == 2 and len(full["choices"][0]["logprobs"]["content"]) == 2
    first = protocol.chunk(r, "", None, first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant"} and first["usage"] is None
    assert protocol.usage_chunk(r, 2)["choices"] == []
    c = parse({"prompt": "a"}, "completion")
    assert protocol.response(c, "x", "length", 1)["choices"][0]["text"] == "x"


def test_prompts_are_built_as_on_the_command_line():
    """Both endpoints build their prompt with the command line's builder (``jaxlab.io.tokenizer.prompt_ids``): a
    chat through the chat template, a completion's text as ``--raw``, each text sanitized (control characters
    out) and an empty completion starting from BOS."""
    from jaxlab.io.tokenizer import prompt_ids

    tok = FakeTokenizer()
    assert list(parse({"messages": MSG}).generation.prompt_ids) == prompt_ids(tok, messages=MSG)
    assert (
        list(parse({"prompt": "a\x07b"}, "completion").generation.prompt_ids)
        == prompt_ids(tok, "ab", raw=True)
        == tok.encode("ab")
    )
    assert list(parse({"prompt": ""}, "completion").generation.prompt_ids) == [tok.bos_id]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(slots=0), "--max-batch must be >= 1, got 0"),
        (dict(context=0), "--context must be >= 1, got 0"),
        (dict(max_body_bytes=-1), "--max-body-bytes must be >= 1, got -1"),
        (dict(port=70000), "--port must be in 1..65535, got 70000"),
        (dict(rate_limit=0), "--rate-limit must be > 0 requests per minute, got 0"),
        (dict(max_running=0), "--max-running must be >= 1, got 0"),
        (dict(kv_tokens=100, context=256), "--kv-tokens 100 cannot hold one request of --context 256"),
        (dict(kv_tokens=4096, kv_memory=0.5), "give the KV budget once: --kv-tokens or --kv-memory"),
        (dict(kv_memory=1.5), "--kv-memory is a fraction of the free memory in (0, 1), got 1.5"),
    ],
)
def test_serve_options_name_the_flag(kwargs, match):
    from jaxlab.errors import InvalidRequestError
    from jaxlab.serve.app import ServeOptions

    with pytest.raises(InvalidRequestError) as e:
        ServeOptions(**kwargs)
    assert match in str(e.value)


def test_served_name():
    from jaxlab.serve.app import served_name

    assert served_name(None) == served_name("smollm2-135m") == "smollm2-135m"
    assert served_name("/models/tiny.gguf") == "tiny" and served_name("ckpt/folder/") == "folder"


class ByteTokenizer(FakeTokenizer):
    """The fake's prompts, and a real byte-level vocabulary for grammars (``response_format``)."""

    def __init__(self):
        real = byte_tokenizer()
        self.backend, self.eos_id = real.backend, real.eos_id


BYTES = ByteTokenizer()


def parse_format(fmt, kind="chat", **extra):
    body = dict({"messages": MSG} if kind == "chat" else {"prompt": "hi"}, response_format=fmt, **extra)
    return parse_request(body, kind, model_name="m", tokenizer=BYTES, context=64, vocab_size=263)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_response_format_becomes_a_constraint():
    from jaxlab.engine.grammar import Constraint

    spec = {"name": "answer", "schema": SCHEMA, "strict": True}
    assert parse_format({"type": "json_schema", "json_schema": spec}).generation.constraint == Constraint.json_schema(
        SCHEMA
    )
    assert parse_format({"type": "json_object"}).generation.constraint == Constraint.json_object()
    assert parse_format({"type": "text"}).generation.constraint is None
    assert parse({"messages": MSG}).generation.constraint is None


@pytest.mark.parametrize(
    "fmt, kind, extra, words",
    [
        ({"type": "xml"}, "chat", {}, "response_format must be"),
        ("json", "chat", {}, "response_format must be"),
        ({"type": "json_schema"}, "chat", {}, "name (string) and a schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}},
            "chat",
            {},
            "name (string) and a schema",
        ),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objekt"}}}, "chat", {}, "objekt"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "x": 1}}, "chat", {}, "unknown field 'x'"),
        ({"type": "json_object", "schema": {}}, "chat", {}, "takes no field 'schema'"),
        ({"type": "json_object"}, "completion", {}, "not supported"),
        ({"type": "json_object"}, "chat", {"ignore_eos": True}, "ignore_eos"),
    ],
)
def test_bad_response_formats_are_400s_that_say_why(fmt, kind, extra, words):
    with pytest.raises(ApiError) as e:
        parse_format(fmt, kind, **extra)
    assert e.value.status == 400 and words in e.value.message and "\n" not in e.value.message


def test_the_request_is_checked_by_the_engines_one_check(monkeypatch):
    """The server reads OpenAI's fields and hands the rest to ``check_generation`` once (the engine then takes the
    result as is: tests/engine/test_plan.py); its errors come back named by the field this endpoint's client sent."""
    calls = []
    real = protocol.check_generation
    monkeypatch.setattr(protocol, "check_generation", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = parse({"messages": MSG, "max_tokens": 3, "logprobs": True, "top_logprobs": 2})
    assert calls == [1] and (r.generation.max_new_tokens, r.generation.top_logprobs) == (3, 2)
    with pytest.raises(ApiError) as e:
        parse({"prompt": "a", "max_tokens": 64}, "completion")
    assert (e.value.param, e.value.body()["error"]["code"]) == ("max_tokens", "context_length_exceeded")
    assert "ask for at most" in e.value.message
