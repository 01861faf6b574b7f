"""Notebook 11's pictures and measurements: static against continuous batching, the page pool, a reduced trace.

* :func:`schedule_steps` — the two policies on a list of requests counted in decode steps (no model): which
  slot holds which request at each step. What it draws is the scheduling alone; the real engine is measured
  by :func:`serve_both`.
* :func:`plot_timelines` — those schedules side by side (a slot per row, a request per colour, idle slots
  grey).
* :func:`plot_pool` — an engine's page pool: each page coloured by the request that holds it, pages read by
  several requests (a shared prefix) hatched, free pages white; and each running request's page table.
* :func:`serve_both` / :func:`plot_serving` — a short trace through static batches (the Generator) and the
  continuous engine, with the functions ``jaxlab bench --trace`` uses, and its figure.
* :data:`STORED_TRACE` — the full trace's recorded ratios (``benchmarks/results-trace-cpu.json``), which the
  notebook judges its claims on beside its own reduced trace.
* :func:`plot_prefix_reuse` — time to first token of each request with prefix reuse off and on.
* :func:`run_arrivals` / :func:`plot_engine_state` — requests arriving at given steps through an engine, with
  what ``/metrics`` shows after each step (running, waiting, pages held, the decode row bucket), and its figure.
"""

from __future__ import annotations

from typing import Sequence

# ``jaxlab bench --trace``'s recorded run (``benchmarks/results-trace-cpu.json``, 2026-12-05, 2-core AMD EPYC,
# float32, admission by memory, offered load 4x static's). The wheel carries data/ but not benchmarks/, so the
# ratios notebook 11 needs are copied here; tests/lab/test_batching.py keeps them equal to the file.
STORED_TRACE = {
    "label": "stored run: AMD EPYC, 2 CPUs, 2026-12-05 14:04 UTC",
    "requests": 64,
    "max_batch": 8,
    "throughput_ratio": 2.7006035728120774,
    "ttft_p99_s": {"static": 194.95933249609018, "continuous": 7.011542025662546},
    "prefix": {"requests": 32, "system_tokens": 400, "slots": 8, "ttft_ratio": 4.89425864348567},
}


def schedule_steps(requests: Sequence[tuple[int, int]], slots: int, policy: str) -> list[tuple[int, int, int, int]]:
    """requests: (arrival step, decode steps) each -> bars (slot, request index, start step, end step).

    ``"static"``: when every slot is free, take up to ``slots`` arrived requests and hold their slots until the
    longest ends. ``"continuous"``: between any two steps, an arrived request takes any free slot, and a slot is
    free the step after its request's last token."""
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    waiting = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    free_at = [0] * slots  # step from which each slot is free (continuous)
    bars, t = [], 0
    while waiting:
        arrived = [i for i in waiting if requests[i][0] <= t]
        if policy == "static":
            if not arrived:
                t = min(requests[i][0] for i in waiting)
                continue
            batch = arrived[:slots]
            for s, i in enumerate(batch):
                bars.append((s, i, t, t + requests[i][1]))
                waiting.remove(i)
            t += max(requests[i][1] for i in batch)
        else:
            free = [s for s in range(slots) if free_at[s] <= t]
            for s, i in zip(free, arrived):
                bars.append((s, i, t, t + requests[i][1]))
                free_at[s] = t + requests[i][1]
                waiting.remove(i)
            t += 1
    return bars


def plot_timelines(requests: Sequence[tuple[int, int]], slots: int):
    """The static and the continuous schedule of ``requests`` one above the other; returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 1.2 + 0.55 * slots * 2), sharex=True)
    cmap = plt.get_cmap("tab20")
    for ax, policy in zip(axes, ("static", "continuous")):
        bars = schedule_steps(requests, slots, policy)
        end = max(b[3] for b in bars)
        for s in range(slots):
            ax.broken_barh([(0, end)], (s - 0.4, 0.8), color="0.92")
        if policy == "static":  # a slot stays taken until its batch's longest request ends
            for s, i, start, stop in bars:
                batch_end = max(b[3] for b in bars if b[2] == start)
                ax.broken_barh([(stop, batch_end - stop)], (s - 0.4, 0.8), color="0.75", hatch="//")
        for s, i, start, stop in bars:
            ax.broken_barh([(start, stop - start)], (s - 0.4, 0.8), color=cmap(i % 20))
            ax.text(start + 0.3, s, str(i), va="center", fontsize=8)
        for i, (arrival, _) in enumerate(requests):
            ax.plot(arrival, slots - 0.3, marker="v", color=cmap(i % 20), markersize=5)
        ax.set_yticks(range(slots), [f"slot {s}" for s in range(slots)])
        ax.set_title(f"{policy} batching: all requests done after {end} steps", fontsize=10)
        ax.grid(False)
    axes[-1].set_xlabel("decode step (a triangle marks each request's arrival; hatched: a held, idle slot)")
    fig.tight_layout()
    return fig


def plot_pool(engine, title: str = "the page pool"):
    """The engine's pages: one cell per page, coloured by its holder, hatched when several hold it; returns
    (figure, page tables as text)."""
    import matplotlib.pyplot as plt
    import numpy as np

    pool, sched = engine.pool, engine.scheduler
    n = pool.num_pages
    cols = min(32, n)
    rows = -(-n // cols)
    fig, ax = plt.subplots(figsize=(9, 0.45 * rows + 0.9))
    cmap = plt.get_cmap("tab10")
    owner = {}
    for k, seq in enumerate(sched.running):
        for p in seq.pages:
            owner.setdefault(p, []).append(k)
    for p in range(n):
        r, c = divmod(p, cols)
        if p == 0:
            color, hatch = "black", None
        elif p in owner:
            color, hatch = cmap(owner[p][0] % 10), ("xx" if pool.refs[p] > 1 else None)
        else:
            color, hatch = "white", None
        ax.add_patch(plt.Rectangle((c, -r), 0.92, 0.92, facecolor=color, edgecolor="0.6", hatch=hatch))
    ax.set_xlim(0, cols)
    ax.set_ylim(-rows + 0.9, 1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{title}: page 0 (black) is the null page; hatched = shared by several requests", fontsize=9)
    lines = []
    for k, seq in enumerate(sched.running):
        lines.append(
            f"request {seq.id:>3s} (colour {k % 10}): {seq.computed:4d} positions in pages {np.asarray(seq.pages).tolist()}"
        )
    return fig, "\n".join(lines)


def serve_both(
    params, tokenizer, trace: Sequence[dict], max_batch: int, max_running: int, load: float = 4.0, log=None
) -> dict:
    """A trace (``{"arrival", "prompt_len", "new_tokens"}`` each) through static batches of ``max_batch`` and the
    continuous engine (the same KV memory, up to ``max_running`` admitted by memory, decode calls of ``max_batch``
    rows), at ``load`` x static's throughput on a warm-up slice (:func:`jaxlab.bench.trace.serve_trace`)."""
    from jaxlab.bench.trace import serve_trace

    shape = {
        "max_batch": max_batch,
        "load": load,
        "rows": max_batch,
        "max_running": max_running,
        "decode_buckets": False,
    }
    return serve_trace(params, tokenizer, list(trace), shape, log or (lambda _m: None))


def plot_serving(res: dict):
    """Throughput and time to first token, static against continuous; returns the figure."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    names = ("static", "continuous")
    a.bar(names, [res[n]["throughput"] for n in names], color=["0.6", "tab:blue"])
    a.set_ylabel("output tokens / s")
    a.set_title("throughput", fontsize=10)
    x = range(2)
    for k, (q, shade) in enumerate((("p50", 0.7), ("p99", 0.4))):
        b.bar([i + 0.38 * k for i in x], [res[n]["ttft_s"][q] for n in names], width=0.36, label=q, alpha=shade + 0.3)
    b.set_xticks([i + 0.19 for i in x], names)
    b.set_ylabel("seconds")
    b.set_title("time to first token", fontsize=10)
    b.legend()
    fig.tight_layout()
    return fig


def plot_prefix_reuse(ttft: dict):
    """``{reuse (bool): [time to first token of each request, s]}`` as two step curves; returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    for reuse in (False, True):
        times = sorted(ttft[reuse])
        ax.plot(times, range(1, len(times) + 1), "o-", label=f"reuse {'on' if reuse else 'off'}")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("requests served")
    ax.set_title("Prefix reuse: requests that share a system prompt", fontsize=10)
    ax.legend()
    fig.tight_layout()
    return fig


def run_arrivals(engine, requests: Sequence[tuple]) -> tuple[dict, list[dict]]:
    """``requests``: (arrival step, prompt ids, new tokens, sampling, seed) each, run through ``engine`` (EOS
    ignored) -> (their streams by seed, the engine's state after each step: running, waiting, pages held, the row
    bucket of the step's last decode call (0 when it decoded nothing) and the preemptions so far)."""
    streams, history, step = {}, [], 0
    pending = sorted(requests, key=lambda r: r[0])
    while pending or engine.has_work:
        while pending and pending[0][0] <= step:
            _, ids, n, sp, seed = pending.pop(0)
            streams[seed] = engine.add_request(ids, sp, max_new_tokens=n, seed=seed, ignore_eos=True)
        calls = engine.row_calls
        engine.step()
        sched = engine.scheduler
        history.append(
            {
                "step": step,
                "running": len(sched.running),
                "waiting": len(sched.waiting),
                "pages": engine.pool.used,
                "bucket": engine.last_bucket if engine.row_calls > calls else 0,
                "preemptions": sched.preemptions,
            }
        )
        step += 1
    return streams, history


def plot_engine_state(histories: dict, pool_pages: int):
    """``{label: run_arrivals' history}``: requests running and waiting, KV pages held (against the pool) and the
    decode row bucket, step by step, one line per label; returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    for (label, hist), colour in zip(histories.items(), ("tab:grey", "tab:blue", "tab:orange")):
        steps = [h["step"] for h in hist]
        axes[0].step(steps, [h["running"] for h in hist], where="post", color=colour, label=f"{label}: running")
        axes[0].step(steps, [h["waiting"] for h in hist], where="post", color=colour, ls=":", label=f"{label}: waiting")
        axes[1].step(steps, [h["pages"] for h in hist], where="post", color=colour, label=label)
        axes[2].step(steps, [h["bucket"] for h in hist], where="post", color=colour, label=label)
    axes[1].axhline(pool_pages, color="k", lw=0.8, ls="--", label="pool")
    for ax, title in zip(axes, ("requests", "KV pages held", "decode rows (bucket)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("engine step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
