"""Planning a request: check it, then choose its shapes from a few buckets so compiled programs are reused.

* :func:`check_generation` validates one request, once, for every face (the CLI, the server, the bench, the
  notebooks) and gives the :class:`GenerationRequest` the engine runs; :func:`check_request` is its form for a
  batch of prompts that share the number of new tokens (the single-device, mesh and speculative loops). Each
  rule exists once here, with a message that names the field at fault and says what to do.
* :func:`plan` picks the padded prompt length, the prefill chunk and the cache length. Prompts are
  left-padded to a *bucket* length (32, 64, 128, 256, 512 tokens), so a new prompt length reuses a
  compiled program; prompts longer than the largest bucket are prefilled in chunks of that size. The
  cache length is bucketed too (256, 512, 1024, ... slots), so the number of programs is small and known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence

from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import InvalidRequestError, PromptTooLongError
from jaxlab.io.config import LlamaConfig

if TYPE_CHECKING:
    from jaxlab.engine.grammar import Constraint

PREFILL_BUCKETS = (32, 64, 128, 256, 512)
CACHE_BUCKETS = (256, 512, 1024, 2048, 4096, 8192)


def bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; past the largest, the next multiple of it."""
    for b in buckets:
        if n <= b:
            return b
    top = buckets[-1]
    return -(-n // top) * top


class Plan(NamedTuple):
    """The shapes of one request (a tuple, so ``padded, chunk, cache_len = plan(...)`` works)."""

    padded: int  # prompt length after left padding: a whole number of chunks
    chunk: int  # tokens per prefill call
    cache_len: int  # KV-cache slots per row


#: the most alternatives a request may ask for with ``top_logprobs`` (OpenAI's limit)
TOP_LOGPROBS = 20


@dataclass(frozen=True)
class GenerationRequest:
    """One request, checked (build it with :func:`check_generation`): what every face hands the engine."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    seed: int = 0  # in [0, 2**32): the request's random stream (sampling)
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one
    ignore_eos: bool = False
    logprobs: bool = False  # keep each token's logprob (true whenever top_logprobs is)
    top_logprobs: int = 0  # also each token's most likely alternatives (0..TOP_LOGPROBS)
    constraint: Constraint | None = None  # the output must match this grammar (structured output)


def check_prompt(prompt, vocab_size: int, name: str = "the prompt") -> list[int]:
    """A prompt as a list of token ids, or an :class:`InvalidRequestError` (param ``prompt``)."""
    try:
        ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must be a list of token ids (whole numbers)", "prompt") from None
    if not ids:
        raise InvalidRequestError(f"{name} is empty: give at least one token", "prompt")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"{name} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", "prompt")
    return ids


def whole(v) -> bool:
    """``v`` is a whole number (an int, or a float or NumPy value equal to one; never a bool)."""
    try:
        return not isinstance(v, bool) and int(v) == v
    except (TypeError, ValueError, OverflowError):
        return False


def check_new_tokens(max_new_tokens) -> int:
    if not whole(max_new_tokens) or max_new_tokens < 1:
        raise InvalidRequestError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens}", "max_new_tokens")
    return int(max_new_tokens)


def check_room(prompt_len: int, max_new_tokens: int, context: int) -> None:
    """Prompt plus new tokens fit in ``context`` positions, or a :class:`PromptTooLongError` that says how much to
    cut (param ``prompt`` when the prompt alone does not fit, else ``max_new_tokens``)."""
    if prompt_len >= context:
        raise PromptTooLongError(
            f"the prompt has {prompt_len} tokens, but the context is {context} (prompt plus new tokens): "
            f"shorten the prompt by at least {prompt_len - context + 1} tokens"
        )
    if prompt_len + max_new_tokens > context:
        raise PromptTooLongError(
            f"the prompt has {prompt_len} tokens and {max_new_tokens} new tokens were asked for: "
            f"{prompt_len + max_new_tokens} positions, but the context is {context}, at most {context} per request; "
            f"shorten the prompt or ask for at most {context - prompt_len} new tokens",
            "max_new_tokens",
        )


def check_generation(
    prompt_ids: Sequence[int],
    max_new_tokens: int = 32,
    *,
    vocab_size: int,
    context: int,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    logprobs: bool = False,
    top_logprobs: int = 0,
    constraint: Constraint | None = None,
) -> GenerationRequest:
    """The one check of a request (every face calls it; the engine takes its result without checking again):
    a :class:`GenerationRequest`, or an :class:`InvalidRequestError` whose ``param`` names the field at fault.
    ``context``: the positions a request may take where it will run (the engine's, or the model's)."""
    prompt = check_prompt(prompt_ids, vocab_size)
    max_new_tokens = check_new_tokens(max_new_tokens)
    check_room(len(prompt), max_new_tokens, context)
    if sampling is None:
        sampling = SamplingParams()
    elif not isinstance(sampling, SamplingParams):
        raise InvalidRequestError(f"sampling must be a SamplingParams, got {type(sampling).__name__}", "sampling")
    if not whole(seed):
        raise InvalidRequestError(f"seed must be a whole number, got {seed!r}", "seed")
    if isinstance(stop, str):
        stop = [stop]
    if not all(isinstance(s, str) and s for s in stop):
        raise InvalidRequestError("each stop string must be a non-empty string", "stop")
    if isinstance(top_logprobs, bool) or not (isinstance(top_logprobs, int) and 0 <= top_logprobs <= TOP_LOGPROBS):
        raise InvalidRequestError(
            f"top_logprobs must be a whole number in [0, {TOP_LOGPROBS}], got {top_logprobs!r}", "top_logprobs"
        )
    if constraint is not None and ignore_eos:
        raise InvalidRequestError(
            "ignore_eos cannot be combined with a constraint: the grammar ends the output", "ignore_eos"
        )
    return GenerationRequest(
        tuple(prompt),
        max_new_tokens,
        sampling,
        int(seed) % 2**32,
        tuple(stop),
        bool(ignore_eos),
        bool(logprobs or top_logprobs),
        top_logprobs,
        constraint,
    )


def check_request(cfg: LlamaConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """A batch's prompts as lists of ints, or an :class:`InvalidRequestError` naming the problem and the fix (the
    rules of :func:`check_generation`; the context is checked by :func:`plan`, which buckets the shapes)."""
    prompts = list(prompts)
    if not prompts:
        raise InvalidRequestError("no prompts given", "prompt")
    check_new_tokens(max_new_tokens)
    return [check_prompt(p, cfg.vocab_size, f"prompt {i}") for i, p in enumerate(prompts)]


def plan(
    cfg: LlamaConfig,
    prompt_lens: Sequence[int],
    max_new_tokens: int,
    prefill_buckets: Sequence[int] = PREFILL_BUCKETS,
    cache_buckets: Sequence[int] = CACHE_BUCKETS,
) -> Plan:
    """The shapes for these prompts, or a :class:`PromptTooLongError` that says how much to cut."""
    longest = max(prompt_lens)
    context = cfg.max_seq_len
    check_room(longest, max_new_tokens, context)
    chunk = min(bucket(longest, prefill_buckets), prefill_buckets[-1])
    padded = -(-longest // chunk) * chunk
    needed = padded + max_new_tokens
    cache_len = bucket(needed, cache_buckets)
    if cache_len > context:  # never allocate more slots than a full context needs (plus padding)
        cache_len = max(needed, context)
    return Plan(padded, chunk, cache_len)
