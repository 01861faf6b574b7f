# %% [markdown]
# # 12 · Serving: an OpenAI-compatible server, streaming, limits
#
# *About 35 minutes.* Notebook 11 built an engine that takes requests between decode steps. A program or a
# browser still cannot talk to it. This notebook puts it behind HTTP, the way real inference servers (vLLM,
# SGLang, llama.cpp's `llama-server`, JetStream) do: the **OpenAI API** (`POST /v1/chat/completions`), answers
# streamed as **server-sent events**, and the limits a public endpoint needs — bad input, API keys, a rate limit.
# It is `jaxlab serve`, started here on a thread of this notebook's process, on the real SmolLM2-135M.
#
# The first seed article ends by telling you to "build a web service that uses JAX-compiled inference to power
# a real-time chatbot" and names "API rate limits, malformed inputs" as the common failure modes. Its code does
# not run; here both claims are measured.
#
# **Learning goals**
#
# - Read an OpenAI chat request and its answer on the wire, with no client library, then with the `openai`
#   package.
# - Read a stream of server-sent events and say what each line is; know where the server makes them.
# - Watch continuous batching from the outside: batch occupancy and the queue while 16 clients stream.
# - Name the status code of each kind of bad request, and check that a bad request never reaches the model.
# - Explain a token-bucket rate limit and what `Retry-After` tells a client.
#
# Links: [OpenAI chat completions API](https://platform.openai.com/docs/api-reference/chat) ·
# [server-sent events (WHATWG)](https://html.spec.whatwg.org/multipage/server-sent-events.html) ·
# [Starlette](https://www.starlette.io/) · [uvicorn](https://www.uvicorn.org/) ·
# [Prometheus exposition format](https://prometheus.io/docs/instrumenting/exposition_formats/) ·
# [vLLM / PagedAttention](https://arxiv.org/abs/2309.06180) ·
# [Orca: iteration-level scheduling](https://www.usenix.org/conference/osdi22/presentation/yu)

# %% tags=["nbval-ignore-output"]
import http.client
import json
import statistics
import threading
import time
from urllib.parse import urlsplit

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
from openai import OpenAI

import jaxlab
from jaxlab.engine.continuous import Engine
from jaxlab.lab import serving
from jaxlab.lab.notebook import check, setup, show_source, table, unmeasured, verdict
from jaxlab.serve import BackgroundServer, ServeOptions

setup()
m = jaxlab.load()
MODEL, KEY, SLOTS = "smollm2-135m", "workshop-key", 8
engine = Engine(m.params, m.tokenizer, slots=SLOTS, context=256)
compile_s = engine.warmup()
options = ServeOptions(model_name=MODEL, api_key=KEY, rate_limit=60, max_body_bytes=64 * 1024)
server = BackgroundServer(engine, options).start()
print(f"serving {MODEL} on {server.url} ({SLOTS} slots, compiled in {compile_s:.1f} s)")

# %% [markdown]
# That cell is what `jaxlab serve --max-batch 8 --context 256 --api-key workshop-key --rate-limit 60
# --max-body-bytes 65536` does in a terminal, minus the process of its own: the same Starlette app, run by
# uvicorn, over the same engine. (In a terminal, `jaxlab serve` also drains on SIGTERM: new requests get 503,
# requests in flight get a grace period.) On Colab it runs the same way, on `127.0.0.1` inside the runtime.
#
# ## 1 · A request on the wire
#
# HTTP needs no library. `call` below opens a connection, sends JSON, and reads the status, the headers and the
# JSON answer. **Predict first:** what does the answer hold besides the text?

# %%
HOST = urlsplit(server.url)


def call(method, path, body=None, key=KEY, raw=None):
    """One HTTP request with nothing but the standard library -> (status, headers, parsed JSON)."""
    conn = http.client.HTTPConnection(HOST.hostname, HOST.port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    payload = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), json.loads(payload)


question = [{"role": "user", "content": "What is the capital of France?"}]
story = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
status, headers, answer = call(
    "POST", "/v1/chat/completions", {"model": MODEL, "messages": question, "max_tokens": 24, "temperature": 0}
)
print("status", status, "| content-type", headers["content-type"])
print("keys:", sorted(answer))
print("finish_reason:", answer["choices"][0]["finish_reason"], "| usage:", answer["usage"])

# %% tags=["nbval-ignore-output"]
print(json.dumps(answer, indent=1)[:900])

# %% [markdown]
# The answer carries an `id`, the `model`, one `choice` with the assistant's `message` and why it stopped
# (`length`: it hit `max_tokens`; `stop`: the end-of-turn token or a stop string), and `usage`: prompt and
# completion tokens, which is what hosted APIs bill.
#
# The `openai` package speaks the same protocol. Point its `base_url` at this server:

# %%
client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0)
_ = check(
    "the openai client gets the text raw HTTP got",
    r.choices[0].message.content == answer["choices"][0]["message"]["content"],
)
print([model.id for model in client.models.list()])

# %% tags=["nbval-ignore-output"]
print(r.choices[0].message.content)

# %% [markdown]
# ## 2 · Streaming: server-sent events
#
# With `"stream": true` the answer is not one JSON document but a stream of lines, sent as tokens are made:
# `data: {chunk}` and a blank line per event, and `data: [DONE]` at the end. **Predict first:** how many
# `data:` lines for a chat answer of 8 tokens?

# %%
conn = http.client.HTTPConnection(HOST.hostname, HOST.port, timeout=120)
body = {"model": MODEL, "messages": story, "max_tokens": 8, "temperature": 0, "stream": True}
body["stream_options"] = {"include_usage": True}
conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
resp = conn.getresponse()
lines = [raw.decode().rstrip("\n") for raw in resp]
conn.close()
events = [ln for ln in lines if ln.startswith("data:")]
print(resp.status, resp.getheader("content-type"), f"| {len(events)} events; their choices and usage:")
for ln in events:
    chunk = None if ln == "data: [DONE]" else json.loads(ln[len("data:") :])
    print(ln if chunk is None else "data: " + json.dumps({k: chunk[k] for k in ("choices", "usage") if k in chunk}))

# %% tags=["nbval-ignore-output"]
print(events[1])  # one event whole: an id and a time of its own, the same in every chunk of the answer

# %% [markdown]
# One event gives the role, then one per token, then the finish reason, the usage (because we asked for it with
# `stream_options`), and `[DONE]`. Exercise 1 below reads such a stream. The server makes these events in
# `Server.stream` — the generator that Starlette's `StreamingResponse` sends as it yields. Its `finally` is
# what frees the slot when a client hangs up:

# %% tags=["nbval-ignore-output"]
from jaxlab.serve.app import Server

_ = show_source(Server.stream)

# %% [markdown]
# The engine runs on a thread of its own (`jaxlab/serve/worker.py`): between two decode steps it takes new
# requests and aborts from a queue, then runs one step of the whole batch and hands each request its new
# tokens through an `asyncio.Queue` that the HTTP side awaits. Its loop:

# %% tags=["nbval-ignore-output"]
from jaxlab.serve.worker import EngineWorker

_ = show_source(EngineWorker.run)

# %% [markdown]
# ## 3 · Sixteen clients, eight slots
#
# Now 16 clients stream at once, each with its own question and its own length (8 to 38 tokens), on a server
# with 8 slots. While they run, a sampler scrapes `GET /metrics` (Prometheus text) every 50 ms.
# **Predict first:** how long does the last client wait for its first token, compared with the first?

# %%
QUESTIONS = [
    "Name a planet.", "What is 7 times 8?", "Give me a synonym for happy.", "What colour is the sky?",
    "Name a large river.", "Write a haiku about rain.", "What is the opposite of cold?", "Name a fruit.",
    "Who wrote Hamlet?", "What is H2O?", "Name a musical instrument.", "Describe a cat in three words.",
    "What is the boiling point of water?", "Name a programming language.", "What do bees make?",
    "Suggest a name for a dog.",
]  # fmt: skip
LENGTHS = [8 + 2 * i for i in range(16)]


def stream_one(i, t0, out):
    """Client i: one streamed chat request; records when it was sent, each token's arrival, the text."""
    sent = time.perf_counter() - t0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTIONS[i]}],
        max_tokens=LENGTHS[i],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    times, text, usage = [], [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter() - t0)
            text.append(chunk.choices[0].delta.content)
    out[i] = {"name": f"client {i:2d}", "sent": sent, "first": times[0], "last": times[-1],
              "text": "".join(text), "tokens": usage.completion_tokens}  # fmt: skip


crowd = [None] * 16
with serving.MetricsSampler(server.url, every=0.05, key=KEY) as sampler:
    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream_one, args=(i, t0, crowd)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

# %% tags=["nbval-ignore-output"]
fig = serving.plot_occupancy(sampler, SLOTS, "16 streaming clients on 8 slots, as /metrics saw it")
plt.show()
fig = serving.plot_streams(crowd)
plt.show()

# %% [markdown]
# The first eight take the slots; eight wait in the queue (orange bars). Each time a short request ends, the
# next waiting one joins **at the next step** — the occupancy stays at 8 until the queue is empty, then falls
# as the longest requests finish alone. From the outside, that is continuous batching.

# %%
done = [c for c in crowd if c is not None]
_ = check("16 of 16 streams finished with every token", len(done) == 16 and all(
    c["tokens"] == n for c, n in zip(crowd, LENGTHS)), "none lost")  # fmt: skip
_, occupancy = sampler.series("jaxlab_batch_occupancy")
_, queue = sampler.series("jaxlab_queue_length")
_ = check("requests waited in the queue while all 8 slots were busy", max(queue) > 0 and max(occupancy) == 1.0)
alone = {}
for i in (0, 15):
    alone[i] = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[i]}], max_tokens=LENGTHS[i],
        temperature=0, extra_body={"ignore_eos": True},
    ).choices[0].message.content  # fmt: skip
_ = check("a request's answer in the crowd equals its answer alone", all(alone[i] == crowd[i]["text"] for i in alone),
          "clients 0 and 15")  # fmt: skip

# %% tags=["nbval-ignore-output"]
ttft = sorted(c["first"] - c["sent"] for c in crowd)
tokens = sum(c["tokens"] for c in crowd)
print(f"time to first token: p50 {statistics.median(ttft):.2f} s, max {ttft[-1]:.2f} s")
print(f"{tokens} tokens in {wall:.1f} s: {tokens / wall:.1f} tokens/s for all 16 clients together")

# %% [markdown]
# `jaxlab bench --serve` runs this kind of load at 1, 8, 32 and 64 clients against llama.cpp's `llama-server`
# on the same GGUF (`benchmarks/README.md` has the table and the host).
#
# ## 4 · Bad input, and the seed's first claim
#
# > "The most common failure modes in LLM inference are API rate limits, malformed inputs, and hardware
# > failures. A defensive programming approach is essential: `try: logits = inference(input_ids) except
# > jax.errors.TracebackError as e: ...`"
#
# A server does not wait for the model to fail: each request is checked first, and a bad one gets an error in
# OpenAI's shape with a status that says whose fault it is (4xx: the client's) and a message that names the
# problem. Every generation request goes through one handler: `guard` (shutting down? the API key, the rate
# limit), `body` (the size, then the JSON), `parse` (every field, against the model and its context); each step
# raises an `ApiError`, which becomes the error answer before anything reaches the engine:

# %% tags=["nbval-ignore-output"]
from jaxlab.serve import protocol

_ = show_source(Server.generate)
_ = show_source(Server.guard)
_ = show_source(protocol.parse_request, max_lines=30, skip_docstring=True)

# %% [markdown]
# **Predict first:** which status for an unknown model? For a body that is too large? Each bad request below is
# sent alone; after each, the server's counter of prompt tokens tells whether it reached the model, and
# `GET /health` whether the server still serves.

# %%
ok_body = {"model": MODEL, "messages": question, "max_tokens": 4, "temperature": 0}
cases = [
    ("malformed JSON", 400, dict(raw=b'{"model": "smollm2-135m", "messages": [')),
    ("wrong type: max_tokens 'ten'", 400, dict(body={**ok_body, "max_tokens": "ten"})),
    ("out of range: temperature 7", 400, dict(body={**ok_body, "temperature": 7})),
    ("not implemented: n = 2", 400, dict(body={**ok_body, "n": 2})),
    ("unknown field: temprature", 400, dict(body={**ok_body, "temprature": 0.5})),
    ("prompt longer than the context", 400, dict(body={**ok_body, "messages": [
        {"role": "user", "content": "word " * 400}]})),  # fmt: skip
    ("unknown model", 404, dict(body={**ok_body, "model": "gpt-5"})),
    ("body over 64 KiB", 413, dict(raw=json.dumps({**ok_body, "pad": "x" * 70_000}).encode())),
    ("missing API key", 401, dict(body=ok_body, key=None)),
    ("wrong API key", 401, dict(body=ok_body, key="guess")),
]
rows, handled = [], 0
for name, want, kw in cases:
    before = serving.scrape(server.url, key=KEY)["jaxlab_prompt_tokens_total"]
    status, _, err = call("POST", "/v1/chat/completions", **kw)
    reached = serving.scrape(server.url, key=KEY)["jaxlab_prompt_tokens_total"] - before
    health, _, _ = call("GET", "/health")
    handled += status == want and reached == 0 and health == 200
    rows.append({"case": name, "expected": want, "got": status, "model tokens": int(reached), "health": health,
                 "message": err["error"]["message"][:60]})  # fmt: skip
_ = table(rows)
after, _, _ = call("POST", "/v1/chat/completions", ok_body)
_ = check("every bad request got its status and an OpenAI-shaped error", all(r["expected"] == r["got"] for r in rows),
          f"{len(rows)} cases")  # fmt: skip
_ = check("no bad request reached the model", all(r["model tokens"] == 0 for r in rows), "prompt tokens counter unchanged")
_ = check("the server still serves a good request", after == 200)

# %% [markdown]
# The seed's defence is a `try/except` around inference. Does its clause catch anything? Below, four real JAX
# errors (a traced value used as a Python number and as a Python bool, two shape mismatches), each raised inside
# the seed's `except jax.errors.TracebackError:`, and what comes out. **Predict first:** how many of the four does
# the clause catch?

# %%
failures = {
    "int() of a traced value": lambda: jax.jit(lambda x: int(x))(1.0),
    "if on a traced value": lambda: jax.jit(lambda x: x if x > 0 else -x)(1.0),
    "matmul of mismatched shapes": lambda: jnp.ones(3) @ jnp.ones(4),
    "reshape to the wrong size": lambda: jnp.ones(6).reshape(4),
}
caught, seen = 0, []
for name, fail in failures.items():
    try:
        try:
            fail()
        except jax.errors.TracebackError:  # the seed's clause
            caught += 1
    except Exception as e:  # what got out of it
        seen.append({"JAX error": name, "JAX raised": type(e.__context__ or e).__name__, "what came out": type(e).__name__})
_ = table(seen)
_ = verdict(
    "malformed_inputs_handled",
    100 * handled / len(cases),
    because="each bad request is refused with a 4xx naming the problem before it reaches the model, and the "
    "server serves on",
)
_ = verdict(
    "jax_traceback_error",
    100 * caught / len(failures),
    because="jax.errors has no TracebackError: the except clause raises AttributeError in place of JAX's own error; "
    "a server checks its input before the model instead",
)

# %% [markdown]
# Where a failure can only show inside the engine (a bug), the worker answers that one request with a 500 and
# keeps stepping the others (`tests/serve/test_worker.py` checks both).
#
# ## 5 · Rate limiting, and the seed's second claim
#
# > "Strip control characters, validate token lengths, and implement rate limiting at the API gateway level."
#
# Token lengths are validated (the "prompt longer than the context" row above). The rate limit here is a
# **token bucket** per API key: it holds up to 60 requests, refills at 60 a minute, and each request takes one.
# When it is empty the server answers 429 with a `Retry-After` header: the seconds until a token is back.
# `GET /v1/models` costs no model time, so a burst of them shows the limit cheaply. **Predict first:** this
# notebook has sent about 30 requests with this key so far (and the bucket refilled meanwhile); how many of a
# burst of 90 pass?

# %%
statuses, retry_after, t_429 = [], [], []
for _ in range(90):
    t = time.perf_counter()
    status, headers, _ = call("GET", "/v1/models")
    statuses.append(status)
    if status == 429:
        t_429.append(time.perf_counter() - t)
        retry_after.append(int(headers["retry-after"]))
fig = serving.plot_burst(statuses, "A burst of 90 GET /v1/models with one key: 200 until the bucket is empty, then 429")
plt.show()
_ = check("the limit answers 429 with Retry-After once the bucket is empty",
          statuses.count(429) > 0 and all(s in (200, 429) for s in statuses) and min(retry_after) >= 1)  # fmt: skip
status, _, _ = call("GET", "/v1/models", key=None)
_ = check("the key is checked before the limit", status == 401)

# %% tags=["nbval-ignore-output"]
print(f"{statuses.count(200)} passed, {statuses.count(429)} refused; Retry-After {min(retry_after)}-{max(retry_after)} s; "
      f"a 429 took {statistics.median(t_429) * 1000:.1f} ms")

# %% [markdown]
# A refusal is cheap, but does the limit *protect* anyone? The test is another client's experience. A second
# client (its own loopback address, `127.0.0.2`, so its own bucket) floods the server with chat requests on half
# the slots, back to back, while a well-behaved client (`127.0.0.3`) asks for a 12-token answer: first while the
# flooder is within its allowance (its bucket full: its requests reach the model), then after it has used it up
# (its requests refused with 429, as the burst above was). `serving.flood_effect` times the well-behaved answer
# alone and in both floods. **Predict first:** past its allowance, how much slower is the other client's answer?

# %% tags=["nbval-ignore-output"]
try:
    flood = serving.flood_effect(server.url, KEY, MODEL, victim_tokens=12, flood_threads=SLOTS // 2)
except OSError as e:  # loopback aliases are a Linux habit (Colab has them; macOS does not)
    flood = None
    _ = unmeasured("rate_limit_protects", f"{e}; the flood needs two client addresses on this machine")
if flood:
    table([{"well-behaved client's answer": label, "s": flood[f"{k}_s"], "x alone": flood[f"{k}_s"] / flood["alone_s"],
            "flooder's requests answered 200": flood.get(k, {}).get(200, "-"),
            "refused 429": flood.get(k, {}).get(429, "-")}
           for label, k in (("alone", "alone"), ("flooder within its allowance", "within"),
                            ("flooder past its allowance", "past"))])
    past = flood["past"]
    _ = verdict(
        "rate_limit_protects",
        {"flooder within its allowance": flood["within_s"] / flood["alone_s"],
         "flooder past its allowance": flood["past_s"] / flood["alone_s"]},
        because=f"past its allowance the flooder still had {past.get(200, 0)} requests answered (its bucket refills "
        f"one a second) and {past.get(429, 0)} refused, each refusal handled by the same process and CPU as the "
        "model; a gateway in front (the seed's advice) would take that load off the server",
    )

# %% [markdown]
# Well-behaved clients wait `Retry-After` seconds and try again; the `openai` package does that by itself when
# `max_retries` > 0 (we set 0 above to see the 429s).
#
# ## 6 · Stop the server

# %%
server.stop()
print("stopped:", not server.thread.is_alive())


# %% [markdown]
# ## Summary
#
# - An OpenAI-compatible server is JSON over HTTP: a request names the model, the messages and the sampling
#   settings; the answer has the text, why it stopped and the token usage. Any OpenAI client talks to it.
# - Streaming is server-sent events: one `data:` line per token, `[DONE]` at the end; the server frees the
#   request's slot and pages when the client hangs up.
# - Behind it, continuous batching shows in `/metrics`: the batch stays full while requests wait, and a
#   request's answer in a crowd equals its answer alone.
# - Bad input is refused before the model with a status that names whose fault it is (400, 401, 404, 413, 429);
#   the seed's `try/except` around inference names an exception JAX does not have.
# - A token bucket per key and client limits the rate cheaply; `Retry-After` tells the client when to come back.
#   Whether it protects the others is measured as their answer time during a flood: a flood within its
#   allowance still reaches the model, and refusing one past it costs the same CPU the model runs on.
#
# **Quiz**
#
# 1. Why does a streamed chat answer start with an event that has a role and no text?
#    <details><summary>Answer</summary>OpenAI's chunk format sends the assistant's role first, so a client can
#    open the message before the first token; the text follows in `delta.content` events.</details>
# 2. A client disconnects half-way through a 200-token answer. What must the server do, and when?
#    <details><summary>Answer</summary>Abort the request: the stream's generator is cancelled, its `finally`
#    calls `worker.abort`, and the engine frees the slot and pages before its next step.</details>
# 3. Why 413 and not 400 for a body over the limit, and why is it checked before the JSON is parsed?
#    <details><summary>Answer</summary>413 says "too large" so a client knows what to change; checking the size
#    first (the Content-Length header, then while reading) means a huge body is never held in memory.</details>
# 4. Two users share one API key. What does the rate limit do to them?
#    <details><summary>Answer</summary>They share one bucket: one user's burst leaves the other with 429s.
#    Keys per client (or per user behind a gateway) give each their own.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/12_serving.py`.
#
# **1. Read a stream.** `my_sse_text(lines)`: the text carried by a stream's lines — `delta.content` of chat
# chunks or `text` of completion chunks, skipping blank lines, `:` comments and chunks without choices, and
# nothing after `data: [DONE]`.

# %%
def my_sse_text(lines):
    raise NotImplementedError


from jaxlab.lab.exercises import nb12

passed = nb12.check_sse_text(my_sse_text)


# %% [markdown]
# **2. A token bucket.** `my_bucket(per_minute, times)`: which requests, arriving at `times` (seconds,
# ascending), pass a bucket that starts full with `max(1, per_minute)` tokens, refills `per_minute / 60` a
# second up to that, and spends one per request that passes (a list of booleans).

# %%
def my_bucket(per_minute, times):
    raise NotImplementedError


passed = nb12.check_bucket(my_bucket)


# %% [markdown]
# **3. Latency of one request.** `my_ttft_tpot(sent, token_times)`: time to first token, and time per output
# token after the first (`None` with fewer than two tokens). Section 3 used the same definitions.

# %%
def my_ttft_tpot(sent, token_times):
    raise NotImplementedError


passed = nb12.check_ttft_tpot(my_ttft_tpot)

# %% [markdown]
# **An experiment of your own.** Start a server with `slots=4` (or 16) and rerun section 3. How do the waiting
# bars and the total tokens/s change, and why? Then run `jaxlab serve` in a terminal and open its chat page at
# `http://127.0.0.1:8000/` in your browser.
