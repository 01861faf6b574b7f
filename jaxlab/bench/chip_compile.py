"""Every program the lab runs, compiled for a chip that is not here: ``jaxlab compile --chip v5e-1``.

libtpu, the TPU compiler, runs on a CPU host: given a slice's devices from
:func:`jaxlab.tools.hardware.topology_devices`, ``jit(f).lower(<abstract arguments placed on them>).compile()``
returns a real TPU executable, with no chip attached. Nothing runs; what the compiler says is read:

* compiled, or refused (the compiler's first line: a Pallas block shape Mosaic rejects, a program too big);
* HBM bytes from ``memory_analysis()`` (arguments, outputs, temporaries, generated code; the KV cache
  donated is counted once) and FLOPs and bytes from ``cost_analysis()``;
* a predicted time per call from the chip's published peaks (:data:`jaxlab.tools.hardware.CHIPS`): the
  larger of FLOPs / peak and bytes / bandwidth, with the bytes every call must move at least once (its
  arguments and outputs, the donated cache once). Cost analysis's own "bytes accessed" counts every
  operation's operands and is several times larger on these programs: it is reported, not used;
* what the TPU layout pads: the arguments' bytes in the compiled program's tiled layouts (a minor dimension
  rounds up to 128 lanes) against their logical bytes;
* on a slice of several chips, the collectives in the compiled HLO (all-reduce, all-gather, ...).

The programs (:func:`lab_programs`) are the step toolkit's, with the shapes the loops give them: the prefill
chunk and the decode step (:class:`~jaxlab.engine.generate.Generator`), the continuous engine's rows step at
each page-table width, decode and prefill (:class:`~jaxlab.engine.continuous.Engine`), speculative
verify and draft, the three Pallas kernels' TPU variants standing alone, the encoder's forward, the LoRA
train step, and on several chips the data- and tensor-parallel decode steps
(:class:`~jaxlab.engine.sharding.Sharded`). Parameters are abstract (``jax.eval_shape``): the model is
never read, so ``--config`` (a Hugging Face ``config.json``) asks the compiler whether a model of any size
fits, with no weights.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import threading
import time
from collections import Counter
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.engine import grammar, paged, runner, steps
from jaxlab.engine.kernels import compiling_for, flash_attention, paged_attention, rms_norm
from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import Params, default_policy, init_params
from jaxlab.engine.speculative import DEFAULT_DRAFT_LAYERS, DEFAULT_K, accept
from jaxlab.errors import ConfigError
from jaxlab.io.config import LlamaConfig
from jaxlab.quant.calibrate import quantized_shapes
from jaxlab.tools import hardware
from jaxlab.tools.profile import COLLECTIVES, array_bytes, count_ops, matmul_probe

CHIP_NAMES = (*hardware.TOPOLOGIES, "cpu")


@dataclasses.dataclass
class Compiled:
    """What the compiler said of one program."""

    name: str
    ok: bool
    message: str = ""  # the compiler's first line when it refused
    seconds: float = 0.0  # lowering and compiling
    argument_bytes: int = 0  # in the compiled layouts (tiled on a TPU)
    output_bytes: int = 0
    alias_bytes: int = 0  # outputs that reuse an argument's buffer (the donated KV cache)
    temp_bytes: int = 0
    code_bytes: int = 0
    logical_bytes: int = 0  # the arguments' bytes as shapes x dtypes, no padding
    flops: float = 0.0
    cost_bytes: float = 0.0  # cost analysis's "bytes accessed"
    collectives: dict = dataclasses.field(default_factory=dict)  # op -> count in the compiled HLO
    custom_calls: dict = dataclasses.field(default_factory=dict)  # target -> count (tpu_custom_call: a kernel)
    predicted_s: float | None = None
    bound: str = ""  # "memory" or "compute": which limit the prediction hit
    measured_s: float | None = None  # on this CPU (--measure): the best of a few timed calls
    executable: Any = dataclasses.field(default=None, repr=False, compare=False)  # not in the JSON
    args: tuple = dataclasses.field(default=(), repr=False, compare=False)  # the abstract arguments

    @property
    def device_bytes(self) -> int:
        """Bytes the program holds on one device while it runs."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

    @property
    def moved_bytes(self) -> int:
        """Bytes a call moves at least once: every argument read, every output written (the aliased cache once)."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes

    @property
    def padding(self) -> float | None:
        """Tiled argument bytes / logical bytes (1.0: no padding)."""
        return self.argument_bytes / self.logical_bytes if self.ok and self.logical_bytes else None


@dataclasses.dataclass(frozen=True)
class Target:
    """The chip programs compile for: a TPU slice that is not attached, or this CPU."""

    name: str
    devices: tuple
    chip: hardware.Chip | None

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def _per_chip(self) -> float:
        """jax devices per chip (libtpu's v4 topology lists each TensorCore)."""
        return len(self.devices) / hardware.TOPOLOGIES[self.name].n_chips

    @property
    def device_peaks(self) -> tuple[float, float] | None:
        """(FLOP/s, bytes/s) of one device, from the chip's published peaks; None on a CPU."""
        if self.chip is None:
            return None
        return self.chip.peak_flops / self._per_chip, self.chip.hbm_bandwidth / self._per_chip

    @property
    def device_hbm(self) -> float | None:
        """Memory bytes of one device, from the chip's published size; None on a CPU."""
        return None if self.chip is None else self.chip.hbm_bytes / self._per_chip

    def mesh(self, n: int = 1, axes=("x",)) -> Mesh:
        return Mesh(np.asarray(self.devices[:n]).reshape((n,) + (1,) * (len(axes) - 1)), axes)


def target(name: str) -> Target:
    """``name`` in :data:`CHIP_NAMES` -> its devices (libtpu's compile-only topology for a TPU slice)."""
    if name == "cpu":
        return Target("cpu", tuple(jax.devices("cpu")), None)
    if name not in hardware.TOPOLOGIES:
        raise ConfigError(f"unknown chip {name!r}; choose one of {', '.join(CHIP_NAMES)}")
    return Target(name, tuple(hardware.topology_devices(name)), hardware.CHIPS[hardware.TOPOLOGIES[name].chip])


# -- reading a compiled program ------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


def custom_call_targets(hlo: str) -> dict:
    return dict(Counter(re.findall(r'custom_call_target="([^"]+)"', hlo)))


def compile_one(name: str, fn, args: tuple, static: dict | None, tgt: Target, effort: float = 0.0) -> Compiled:
    """Lower and compile ``fn(*args, **static)`` for ``tgt`` (args abstract, placed on its devices). ``effort``: the
    compiler's exec_time_optimization_effort (-1 to 1, 0 its default): how hard XLA works on the program's speed;
    -1 compiled SmolLM2's decode step at batch 512 for v5e in 6.9 s instead of 16.8 with the same FLOPs and bytes
    moved (its temporaries 107 MB instead of 136: a fit is the default effort's question)."""
    options = {"exec_time_optimization_effort": float(effort)} if effort else None
    t0 = time.perf_counter()
    try:
        with compiling_for(tgt.platform):
            exe = fn.lower(*args, **(static or {})).compile(options)
    except Exception as e:  # the compiler's refusal is the result, not a crash
        return Compiled(name, False, _first_line(e), time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    mem = exe.memory_analysis()
    cost = exe.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    hlo = exe.as_text()
    out = Compiled(
        name,
        True,
        seconds=seconds,
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        code_bytes=int(mem.generated_code_size_in_bytes),
        logical_bytes=array_bytes(args, per_device=True),
        flops=float(cost.get("flops", 0.0)),
        cost_bytes=float(cost.get("bytes accessed", 0.0)),
        collectives={k: n for k, n in count_ops(hlo, COLLECTIVES).items() if n},
        custom_calls=custom_call_targets(hlo),
        executable=exe,
        args=args,
    )
    peaks = tgt.device_peaks
    if peaks is not None:
        t_compute, t_memory = out.flops / peaks[0], out.moved_bytes / peaks[1]
        out.predicted_s, out.bound = max(t_compute, t_memory), "compute" if t_compute > t_memory else "memory"
    return out


# -- the programs ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """What to compile: the model and the shapes of its programs."""

    config: LlamaConfig
    dtype: str = "bfloat16"
    quant: str | None = None  # "int8", "int4", "w8a8" or None
    group: int = 32  # int4 group size
    attention: str = "xla"  # or "pallas"
    batch: int = 8
    context: int = 1024
    kv_cache: str | None = None  # "int8" for the int8 KV cache; default the parameters' dtype
    effort: float = 0.0  # XLA's exec_time_optimization_effort, -1 to 1 (0: the compiler's default); -1 compiles fastest

    @property
    def compute_dtype(self) -> str:
        """The parameters' policy: quantized weights compute in float32 (the quantized path's dtype)."""
        return "float32" if self.quant else self.dtype

    @property
    def cache_dtype(self):
        return jnp.dtype(jnp.int8 if self.kv_cache == "int8" else self.compute_dtype)


def abstract_params(s: Settings) -> Params:
    """The model's parameters as shapes only (nothing allocated, no file read)."""
    policy = dataclasses.replace(default_policy(s.compute_dtype), attention=s.attention)
    params = jax.eval_shape(lambda: init_params(s.config, 0, policy))
    return quantized_shapes(params, s.quant, s.group) if s.quant else params


def _placed(tree, sharding):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def lab_programs(s: Settings, tgt: Target, params: Params) -> list[tuple[str, Callable, tuple, dict | None]]:
    """(name, jitted function, abstract arguments, static arguments) of every one-device program (``params``:
    :func:`abstract_params`)."""
    one = NamedSharding(tgt.mesh(1), P())
    put = lambda tree: _placed(tree, one)  # noqa: E731
    cfg, b, ctx = s.config, s.batch, s.context
    params = put(params)
    cache_dtype = s.cache_dtype
    cache = put(jax.eval_shape(lambda: init_cache(cfg, b, ctx, cache_dtype)))
    key = put(jax.eval_shape(lambda: jax.random.key(0)))
    greedy = put(steps.GREEDY)
    row = lambda n, t=None: put(jax.ShapeDtypeStruct((n,) if t is None else (n, t), jnp.int32))  # noqa: E731
    chunk = min(512, ctx)
    progs = [
        (
            f"prefill chunk [{b}, {chunk}]",
            steps.jit_prefill,
            (params, row(b, chunk), row(b, chunk), cache, key, greedy),
            None,
        ),
        (f"decode step [{b}]", steps.jit_decode, (params, row(b), row(b), cache, key, greedy), None),
    ]
    # the continuous engine: a pool where every slot reaches the context, the rows step at each table width
    widths = runner.table_widths(ctx, runner.PAGE_SIZE)
    pool = 1 + b * widths[-1] // runner.PAGE_SIZE
    pages = jax.eval_shape(lambda: paged.init_paged_cache(cfg, pool, runner.PAGE_SIZE, dtype=cache_dtype))
    words = grammar.words(cfg.vocab_size)  # the grammar bitmask's int32 words per row (all ones: free rows)
    for width in widths:
        for label, rows, t in (("decode", b, 1), ("prefill", 1, runner.default_chunk(ctx, runner.PAGE_SIZE))):
            table = jax.ShapeDtypeStruct((rows, width // runner.PAGE_SIZE), jnp.int32)
            pc = put(dataclasses.replace(pages, page_table=table))
            args = (params, row(rows, t), row(rows, t), pc, put(jax.ShapeDtypeStruct((rows,), jnp.uint32)), greedy)
            args += (put(jax.ShapeDtypeStruct((rows,), jnp.bool_)), put(jax.ShapeDtypeStruct((rows, words), jnp.int32)))
            progs.append((f"rows {label} [{rows}, {t}] width {width}", steps.jit_rows, args, None))
    k = DEFAULT_K
    index = put(jax.ShapeDtypeStruct((), jnp.int32))
    verify_args = (params, row(b, k + 1), row(b, k + 1), cache, index, None, key, greedy)
    progs.append((f"speculative verify k={k}", steps.jit_verify, verify_args, {"accept": accept}))
    layers = min(DEFAULT_DRAFT_LAYERS, cfg.n_layers)
    dcache = put(jax.eval_shape(lambda: init_cache(cfg.replace(n_layers=layers), b, ctx, cache_dtype)))
    draft_args = (params, row(b), row(b), row(b), dcache, index, key, greedy)
    progs.append((f"speculative draft k={k}, {layers} layers", steps.jit_draft, draft_args, {"k": k, "upto": layers}))
    return progs


def kernel_programs(s: Settings, tgt: Target) -> list[tuple[str, Callable, tuple, dict | None]]:
    """The three Pallas kernels alone, at the model's shapes (the TPU variant on a TPU: Mosaic's checks)."""
    one = NamedSharding(tgt.mesh(1), P())
    cfg, b, ctx = s.config, s.batch, s.context
    dt = jnp.dtype(s.dtype)
    sds = lambda shape, dtype=dt: jax.ShapeDtypeStruct(shape, dtype, sharding=one)  # noqa: E731
    n, g, hd = b * cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    flash = jax.jit(lambda q, k, v, qp, kp: flash_attention(q, k, v, qp, kp, v_transposed=True))
    flash_args = (
        sds((n, g, hd)),
        sds((n, ctx, hd)),
        sds((n, hd, ctx)),
        sds((n, g), jnp.int32),
        sds((n, ctx), jnp.int32),
    )
    ps = runner.PAGE_SIZE
    pool = 1 + b * ctx // ps
    paged_fn = jax.jit(lambda q, kp, vp, t, qp: paged_attention(q, kp, vp, t, qp))
    paged_args = (
        sds((b, cfg.n_kv_heads, g, hd)),
        sds((cfg.n_kv_heads, pool, ps, hd)),
        sds((cfg.n_kv_heads, pool, ps, hd)),
        sds((b, ctx // ps), jnp.int32),
        sds((b, g), jnp.int32),
    )
    norm = jax.jit(lambda x, w: rms_norm(x, w, cfg.norm_eps))
    return [
        (f"kernel flash attention [{n}, {g}, {hd}] over {ctx}", flash, flash_args, None),
        (f"kernel paged attention [{b}, {cfg.n_kv_heads}, {g}, {hd}], {ctx // ps} pages", paged_fn, paged_args, None),
        (f"kernel rms norm [{max(8, b)}, {cfg.dim}]", norm, (sds((max(8, b), cfg.dim)), sds((cfg.dim,))), None),
    ]


def parallel_programs(s: Settings, tgt: Target, params: Params) -> list[tuple[str, Callable, tuple, dict | None]]:
    """On a slice of several devices: the decode step split by rows (data) and by heads (tensor), each as
    :class:`~jaxlab.engine.sharding.Sharded` builds it for a real mesh (the parameters shapes only)."""
    from jaxlab.engine.sharding import shard

    n = len(tgt.devices)
    if n < 2:
        return []
    out = []
    for strategy, mesh in (("data", f"data={n},model=1"), ("tensor", f"data=1,model={n}")):
        sharded = shard(params, mesh, strategy, devices=list(tgt.devices), cache_dtype=s.cache_dtype)
        batch = -(-s.batch // sharded.rows_multiple) * sharded.rows_multiple
        args = sharded.decode_args(batch, s.context)
        out.append((f"decode step [{batch}], {strategy}-parallel over {n} devices", sharded.decode_fn, args, None))
    return out


def extra_programs(s: Settings, tgt: Target, params: Params) -> list[tuple[str, Callable, tuple, dict | None]]:
    """The encoder's forward (retrieval) and the LoRA train step (fine-tuning) at their usual shapes."""
    from jaxlab.engine.encoder import BertConfig, init_encoder, sentence_embeddings
    from jaxlab.train import lora
    from jaxlab.train.step import TrainConfig, lora_build, optimizer, train_step

    one = NamedSharding(tgt.mesh(1), P())
    put = lambda tree: _placed(tree, one)  # noqa: E731
    enc = put(jax.eval_shape(lambda: init_encoder(BertConfig())))
    eb, et = 32, 128
    ids = put(jax.ShapeDtypeStruct((eb, et), jnp.int32))
    progs = [(f"encoder forward [{eb}, {et}]", jax.jit(sentence_embeddings), (enc, ids, ids), None)]
    if s.quant is None:
        lcfg, tcfg = lora.LoraConfig(), TrainConfig()
        adapter = jax.eval_shape(lambda p: lora.init_adapter(p, lcfg), params)
        opt = optimizer(tcfg)
        state = jax.eval_shape(opt.init, adapter)
        tb, tt, ta = tcfg.batch_size, 256, 64
        i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
        batch = dict(tokens=i32(tb, tt), positions=i32(tb, tt), at=i32(tb, ta), targets=i32(tb, ta))
        batch["weights"] = jax.ShapeDtypeStruct((tb, ta), jnp.float32)
        static = {"build": lora_build(lcfg), "opt": opt}
        args = (put(adapter), put(state), put(params), put(batch))
        progs.append((f"LoRA train step [{tb}, {tt}], rank {lcfg.rank}", train_step, args, static))
    return progs


# -- the whole set, and what it says ----------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    chip: str
    settings: Settings
    programs: list[Compiled]
    weights_bytes: int
    cache_bytes: int
    hbm_bytes: float | None  # the chip's, per device; None on a CPU
    seconds: float
    roofline: Any = None  # this CPU's measured ceilings, after measure()

    @property
    def refused(self) -> list[Compiled]:
        return [p for p in self.programs if not p.ok]

    @property
    def largest(self) -> Compiled | None:
        """The one-device program that holds the most bytes while it runs."""
        ok = [p for p in self.programs if p.ok and "parallel" not in p.name]
        return max(ok, key=lambda p: p.device_bytes, default=None)

    @property
    def fits(self) -> bool | None:
        big = self.largest
        return None if self.hbm_bytes is None or big is None else big.device_bytes <= self.hbm_bytes

    def as_json(self) -> dict:
        s = dataclasses.asdict(self.settings)
        s["config"] = self.settings.config.name
        rows = []
        for p in self.programs:
            row = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name not in ("executable", "args")}
            row["device_bytes"], row["moved_bytes"], row["padding"] = p.device_bytes, p.moved_bytes, p.padding
            rows.append(row)
        big = self.largest
        return {
            "chip": self.chip,
            "settings": s,
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.cache_bytes,
            "hbm_bytes": self.hbm_bytes,
            "largest_program": big.name if big else None,
            "fits": self.fits,
            "refused": len(self.refused),
            "cpu": hardware.cpu_name() if self.chip == "cpu" else None,
            "ceilings": None
            if self.roofline is None
            else {"bandwidth_bytes_per_s": self.roofline.bandwidth, "matmul_flops_per_s": self.roofline.peak_flops},
            "seconds": self.seconds,
            "programs": rows,
        }


#: Rough compile seconds for v5e-1 (2-core AMD EPYC), to start the longest first
_EXPECTED = {"LoRA train step": 74, "prefill chunk": 31, "encoder forward": 26}


def compile_all(
    s: Settings, chip: str, only: Callable[[str], bool] | None = None, progress=None, workers: int | None = None
) -> Report:
    """Compile the lab's programs (:func:`lab_programs`, :func:`kernel_programs`, :func:`parallel_programs`,
    :func:`extra_programs`; ``only`` picks by name) for ``chip``; ``progress(done, total, name)`` after each."""
    if not -1.0 <= s.effort <= 1.0:
        raise ConfigError(f"--effort must lie between -1 and 1 (XLA's exec_time_optimization_effort), got {s.effort}")
    t0 = time.perf_counter()
    tgt = target(chip)
    if s.attention == "pallas" and s.kv_cache == "int8":
        raise ConfigError("attention 'pallas' reads a float KV cache: drop --kv-cache int8, or use --attention xla")
    params = abstract_params(s)
    todo = lab_programs(s, tgt, params) + kernel_programs(s, tgt)
    todo += parallel_programs(s, tgt, params) + extra_programs(s, tgt, params)
    todo = [t for t in todo if only is None or only(t[0])]
    # XLA compiles outside Python's lock: a thread per core overlaps one program's compile with another's tracing
    # and compiling (the whole set for v5e-1 on 2 cores: 213 s one at a time)
    done = [0]
    lock = threading.Lock()

    def one(item):
        result = compile_one(*item[:4], tgt, s.effort)
        with lock:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(todo), item[0])
        return result

    longest_first = sorted(todo, key=lambda t: -_EXPECTED.get(t[0].split(" [")[0], 1))
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers or os.cpu_count() or 1, len(todo)))) as pool:
        by_name = {r.name: r for r in pool.map(one, longest_first)}
    out = [by_name[t[0]] for t in todo]
    cache = array_bytes(jax.eval_shape(lambda: init_cache(s.config, s.batch, s.context, s.cache_dtype)))
    return Report(chip, s, out, array_bytes(params), cache, tgt.device_hbm, time.perf_counter() - t0)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def _time(t: float | None) -> str:
    if t is None:
        return "-"
    return f"{t * 1e6:,.0f} us" if t < 1e-3 else f"{t * 1e3:,.2f} ms"


def format_report(r: Report) -> str:
    s = r.settings
    quant = (
        f"{s.quant}" + (f" g{s.group}" if s.quant == "int4" else "") + " weights, float32 compute" if s.quant else ""
    )
    kv = f", KV cache {s.kv_cache}" if s.kv_cache else ""
    head = (
        f"{s.config.name} ({quant or s.dtype}{kv}, attention {s.attention}"
        + (f", effort {s.effort:g}" if s.effort else "")
        + f") compiled for {r.chip}: batch {s.batch}, "
        f"context {s.context}; {len(r.programs)} programs in {r.seconds:.1f} s, {len(r.refused)} refused"
    )
    lines = [head, ""]
    cols = f"{'program':<52} {'compile':>8} {'on device':>11} {'padding':>8} {'GFLOP':>8} {'predicted':>10}  bound"
    lines.append(cols)
    for p in r.programs:
        if not p.ok:
            lines.append(f"{p.name:<52} REFUSED  {p.message}")
            continue
        pad = f"{p.padding:.2f}x" if p.padding else "-"
        extra = ""
        if p.collectives:
            extra = "  " + ", ".join(f"{v} {k}" for k, v in sorted(p.collectives.items()))
        if p.custom_calls.get("tpu_custom_call"):
            extra += f"  {p.custom_calls['tpu_custom_call']} Mosaic kernel calls"
        lines.append(
            f"{p.name:<52} {p.seconds:7.1f}s {_mb(p.device_bytes):>11} {pad:>8} {p.flops / 1e9:8.2f} "
            f"{_time(p.predicted_s):>10}  {p.bound}{extra}"
        )
    lines.append("")
    lines.append(
        f"weights {_mb(r.weights_bytes)}, KV cache {_mb(r.cache_bytes)} (batch {s.batch} x context {s.context})"
    )
    big = r.largest
    if r.hbm_bytes is None:
        lines.append(
            "this CPU: no published memory or peaks; predicted times need a chip (`jaxlab bench` measures this one)"
        )
    elif big is not None:
        verdict = "fits" if r.fits else "does NOT fit"
        lines.append(
            f"{verdict} {r.chip}'s {_mb(r.hbm_bytes)} per device: the largest program ({big.name}) holds "
            f"{_mb(big.device_bytes)} (arguments {_mb(big.argument_bytes)}, outputs {_mb(big.output_bytes - big.alias_bytes)} "
            f"beyond the donated cache, temporaries {_mb(big.temp_bytes)}, code {_mb(big.code_bytes)})"
        )
        lines.append(
            "predicted: max(FLOPs / peak, bytes moved / bandwidth) at the chip's published peaks, bytes moved = "
            "arguments + outputs (cost analysis's 'bytes accessed' is in --json, larger: every operand of every op)"
        )
    return "\n".join(lines)


def write_json(r: Report, path) -> None:
    with open(path, "w") as f:
        json.dump(r.as_json(), f, indent=1)


# -- predicted against measured, on this CPU -----------------------------------------------------------------------

#: The programs `jaxlab bench` times (the kernels run interpreted on a CPU, the train step is minutes per call)
MEASURED = ("prefill chunk", "decode step [", "rows decode", "rows prefill", "speculative")


def _concrete(tree):
    """Zeros of every abstract leaf (a key: key 0): a program's speed does not depend on the values."""

    def one(a):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            return jax.random.key(0)
        return jnp.zeros(a.shape, a.dtype)

    return jax.tree.map(one, tree)


def measure(report: Report, roofline, reps: int = 5, progress=None, matmul_n: int = 1024) -> None:
    """Time each compiled one-device program of a CPU report (best of ``reps`` calls, fresh arguments each,
    since the cache is donated) and predict it with this CPU's measured ceilings (``roofline``:
    :class:`jaxlab.tools.profile.Roofline`) the way a chip's published peaks predict it.

    A prediction is a lower bound only if the ceilings are the best this CPU reached *while the programs ran*:
    measured once beforehand, the matmul ceiling can land in a moment when a neighbouring process held a core,
    and a program timed in a quiet moment then beats its "bound". So an ``matmul_n``-square float32 matmul is
    timed beside every call of every program, and the report's ceiling is the best of those samples and
    ``roofline.peak_flops``."""
    todo = [p for p in report.programs if p.ok and p.name.startswith(MEASURED) and "parallel" not in p.name]
    probe = matmul_probe(matmul_n)
    peak = roofline.peak_flops
    for i, p in enumerate(todo):
        times = []
        for _ in range(reps + 1):  # the first call warms the caches and page-faults the outputs in
            args = jax.block_until_ready(_concrete(p.args))
            peak = max(peak, probe())
            t0 = time.perf_counter()
            jax.block_until_ready(p.executable(*args))
            times.append(time.perf_counter() - t0)
        p.measured_s = min(times[1:])
        if progress is not None:
            progress(i + 1, len(todo), p.name)
    report.roofline = dataclasses.replace(roofline, peak_flops=peak)
    for p in todo:
        t_compute, t_memory = p.flops / peak, p.moved_bytes / roofline.bandwidth
        p.predicted_s, p.bound = max(t_compute, t_memory), "compute" if t_compute > t_memory else "memory"


def format_measured(r: Report) -> str:
    rows = [p for p in r.programs if p.measured_s is not None]
    if not rows:
        return ""
    rf = r.roofline
    lines = [
        f"predicted against measured on this CPU ({hardware.cpu_name()}): ceilings measured now, "
        f"{rf.bandwidth / 1e9:.1f} GB/s (a 1 GiB copy) and {rf.peak_flops / 1e9:.0f} GFLOP/s "
        "(a float32 matmul, the best timed beside the programs)",
        f"{'program':<52} {'predicted':>10} {'measured':>10} {'measured/predicted':>19}  bound",
    ]
    for p in rows:
        lines.append(
            f"{p.name:<52} {_time(p.predicted_s):>10} {_time(p.measured_s):>10} "
            f"{p.measured_s / p.predicted_s:18.1f}x  {p.bound}"
        )
    return "\n".join(lines)


# -- the command: jaxlab compile ----------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument(
        "--chip", required=True, choices=CHIP_NAMES, help="the chip (a TPU slice compiles by libtpu here)"
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--model", default=None, help="smollm2-135m (default), smollm2-360m, or a .gguf file (only its header is read)"
    )
    src.add_argument(
        "--config",
        default=None,
        metavar="CONFIG_JSON",
        help="a Hugging Face config.json (no weights): any Llama-family size",
    )
    parser.add_argument(
        "--dtype", default=None, choices=("bfloat16", "float32"), help="default bfloat16 on a TPU, float32 on the CPU"
    )
    parser.add_argument(
        "--quant", default=None, choices=("int8", "int4", "w8a8"), help="quantized weights (computed in float32)"
    )
    parser.add_argument("--group-size", type=int, default=32, help="int4 group size (default 32)")
    parser.add_argument("--kv-cache", default=None, choices=("int8",), help="the int8 KV cache")
    parser.add_argument(
        "--attention", default="xla", choices=("xla", "pallas"), help="pallas: the kernels' TPU variants"
    )
    parser.add_argument(
        "--batch", type=int, default=8, help="rows of the decode step and slots of the engine (default 8)"
    )
    parser.add_argument("--context", type=int, default=1024, help="KV cache positions per row (default 1024)")
    parser.add_argument(
        "--only", default=None, metavar="TEXT", help="compile only the programs whose name contains TEXT"
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="write every figure as JSON")
    parser.add_argument(
        "--effort",
        type=float,
        default=0.0,
        help="the compiler's optimization effort, -1 to 1 (default 0): -1 compiles in about a third of the time, "
        "with the same FLOPs and bytes moved; the memory fit is the default's",
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="with --chip cpu: also run the programs jaxlab bench times and set the prediction (from this CPU's "
        "measured ceilings) beside the measured time",
    )


def model_config(model: str | None, config: str | None) -> LlamaConfig:
    """The config ``jaxlab compile`` compiles: a preset name, a GGUF file's header, or an HF ``config.json``."""
    from pathlib import Path

    from jaxlab.io import config as configs

    if config is not None:
        path = Path(config)
        try:
            hf = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"--config {config}: cannot read it as JSON ({e}); give a Hugging Face config.json"
            ) from None
        return configs.from_hf_config(hf, name=str(hf.get("_name_or_path") or path.parent.name or path.stem))
    if model is None or model.replace("-", "_") in configs.PRESETS:
        return configs.preset((model or "smollm2-135m").replace("-", "_"))
    from jaxlab.io.gguf import gguf_config, open_gguf

    return gguf_config(open_gguf(model))


def run(args, out) -> int:
    for name in ("batch", "context", "group_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    cfg = model_config(args.model, args.config)
    if args.context > cfg.max_seq_len:
        raise ConfigError(f"--context {args.context} exceeds the model's {cfg.max_seq_len} positions")
    if args.measure and args.chip != "cpu":
        raise ConfigError(f"--measure runs the programs, which needs the chip: use it with --chip cpu, not {args.chip}")
    dtype = args.dtype or ("float32" if args.chip == "cpu" else "bfloat16")
    s = Settings(
        cfg, dtype, args.quant, args.group_size, args.attention, args.batch, args.context, args.kv_cache, args.effort
    )
    only = (lambda name: args.only.lower() in name.lower()) if args.only else None
    import sys

    def progress(done, total, name):
        if sys.stderr.isatty():
            print(f"\r[{done}/{total}] {name[:60]:<60}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    report = compile_all(s, args.chip, only, progress)
    if args.measure:
        from jaxlab.tools.profile import Roofline

        measure(report, Roofline.measure(), progress=progress)
    print(format_report(report), file=out)
    if args.measure:
        print("\n" + format_measured(report), file=out)
    if args.json:
        write_json(report, args.json)
    return 1 if report.refused else 0


__all__ = [
    "CHIP_NAMES",
    "Compiled",
    "Report",
    "Settings",
    "Target",
    "abstract_params",
    "add_arguments",
    "model_config",
    "run",
    "compile_all",
    "compile_one",
    "format_measured",
    "format_report",
    "measure",
    "kernel_programs",
    "lab_programs",
    "parallel_programs",
    "target",
    "write_json",
]
