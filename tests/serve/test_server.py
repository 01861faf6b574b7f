"""``jaxlab serve``: a real uvicorn server on loopback, called with the ``openai`` client, raw HTTP and a real browser.
Answers equal ``jaxlab generate`` greedy; bad requests get OpenAI-shaped errors with their status and the server
keeps serving; disconnects and timeouts free the slot; 64 concurrent streams come back whole; SIGTERM drains.

The server runs the embedded model's first two layers (``small_model``: its weights and tokenizer, a fraction of
the compile and decode time): every check here compares the server with the same model run another way. The whole
model is served, and its answers checked, in notebook 12."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

SLOTS, CONTEXT = 8, 256
QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "Write one word that rhymes with cat.",
    "What is 2 plus 2?",
]


@pytest.fixture(scope="module")
def live(small_model):
    """A server over the small model (8 slots, context 256) on a free loopback port, run by uvicorn on a thread of
    this process; -> (base url, the app's Server)."""
    from jaxlab.engine.continuous import Engine
    from jaxlab.serve import BackgroundServer, ServeOptions

    engine = Engine(small_model.params, small_model.tokenizer, slots=SLOTS, context=CONTEXT)
    engine.warmup()  # as jaxlab serve does: no request compiles on the engine thread
    with BackgroundServer(engine, ServeOptions(model_name="smollm2-135m")) as bg:
        yield bg.url, bg.state


@pytest.fixture(scope="module")
def client(live):
    from openai import OpenAI

    return OpenAI(base_url=live[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def generate_json(small_gguf, converted_cache, *args):
    """``jaxlab generate --model <small> --json ARGS`` in this process -> its rows by prompt."""
    import contextlib
    import io

    from jaxlab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXLAB_CACHE", str(converted_cache))
        assert main(["generate", "--model", str(small_gguf), "--json", *args]) == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    return {r["prompt"]: r for r in rows}


@pytest.fixture(scope="module")
def generated(small_gguf, converted_cache, load_once_module):
    """``jaxlab generate --json`` greedy for each question (24 new tokens): the answers the server must give."""
    return generate_json(small_gguf, converted_cache, *QUESTIONS, "--max-new-tokens", "24")


@pytest.fixture(scope="module")
def load_once_module():
    """``load_once`` for a module-scoped fixture."""
    from conftest import share_loads

    with pytest.MonkeyPatch.context() as mp:
        share_loads(mp)
        yield


def wait_idle(server, seconds=10.0):
    """True once no request holds a slot or a page (aborts are carried out between steps)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sched = server.engine.scheduler
        if server.worker.in_flight == 0 and not sched.running and not sched.waiting and server.engine.pool.used == 0:
            return True
        time.sleep(0.02)
    return False


def test_openai_client_gets_what_jaxlab_generate_gives(client, generated):
    for q in QUESTIONS[:2]:
        r = client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0
        )
        want = generated[q]
        assert r.choices[0].message.content == want["text"]
        assert r.usage.completion_tokens == len(want["generated_ids"])
        assert r.usage.prompt_tokens == len(want["prompt_ids"])
        assert r.choices[0].finish_reason == ("length" if want["finish_reason"] == "length" else "stop")


def test_streaming_gives_the_same_text_in_pieces(client, generated):
    q = QUESTIONS[2]
    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": q}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, reasons, usage = [], [], None
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert "".join(pieces) == generated[q]["text"] and len(pieces) > 1
    assert len(reasons) == 1 and usage.completion_tokens == len(generated[q]["generated_ids"])


def test_completions_and_models(client, live, small_model):
    from jaxlab.engine.continuous import Engine

    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
    r = client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=8, temperature=0)
    ids = small_model.tokenizer.encode("The capital of France is")
    eng = Engine(small_model.params, small_model.tokenizer, slots=SLOTS, context=CONTEXT)
    (alone,) = eng.generate([ids], 8)
    assert r.choices[0].text == alone.text and r.usage.completion_tokens == len(alone.generated_ids)
    lp = client.completions.create(
        model="smollm2-135m", prompt="The capital of France is", max_tokens=3, logprobs=2, temperature=0
    )
    values, tops = lp.choices[0].logprobs.token_logprobs, lp.choices[0].logprobs.top_logprobs
    assert len(values) == 3 and all(v <= 0 for v in values) and all(len(t) == 2 for t in tops)
    assert [max(t, key=t.get) for t in tops] == lp.choices[0].logprobs.tokens  # greedy: the most likely


def test_chat_top_logprobs(client, live):
    programs = live[1].engine.programs
    compiled = len(programs)
    r = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": QUESTIONS[0]}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for c in content:
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token
        assert c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6)
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob
    assert len(programs) == compiled, "a top_logprobs request compiled on the engine's thread, stalling every stream"


def test_sampling_is_seeded(client):
    def ask(seed):
        return (
            client.chat.completions.create(
                model="smollm2-135m",
                messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=12,
                temperature=1.0,
                top_p=0.9,
                seed=seed,
            )
            .choices[0]
            .message.content
        )

    a = ask(1)
    assert ask(1) == a
    assert any(ask(s) != a for s in (2, 3))


BAD = [
    (b"{not json", {}, 400, "not valid JSON"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}), {}, 400, "temperature"),
    (json.dumps({"messages": "hi"}), {}, 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 300}]}), {}, 400, "context"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}), {}, 404, "does not exist"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 3}), {}, 400, "not supported"),
    (b"{" + b'"a": "' + b"x" * (2 << 20) + b'"}', {}, 413, "over"),
]


def test_bad_requests_get_errors_and_the_server_keeps_serving(live, client):
    base, server = live
    with httpx.Client(base_url=base, timeout=30) as http:
        for body, headers, status, words in BAD:
            r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json", **headers})
            assert r.status_code == status, (body[:80], r.text)
            err = r.json()["error"]
            assert words in err["message"] and err["type"]
        assert http.get("/v1/nothing").status_code == 404
        assert http.delete("/v1/models").status_code == 405
        assert http.get("/health").json()["status"] == "ok"
    ok = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
    )
    assert ok.usage.completion_tokens == 2


def test_structured_output_through_the_openai_clients_parse(client):
    """``response_format`` from a pydantic model (the client's structured-output helper): the reply parses into it,
    on the small model that answers in prose unaided (160 tokens: the most this schema allows with 12 whitespace
    characters at each of its separators); a schema the grammar compiler refuses is a 400."""
    from typing import Literal

    import openai
    from pydantic import BaseModel

    class Colour(BaseModel):
        colour: Literal["red", "green", "blue"]
        primary: bool

    messages = [{"role": "user", "content": QUESTIONS[1]}]
    r = client.chat.completions.parse(
        model="smollm2-135m", messages=messages, response_format=Colour, max_tokens=160, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Colour)
    free = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=20, temperature=0)
    assert not free.choices[0].message.content.lstrip().startswith("{")  # unaided, it answers in prose
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    with pytest.raises(openai.BadRequestError, match="objekt"):
        client.chat.completions.create(model="smollm2-135m", messages=messages, response_format=bad, max_tokens=5)


def test_api_key_and_rate_limit(live):
    from jaxlab.serve.app import RateLimiter

    base, server = live
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    server.options.api_key = "sesame"
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.post("/v1/chat/completions", json=body).status_code == 401
            wrong = http.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
            key = {"Authorization": "Bearer sesame"}
            assert http.post("/v1/chat/completions", json=body, headers=key).status_code == 200
            assert http.get("/metrics").status_code == 401 and http.get("/metrics", headers=key).status_code == 200
            server.options.open_metrics = True  # what --open-metrics gives a scraper without the key
            assert http.get("/metrics").status_code == 200
            server.options.open_metrics = False
            # a key outside ASCII is a wrong key (401), on POST and GET, not a 500 from the comparison
            odd = {"Authorization": b"Bearer s\xc3\xa9same"}
            assert http.post("/v1/chat/completions", json=body, headers=odd).status_code == 401
            assert http.get("/v1/models", headers=odd).status_code == 401
            server.options.api_key = "s\u00e9same"  # and a server key outside ASCII matches its UTF-8 bytes
            assert http.post("/v1/chat/completions", json=body, headers=odd).status_code == 200
            server.options.api_key = "sesame"
            server.limiter = RateLimiter(2)  # 2 a minute per key
            codes = [http.post("/v1/chat/completions", json=body, headers=key).status_code for _ in range(3)]
            assert codes == [200, 200, 429]
            r = http.post("/v1/chat/completions", json=body, headers=key)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
            # wrong keys are throttled per client, whatever keys it makes up
            server.failures = RateLimiter(2)
            codes = [
                http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer guess{i}"}).status_code
                for i in range(3)
            ]
            assert codes == [401, 401, 429]
            # without keys, the limit is the client's: neither a made-up token nor X-Forwarded-For is a new bucket
            server.options.api_key, server.limiter = None, RateLimiter(2)
            heads = [{"Authorization": "Bearer a"}, {"Authorization": "Bearer b"}, {"X-Forwarded-For": "10.9.8.7"}]
            codes = [http.post("/v1/chat/completions", json=body, headers=h).status_code for h in heads]
            assert codes == [200, 200, 429]
    finally:
        server.options.api_key, server.limiter = None, None
        server.failures = RateLimiter(10)


def test_flood_effect_gives_each_client_its_own_bucket(live):
    """Notebook 12's measurement: the flooder (its own loopback address) is refused once its bucket is empty while
    the well-behaved client, another address under the same key, is answered every time."""
    from jaxlab.lab import serving
    from jaxlab.serve.app import RateLimiter

    base, server = live
    server.options.api_key, server.limiter = "sesame", RateLimiter(6)
    try:
        got = serving.flood_effect(base, "sesame", "smollm2-135m", victim_tokens=2, flood_threads=2, flood_tokens=2)
    finally:
        server.options.api_key, server.limiter = None, None
    assert got["alone_s"] > 0 and got["within_s"] > 0 and got["past_s"] > 0
    assert got["within"].get(200, 0) >= 1  # within its allowance the flood reached the model
    assert got["past"].get(429, 0) >= 1 and set(got["past"]) <= {200, 429}  # past it, refused


def test_timeout_and_disconnect_free_the_slot(live):
    base, server = live
    body = {"messages": [{"role": "user", "content": "Count to a hundred."}], "max_tokens": 200, "ignore_eos": True}
    timeout = server.options.request_timeout
    server.options.request_timeout = 0.5
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 504 and "timeout" in r.json()["error"]["message"]
    finally:
        server.options.request_timeout = timeout
    assert wait_idle(server), "a timed-out request still holds its slot or pages"
    with httpx.Client(base_url=base, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if '"content"' in line:
                    break  # the first token arrived: hang up
    assert wait_idle(server), "a disconnected stream still holds its slot or pages"
    # a client that is not streaming and gives up is aborted too, within a step, not at its last token
    with httpx.Client(base_url=base, timeout=1.0) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=dict(body, max_tokens=CONTEXT - 40))
    assert wait_idle(server, seconds=1.5), "a disconnected non-streaming request still holds its slot or pages"
    metrics = httpx.get(base + "/metrics").text
    assert 'jaxlab_finished_total{reason="abort"}' in metrics


def test_metrics_are_prometheus_text(live, client):
    client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    text = httpx.get(live[0] + "/metrics").text
    for name in (
        "jaxlab_requests_total",
        "jaxlab_generation_tokens_total",
        "jaxlab_queue_length",
        "jaxlab_batch_occupancy",
        "jaxlab_preemptions_total",
        "jaxlab_kv_pages_held",
        "jaxlab_time_to_first_token_seconds_bucket",
        "jaxlab_time_per_output_token_seconds_count",
    ):
        assert name in text, name
    engine = live[1].engine
    # what admission by memory reads: the pool's pages, and the row bucket the last decode call ran in
    assert gauge(text, "jaxlab_kv_pages_total") == engine.pool.capacity
    assert gauge(text, "jaxlab_decode_bucket_rows") == engine.last_bucket
    assert engine.last_bucket in engine.runner.row_buckets


def test_a_full_queue_is_a_503_and_a_slow_body_a_408(live):
    import socket

    base, server = live
    body = {"messages": [{"role": "user", "content": "Count to a hundred."}], "max_tokens": 8, "ignore_eos": True}
    queue, slow = server.options.max_queue, server.options.body_timeout
    server.options.max_queue, server.options.body_timeout = 2, 0.5
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.post("/v1/chat/completions", json=body).status_code == 200 and not server.admitted
            # the small model finishes a request faster than a client can send the next one: hold the queue's
            # places with two requests that stay admitted, as requests still running would
            server.admitted.update({"held-1", "held-2"})
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "overloaded"
            server.admitted.discard("held-2")
            assert http.post("/v1/chat/completions", json=body).status_code == 200  # one place free again
            server.admitted.discard("held-1")
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # half a body, then nothing
            head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            sock.sendall((head + "Content-Length: 100\r\n\r\n" + '{"messages": [').encode())
            t0, answer = time.monotonic(), b""
            while b"body_timeout" not in answer and (part := sock.recv(4096)):
                answer += part
            assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer and time.monotonic() - t0 < 5
    finally:
        server.options.max_queue, server.options.body_timeout = queue, slow
    assert wait_idle(server), "the overload test left a request holding a slot"


def test_chat_page_is_served(live):
    r = httpx.get(live[0] + "/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "/v1/chat/completions" in r.text and "tokens/s" in r.text
    # its own policy: no page may frame it, its script talks to this server only
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"] and r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    # a page elsewhere cannot make a key-less server generate, nor reach it through a rebound name
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    evil = httpx.post(
        live[0] + "/v1/chat/completions",
        content=json.dumps(body),
        headers={"Content-Type": "text/plain", "Origin": "http://attacker.example"},
    )
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "cross_origin_refused"
    rebound = httpx.get(live[0] + "/v1/models", headers={"Host": "attacker.example"})
    assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "host_not_allowed"


def test_chat_page_in_a_real_browser(live, generated, tmp_path):
    """Headless chromium (Debian's, driven by Selenium through chromium-driver; ``make test`` installs both) opens
    the page, sets its max tokens to 24, types a question and sees the streamed answer, the greedy one ``jaxlab
    generate`` gives, and a tokens/s figure; then a second turn keeps the conversation."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_path, "Debian's chromium and chromium-driver are missing: run scripts/install_browser.sh"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=900,700"):
        opts.add_argument(arg)
    browser = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        browser.get(live[0] + "/")
        # the settings' max tokens (folded away until opened) to 24: as `generated`, and two turns fit the context
        browser.execute_script("document.getElementById('max_tokens').value = '24'")
        q = QUESTIONS[0]
        box = browser.find_element(By.ID, "input")
        box.send_keys(q, Keys.ENTER)
        wait = WebDriverWait(browser, 120)
        wait.until(lambda b: "tokens/s" in b.find_element(By.ID, "stats").text)
        answers = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        assert len(answers) == 1
        assert answers[0].text.strip() == generated[q]["text"].strip()
        box.send_keys("And of Italy?", Keys.ENTER)
        wait.until(
            lambda b: (
                len(b.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
                and not b.find_element(By.ID, "send").get_attribute("disabled")
            )
        )
        second = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].text
        assert second and "error" not in browser.find_elements(By.CSS_SELECTOR, ".msg")[-1].get_attribute("class")
        browser.save_screenshot(str(tmp_path / "chat.png"))
    finally:
        browser.quit()


def test_64_concurrent_streams_each_equal_to_the_request_alone(live, small_model, measured):
    """64 streaming clients at once, prompt and length mixed: every answer equals the same request run alone
    through an engine of the same shape; none lost, none mixed up. Prints TTFT percentiles and tokens/s."""
    from openai import AsyncOpenAI

    from jaxlab.engine.continuous import Engine

    base, server = live
    tok = small_model.tokenizer
    jobs = [(QUESTIONS[i % len(QUESTIONS)], 1 + (i * 5) % 7) for i in range(64)]  # 1..7 new tokens
    eng = Engine(small_model.params, tok, slots=SLOTS, context=CONTEXT)
    ids = {
        q: tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in QUESTIONS
    }
    longest = {q: max(n for qq, n in jobs if qq == q) for q in QUESTIONS}
    alone = {q: eng.generate([ids[q]], longest[q], ignore_eos=True)[0].generated_ids for q in QUESTIONS}
    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)

    async def one(q, n):
        t0 = time.perf_counter()
        first, text, count = None, [], 0
        stream = await client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": q}],
            max_tokens=n,
            temperature=0,
            stream=True,
            logprobs=True,
            extra_body={"ignore_eos": True},
        )
        async for ch in stream:
            for c in ch.choices:
                if c.logprobs and c.logprobs.content:
                    count += len(c.logprobs.content)
                    first = first or time.perf_counter() - t0
                text.append(c.delta.content or "")
        return "".join(text), count, first

    async def all_of_them():
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(q, n) for q, n in jobs))
        return got, time.perf_counter() - t0

    got, wall = asyncio.run(all_of_them())
    want = [tok.decode(alone[q][:n]) for q, n in jobs]
    mismatched = [i for i, ((text, count, _), w, (q, n)) in enumerate(zip(got, want, jobs)) if text != w or count != n]
    assert not mismatched, f"{len(mismatched)} of 64 answers differ from the request alone: {mismatched[:5]}"
    ttft = sorted(g[2] for g in got)
    tokens = sum(n for _, n in jobs)
    from jaxlab.bench.harness import cpu_name

    measured(
        f"jaxlab serve on {cpu_name()}, 64 concurrent streams, {SLOTS} slots: p50 TTFT {statistics.median(ttft):.2f} s, "
        f"p99 {ttft[int(0.99 * (len(ttft) - 1))]:.2f} s, {tokens / wall:.1f} output tokens/s ({tokens} in {wall:.1f} s)"
    )
    assert wait_idle(server)


def gauge(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_health_holds_and_the_gauges_return_to_zero_under_abuse(live):
    """64 clients at once, a third of them hanging up (streaming or not), beside a flood of malformed requests and a
    /health poller: /health answers within a second throughout, every bad request is a 4xx, and when it is over
    /metrics shows nothing running and no page held within a second, and the server still answers."""
    base, server = live
    body = {"messages": [{"role": "user", "content": "Count to a hundred."}], "max_tokens": 12, "ignore_eos": True}
    bad = [b"{", b"[" * 5000 + b"]" * 5000, b'{"seed": ' + b"9" * 5000 + b"}", b'{"max_tokens": 1e999}', b"\xff"]

    async def run():
        health, bad_codes, done = [], [], asyncio.Event()
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:

            async def client(i):
                if i % 3 == 0 and i % 2 == 0:  # a streaming client that hangs up after its first token
                    async with http.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as r:
                        async for line in r.aiter_lines():
                            if '"content"' in line:
                                return
                elif i % 3 == 0:  # a non-streaming client that gives up after 0.3 s (if its answer is not back)
                    try:
                        await http.post("/v1/chat/completions", json=body, timeout=0.3)
                    except httpx.ReadTimeout:
                        pass
                else:
                    r = await http.post("/v1/chat/completions", json=dict(body, stream=i % 2 == 0))
                    assert r.status_code == 200

            async def flood():
                for i in range(200):
                    r = await http.post("/v1/chat/completions", content=bad[i % len(bad)])
                    bad_codes.append(r.status_code)

            async def poll():
                while not done.is_set():
                    t0 = time.perf_counter()
                    assert (await http.get("/health")).status_code == 200
                    health.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.05)

            poller = asyncio.create_task(poll())
            await asyncio.gather(flood(), *(client(i) for i in range(64)))
            done.set()
            await poller
        return health, bad_codes

    health, bad_codes = asyncio.run(run())
    health.sort()
    assert len(health) > 10 and health[int(0.99 * (len(health) - 1))] < 1.0, f"/health p99 {health[-1]:.2f} s"
    assert bad_codes and all(400 <= c < 500 for c in bad_codes), sorted(set(bad_codes))
    end = time.monotonic() + 1.0
    while True:
        text = httpx.get(base + "/metrics").text
        idle = gauge(text, "jaxlab_running_requests") == 0 and gauge(text, "jaxlab_kv_pages_used") == 0
        if idle or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert idle, "after the clients left, /metrics still shows requests running or pages held"
    ok = httpx.post(base + "/v1/chat/completions", json=dict(body, max_tokens=2), timeout=30)
    assert ok.status_code == 200


def test_sigterm_drains_then_stops(tmp_path):
    """``jaxlab serve`` as users run it: after SIGTERM a new request gets 503, a request in flight that ends
    within the grace period ends normally, one that does not is aborted at its end; the process exits 0."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "jaxlab.cli", "serve", "--port", str(port), "--context", str(CONTEXT)]
    # one row per decode call: no row buckets to probe (three whole-model programs fewer to compile), and the two
    # requests run at once in two calls a step (--max-running), as a server with more requests than rows does; 4 s of
    # grace tell them apart: the short one's last 5 tokens take well under a second, the long one's 199 over ten
    cmd += ["--max-batch", "1", "--kv-tokens", str(2 * CONTEXT), "--grace", "4"]
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, open(tmp_path / "serve.log").read()
            assert time.monotonic() < deadline, "the server did not come up in 300 s"
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        results = {}

        def stream(name, n):
            body = {"messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": n, "ignore_eos": True}
            reasons, done = [], False
            with httpx.stream("POST", base + "/v1/chat/completions", json=dict(body, stream=True), timeout=60) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        for c in json.loads(line[6:]).get("choices", []):
                            if c["finish_reason"]:
                                reasons.append(c["finish_reason"])
                    if line.startswith("data: ") and name not in results:
                        results[name] = "started"
            results[name] = (reasons, done)

        threads = [threading.Thread(target=stream, args=a) for a in (("short", 6), ("long", 200))]
        for t in threads:
            t.start()
        while len(results) < 2:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        assert httpx.get(base + "/health").status_code == 503
        for t in threads:
            t.join(60)
        assert results["short"] == (["length"], True)
        assert results["long"] == (["abort"], True)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = open(tmp_path / "serve.log").read()
    assert "draining" in text and "aborting 1" in text


def test_the_bench_load_generator_measures_a_live_server(live):
    """``jaxlab bench --serve``'s clients (plain http.client, streamed /v1/completions with token-id prompts and
    ignore_eos) against this server: every request whole, the figures consistent."""
    from jaxlab.bench import serving
    from jaxlab.bench.prompts import TEXT, make_prompts

    url, server = live
    port = int(url.rsplit(":", 1)[1])
    opts = serving.ServeBench(
        concurrency=(4,), prompt_len=12, new_tokens=6, requests_per_client=2, slots=SLOTS, quant="none",
        kv_cache="float32", llama_server=None,
    )  # fmt: skip
    prompts = make_prompts(server.tokenizer.encode(TEXT), 8, 12)
    lv = serving.run_level(port, "smollm2-135m", prompts, 4, opts)
    assert lv["requests"] == 8 and lv["failed"] == 0 and lv["errors"] == [] and lv["short"] == 0
    assert lv["output_tokens"] == 8 * 6 and lv["cached_prompt_tokens"] == 0
    assert 0 < lv["ttft_s"][50] <= lv["ttft_s"][99] < lv["wall_s"] and 0 < lv["tpot_s"][50] <= lv["tpot_s"][99]
    assert lv["output_tokens_per_s"] == pytest.approx(48 / lv["wall_s"])
    assert wait_idle(server)
