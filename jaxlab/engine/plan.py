"""Planning a request: check it, then choose its shapes from a few buckets so compiled programs are reused.

* :func:`check_request` validates prompts and the number of new tokens once, for every loop (single
  device, mesh, speculative), and says what to do when something is wrong.
* :func:`plan` picks the padded prompt length, the prefill chunk and the cache length. Prompts are
  left-padded to a *bucket* length (32, 64, 128, 256, 512 tokens), so a new prompt length reuses a
  compiled program; prompts longer than the largest bucket are prefilled in chunks of that size. The
  cache length is bucketed too (256, 512, 1024, ... slots), so the number of programs is small and known.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from jaxlab.errors import InvalidRequestError, PromptTooLongError
from jaxlab.io.config import LlamaConfig

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


def check_request(cfg: LlamaConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Prompts as lists of ints, or an :class:`InvalidRequestError` naming the problem and the fix."""
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise InvalidRequestError("no prompts given")
    if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise InvalidRequestError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if not p:
            raise InvalidRequestError(f"prompt {i} is empty: give at least one token")
        bad = [t for t in p if not 0 <= t < cfg.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt {i} has token ids outside the vocabulary [0, {cfg.vocab_size}): {bad[:5]}"
            )
    return prompts


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
    if longest >= context:
        raise PromptTooLongError(
            f"the prompt has {longest} tokens, but the model's context is {context} (prompt plus new "
            f"tokens): shorten the prompt by at least {longest - context + 1} tokens"
        )
    if longest + max_new_tokens > context:
        raise PromptTooLongError(
            f"the prompt has {longest} tokens and {max_new_tokens} new tokens were asked for: "
            f"{longest + max_new_tokens} positions, but the model's context is {context}; "
            f"shorten the prompt or ask for at most {max(context - longest, 0)} new tokens"
        )
    chunk = min(bucket(longest, prefill_buckets), prefill_buckets[-1])
    padded = -(-longest // chunk) * chunk
    needed = padded + max_new_tokens
    cache_len = bucket(needed, cache_buckets)
    if cache_len > context:  # never allocate more slots than a full context needs (plus padding)
        cache_len = max(needed, context)
    return Plan(padded, chunk, cache_len)
