"""Checks for notebook 12's exercises: reading a server-sent-event stream, a token-bucket rate limiter, and
time to first token / time per output token of one streamed request.

* ``my_sse_text(lines)``: the text an OpenAI-style stream carries. ``lines`` are the stream's lines (``data:
  {json}``, blank lines, ``:`` comments, ``data: [DONE]``); a chunk's text is ``choices[0].delta.content``
  (chat) or ``choices[0].text`` (completions); chunks without choices (the usage chunk) carry none; nothing
  after ``[DONE]`` counts. Reference: :func:`reference_sse_text`.
* ``my_bucket(per_minute, times)``: for requests arriving at ``times`` (seconds, ascending), which are let
  through by a token bucket that starts full with ``max(1, per_minute)`` tokens, gains ``per_minute / 60`` a
  second up to that, and spends one per request let through. Reference: what
  :class:`jaxlab.serve.app.RateLimiter` answers (``tests/lab/test_serving_lab.py`` checks they agree).
* ``my_ttft_tpot(sent, token_times)``: (time to first token, time per output token after the first), the
  second ``None`` for fewer than two tokens.
"""

from __future__ import annotations

import json
import string

import numpy as np

from jaxlab.lab.exercises import check_function, report


def reference_sse_text(lines) -> str:
    text = []
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        for choice in json.loads(data).get("choices") or []:
            piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
            text.append(piece or "")
    return "".join(text)


def _sse_inputs(rng):
    chat = bool(rng.integers(0, 2))
    alphabet = string.ascii_letters + " .,!é€"
    pieces = ["".join(rng.choice(list(alphabet), size=int(rng.integers(0, 5)))) for _ in range(int(rng.integers(1, 8)))]
    lines = [": keep-alive", ""] if rng.integers(0, 2) else []
    if chat:
        lines += [f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}}]})}", ""]
    for p in pieces:
        choice = {"index": 0, "delta": {"content": p}} if chat else {"index": 0, "text": p}
        lines += [f"data: {json.dumps({'object': 'chunk', 'choices': [choice]}, ensure_ascii=False)}", ""]
    end = (
        {"index": 0, "delta": {}, "finish_reason": "length"}
        if chat
        else {"index": 0, "text": "", "finish_reason": "length"}
    )
    lines += [f"data: {json.dumps({'choices': [end]})}", ""]
    if rng.integers(0, 2):
        lines += [f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': len(pieces)}})}", ""]
    lines += ["data: [DONE]", "", f"data: {json.dumps({'choices': [{'index': 0, 'text': 'AFTER DONE'}]})}"]
    return (lines,)


def check_sse_text(fn, trials: int = 20) -> bool:
    name = "text of a server-sent-event stream"
    rng = np.random.default_rng(0)
    for trial in range(trials):
        (lines,) = _sse_inputs(rng)
        try:
            got = fn(list(lines))
        except NotImplementedError:
            return report(False, name, "not implemented yet", False)
        except Exception as e:
            return report(False, name, f"trial {trial}: raised {type(e).__name__}: {e}", False)
        want = reference_sse_text(lines)
        if got != want:
            return report(False, name, f"trial {trial}: got {got!r}, expected {want!r} from {len(lines)} lines", False)
    return report(True, name, f"{trials} random streams (chat and completions)", False)


def reference_bucket(per_minute, times):
    capacity, rate = max(1.0, per_minute), per_minute / 60.0
    tokens, last, out = capacity, None, []
    for t in times:
        if last is not None:
            tokens = min(capacity, tokens + (t - last) * rate)
        last = t
        if tokens >= 1:
            tokens -= 1
            out.append(True)
        else:
            out.append(False)
    return out


def _bucket_inputs(rng):
    per_minute = float(rng.choice([1, 6, 30, 120]))
    gaps = rng.exponential(float(rng.choice([0.05, 0.5, 3.0])), size=int(rng.integers(1, 40)))
    return per_minute, [float(t) for t in np.cumsum(gaps)]


def check_bucket(fn, trials: int = 20) -> bool:
    return check_function(
        lambda pm, times: np.asarray([bool(x) for x in fn(pm, list(times))]),
        lambda pm, times: np.asarray(reference_bucket(pm, times)),
        _bucket_inputs,
        name="token bucket: which requests pass",
        trials=trials,
    )


def reference_ttft_tpot(sent, token_times):
    ttft = token_times[0] - sent
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return ttft, tpot


def _ttft_inputs(rng):
    sent = float(rng.uniform(0, 10))
    times = sent + np.cumsum(rng.exponential(0.05, size=int(rng.integers(1, 20)))) + float(rng.uniform(0, 2))
    return sent, [float(t) for t in times]


def check_ttft_tpot(fn, trials: int = 20) -> bool:
    def nan_none(pair):
        ttft, tpot = pair
        return np.asarray([ttft, np.nan if tpot is None else tpot], dtype=float)

    return check_function(
        lambda s, t: nan_none(fn(s, list(t))),
        lambda s, t: nan_none(reference_ttft_tpot(s, t)),
        _ttft_inputs,
        name="time to first token, time per output token",
        trials=trials,
    )
