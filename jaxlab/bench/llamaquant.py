"""``jaxlab bench --quant --llama-bench``: what quantization buys in llama.cpp, beside what it buys in jaxlab.

llama.cpp is the mature stack for local deployment that the seed glossary compares JAX with. What its stock
kernels gain from quantized weights (Q8_0 and Q4_1 against its own F32) is the yardstick for what jaxlab's int8
and int4 decode steps gain against float32, measured in the same run by :func:`jaxlab.bench.quantrows.measure_quant`.

``llama-bench -p 0 -n N -t T -r R -o json`` times token generation (one sequence, batch 1) of three GGUFs of the
same model: F32 and Q8_0 written by :func:`jaxlab.io.export.export_gguf` from the loaded weights, and the embedded
Q4_1 file itself. :func:`compare` puts the two stacks side by side at batch 1: each one's fastest quantized format
in tokens/s (the best repetition of each: the one least disturbed by other work on a shared machine), jaxlab's
over llama.cpp's (``ratio``: < 1, quantized models run slower locally in jaxlab), and what quantization buys each
over its own float32 (the baselines differ: on a CPU jaxlab's float32 step is the faster one).

Where the run measures batches above 1, ``llama-batched-bench`` (built beside llama-bench by ``make llama-cpp``) times
the two quantized files with that many sequences decoding at once (``-npl``; one prompt of the bench's length shared by
every sequence, ``-pps``, so the run is not spent on prefill; the decode steps attend over prompt + generated tokens
as jaxlab's rows do), best of up to 3 runs; :func:`compare` puts each batch side by side too (``batched``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from jaxlab.errors import InvalidRequestError

QTYPES = ("F32", "Q8_0", "Q4_1")  # the baseline first
WHAT = "llama.cpp llama-bench, token generation (batch 1, no prompt), F32 / Q8_0 / Q4_1 GGUFs of the same model"
WHAT_BATCHED = (
    "llama.cpp llama-batched-bench, text generation of -npl sequences at once after one shared prompt (-pps), "
    "Q8_0 / Q4_1 GGUFs of the same model"
)


def llama_bench_path() -> Path:
    """Where ``make llama-cpp`` puts llama-bench: ``$JAXLAB_CACHE/llama-cpp/<version>/bin/llama-bench``."""
    from jaxlab.bench.serving import llama_server_path

    return llama_server_path().with_name("llama-bench")


def resolve_llama_bench(value: str | None) -> str | None:
    """``--llama-bench``: None or 'none' -> no peer; 'auto' -> the one ``make llama-cpp`` built (a clear error
    when it is missing); a path -> that executable."""
    if value in (None, "none"):
        return None
    path = llama_bench_path() if value == "auto" else Path(value)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise InvalidRequestError(
            f"--llama-bench {value}: {path} is not an executable file; build it with `make llama-cpp` (about 10 "
            "minutes on 2 cores), or pass --llama-bench none"
        )
    return str(path)


def measure_llama_quant(
    bench: str,
    params,
    tokenizer,
    gguf: Path,
    new_tokens: int,
    reps: int,
    threads: int,
    log,
    batch_sizes: tuple[int, ...] = (),
    prompt_len: int = 128,
):
    """Tokens/s of llama.cpp's token generation for each of :data:`QTYPES` -> ``{"what", "argv", "tok_s",
    "stddev", "vs_F32"}``, and with ``batch_sizes`` above 1 llama-batched-bench's (``"batched"``:
    :func:`measure_batched`). The F32 and Q8_0 files are written to a temporary folder and removed afterwards."""
    from jaxlab.io.export import export_gguf

    with tempfile.TemporaryDirectory(prefix="jaxlab-llama-quant-") as folder:
        files = {}
        for q in QTYPES[:2]:
            log(f"llama.cpp peer: writing the {q} GGUF")
            files[q] = export_gguf(params, tokenizer, Path(folder) / f"model-{q}.gguf", qtype=q, source=gguf)
        files["Q4_1"] = Path(gguf)
        argv = [bench, "-p", "0", "-n", str(new_tokens), "-t", str(threads), "-r", str(reps), "-o", "json"]
        for q in QTYPES:
            argv += ["-m", str(files[q])]
        log(f"llama.cpp peer: {' '.join(Path(a).name if a.startswith(folder) else a for a in argv)}")
        out = parse(_run(argv), {q: Path(f).name for q, f in files.items()}, argv)
        many = tuple(b for b in batch_sizes if b > 1)
        if many:
            batched = str(Path(bench).with_name("llama-batched-bench"))
            quantized = {q: f for q, f in files.items() if q != "F32"}  # F32 at 32 rows: minutes, and no target
            out["batched"] = measure_batched(
                batched, quantized, many, prompt_len, new_tokens, min(reps, 3), threads, log
            )
    return out


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{Path(argv[0]).name} exited with {done.returncode}: {' | '.join(tail)}")
    return done.stdout


def measure_batched(
    batched: str, files: dict, batch_sizes: tuple[int, ...], prompt_len: int, new_tokens: int, reps: int, threads, log
) -> dict:
    """llama-batched-bench on each file at each of ``batch_sizes`` -> ``{"what", "argv", "tok_s": {qtype: {batch:
    best tokens/s}}, "samples": {qtype: {batch: [every run's]}}}``: tokens/s is the generated tokens of all sequences
    over the generation's time (its ``speed_tg``), best of ``reps`` runs."""
    if not (Path(batched).is_file() and os.access(batched, os.X_OK)):
        raise RuntimeError(f"{batched} is missing: rebuild llama.cpp with `make llama-cpp`")
    ctx = max(batch_sizes) * (prompt_len + new_tokens)  # room for every sequence, whether the cache is unified or not
    npl = ",".join(map(str, batch_sizes))
    base = [batched, "-c", str(ctx), "-npp", str(prompt_len), "-ntg", str(new_tokens), "-npl", npl, "-pps"]
    base += ["-t", str(threads), "--output-format", "jsonl"]
    samples: dict[str, dict[int, list[float]]] = {}
    for rep in range(reps):
        for q, f in files.items():
            log(f"llama.cpp peer: llama-batched-bench {q}, batches {npl}, run {rep + 1}/{reps}")
            for b, v in parse_batched(_run([*base, "-m", str(f)])).items():
                samples.setdefault(q, {}).setdefault(b, []).append(v)
    return {
        "what": WHAT_BATCHED,
        "argv": [Path(a).name if i == 0 else a for i, a in enumerate(base)] + ["-m", "<file>"],
        "tok_s": {q: {b: max(v) for b, v in per.items()} for q, per in samples.items()},
        "samples": samples,
    }


def parse_batched(stdout: str) -> dict[int, float]:
    """llama-batched-bench's JSON lines -> {sequences: text-generation tokens/s} (its ``pl`` and ``speed_tg``)."""
    out = {}
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            out[int(r["pl"])] = float(r["speed_tg"])
    if not out:
        raise RuntimeError("llama-batched-bench printed no result line")
    return out


def parse(stdout: str, names: dict[str, str], argv: list[str]) -> dict:
    """llama-bench's JSON (one record per model) -> tokens/s per qtype (``names``: qtype -> file name): the mean
    over repetitions (``tok_s``, llama-bench's own ``avg_ts``) and the best one (``best_tok_s``)."""
    records = json.loads(stdout)
    tok_s, best, stddev = {}, {}, {}
    for q, name in names.items():
        r = next((r for r in records if Path(r.get("model_filename", "")).name == name), None)
        if r is None:
            raise RuntimeError(f"llama-bench printed no result for {name}")
        tok_s[q], stddev[q] = float(r["avg_ts"]), float(r.get("stddev_ts", 0.0))
        best[q] = max(float(x) for x in r.get("samples_ts") or [r["avg_ts"]])
    return {
        "what": WHAT,
        "argv": [Path(a).name if a.endswith(".gguf") else a for a in argv],
        "tok_s": tok_s,
        "best_tok_s": best,
        "stddev": stddev,
        "vs_F32": {q: best[q] / best["F32"] for q in QTYPES[1:]},
    }


def compare(jaxlab_rows: list[dict], peer: dict) -> dict:
    """Batch 1 (float32 KV cache in jaxlab), best repetition of each: each stack's fastest quantized format in
    tokens/s, ``ratio`` = jaxlab's over llama.cpp's (< 1: quantized models run slower locally in jaxlab), and each
    format's speed-up over its own stack's float32 (``jaxlab``, ``llama_cpp``)."""

    def best(r):
        t = r["tokens_per_s"]
        return max(t["values"]) if isinstance(t, dict) else float(t)

    rows = {r["weights"]: best(r) for r in jaxlab_rows if r["batch"] == 1 and r["kv_cache"] == "float32"}
    ours = {w: v for w, v in rows.items() if w != "float32"}
    if not ours or "float32" not in rows:
        raise RuntimeError("no jaxlab rows at batch 1 with the float32 cache: add 1 to --quant-batch-sizes")
    theirs = {q: peer["best_tok_s"][q] for q in QTYPES[1:]}
    best_ours, best_peer = max(ours, key=ours.get), max(theirs, key=theirs.get)
    out = {
        "tok_s": {"jaxlab": rows, "llama_cpp": dict(peer["best_tok_s"])},
        "jaxlab": {w: v / rows["float32"] for w, v in ours.items()},
        "llama_cpp": peer["vs_F32"],
        "best_jaxlab": [best_ours, ours[best_ours]],
        "best_llama_cpp": [best_peer, theirs[best_peer]],
        "ratio": ours[best_ours] / theirs[best_peer],
        # the CPU-speed issue's batch-1 yardstick: int8 reads 1.4x Q4_1's bytes
        "int8_vs_q4_1": ours["int8"] / theirs["Q4_1"] if "int8" in ours else None,
    }
    batched = peer.get("batched")
    if batched:
        out["batched"] = {}
        per_q = {q: {int(k): v for k, v in per.items()} for q, per in batched["tok_s"].items()}  # JSON: str keys
        for b in sorted({b for per in per_q.values() for b in per}):
            mine = {r["label"]: best(r) for r in jaxlab_rows if r["batch"] == b and r["weights"] != "float32"}
            peer_b = {q: per[b] for q, per in per_q.items() if b in per}
            peer_q = {q: v for q, v in peer_b.items() if q != "F32"}
            if not mine or not peer_q:
                continue
            top, top_peer = max(mine, key=mine.get), max(peer_q, key=peer_q.get)
            out["batched"][b] = {
                "jaxlab": mine,
                "llama_cpp": peer_b,
                "best_jaxlab": [top, mine[top]],
                "best_llama_cpp": [top_peer, peer_q[top_peer]],
                "ratio": mine[top] / peer_q[top_peer],
            }
    return out


def render(q: dict) -> str:
    """The side-by-side lines of the report."""
    p, c = q["llama_cpp"], q["llama_cpp_vs_jaxlab"]
    lines = [
        f"Quantized decode at batch 1, jaxlab beside llama.cpp, best repetition of each ({p['what']}; "
        f"`{' '.join(p['argv'])}`)"
    ]
    for stack, speeds, base in (
        ("jaxlab", c["tok_s"]["jaxlab"], "float32"),
        ("llama.cpp", c["tok_s"]["llama_cpp"], "F32"),
    ):
        for fmt, v in speeds.items():
            gain = "" if fmt == base else f" ({v / speeds[base]:.2f}x its {base})"
            lines.append(f"  {stack} {fmt}: {v:.1f} tok/s{gain}")
    lines.append(
        f"  fastest quantized: jaxlab {c['best_jaxlab'][0]} {c['best_jaxlab'][1]:.1f} tok/s, llama.cpp "
        f"{c['best_llama_cpp'][0]} {c['best_llama_cpp'][1]:.1f} tok/s; jaxlab / llama.cpp = {c['ratio']:.2f} "
        "(< 1: slower in jaxlab)"
    )
    if c.get("int8_vs_q4_1") is not None:
        lines.append(f"  jaxlab int8 / llama.cpp Q4_1 = {c['int8_vs_q4_1']:.2f} (int8 reads 1.4x Q4_1's bytes)")
    if c.get("batched"):
        lines.append(f"Quantized decode at batch > 1, best run of each ({p['batched']['what']}; "
                     f"`{' '.join(p['batched']['argv'])}`)")  # fmt: skip
        for b, row in c["batched"].items():
            ours = ", ".join(f"{k} {v:.0f}" for k, v in row["jaxlab"].items())
            theirs = ", ".join(f"{k} {v:.0f}" for k, v in row["llama_cpp"].items())
            lines.append(
                f"  batch {b}: jaxlab {ours}; llama.cpp {theirs} tok/s; fastest quantized: jaxlab "
                f"{row['best_jaxlab'][0]} / llama.cpp {row['best_llama_cpp'][0]} = {row['ratio']:.2f}"
            )
    return "\n".join(lines)
