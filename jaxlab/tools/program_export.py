"""Compilation you can keep: the decode step as a ``jax.export`` file, and measurements in fresh processes.
(Model files, a Hugging Face folder or a GGUF file, are written by :mod:`jaxlab.io.export`.)

A jitted function lives in one process: its compiled program is gone when the process exits. Two
ways keep the work of compiling across processes, and this module measures both:

* **The persistent compilation cache** (:mod:`jaxlab.tools.compile_cache`): XLA's executables are written to
  a folder, and a fresh process that compiles the same program loads it from there instead.
  :func:`ttft_in_fresh_process` measures the time to first token of a freshly started process with an
  empty or a filled cache folder; :func:`compile_in_fresh_process` reports what one compile did.
* **jax.export** (:func:`export_decode_step`): the traced and lowered program (StableHLO) is
  serialized to a file, with its input and output shapes. Another process (or another program:
  the format is versioned and stable for months of jax releases) deserializes it and runs it without
  the Python code that made it, without tracing, and without jaxlab's model code. It still compiles
  it for the device it runs on (lowering is saved, XLA compilation is not).

Choices made here, and why:

* **The weights are arguments, not constants.** A function that closes over 540 MB of float32 weights
  exports them as constants inside the StableHLO: the file would hold the whole model. Passing them as
  arguments keeps the file to the program alone (about 120 KB for SmolLM2-135M's 30 layers) and
  lets one file serve any weights of the same shapes. The price: the caller must pass the weights in
  the same order (the leaf order of ``jax.tree.leaves(params)``); :func:`run_exported` checks every
  shape and dtype and says which one does not fit.
* **Flat, serializable pytrees.** ``Exported`` stores its input tree, and custom pytree nodes (our
  ``Params`` with its NNX graph definition, ``KVCache``) would need serialization hooks. The exported
  function takes plain tuples instead: ``(weights, tokens, positions, cache_k, cache_v, cache_pos,
  cache_index)``; :func:`run_exported` flattens and rebuilds around it.
* **Greedy only, no donation.** The step returns ``(next tokens [B], logits [B, V], cache)``. An
  ``Exported`` carries no buffer donation, so the cache comes back as new buffers (one cache copy per
  step; small next to the weights that every step reads).
* **Platforms.** By default the program is lowered for the backend it is exported on
  (``jax.export.default_export_platform()``). ``platforms=("cpu", "cuda", "tpu")`` lowers it for all
  three into one module that picks its branch at run time: one file for every machine, lowered on
  any of them (no accelerator needed to export for it).
* **Batch.** ``batch=None`` exports a shape-polymorphic step (a symbolic batch ``b``): one file for
  every batch size. The cache length stays fixed.

File format of :func:`save`: 8 bytes ``JAXLABX1``, the 32-byte SHA-256 of the payload, then the
payload: exactly ``Exported.serialize()``, which :func:`jax.export.deserialize` reads (:func:`load`
also accepts a bare payload). Serialization needs the small ``flatbuffers`` package.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kvcache import KVCache, init_cache, left_pad
from jaxlab.engine.model import Params
from jaxlab.engine.steps import greedy_step
from jaxlab.errors import ConfigError, ModelFileError

MAGIC = b"JAXLABX1"
_DIGEST = 32

__all__ = [
    "decode_step",
    "export_decode_step",
    "save",
    "load",
    "run_exported",
    "greedy_decode",
    "top_ops",
    "weights_read",
    "run_child",
    "ttft_in_fresh_process",
    "compile_in_fresh_process",
    "exported_in_fresh_process",
    "tiny_params",
]


# --------------------------------------------------------------------------------------------------
# The decode step, natively and exported
# --------------------------------------------------------------------------------------------------


#: The greedy decode step, the one that is exported: tokens, positions [B] -> (next tokens [B] int32,
#: logits [B, V] float32, cache). It is the engine's own (:func:`jaxlab.engine.steps.greedy_step`), a pure
#: function of arrays, so an exported file runs exactly the step the library runs.
decode_step = greedy_step


def _flat_step(treedef):
    """The decode step over plain tuples (serializable input/output trees); ``treedef`` (the weights'
    tree structure, holding the NNX graph definition) is static, closed over."""

    def step(weights, tokens, positions, cache_k, cache_v, cache_pos, cache_index):
        params = jax.tree.unflatten(treedef, weights)
        cache = KVCache(tuple(cache_k), tuple(cache_v), cache_pos, cache_index)
        nxt, logits, cache = decode_step(params, tokens, positions, cache)
        return nxt, logits, cache.k, cache.v, cache.pos, cache.index

    return step


def _cache_args(cache: KVCache) -> tuple:
    return (tuple(cache.k), tuple(cache.v), cache.pos, cache.index)


def export_decode_step(
    params: Params, batch: int | None = 1, cache_len: int = 256, *, platforms: Sequence[str] | None = None
) -> jax.export.Exported:
    """Export the greedy decode step for ``batch`` rows (None: any batch) and ``cache_len`` cache slots.

    The weights are arguments (see the module docstring): the exported function is
    ``(weights, tokens [B], positions [B], cache_k, cache_v, cache_pos, cache_index)
    -> (next tokens [B], logits [B, V], cache_k, cache_v, cache_pos, cache_index)``; call it through
    :func:`run_exported`. ``platforms`` defaults to the current backend."""
    cfg = params.config
    b = jax.export.symbolic_shape("b")[0] if batch is None else int(batch)
    sds = jax.ShapeDtypeStruct
    dtype = params.policy.jnp_dtype
    weights = tuple(sds(w.shape, w.dtype) for w in jax.tree.leaves(params))
    k = tuple(sds((b * cfg.n_kv_heads, cache_len, cfg.head_dim), dtype) for _ in range(cfg.n_layers))
    v = tuple(sds((b * cfg.n_kv_heads, cfg.head_dim, cache_len), dtype) for _ in range(cfg.n_layers))
    args = (
        weights,
        sds((b,), jnp.int32),
        sds((b,), jnp.int32),
        k,
        v,
        sds((b, cache_len), jnp.int32),
        sds((), jnp.int32),
    )
    with cpu_kernels.xla_only():  # a file to run anywhere: XLA's code, not a custom call of this host's library
        return jax.export.export(jax.jit(_flat_step(jax.tree.structure(params))), platforms=platforms)(*args)


def run_exported(exported: jax.export.Exported, params: Params, tokens, positions, cache: KVCache):
    """Run an exported decode step: -> (next tokens [B], logits [B, V], cache), like :func:`decode_step`.

    Raises :class:`~jaxlab.errors.ConfigError` naming the first argument whose shape or dtype does not
    fit the exported program (other weights, another batch size or cache length)."""
    weights = tuple(jax.tree.leaves(params))
    args = (weights, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), *_cache_args(cache))
    leaves = jax.tree.leaves(args)
    if len(leaves) != len(exported.in_avals):
        raise ConfigError(
            f"the exported step takes {len(exported.in_avals)} arrays, got {len(leaves)}: "
            "were the weights or the cache made for another model config?"
        )
    for i, (leaf, aval) in enumerate(zip(leaves, exported.in_avals)):
        dims_fit = len(leaf.shape) == len(aval.shape) and all(
            not isinstance(d, int) or d == s for d, s in zip(aval.shape, leaf.shape)
        )
        if not dims_fit or leaf.dtype != aval.dtype:
            names = (
                [f"weight {j}" for j in range(len(weights))]
                + ["tokens", "positions"]
                + [f"cache.k[{j}]" for j in range(len(cache.k))]
                + [f"cache.v[{j}]" for j in range(len(cache.v))]
                + ["cache.pos", "cache.index"]
            )
            raise ConfigError(
                f"{names[i]} is {leaf.dtype}{list(leaf.shape)}, but the exported step was made for "
                f"{aval.dtype}{list(aval.shape)}: export it again for this batch size / cache length"
            )
    nxt, logits, k, v, pos, index = _jitted_call(exported)(*args)
    return nxt, logits, KVCache(tuple(k), tuple(v), pos, index)


_CALLS: dict[int, tuple[jax.export.Exported, Callable]] = {}


def _jitted_call(exported: jax.export.Exported) -> Callable:
    """``jax.jit(exported.call)``, kept per exported program: calling ``exported.call`` directly
    re-traces and re-lowers the call on every step."""
    hit = _CALLS.get(id(exported))
    if hit is None or hit[0] is not exported:
        if len(_CALLS) >= 8:
            _CALLS.pop(next(iter(_CALLS)))
        hit = _CALLS[id(exported)] = (exported, jax.jit(exported.call))
    return hit[1]


def greedy_decode(
    step: Callable, params: Params, prompts: Sequence[Sequence[int]], max_new_tokens: int, cache_len: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy generation with a decode step only: the prompt goes in one token per step, then the
    step's own tokens. ``step(params, tokens [B], positions [B], cache) -> (next [B], logits [B, V], cache)``
    (e.g. ``jax.jit(decode_step)`` or ``lambda *a: run_exported(exported, *a)``).

    Prompts are left-padded (padding has position -1). Returns (new tokens [B, max_new_tokens],
    logits of the last step [B, V]) as numpy arrays."""
    cfg = params.config
    tokens, positions = left_pad(prompts, cfg.pad_id)
    b, longest = tokens.shape
    cache = init_cache(cfg, b, cache_len or longest + max_new_tokens, params.policy.jnp_dtype)
    for c in range(longest):
        nxt, logits, cache = step(params, jnp.asarray(tokens[:, c]), jnp.asarray(positions[:, c]), cache)
    pos = np.array([len(p) for p in prompts], np.int32)
    out = [np.asarray(nxt)]
    for i in range(max_new_tokens - 1):
        nxt, logits, cache = step(params, nxt, jnp.asarray(pos + i), cache)
        out.append(np.asarray(nxt))
    return np.stack(out, axis=1), np.asarray(logits)


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def save(exported: jax.export.Exported, path: str | os.PathLike) -> Path:
    """Write ``exported`` to ``path`` (magic, SHA-256, ``Exported.serialize()``); returns the path."""
    try:
        payload = bytes(exported.serialize())
    except ImportError as e:  # jax serializes with the flatbuffers package
        raise ModelFileError(f"cannot serialize an exported program: {e} (pip install flatbuffers)") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(MAGIC + hashlib.sha256(payload).digest() + payload)
    tmp.replace(path)  # never leave a half-written file under the real name
    return path


def load(path: str | os.PathLike) -> jax.export.Exported:
    """Read a file written by :func:`save` (or a bare ``Exported.serialize()`` payload).

    Raises :class:`~jaxlab.errors.ModelFileError` for a missing, empty, truncated or corrupt file."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"exported program not found: {path} (write one with jaxlab.tools.program_export.save)")
    data = path.read_bytes()
    if not data:
        raise ModelFileError(f"exported program {path} is empty")
    payload = data
    if data.startswith(MAGIC):
        digest, payload = data[len(MAGIC) : len(MAGIC) + _DIGEST], data[len(MAGIC) + _DIGEST :]
        if hashlib.sha256(payload).digest() != digest:
            raise ModelFileError(
                f"exported program {path} is corrupt or truncated (checksum mismatch): export it again"
            )
    try:
        return jax.export.deserialize(bytearray(payload))
    except ImportError as e:
        raise ModelFileError(f"cannot read {path}: {e} (pip install flatbuffers)") from None
    except Exception as e:  # flatbuffers raises struct.error, IndexError, ... on foreign bytes
        raise ModelFileError(f"{path} is not an exported jax program ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------------------------------
# Reading a profiler trace
# --------------------------------------------------------------------------------------------------

_WEIGHT_OPERAND = re.compile(r"%params_0___(\w+?)___value")


def weights_read(hlo: str) -> dict[str, list[str]]:
    """{HLO instruction name: the weights its operands name} from optimized HLO text.

    jax names a parameter after its pytree path, e.g. ``%params_0___layers___3___mlp____w_up___value``
    for ``layers.3.mlp.w_up`` (runs of 3+ underscores separate the path's parts)."""
    reads = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = [^\n]*$", hlo, flags=re.M):
        found = {".".join(re.split(r"_{3,}", w)) for w in _WEIGHT_OPERAND.findall(m.group(0))}
        if found:
            reads[m.group(1)] = sorted(found)
    return reads


def top_ops(trace_dir: str | os.PathLike, n: int = 10, hlo: str | None = None, by: str = "op") -> list[dict]:
    """The ``n`` biggest consumers of time among the XLA operations in a ``jax.profiler`` trace folder.

    Reads the ``*.trace.json.gz`` that :func:`jaxlab.tools.profile.trace` writes (Chrome trace format) and
    sums the durations of the events that carry an ``hlo_op`` (the compiled program's operations, on
    any device). With the program's optimized ``hlo`` text (:func:`jaxlab.tools.profile.hlo_text`), each row
    also says which weights the op ``reads`` (e.g. ``layers.3.mlp.w_up``), and ``by="weight"`` groups
    the ops by that, with the layer number replaced by ``*`` (``layers.*.mlp.w_up``: one row for the
    30 matmuls with that weight; ops that read no weight are grouped by their kind, e.g. ``fusion``).
    Rows: ``op``, ``calls``, ``ms`` (total), ``share`` (of all ops' time) [, ``reads``]."""
    if by not in ("op", "weight") or (by == "weight" and hlo is None):
        raise ValueError("by must be 'op', or 'weight' together with the program's hlo text")
    files = sorted(Path(trace_dir).glob("**/*.trace.json.gz"))
    if not files:
        raise ModelFileError(f"no *.trace.json.gz under {trace_dir}: record one with jaxlab.tools.profile.trace")
    with gzip.open(files[-1]) as f:
        events = json.load(f).get("traceEvents", [])
    reads = weights_read(hlo) if hlo else {}
    total, calls = defaultdict(float), defaultdict(int)
    for e in events:
        op = e.get("args", {}).get("hlo_op") if e.get("ph") == "X" else None
        if op is None:
            continue
        if by == "weight":
            op = (
                re.sub(r"\.\d+\.", ".*.", ", ".join(reads[op]))
                if op in reads
                else re.sub(r"\.\d+$", "", op) + " (no weight)"
            )
        total[op] += float(e.get("dur", 0.0))
        calls[op] += 1
    whole = sum(total.values()) or 1.0
    rows = []
    for op in sorted(total, key=total.get, reverse=True)[:n]:
        row = {"op": op, "calls": calls[op], "ms": total[op] / 1e3, "share": total[op] / whole}
        if hlo is not None and by == "op":
            row["reads"] = ", ".join(reads.get(op, [])) or "-"
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# Fresh processes
# --------------------------------------------------------------------------------------------------


def tiny_params(seed: int = 0) -> Params:
    """The ``tiny`` config with random weights drawn by numpy (the same in every process), large
    enough that greedy tokens vary from step to step."""
    from jaxlab.engine.model import params_from_flat
    from jaxlab.io.config import param_shapes, tiny

    cfg, rng = tiny(), np.random.default_rng(seed)
    flat = {
        name: (rng.normal(0.0, 0.2, shape) if len(shape) > 1 else 1.0 + rng.normal(0.0, 0.1, shape)).astype(np.float32)
        for name, shape in param_shapes(cfg).items()
    }
    return params_from_flat(cfg, flat)


def _params_for(model: str, dtype: str = "auto") -> Params:
    if model == "tiny":
        return tiny_params()
    from jaxlab.engine.loading import load as load_model

    return load_model(None if model == "default" else model, dtype=dtype).params


def _child_env(cache_dir: str | os.PathLike | None) -> dict:
    """The environment of a child process (:func:`jaxlab.tools.hardware.child_env`): this process's accelerator
    when it can be shared (a GPU without preallocation; a TPU only if this process has not started its
    backend), else explicitly the CPU."""
    from jaxlab.tools.hardware import child_env

    env = child_env()
    env.pop("JAXLAB_COMPILE_CACHE", None)
    if cache_dir is not None:
        env["JAXLAB_COMPILE_CACHE"] = str(cache_dir)
    return env


def run_child(command: str, args: dict, cache_dir=None, timeout: float = 300) -> dict:
    """Run ``python -m jaxlab.tools.program_export COMMAND ARGS`` in a fresh process; -> its JSON answer (last line),
    with ``note``: the label of its figures when it ran on another backend than this process (else None)."""
    from jaxlab.tools.hardware import figure_note

    args = dict(args, launched=time.time())
    proc = subprocess.run(
        [sys.executable, "-m", "jaxlab.tools.program_export", command, json.dumps(args)],
        capture_output=True,
        text=True,
        env=_child_env(cache_dir),
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child process `{command}` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = time.time() - args["launched"]
    out["note"] = figure_note(out.get("backend", out.get("platform")))
    return out


def ttft_in_fresh_process(
    prompt_ids: Sequence[int],
    cache_dir: str | os.PathLike | None,
    max_new_tokens: int = 8,
    model: str = "default",
    timeout: float = 300,
) -> dict:
    """Start a fresh Python, load the model, and time one chat request with ``Generator.generate``.

    ``cache_dir``: the persistent compilation cache folder for the child (None: no persistent cache).
    Returns seconds ``startup_s`` (interpreter + imports), ``load_s``, ``ttft_s`` (from the
    ``generate`` call to the first streamed text), ``total_s`` (the whole request), ``compile_s``
    (compiling or loading programs, inside the request), counts ``compiles`` and ``cache_hits``
    (:class:`~jaxlab.tools.profile.CompileCounter`), ``cache_files`` (files in the folder afterwards),
    ``platform`` / ``backend`` (where the child ran), ``note`` (e.g. "CPU figure: the TPU is held by this
    process" when that is not this process's backend, else None), ``text`` and ``process_s`` (wall time of
    the child, seen from here)."""
    return run_child(
        "ttft",
        {"prompt_ids": list(map(int, prompt_ids)), "max_new_tokens": max_new_tokens, "model": model},
        cache_dir,
        timeout,
    )


def compile_in_fresh_process(
    cache_dir: str | os.PathLike | None, model: str = "tiny", batch: int = 1, cache_len: int = 64, timeout: float = 300
) -> dict:
    """Compile the jitted decode step (AOT) in a fresh process; -> ``compiles``, ``cache_hits``,
    ``compile_s``, ``cache_files`` (files in ``cache_dir`` afterwards), ``platform``."""
    return run_child("compile", {"model": model, "batch": batch, "cache_len": cache_len}, cache_dir, timeout)


def exported_in_fresh_process(
    path: str | os.PathLike,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    cache_len: int,
    model: str = "default",
    cache_dir: str | os.PathLike | None = None,
    timeout: float = 300,
) -> dict:
    """Load the exported step at ``path`` in a fresh process that never imports the model's code for it,
    and run :func:`greedy_decode` with it on ``model``'s weights (``"tiny"``: :func:`tiny_params`).
    ``cache_dir``: a persistent compilation cache for the child (None: none, it compiles the program).

    Returns ``tokens`` [B, new] and ``logits`` [B, V] (numpy), ``platform``, ``load_s`` (reading and
    deserializing the file), ``first_call_s`` (compiling the program for this device, or loading it from
    ``cache_dir``, and one step), ``decode_s`` (then the whole greedy decoding), ``compiles``, ``cache_hits``."""
    with tempfile.TemporaryDirectory(prefix="jaxlab-export-") as tmp:
        out_file = Path(tmp) / "out.npz"
        out = run_child(
            "run-exported",
            {
                "path": str(path),
                "prompts": [list(map(int, p)) for p in prompts],
                "max_new_tokens": max_new_tokens,
                "cache_len": cache_len,
                "model": model,
                "out": str(out_file),
            },
            cache_dir,
            timeout,
        )
        with np.load(out_file) as arrays:
            out["tokens"], out["logits"] = arrays["tokens"], arrays["logits"]
    return out


def _cache_files(cache_dir) -> int:
    return sum(1 for p in Path(cache_dir).rglob("*") if p.is_file()) if cache_dir else 0


def _child_main(command: str, args: dict) -> dict:
    """What a child process does (``python -m jaxlab.tools.program_export COMMAND JSON``)."""
    from jaxlab.tools import compile_cache
    from jaxlab.tools.profile import CompileCounter

    cache_dir = os.environ.get("JAXLAB_COMPILE_CACHE")
    if cache_dir:
        compile_cache.enable(cache_dir)
    out: dict[str, Any] = {
        "platform": jax.default_backend(),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "startup_s": time.time() - args["launched"],
    }
    if command == "ttft":
        t0 = time.perf_counter()
        from jaxlab.engine.generate import Generator
        from jaxlab.engine.loading import load as load_model

        model = load_model(None if args["model"] == "default" else args["model"])
        gen = Generator(model.params, model.tokenizer)
        out["load_s"] = time.perf_counter() - t0
        first: list[float] = []
        with CompileCounter() as cc:
            t0 = time.perf_counter()
            result = gen.generate(
                [args["prompt_ids"]],
                args["max_new_tokens"],
                ignore_eos=True,
                on_text=lambda row, piece: first or first.append(time.perf_counter()),
            )
            out["total_s"] = time.perf_counter() - t0
        out.update(
            ttft_s=(first[0] if first else time.perf_counter()) - t0,
            compile_s=result[0].compile_seconds,
            text=result[0].text,
            tokens=result[0].generated_ids,
        )
    elif command == "compile":
        params = _params_for(args["model"])
        cache = init_cache(params.config, args["batch"], args["cache_len"], params.policy.jnp_dtype)
        tokens = jnp.zeros((args["batch"],), jnp.int32)
        with CompileCounter() as cc:
            t0 = time.perf_counter()
            jax.jit(decode_step).lower(params, tokens, tokens, cache).compile()
            out["compile_s"] = time.perf_counter() - t0
    elif command == "run-exported":
        t0 = time.perf_counter()
        exported = load(args["path"])
        out["load_s"] = time.perf_counter() - t0
        here = jax.export.default_export_platform()
        if here not in exported.platforms:  # e.g. lowered for a TPU that the parent holds: this child runs on the CPU
            raise ConfigError(
                f"the exported step was lowered for {', '.join(exported.platforms)}, and this process "
                f"runs on {here}: export it with platforms=(..., {here!r})"
            )
        params = _params_for(args["model"], dtype=str(exported.in_avals[0].dtype))  # the weights it was made for
        b = len(args["prompts"])
        with CompileCounter() as cc:
            t0 = time.perf_counter()  # compile (or load from the cache) + one step, on an empty cache
            empty = init_cache(params.config, b, args["cache_len"], params.policy.jnp_dtype)
            jax.block_until_ready(
                run_exported(exported, params, jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.int32), empty)
            )
            out["first_call_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            tokens, logits = greedy_decode(
                lambda *a: run_exported(exported, *a),
                params,
                args["prompts"],
                args["max_new_tokens"],
                args["cache_len"],
            )
            out["decode_s"] = time.perf_counter() - t0
        np.savez(args["out"], tokens=tokens, logits=logits)
        out["fun_name"] = exported.fun_name
    else:
        raise SystemExit(f"unknown command {command!r}")
    out.update(compiles=cc.count, cache_hits=cc.cache_hits, cache_files=_cache_files(cache_dir))
    return out


if __name__ == "__main__":
    print(json.dumps(_child_main(sys.argv[1], json.loads(sys.argv[2]))))
