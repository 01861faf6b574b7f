"""The lab's generation stages: notebook 04's ladder with its plots, and notebook 06's batching and sampling.

The ladder itself (greedy decoding from the obvious loop to the fast one: :func:`naive_generate`,
:func:`padded_generate`, :func:`cached_generate`, :func:`on_device_generate`, each returning a
:class:`StageRun` measured by a :class:`Meter`) lives in :mod:`jaxlab.bench.stages`, which ``jaxlab bench``
measures too; it is imported here so that the notebook reads it as ``stages.naive_generate``.
:func:`plot_stage_speed` and :func:`plot_compile_vs_run` draw a list of runs.

Notebook 06 batches and samples:

* :func:`single_sequence_step` handles one sequence (no batch axis); :func:`vmap_step` is ``jax.vmap``
  of it, :func:`batched_step` the natively batched model (the engine's greedy step). :func:`step_generate`
  runs either over a ragged, left-padded batch (:func:`left_pad`: padding at position -1) one token per call.
  Both are XLA's programs, without jaxlab's CPU kernels (:func:`~jaxlab.engine.kernels.cpu.xla_program`): under
  vmap a kernel's call is XLA's, so the natively batched step must be XLA's too for the two to be compared.
* :func:`throughput_vs_batch` times a decode step at several batch sizes, :func:`decode_step_cost`
  counts its FLOPs and bytes, and :func:`add_roofline` puts each row against the machine's roofline.
* :func:`filtered_probabilities` and :func:`sample_frequencies` show what each sampling filter leaves
  of a toy distribution; :class:`Explorer` is an ipywidgets front end whose callback
  (:meth:`Explorer.generate`) also runs headless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.bench.stages import (  # noqa: F401 - the ladder, read by notebook 04 as stages.<name>
    PROGRAMS,
    SEQ_BUCKETS,
    Meter,
    StageRun,
    cached_generate,
    greedy_decode_step,
    naive_generate,
    next_from_full,
    on_device_generate,
    pad_to_bucket,
    padded_generate,
)
from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kvcache import KVCache, cache_bytes, init_cache, left_pad
from jaxlab.engine.model import Params
from jaxlab.engine.sampling import SamplingParams, filter_logits, sample
from jaxlab.engine.steps import greedy_step, next_logits


def _label(run: StageRun) -> str:
    return run.name.split(":")[0] + (" (eager)" if "eager" in run.name else "")


def plot_stage_speed(runs: Sequence[StageRun]):
    """Horizontal bars: tokens/s of each stage, execution only and with its compilation counted."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    names = [_label(r) for r in runs]
    y = np.arange(len(runs))
    ax.barh(y - 0.2, [r.tokens_per_s for r in runs], 0.4, label="execution only")
    ax.barh(y + 0.2, [r.tokens_per_s_with_compile for r in runs], 0.4, label="including compilation")
    for i, r in enumerate(runs):
        ax.text(r.tokens_per_s, i - 0.2, f" {r.tokens_per_s:.1f}", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(r.tokens_per_s for r in runs) * 1.2)
    ax.set_xlabel("generated tokens / s (batch 1)")
    ax.set_title("Speed of each generation loop")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_compile_vs_run(runs: Sequence[StageRun]):
    """Stacked horizontal bars: each stage's seconds of compiling and of running, with its compile count."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    names = [_label(r) for r in runs]
    comp, run = [r.compile_s for r in runs], [r.run_s for r in runs]
    ax.barh(names, comp, color="tab:red", label="compiling (or loading from the disk cache)")
    ax.barh(names, run, left=comp, color="tab:green", label="running")
    for i, r in enumerate(runs):
        programs = f"{r.compiles} program{'s' * (r.compiles != 1)}"
        ax.text(comp[i] + run[i], i, f" {programs}, {len(r.tokens)} tokens", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(c + x for c, x in zip(comp, run)) * 1.5)
    ax.set_xlabel("seconds")
    ax.set_title("Compile time vs run time, per stage")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    fig.tight_layout()
    return fig


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token lists differ (over the shorter length), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def break_even_tokens(compile_s: float, fast_step_s: float, slow_step_s: float) -> float:
    """How many tokens it takes for compiling to pay for itself against a slower, uncompiled step."""
    saved = slow_step_s - fast_step_s
    return compile_s / saved if saved > 0 else float("inf")


# --------------------------------------------------------------------------------------------------
# Notebook 06: vmap vs a batched model, ragged batches, throughput against batch size
# --------------------------------------------------------------------------------------------------


def single_sequence_step(params: Params, token, pos, cache: KVCache):
    """One sequence, no batch axis on the tokens: token, pos [] int; ``cache`` a batch-1 cache.

    -> (logits [V], cache). Written for one example, as equinox-style layers are; ``vmap`` batches it
    (:func:`vmap_step`)."""
    logits, cache = next_logits(params, token[None, None], pos[None, None], cache)  # [1, V]
    return logits[0], cache


def _rows(a, b: int):
    """[B*X, ...] -> [B, X, ...]: each row's slice is then exactly a batch-1 cache array (any layout
    whose leading axis is the batch, alone or merged with heads)."""
    return a.reshape((b, a.shape[0] // b) + a.shape[1:])


def _unrows(a):
    return a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])


def cache_axes(n_layers: int) -> KVCache:
    """``vmap`` axes for a cache split into rows: rows on axis 0, the write index shared (not mapped)."""
    return KVCache(k=(0,) * n_layers, v=(0,) * n_layers, pos=0, index=None)


def vmap_step(params: Params, tokens, pos, cache: KVCache):
    """``jax.vmap`` of :func:`single_sequence_step`: tokens, pos [B] -> (next [B], logits [B, V], cache).

    The batched cache is viewed as B batch-1 caches (a free reshape), vmapped over, and viewed back."""
    b = tokens.shape[0]
    rows = KVCache(
        tuple(_rows(a, b) for a in cache.k), tuple(_rows(a, b) for a in cache.v), _rows(cache.pos, b), cache.index
    )
    axes = cache_axes(len(cache.k))
    logits, rows = jax.vmap(single_sequence_step, in_axes=(None, 0, 0, axes), out_axes=(0, axes))(
        params, tokens, pos, rows
    )
    cache = KVCache(tuple(map(_unrows, rows.k)), tuple(map(_unrows, rows.v)), _unrows(rows.pos), rows.index)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits, cache


def batched_step(params: Params, tokens, pos, cache: KVCache):
    """The natively batched model: tokens, pos [B] -> (next [B], logits [B, V], cache). It is the engine's
    greedy decode step (:func:`jaxlab.engine.steps.greedy_step`) as it is."""
    return greedy_step(params, tokens, pos, cache)


# XLA's code in both (cpu_kernels.xla_program): a kernel takes whole arrays, so under vmap the one-sequence step keeps
# XLA's matmuls, and the batched step must too for the two to be compared
_STEPS = {
    name: jax.jit(cpu_kernels.xla_program(step), donate_argnums=(3,))
    for name, step in (("batched", batched_step), ("vmap", vmap_step))
}


@dataclass
class BatchRun:
    """Greedy tokens of a batch fed one token per call, with the costs."""

    tokens: np.ndarray  # [B, n] generated ids
    last_logits: np.ndarray  # [B, V] logits of the last step
    compiles: int
    compile_s: float
    step_s: list[float]  # seconds of each call (compilation excluded)

    @property
    def median_step_s(self) -> float:
        return float(np.median(self.step_s))

    @property
    def best_step_s(self) -> float:
        return float(np.min(self.step_s))


def step_generate(
    params: Params, prompts: Sequence[Sequence[int]], n: int, *, step: str = "batched", cache_len: int = 64
) -> BatchRun:
    """Greedy ``n`` tokens for a ragged batch, one token per row per call of ``step`` ("batched" or "vmap").

    The prompts are left-padded (:func:`left_pad`) and fed through the same one-token step first (a
    slow but simple prefill: padding steps write slots at position -1, which no query can see)."""
    cfg = params.config
    tokens, positions = left_pad(prompts, cfg.pad_id)
    b, length = tokens.shape
    if length + n > cache_len:
        raise ValueError(f"{length} prompt columns + {n} new tokens do not fit in {cache_len} cache slots")
    cache = init_cache(cfg, b, cache_len, params.policy.jnp_dtype)
    meter, out, step_s = Meter(), [], []
    feed, pos = jnp.asarray(tokens[:, 0]), jnp.asarray(positions[:, 0])
    next_pos = positions[:, -1] + 1
    for i in range(length + n - 1):
        args = (params, feed, pos, cache)
        fn = meter.program(step, _STEPS[step], *args)
        before = meter.run_s
        nxt, logits, cache = meter.run(fn, *args)
        step_s.append(meter.run_s - before)
        if i + 1 < length:  # still reading the prompt
            feed, pos = jnp.asarray(tokens[:, i + 1]), jnp.asarray(positions[:, i + 1])
        else:
            out.append(np.asarray(nxt))
            feed, pos = nxt, jnp.asarray(next_pos)
            next_pos = next_pos + 1
    return BatchRun(np.stack(out, axis=1), np.asarray(logits), meter.compiles, meter.compile_s, step_s)


def step_cost(params: Params, batch: int, step: str = "batched", cache_len: int = 64) -> dict:
    """XLA's cost model of the compiled one-token ``step`` ("batched" or "vmap") at this batch size:
    ``{"flops", "bytes accessed"}`` (both XLA's programs, without jaxlab's CPU kernels, whose calls the cost model
    cannot see into). Reuses the program :func:`step_generate` compiled, if any."""
    cfg = params.config
    args = (
        params,
        jnp.zeros((batch,), jnp.int32),
        jnp.zeros((batch,), jnp.int32),
        init_cache(cfg, batch, cache_len, params.policy.jnp_dtype),
    )
    raw = Meter().program(step, _STEPS[step], *args).cost_analysis()
    if isinstance(raw, (list, tuple)):  # older jax: one dict per device program
        raw = {k: sum(float(d.get(k, 0.0)) for d in raw) for k in ("flops", "bytes accessed")}
    return {
        "flops": float(raw.get("flops", float("nan"))),
        "bytes accessed": float(raw.get("bytes accessed", float("nan"))),
    }


def logits_agree(a: np.ndarray, b: np.ndarray, rtol: float = 1e-4) -> bool:
    """True when two logit arrays agree within ``rtol`` of their largest magnitude."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and float(np.abs(a - b).max()) <= rtol * float(np.abs(b).max())


def throughput_vs_batch(
    params: Params,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    steps: int = 6,
    context: int = 32,
    cache_len: int = 64,
) -> list[dict]:
    """Time the jitted :func:`batched_step` at each batch size -> rows of step ms and tokens/s.

    Each row's cache holds ``context`` visible slots (as after a ``context``-token prompt), so every
    step attends to as many keys as a short chat turn would. The cache is donated and threaded through
    ``steps`` calls (as in a real decode loop); the step time is the best of those calls, the one least
    disturbed by other work on the machine."""
    cfg = params.config
    rows = []
    for b in batch_sizes:
        cache = init_cache(cfg, b, cache_len, params.policy.jnp_dtype)
        cache = KVCache(
            cache.k, cache.v, cache.pos.at[:, :context].set(jnp.arange(context)), jnp.asarray(context, jnp.int32)
        )
        tok = jnp.full((b,), cfg.bos_id, jnp.int32)
        meter, times = Meter(), []
        for s in range(steps):
            args = (params, tok, jnp.full((b,), context + s, jnp.int32), cache)
            fn = meter.program("batched", _STEPS["batched"], *args)
            before = meter.run_s
            tok, _, cache = meter.run(fn, *args)
            times.append(meter.run_s - before)
        step = float(np.min(times))
        rows.append({"batch": b, "compile s": meter.compile_s, "step ms": step * 1e3, "tokens/s": b / step})
    base = next((r["tokens/s"] for r in rows if r["batch"] == 1), float("nan"))
    for r in rows:
        r["x batch 1"] = r["tokens/s"] / base
    return rows


def decode_step_cost(params: Params, batch: int, context: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step for ``batch`` rows attending to ``context`` keys.

    FLOPs: 2 per weight per row for every matmul (the tied embedding serves as the output layer; the
    input lookup is free), plus attention's two products over the context. Bytes: every weight once
    (shared by the whole batch: this is why batching helps) plus each row's K and V for the context.
    Both are lower bounds: XLA may move more (temporaries, a cache copy)."""
    cfg = params.config
    matmul_weights = sum(a.size for name, a in params.flat().items() if a.ndim == 2)
    attn = 2 * 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * context
    flops = batch * (2.0 * matmul_weights + attn)
    kv = cache_bytes(cfg, batch, context, params.policy.jnp_dtype)
    return flops, float(params.nbytes() + kv)


def add_roofline(rows: list[dict], params: Params, roofline, context: int = 32) -> list[dict]:
    """Add to each :func:`throughput_vs_batch` row its arithmetic intensity, the roofline's bound on
    tokens/s and the fraction of that bound reached. ``roofline`` is a :class:`jaxlab.tools.profile.Roofline`."""
    for r in rows:
        flops, nbytes = decode_step_cost(params, r["batch"], context)
        bound_s = roofline.time_bound(flops, nbytes)
        r["FLOP/byte"] = flops / nbytes
        r["bound"] = roofline.bound(flops, nbytes)
        r["bound tokens/s"] = r["batch"] / bound_s
        r["% of bound"] = 100.0 * r["tokens/s"] / r["bound tokens/s"]
    return rows


# --------------------------------------------------------------------------------------------------
# Notebook 06: sampling filters on a toy distribution
# --------------------------------------------------------------------------------------------------


def filtered_probabilities(logits, sampling: SamplingParams) -> np.ndarray:
    """The distribution one draw with ``sampling`` samples from, for logits [V] -> probabilities [V].

    Greedy (temperature 0) puts all the mass on the argmax."""
    logits = jnp.asarray(logits, jnp.float32)
    if sampling.greedy:
        return np.eye(logits.shape[-1], dtype=np.float32)[int(jnp.argmax(logits))]
    return np.asarray(jax.nn.softmax(filter_logits(logits, sampling.state()), axis=-1))


def sample_frequencies(logits, sampling: SamplingParams, draws: int = 4000, seed: int = 0) -> np.ndarray:
    """Empirical frequencies of ``draws`` samples from logits [V], each with its own key split from ``seed``."""
    logits = jnp.asarray(logits, jnp.float32)
    rows = jnp.broadcast_to(logits, (draws, logits.shape[-1]))
    toks = sample(rows, jax.random.key(seed), sampling.state())
    return np.bincount(np.asarray(toks), minlength=logits.shape[-1]) / draws


# --------------------------------------------------------------------------------------------------
# Notebook 06: an interactive explorer whose callback also runs headless
# --------------------------------------------------------------------------------------------------


class Explorer:
    """A prompt box, temperature and top-p sliders, a seed, a Generate button and streamed output.

    :meth:`generate` is the callback: the button calls it with the widgets' values, and a headless
    run (CI, a script, GitHub's static view) can call it directly with fixed values."""

    def __init__(self, generator, tokenizer, prompt: str = "Write a haiku about the sea.", max_new_tokens: int = 40):
        self.generator = generator
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.widgets: dict[str, Any] = {}  # the last widget() call's widgets, by name

    def generate(
        self,
        prompt: str,
        temperature: float = 0.7,
        top_p: float = 0.9,
        seed: int = 0,
        max_new_tokens: int | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> str:
        """Reply to ``prompt`` (one user message through the chat template); ``on_text`` gets pieces as they
        arrive. Returns the whole reply; the same arguments always give the same reply."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p))
        stream = None if on_text is None else (lambda row, piece: on_text(piece))
        result = self.generator.generate(
            [ids], max_new_tokens or self.max_new_tokens, sampling, seed=int(seed), on_text=stream
        )[0]
        return result.text

    def widget(self):
        """The ipywidgets front end (display it in a notebook; widgets do not render on GitHub)."""
        import ipywidgets as w

        box = w.Textarea(value=self.prompt, description="prompt", layout=w.Layout(width="95%"))
        temp = w.FloatSlider(value=0.7, min=0.0, max=2.0, step=0.05, description="temperature")
        top_p = w.FloatSlider(value=0.9, min=0.05, max=1.0, step=0.05, description="top-p")
        seed = w.IntText(value=0, description="seed")
        button = w.Button(description="Generate", button_style="primary")
        out = w.Output(layout=w.Layout(border="1px solid #ccc", min_height="4em"))

        def on_click(_):
            out.clear_output()
            self.generate(box.value, temp.value, top_p.value, seed.value, on_text=out.append_stdout)

        button.on_click(on_click)
        self.widgets = dict(prompt=box, temperature=temp, top_p=top_p, seed=seed, button=button, output=out)
        return w.VBox([box, w.HBox([temp, top_p]), w.HBox([seed, button]), out])
