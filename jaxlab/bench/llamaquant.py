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


def measure_llama_quant(bench: str, params, tokenizer, gguf: Path, new_tokens: int, reps: int, threads: int, log):
    """Tokens/s of llama.cpp's token generation for each of :data:`QTYPES` -> ``{"what", "argv", "tok_s",
    "stddev", "vs_F32"}``. The F32 and Q8_0 files are written to a temporary folder and removed afterwards."""
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
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"llama-bench exited with {done.returncode}: {' | '.join(tail)}")
    return parse(done.stdout, {q: Path(f).name for q, f in files.items()}, argv)


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
    return {
        "tok_s": {"jaxlab": rows, "llama_cpp": dict(peer["best_tok_s"])},
        "jaxlab": {w: v / rows["float32"] for w, v in ours.items()},
        "llama_cpp": peer["vs_F32"],
        "best_jaxlab": [best_ours, ours[best_ours]],
        "best_llama_cpp": [best_peer, theirs[best_peer]],
        "ratio": ours[best_ours] / theirs[best_peer],
    }


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
    return "\n".join(lines)
