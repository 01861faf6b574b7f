"""The whole app, as a hostile client meets it, over an engine that answers at once (no model): generated request
bodies from the schema and beyond it (any JSON, any types, huge numbers, deep nesting, bad UTF-8, wrong content
types, odd keys) must each get a 2xx or a 4xx in OpenAI's error shape, never a 5xx, and the server keeps answering.

``JAXLAB_FUZZ_EXAMPLES=10000 pytest tests/serve/test_adversarial.py`` runs the issue's ten thousand; ``make test``
runs fewer (``EXAMPLES``) to keep to its time budget.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from conftest import byte_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlab.engine.continuous import RequestOutput

EXAMPLES = int(os.environ.get("JAXLAB_FUZZ_EXAMPLES", "1500"))
VOCAB, CONTEXT = 263, 64  # the tiny model's vocabulary: conftest's byte tokenizer spells it (for response_format)


class Tokenizer:
    bos_id, eos_id = 1, 2
    backend = byte_tokenizer().backend  # a real vocabulary: grammars (response_format) are compiled against it

    def encode(self, text):
        return [3 + (ord(c) % 90) for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [1] + [t for m in messages for t in self.encode(m["role"] + ":" + m["content"])] + [2]


class InstantEngine:
    """Finishes every request in one step with one token (a logprob, and alternatives when asked)."""

    slots, max_running, context, page_size = 4, 4, CONTEXT, 16
    last_bucket = None  # the row bucket of the last decode call (none run)
    drafted = accepted = 0  # no speculative drafts
    ahead_steps = {"used": 0, "dropped": 0}  # no decode call launched a step early
    tokenizer = Tokenizer()
    config = SimpleNamespace(vocab_size=VOCAB)

    def __init__(self):
        self.requests, self.scheduler = {}, SimpleNamespace(waiting=[], running=[], preemptions=0)
        self.pool = SimpleNamespace(used=0, capacity=64)

    @property
    def has_work(self):
        return bool(self.requests)

    def add_request(self, request, request_id=None):
        self.requests[request_id] = request
        return object()

    def step(self):
        out = []
        for rid, request in list(self.requests.items()):
            o = RequestOutput(rid, [5], "f", True, "length", total_tokens=1)
            if request.logprobs:
                o.logprobs, o.token_texts = [-0.5], ["f"]
                o.top = [[("f", -0.5), ("g", -1.5)][: request.top_logprobs]]
            out.append(o)
            del self.requests[rid]
        return out

    def abort(self, request_id):
        return self.requests.pop(request_id, None) is not None


@pytest.fixture(scope="module")
def http():
    from starlette.testclient import TestClient

    from jaxlab.serve import ServeOptions
    from jaxlab.serve.app import build_app

    app = build_app(InstantEngine(), ServeOptions(model_name="m", request_timeout=10))
    with TestClient(app, base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as client:
        yield client


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "ignore_eos", "n", "tools", "user",
    "response_format",
]  # fmt: skip
schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["object", "string", "integer", "array", "objekt"])})
    | st.fixed_dictionaries({"enum": st.lists(st.text(max_size=4), max_size=3)})
    | st.fixed_dictionaries({"pattern": st.text(max_size=6)}),
    lambda inner: (
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=3), inner, max_size=3)}
        )
        | st.fixed_dictionaries({"type": st.just("array"), "items": inner})
    ),
    max_leaves=6,
)
response_formats = st.sampled_from([{"type": "text"}, {"type": "json_object"}]) | st.fixed_dictionaries(
    {"type": st.just("json_schema")},
    optional={
        "json_schema": st.fixed_dictionaries(
            {}, optional={"name": st.text(max_size=4), "schema": schemas | json_values}
        )
    },
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", ""]) | json_values},
    optional={"content": st.text(max_size=40) | json_values, "name": json_values},
)
schema_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["m", "other"]) | json_values,
        "messages": st.lists(message, max_size=3) | json_values,
        "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 2 * VOCAB), max_size=8) | json_values,
        "max_tokens": st.integers(-3, 2 * CONTEXT) | json_values,
        "temperature": st.floats(-1, 3) | json_values,
        "top_p": st.floats(-0.5, 1.5) | json_values,
        "top_k": st.integers(-2, 2 * VOCAB) | json_values,
        "seed": st.integers(-(2**70), 2**70) | json_values,
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | json_values}),
        "logprobs": st.booleans() | st.integers(-1, 7) | json_values,
        "top_logprobs": st.integers(-1, 25) | json_values,
        "n": st.integers(0, 3) | json_values,
        "response_format": response_formats | json_values,
    },
)


#: Requests a client means to be right, with every option in range: the success paths get traffic too
valid_bodies = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 8)},
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "top_k": st.integers(0, VOCAB),
        "seed": st.integers(0, 2**32),
        "stop": st.lists(st.text(min_size=1, max_size=3), max_size=3),
        "stream": st.booleans(),
        "ignore_eos": st.booleans(),
        "response_format": response_formats,
    },
).flatmap(
    lambda base: st.one_of(
        st.builds(lambda text: dict(base, prompt=text), st.text(max_size=20)),
        st.builds(
            lambda text: dict(base, messages=[{"role": "user", "content": text}]), st.text(min_size=1, max_size=20)
        ),
    )
)


def raw_bodies():
    """Bytes a client may send: valid requests, schema-shaped and arbitrary JSON, deep nesting, huge numbers, bad
    UTF-8."""
    as_json = (
        valid_bodies | schema_bodies | json_values | st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)
    ).map(lambda v: json.dumps(v).encode())
    deep = st.integers(100, 20_000).map(lambda n: b"[" * n + b"]" * n)
    deep_field = st.integers(100, 20_000).map(lambda n: b'{"messages": ' + b"[" * n + b"]" * n + b"}")
    digits = st.integers(300, 6000).map(lambda n: b'{"seed": ' + b"9" * n + b', "prompt": "x"}')
    junk = st.binary(max_size=64)
    surrogate = st.just(b'{"prompt": "a\\ud800b", "max_tokens": 1}')
    return as_json | deep | deep_field | digits | junk | surrogate


statuses: dict[int, int] = {}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    body=raw_bodies(),
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    ctype=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
)
def test_every_generated_body_is_answered_2xx_or_4xx(http, body, path, ctype):
    r = http.post(path, content=body, headers={"Content-Type": ctype} if ctype else {})
    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    assert r.status_code < 500, f"{r.status_code} for {body[:200]!r}: {r.text[:300]}"
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"] and len(error["message"]) < 600 and "Traceback" not in error["message"]


def test_the_server_still_answers_and_holds_nothing(http):
    print(f"answers to {sum(statuses.values())} generated bodies, by status: {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= EXAMPLES and statuses.get(200, 0) > 0 and any(400 <= s < 500 for s in statuses)
    assert http.get("/health").json()["status"] == "ok"
    ok = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "f"
    server = http.app.state.server
    assert not server.admitted and server.worker.in_flight == 0


class HangingEngine(InstantEngine):
    """Its step blocks until released: an engine stuck in a step (a hang injected through the engine interface)."""

    def __init__(self):
        import threading

        super().__init__()
        self.release = threading.Event()

    def step(self):
        self.release.wait(30)
        return super().step()


def test_a_hanging_engine_costs_a_504_and_the_server_keeps_answering():
    from starlette.testclient import TestClient

    from jaxlab.serve import ServeOptions
    from jaxlab.serve.app import build_app

    engine = HangingEngine()
    app = build_app(engine, ServeOptions(model_name="m", request_timeout=0.5))
    with TestClient(app, base_url="http://127.0.0.1:8000") as http:
        try:
            r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
            assert http.get("/health").json()["status"] == "ok"  # the event loop is not the engine's thread
            assert http.get("/v1/models").status_code == 200
        finally:
            engine.release.set()
