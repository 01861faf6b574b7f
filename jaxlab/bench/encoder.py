"""``jaxlab bench --encoder``: the second seed's claim that compiled JAX BERT runs 2-3x faster than PyTorch, measured
on all-MiniLM-L6-v2: jaxlab's jitted encoder against ``transformers``' BertModel in PyTorch eager and under
``torch.compile`` (where it compiles), the same CPU, the same threads, the same token ids, side by side.

Each shape (batch x length: 1, 32, 128 x 32, 128 tokens, every row full length, no padding) is timed as the
forward pass plus mean pooling and normalisation, to the embeddings on the host. Reps rotate between the
contenders (one rep of each, then the next), and the median of each is reported with the ratio ours / theirs
(> 1: jaxlab faster). Compilation (XLA's, inductor's) happens before timing and is reported separately.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from jaxlab.bench.stats import ratio

SHAPES = ((1, 32), (1, 128), (32, 32), (32, 128), (128, 32), (128, 128))
QUICK_SHAPES = ((1, 32), (4, 32))
TARGET_SHAPE = (32, 128)  # jaxlab >= 1.0x PyTorch eager here


def _torch_contenders(folder, compile_: bool, log):
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    model = BertModel.from_pretrained(str(folder), dtype=torch.float32).eval()

    def run(m):
        def f(ids, mask):
            with torch.inference_mode():
                h = m(input_ids=ids, attention_mask=mask).last_hidden_state
                mk = mask.unsqueeze(-1).to(h.dtype)
                pooled = (h * mk).sum(1) / mk.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()

        return f

    out = {"PyTorch eager": run(model)}
    why = None
    if compile_:
        try:
            out["torch.compile"] = run(torch.compile(model))
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            why = f"{type(e).__name__}: {e}"[:200]
    return out, why


def measure_encoder(quick: bool, reps: int, torch_compile: bool, log) -> dict:
    import jax
    import torch

    from jaxlab.engine.encoder import compile_options, load_embedder, sentence_embeddings
    from jaxlab.io import assets

    emb = load_embedder()
    folder = assets.encoder_dir()
    contenders, compile_error = _torch_contenders(folder, torch_compile, log)
    jitted = jax.jit(sentence_embeddings)
    rng = np.random.default_rng(0)
    rows = []
    for b, t in QUICK_SHAPES if quick else SHAPES:
        ids = rng.integers(1000, emb.config.vocab_size, size=(b, t)).astype(np.int32)
        ids[:, 0], ids[:, -1] = 101, 102
        mask = np.ones((b, t), np.int32)
        t0 = time.perf_counter()
        fn = jitted.lower(emb.params, ids, mask).compile(compiler_options=compile_options(b, t))  # as Embedder does
        ours_compile = time.perf_counter() - t0
        tid, tmask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
        fns = {"jaxlab (jit)": lambda: np.asarray(fn(emb.params, ids, mask))}
        fns.update({name: (lambda f=f: f(tid, tmask)) for name, f in contenders.items()})
        warm, failed = {}, {}
        for name, f in list(fns.items()):
            t0 = time.perf_counter()
            try:
                f()
                f()
            except Exception as e:  # noqa: BLE001 - torch.compile failing on a shape is a result
                failed[name] = f"{type(e).__name__}: {e}"[:200]
                fns.pop(name)
                continue
            warm[name] = time.perf_counter() - t0
        log(f"encoder batch {b} x {t}: compiled ours in {ours_compile:.1f} s; timing {', '.join(fns)}")
        times = {name: [] for name in fns}
        results = {}
        for _ in range(reps):
            for name, f in fns.items():
                t0 = time.perf_counter()
                results[name] = f()
                times[name].append(time.perf_counter() - t0)
        ref = results.get("PyTorch eager")
        row = {
            "batch": b,
            "length": t,
            "seconds": {k: statistics.median(v) for k, v in times.items()},
            "tokens_per_s": {k: b * t / statistics.median(v) for k, v in times.items()},
            "first_calls_s": warm,
            "ours_compile_s": ours_compile,
            "failed": failed,
            "max_abs_vs_eager": None if ref is None else float(np.abs(results["jaxlab (jit)"] - ref).max()),
        }
        ours = row["seconds"]["jaxlab (jit)"]
        row["speedup"] = {k: ratio(v, ours) for k, v in row["seconds"].items() if k != "jaxlab (jit)"}
        rows.append(row)
    return {"rows": rows, "torch_compile_error": compile_error, "torch_threads": torch.get_num_threads()}


def encoder_verdict(res: dict) -> dict:
    """The seed's "2-3x faster than PyTorch" against eager, by shape: holds where the speed-up is >= 2."""
    ups = [(r["batch"], r["length"], r["speedup"].get("PyTorch eager")) for r in res["rows"]]
    held = [(b, t) for b, t, u in ups if u is not None and u >= 2.0]
    target = next((u for b, t, u in ups if (b, t) == TARGET_SHAPE), None)
    words = "HOLDS" if held and len(held) == len(ups) else ("HOLDS ONLY WHEN" if held else "DOES NOT HOLD")
    return {
        "claim": "compiled JAX BERT runs 2-3x faster than PyTorch",
        "verdict": words,
        "holds_at": held,
        "target": {
            "shape": TARGET_SHAPE,
            "measured": target,
            "status": "n/a" if target is None else ("PASS" if target >= 1.0 else "MISS"),
        },
    }


def render_encoder(res: dict) -> str:
    names = ["jaxlab (jit)", "PyTorch eager", "torch.compile"]
    lines = [f"{'batch x len':>12s} " + " ".join(f"{n:>16s}" for n in names) + "   ours/eager  ours/compile  max|diff|"]
    for r in res["rows"]:
        cells = []
        for n in names:
            v = r["tokens_per_s"].get(n)
            cells.append(f"{v:13.0f} t/s" if v else f"{'failed' if n in r['failed'] else '-':>16s}")
        e, c = r["speedup"].get("PyTorch eager"), r["speedup"].get("torch.compile")
        diff = r["max_abs_vs_eager"]
        lines.append(
            f"{r['batch']:>5d} x {r['length']:<4d} " + " ".join(cells)
            + f"   {'-' if e is None else f'{e:.2f}x':>10s}  {'-' if c is None else f'{c:.2f}x':>12s}  "
            + ("-" if diff is None else f"{diff:.1e}")
        )  # fmt: skip
    if res.get("torch_compile_error"):
        lines.append(f"torch.compile did not work here: {res['torch_compile_error']}")
    v = res["verdict"]
    at = ", ".join(f"{b}x{t}" for b, t in v["holds_at"]) or "no shape"
    m = v["target"]["measured"]
    lines += [
        "",
        f"Claim: {v['claim']}  ->  {v['verdict']}" + (f" (>= 2x against eager at {at})" if v["holds_at"] else ""),
        f"Target: jaxlab >= 1.0x PyTorch eager at batch {TARGET_SHAPE[0]} x {TARGET_SHAPE[1]}: "
        f"{v['target']['status']} ({'-' if m is None else f'{m:.2f}x'})",
    ]
    return "\n".join(lines) + "\n"


def run_encoder(args, out) -> int:
    from jaxlab.bench.harness import Progress
    from jaxlab.bench.output import finish, host_meta

    log = Progress()
    quick = bool(getattr(args, "quick", False))
    reps = getattr(args, "reps", None) or (2 if quick else 5)
    res = measure_encoder(quick, reps, not getattr(args, "no_torch_compile", False), log)
    res["verdict"] = encoder_verdict(res)
    res["meta"] = host_meta(reps=reps, quick=quick)
    text = f"jaxlab bench --encoder  |  {res['meta']['cpu']}  |  {os.cpu_count()} CPUs, torch threads {res['torch_threads']}\n\n"
    return finish(res, text + render_encoder(res), args, out)
