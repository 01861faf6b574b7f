"""Solutions to notebook 12's exercises."""


def my_sse_text(lines):
    """Join the text of every chunk up to [DONE]: delta.content for chat, text for completions."""
    import json

    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue  # blank lines end an event; ':' lines are comments
        data = line[5:].strip()
        if data == "[DONE]":
            break
        for choice in json.loads(data).get("choices") or []:
            out.append((choice["delta"].get("content") if "delta" in choice else choice.get("text")) or "")
    return "".join(out)


def my_bucket(per_minute, times):
    """A token bucket: starts full (max(1, per_minute)), refills per_minute/60 a second, one token a request."""
    capacity, rate = max(1.0, per_minute), per_minute / 60.0
    tokens, last, passed = capacity, None, []
    for t in times:
        if last is not None:
            tokens = min(capacity, tokens + (t - last) * rate)
        last = t
        passed.append(tokens >= 1)
        if tokens >= 1:
            tokens -= 1
    return passed


def my_ttft_tpot(sent, token_times):
    """TTFT: first token minus sent; TPOT: the rest's span over the tokens after the first."""
    ttft = token_times[0] - sent
    if len(token_times) < 2:
        return ttft, None
    return ttft, (token_times[-1] - token_times[0]) / (len(token_times) - 1)
