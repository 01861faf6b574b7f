"""``jaxlab bench --train``: training speed on the shipped fine-tuning task, against the machine's measured matmul ceiling.

Four variants of the same jitted step (:mod:`jaxlab.train.step`) on the same batches (batch 8 of the shipped
JSON-extraction examples, right-padded to a bucket): LoRA (rank 8 on every projection) and a full fine-tune (every
weight trained, AdamW state for all of them), each with and without rematerialisation (``jax.checkpoint`` per
layer). For each: real tokens per second (all timed steps' tokens over their summed time), seconds per step (median
of the timed steps, after a compile step), the compiled step's temporary memory (XLA's ``memory_analysis``: what
the backward pass keeps alive, the quantity remat trades), and the model FLOP utilisation (MFU): model FLOPs per second over the float32 matmul ceiling measured in
the same run (:func:`jaxlab.tools.profile.measure_matmul_flops`).

Model FLOPs count what the step must do, not what remat recomputes: per real token, the forward pass is
``2 x`` the layers' matmul weights plus attention's ``2 x 2 x layers x (t / 2) x heads x head_dim`` (causal: on
average half the keys), and the output head ``2 x vocab x dim`` per scored (answer) position. The backward pass of
a full fine-tune costs twice the forward (gradients for the activations and for the weights); LoRA's needs the
activations' gradients only (once the forward) plus the adapters' (negligible). So a step is ``3 x`` the forward
(full) or ``2 x`` (LoRA).
"""

from __future__ import annotations

import os
import statistics
import time

import jax

VARIANTS = (("LoRA", False), ("LoRA", True), ("full", False), ("full", True))


def step_rates(times: list, tokens: list, flops: list, ceiling: float) -> dict:
    """Seconds per step (the median) and the rates over all timed steps together: each step's rows have other
    lengths, so its tokens and FLOPs differ, and a rate is total work over total time."""
    total = sum(times)
    return {
        "seconds_per_step": statistics.median(times),
        "tokens_per_s": sum(tokens) / total,
        "model_flops_per_s": sum(flops) / total,
        "mfu_vs_measured_ceiling": sum(flops) / total / ceiling,
    }


def training_flops(cfg, tokens_per_row, scored: int, kind: str) -> float:
    """Model FLOPs of one training step: ``tokens_per_row`` the real length of each row, ``scored`` answer positions."""
    layer_weights = cfg.n_layers * (
        cfg.dim * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * cfg.dim * cfg.ffn_dim
    )
    fwd = 0.0
    for t in tokens_per_row:
        fwd += 2 * layer_weights * t + 2 * 2 * cfg.n_layers * (t * t / 2) * cfg.n_heads * cfg.head_dim
    fwd += 2 * cfg.vocab_size * cfg.dim * scored
    return fwd * (3 if kind == "full" else 2)


def measure_training(quick: bool, steps: int, log) -> dict:
    import jax.numpy as jnp

    from jaxlab.engine.loading import load
    from jaxlab.io.assets import data_file
    from jaxlab.tools.profile import measure_matmul_flops
    from jaxlab.train import data, lora, step

    m = load(dtype="float32")
    examples = data.read_jsonl(data_file("finetune", "train.jsonl"))
    encoded = [data.encode_example(m.tokenizer, e) for e in examples[:64]]
    batches = data.Batches(encoded, 8, m.tokenizer.pad_id, seed=0)
    ceiling = measure_matmul_flops(1024 if quick else 2048)
    log(f"float32 matmul ceiling: {ceiling / 1e9:.1f} GFLOP/s")
    rows = []
    for kind, remat in VARIANTS[:2] if quick else VARIANTS:
        cfg = step.TrainConfig(steps=100, batch_size=8, remat=remat)
        opt = step.optimizer(cfg)
        if kind == "LoRA":
            lc = lora.LoraConfig(rank=8)
            trainable, frozen, build = lora.init_adapter(m.params, lc), m.params, step.lora_build(lc)
            n_trained = lora.n_trainable(trainable)
        else:
            trainable = jax.tree.map(jnp.copy, m.params)  # the step donates what it trains
            frozen, build, n_trained = None, step.full_build, m.config.n_params()
        opt_state = opt.init(trainable)
        first = step.device_batch(batches.at(0))
        compiled = step.train_step.lower(
            trainable, opt_state, frozen, first, build=build, opt=opt, remat=remat
        ).compile()
        mem = compiled.memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
        t0 = time.perf_counter()
        trainable, opt_state, metrics = compiled(trainable, opt_state, frozen, first)
        float(metrics["loss"])
        first_s = time.perf_counter() - t0
        times, flops, tokens = [], [], []
        for s in range(1, steps + 1):
            b = batches.at(s)
            arrays = step.device_batch(b)
            if arrays["tokens"].shape != first["tokens"].shape or arrays["at"].shape != first["at"].shape:
                fn = step.train_step  # another bucket: the jitted step compiles it (timed apart below)
                trainable, opt_state, metrics = fn(
                    trainable, opt_state, frozen, arrays, build=build, opt=opt, remat=remat
                )
                float(metrics["loss"])
                continue
            t0 = time.perf_counter()
            trainable, opt_state, metrics = compiled(trainable, opt_state, frozen, arrays)
            float(metrics["loss"])
            times.append(time.perf_counter() - t0)
            real = (b.positions >= 0).sum(1)
            flops.append(training_flops(m.config, real, int(b.weights.sum()), kind.lower()))
            tokens.append(int(real.sum()))
        row = {
            "variant": kind + (" + remat" if remat else ""),
            "trained_params": int(n_trained),
            **step_rates(times, tokens, flops, ceiling),
            "temp_bytes": temp,
            "first_step_s": first_s,
            "timed_steps": len(times),
            "batch_shape": list(first["tokens"].shape),
        }
        log(
            f"{row['variant']}: {row['seconds_per_step']:.2f} s/step, {row['tokens_per_s']:.0f} tok/s, MFU {row['mfu_vs_measured_ceiling']:.0%}"
        )
        rows.append(row)
        del trainable, opt_state
    by = {r["variant"]: r for r in rows}
    trades = {}
    for kind in ("LoRA", "full"):
        a, b = by.get(kind), by.get(kind + " + remat")
        if a and b and a["temp_bytes"] and b["temp_bytes"]:
            trades[kind] = {
                "memory_ratio": b["temp_bytes"] / a["temp_bytes"],
                "time_ratio": b["seconds_per_step"] / a["seconds_per_step"],
            }
    return {
        "rows": rows,
        "matmul_ceiling_flops": ceiling,
        "remat_trade": trades,
        "batch_size": 8,
        "examples_per_batch_from": "data/finetune/train.jsonl",
    }


def render_training(res: dict) -> str:
    lines = [
        f"float32 matmul ceiling measured here: {res['matmul_ceiling_flops'] / 1e9:.1f} GFLOP/s",
        "",
        f"{'variant':16s} {'trained':>12s} {'s/step':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'MFU':>6s} {'temp MB':>9s}",
    ]
    for r in res["rows"]:
        temp = "-" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 1e6:.0f}"
        lines.append(
            f"{r['variant']:16s} {r['trained_params']:>12,d} {r['seconds_per_step']:8.2f} {r['tokens_per_s']:9.0f} "
            f"{r['model_flops_per_s'] / 1e9:8.1f} {r['mfu_vs_measured_ceiling']:6.0%} {temp:>9s}"
        )
    for kind, t in res["remat_trade"].items():
        lines.append(
            f"remat, {kind}: {t['memory_ratio']:.2f}x the temporary memory for {t['time_ratio']:.2f}x the step time"
        )
    return "\n".join(lines) + "\n"


def run_training(args, out) -> int:
    from jaxlab.bench.harness import Progress
    from jaxlab.bench.output import finish, host_meta

    log = Progress()
    quick = bool(getattr(args, "quick", False))
    steps = getattr(args, "reps", None) or (2 if quick else 4)
    res = measure_training(quick, steps, log)
    res["meta"] = host_meta(steps=steps, quick=quick, backend=jax.default_backend())
    text = (
        f"jaxlab bench --train  |  {res['meta']['cpu']}  |  {os.cpu_count()} CPUs, backend {jax.default_backend()}\n\n"
    )
    return finish(res, text + render_training(res), args, out)
