"""OpenAI's request and response shapes: validating a request body, and building responses and stream chunks.

Every field the server implements is checked for type and range; a field we do not implement is accepted at
its default value (``n=1``, ``presence_penalty=0``, ...) and refused with a 400 that names it otherwise; an
unknown field is refused too. Nothing is silently ignored. Errors use OpenAI's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from jaxlab.engine.grammar import Constraint
from jaxlab.engine.plan import TOP_LOGPROBS, GenerationRequest, check_generation
from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import InvalidRequestError

MAX_STOP = 4  # OpenAI's limit on stop strings
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


class ApiError(Exception):
    """An HTTP error with OpenAI's error body."""

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error", param=None, code=None, headers=None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers  # sent with the error (Retry-After with a 429)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


#: Fields accepted only at their default (OpenAI's meaning of "off"): field -> the values that mean "off".
UNSUPPORTED_AT_DEFAULT = {
    "n": (1, None),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "repetition_penalty": (1, 1.0, None),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "best_of": (1, None),
    "echo": (False, None),
    "suffix": (None, ""),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
}
#: Fields that carry no instruction for the model (kept for the caller's own bookkeeping).
METADATA = ("user", "metadata")


@dataclass
class Request:
    """A validated request: what the engine runs (``generation``, checked by the engine's one check,
    :func:`~jaxlab.engine.plan.check_generation`) and how to answer (the endpoint, streaming, usage)."""

    kind: str  # "chat" or "completion"
    model: str
    generation: GenerationRequest
    stream: bool
    include_usage: bool
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def shown(v: Any, limit: int = 60) -> str:
    """A value from a request as an error message quotes it: JSON, cut to ``limit`` characters (a number's digits
    counted), never an exception of its own (a value nested too deeply to write out)."""
    try:
        text = json.dumps(v)
    except (RecursionError, ValueError):
        return "a value nested too deeply to show"
    if len(text) <= limit:
        return text
    what = f"{len(text)} digits" if isinstance(v, int) else f"{len(text)} characters"
    return f"{text[: limit - 20]}... ({what})"


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad("the request body nests arrays or objects too deeply: send a flat JSON object") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"the request body is not valid JSON ({e}): send a JSON object") from None
    except ValueError:  # an integer literal past Python's digit limit (4300): no field takes such a number
        raise bad("the request body holds a number of thousands of digits: send numbers in range") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _number(body, name, lo, hi, default, *, integer=False, lo_open=False, hi_open=False):
    v = body.get(name, default)
    if v is None:
        return default
    kind = "a whole number" if integer else "a number"
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (integer and isinstance(v, float) and not v.is_integer())
    ):
        raise bad(f"{name} must be {kind}, got {shown(v)}", name)
    if isinstance(v, float) and not math.isfinite(v):  # an int is finite at any size (isfinite would overflow)
        raise bad(f"{name} must be finite, got {v}", name)
    low_ok = v > lo if lo_open else v >= lo
    high_ok = v < hi if hi_open else v <= hi
    if not (low_ok and high_ok):
        lb, hb = "(" if lo_open else "[", ")" if hi_open else "]"
        where = f">= {lo}" if hi >= 10**9 else f"in {lb}{lo}, {hi}{hb}"
        raise bad(f"{name} must be {where}, got {shown(v)}", name)
    return int(v) if integer else float(v)


def _bool(body, name, default=False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{name} must be true or false, got {shown(v)}", name)
    return v


def _check_fields(body: dict, known: set[str]) -> None:
    for name, offs in UNSUPPORTED_AT_DEFAULT.items():
        if name in body and name not in known and body[name] not in offs:
            raise bad(
                f"{name}={shown(body[name])} is not supported by this server; leave it out "
                f"(or give its default {json.dumps(offs[0])})",
                name,
                "unsupported_parameter",
            )
    unknown = sorted(set(body) - known - set(UNSUPPORTED_AT_DEFAULT) - set(METADATA))
    if unknown:
        raise bad(
            f"unknown field {unknown[0]!r}: the server implements {', '.join(sorted(known))}",
            unknown[0],
            "unknown_parameter",
        )


COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "ignore_eos",
}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format"}
COMPLETION_FIELDS = COMMON | {"prompt"}


def _stop(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad("stop must be a non-empty string or a list of them", "stop")
    if len(stop) > MAX_STOP:
        raise bad(f"stop takes at most {MAX_STOP} strings, got {len(stop)}", "stop")
    return stop


def _messages(body) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with role and content", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise bad(f"messages[{i}].role must be system, user or assistant, got {shown(role)}", "messages")
        if isinstance(content, list):  # content parts: text only
            parts = []
            for p in content:
                if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                    raise bad(f"messages[{i}].content: only text parts are supported", "messages")
                parts.append(p["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string, got {shown(content)}", "messages")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise bad(f"messages[{i}] has an unsupported field {extra[0]!r}", "messages")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _response_format(body, tokenizer, vocab_size: int) -> Constraint | None:
    """OpenAI's ``response_format``: {"type": "text"} (or none), {"type": "json_object"}, or {"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}, "strict": ...}} -> the constraint, checked against the vocabulary."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kinds = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name", "schema"}}'
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad(f"response_format must be {kinds}, got {shown(fmt)}", "response_format")
    extra = sorted(set(fmt) - {"type", "json_schema"} if fmt["type"] == "json_schema" else set(fmt) - {"type"})
    if extra:
        raise bad(f"response_format of type {fmt['type']} takes no field {extra[0]!r}", "response_format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        constraint = Constraint.json_object()
    else:
        spec = fmt.get("json_schema")
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("name"), str)
            or not isinstance(spec.get("schema"), dict)
        ):
            raise bad(
                "response_format.json_schema must be an object with a name (string) and a schema (a JSON schema "
                f"object), got {shown(spec)}",
                "response_format",
            )
        unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if unknown:
            raise bad(f"response_format.json_schema has an unknown field {unknown[0]!r}", "response_format")
        constraint = Constraint.json_schema(spec["schema"])
    try:
        constraint.check(tokenizer, vocab_size)
    except InvalidRequestError as e:
        raise bad(f"response_format: {e}", "response_format") from None
    return constraint


def parse_request(body: dict, kind: str, *, model_name: str, tokenizer, context: int, vocab_size: int) -> Request:
    """A validated :class:`Request` from a JSON body, or an :class:`ApiError` (400, or 404 for another model)."""
    _check_fields(body, CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS)
    model = body.get("model", model_name)
    if not isinstance(model, str):
        raise bad(f"model must be a string, got {shown(model)}", "model")
    if model != model_name:
        raise ApiError(
            404,
            f"the model {model!r} does not exist here; this server serves {model_name!r} (GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    from jaxlab.io.tokenizer import prompt_ids as build_prompt  # the command line's prompt builder

    if kind == "chat":
        messages = _messages(body)
        if messages[-1]["role"] == "assistant":
            raise bad("the last message must be the user's (or the system's), not the assistant's", "messages")
        prompt_ids = build_prompt(tokenizer, messages=messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = build_prompt(tokenizer, prompt, raw=True)
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            prompt_ids = list(prompt)  # the ids are checked with the rest of the request, below
        else:
            raise bad("prompt must be a string or a non-empty list of token ids (one prompt per request)", "prompt")
    room = context - len(prompt_ids)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    default = room if kind == "chat" else min(DEFAULT_COMPLETION_TOKENS, room)
    max_tokens = _number(body, name, 1, 10**9, max(default, 1), integer=True)
    temperature = _number(body, "temperature", 0, 2, 1.0)
    try:
        sampling = SamplingParams(
            temperature=temperature,
            top_k=_number(body, "top_k", 0, vocab_size, 0, integer=True),
            top_p=_number(body, "top_p", 0, 1, 1.0, lo_open=True),
            min_p=_number(body, "min_p", 0, 1, 0.0, hi_open=True),
        )
    except ApiError:
        raise
    except Exception as e:  # SamplingParams' own checks
        raise bad(str(e)) from None
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}):
        raise bad('stream_options takes only {"include_usage": bool}', "stream_options")
    stream = _bool(body, "stream")
    if opts is not None and not stream:
        raise bad("stream_options is only allowed with stream: true", "stream_options")
    logprobs = body.get("logprobs")
    if kind == "completion":
        # /v1/completions: logprobs is how many alternatives to return with each token's own (0..5), or null
        top = _number(body, "logprobs", 0, 5, 0, integer=True) if logprobs is not None else 0
        logprobs = logprobs is not None
    else:
        logprobs = _bool(body, "logprobs")
        top = _number(body, "top_logprobs", 0, TOP_LOGPROBS, 0, integer=True)
        if top and not logprobs:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    constraint = _response_format(body, tokenizer, vocab_size) if kind == "chat" else None
    try:  # the engine's one check of a request: prompt ids, room in the context, top logprobs, grammar and EOS
        generation = check_generation(
            prompt_ids,
            max_tokens,
            vocab_size=vocab_size,
            context=context,
            sampling=sampling,
            seed=_number(body, "seed", -(2**63), 2**64 - 1, 0, integer=True) % 2**32,
            stop=_stop(body),
            ignore_eos=_bool(body, "ignore_eos"),
            logprobs=logprobs,
            top_logprobs=top,
            constraint=constraint,
        )
    except InvalidRequestError as e:  # named as this endpoint's client sent the field
        param = {
            "prompt": "messages" if kind == "chat" else "prompt",
            "max_new_tokens": name,
            "top_logprobs": "top_logprobs" if kind == "chat" else "logprobs",
        }.get(e.param, e.param)
        raise bad(str(e).replace("max_new_tokens", name), param, e.code) from None
    return Request(
        kind=kind,
        model=model,
        generation=generation,
        stream=stream,
        include_usage=bool(opts and _bool(opts, "include_usage")),
    )


# --------------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------------


def usage(req: Request, completion_tokens: int) -> dict:
    n = len(req.generation.prompt_ids)
    return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}


def _logprobs(req: Request, pieces: list[str], values: list[float], tops=()) -> Any:
    """OpenAI's logprobs object; ``tops``: per token, the alternatives as (text, logprob) pairs, most likely first."""
    if not req.generation.logprobs:
        return None
    tops = list(tops) or [[] for _ in pieces]
    if req.kind == "chat":
        return {
            "content": [
                {
                    "token": p,
                    "logprob": v,
                    "bytes": list(p.encode()),
                    "top_logprobs": [{"token": a, "logprob": b, "bytes": list(a.encode())} for a, b in alts],
                }
                for p, v, alts in zip(pieces, values, tops)
            ]
        }
    top = [dict(alts) for alts in tops] if req.generation.top_logprobs else None
    return {"tokens": pieces, "token_logprobs": values, "top_logprobs": top, "text_offset": None}


def response(req: Request, text: str, reason: str, n_tokens: int, pieces=(), values=(), tops=()) -> dict:
    """The whole answer (``stream: false``)."""
    lp = _logprobs(req, list(pieces), list(values), tops)
    if req.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": lp,
            "finish_reason": reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}
        obj = "text_completion"
    prefix = "chatcmpl-" if req.kind == "chat" else "cmpl-"
    return {
        "id": prefix + req.id,
        "object": obj,
        "created": req.created,
        "model": req.model,
        "choices": [choice],
        "usage": usage(req, n_tokens),
    }


def chunk(req: Request, text: str | None, reason: str | None, *, first=False, pieces=(), values=(), tops=()) -> dict:
    """One server-sent event of a stream (OpenAI's chunk format)."""
    lp = _logprobs(req, list(pieces), list(values), tops) if pieces else None
    if req.kind == "chat":
        delta = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": reason}
        obj, prefix = "chat.completion.chunk", "chatcmpl-"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": reason}
        obj, prefix = "text_completion", "cmpl-"
    out = {"id": prefix + req.id, "object": obj, "created": req.created, "model": req.model, "choices": [choice]}
    if req.include_usage:
        out["usage"] = None
    return out


def usage_chunk(req: Request, n_tokens: int) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
    obj, prefix = ("chat.completion.chunk", "chatcmpl-") if req.kind == "chat" else ("text_completion", "cmpl-")
    return {
        "id": prefix + req.id,
        "object": obj,
        "created": req.created,
        "model": req.model,
        "choices": [],
        "usage": usage(req, n_tokens),
    }
