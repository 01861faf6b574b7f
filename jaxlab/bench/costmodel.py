"""What each measured time is compared with: the FLOPs and bytes a step must cost (the model count), the
machine's ceilings measured in the same run (:class:`Ceilings`), the chip's published peaks, and the
roofline percentages that follow (:func:`add_rooflines`). KV-cache bytes come from the engine's one
formula, :func:`jaxlab.engine.kvcache.cache_bytes`."""

from __future__ import annotations

from jaxlab.bench.options import Options
from jaxlab.engine.kvcache import cache_bytes


def bandwidth_roofline_pct(bytes_per_step: float, step_seconds: float, bandwidth: float) -> float:
    """Achieved bandwidth as % of the ceiling: bytes read per step / step time / bandwidth x 100."""
    return 100.0 * bytes_per_step / step_seconds / bandwidth


def measure_read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float | None:
    """Bytes/s of the best of ``repeats`` reads of a float32 array of ``nbytes`` (1 GiB: far beyond any cache) by
    jaxlab's CPU kernel threads (:func:`jaxlab.engine.kernels.cpu.read_sum`: each thread sums its chunks front to
    back), the array placed as the weights are (:func:`jaxlab.engine.hugepages.put`: 2 MB pages where the host gives
    them). What a decode step, which reads its weights and writes almost nothing, can at most stream. None where
    the kernels do not run (another backend or CPU: the copy's bandwidth is the only ceiling there)."""
    import jax
    import numpy as np

    from jaxlab.engine import hugepages
    from jaxlab.engine.kernels import cpu as cpu_kernels
    from jaxlab.tools import profile

    if jax.default_backend() != "cpu" or not cpu_kernels.status().available:
        return None
    x = hugepages.put(np.ones(max(1, nbytes // 4), np.float32))
    timing = profile.time_fn(jax.jit(cpu_kernels.read_sum), x, repeats=max(1, repeats))  # compile, a first read
    return x.nbytes / timing.min


def compute_pct(flops: float, seconds: float, peak_flops: float) -> float:
    """Achieved FLOP/s as % of the matmul ceiling."""
    return 100.0 * flops / seconds / peak_flops


def published_peaks(chip) -> dict | None:
    """A :class:`jaxlab.tools.hardware.Chip`'s datasheet peaks per jax device, as the report stores them (None: no chip)."""
    if chip is None:
        return None
    return {
        "chip": chip.name,
        "flops_per_s": chip.device_peak_flops,
        "dtype": chip.peak_dtype,
        "bandwidth_bytes_per_s": chip.device_bandwidth,
        "devices_per_chip": chip.devices_per_chip,
        "source": chip.source,
    }


def matmul_params(cfg) -> tuple[int, int]:
    """(weights multiplied per token in the decoder layers, weights of the output head)."""
    per_layer = cfg.dim * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * cfg.dim * cfg.ffn_dim
    return cfg.n_layers * per_layer, cfg.vocab_size * cfg.dim


def attention_flops(cfg, batch: int, tokens: int, context_before: int) -> float:
    """FLOPs of causal attention (QK^T and PV, 2 x head_dim each per query-key pair) for ``tokens``
    new tokens per row after ``context_before`` cached ones: query i sees context_before + i + 1 keys."""
    keys = tokens * context_before + tokens * (tokens + 1) / 2
    return 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * batch * keys


def prefill_flops(cfg, batch: int, prompt_len: int) -> float:
    """Model FLOPs of a prefill: 2 x layer weights x tokens + causal attention + the output head for the
    last position only (what ``last_only`` computes)."""
    layer_w, head_w = matmul_params(cfg)
    return 2.0 * layer_w * batch * prompt_len + 2.0 * head_w * batch + attention_flops(cfg, batch, prompt_len, 0)


def prefill_bytes(weight_bytes: float, cfg, batch: int, prompt_len: int, kv: str = "float32") -> float:
    """Bytes a prefill must move at least: every weight once + the K/V it writes for the prompt."""
    return float(weight_bytes + cache_bytes(cfg, batch, prompt_len, kv))


def decode_context(prompt_len: int, new_tokens: int) -> float:
    """Mean number of keys a decode step attends to: step j (1..N-1) sees prompt_len + j keys."""
    return prompt_len + new_tokens / 2.0


def decode_step_flops(cfg, batch: int, context: float) -> float:
    """Model FLOPs of one decode step (one token per row) at a mean context of ``context`` keys."""
    layer_w, head_w = matmul_params(cfg)
    return 2.0 * (layer_w + head_w) * batch + 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * batch * context


def decode_step_bytes(weight_bytes: float, cfg, batch: int, context: float, kv: str = "float32") -> float:
    """Bytes a decode step must read: every weight once + the K/V of the ``context`` tokens of each row,
    in a ``kv`` ("float32" / "int8") cache."""
    return float(weight_bytes + cache_bytes(cfg, batch, context, kv))


def estimate_seconds(opts: Options, peak_flops: float, weight_bytes: float, n_params: float) -> float:
    """A rough run-time estimate (printed up front): FLOPs at ~40 % of the matmul ceiling, a decode step no
    faster than the weights at an assumed 10 GB/s, the peer ~1.5x our time, plus fixed costs."""
    eff = 0.4 * peak_flops
    n, p, reps = opts.new_tokens, opts.prompt_len, opts.reps
    total = 15.0  # load model, ceilings
    impls = 2.5 if opts.peer else 1.0  # ours + peer
    variants = (1 + len(opts.quant_formats)) * len(opts.quant_kv)
    if opts.quant:  # a compile per program; quantized steps taken as twice float32's (int4 is slower)
        for b in opts.quant_batch_sizes:
            step = max(weight_bytes / 10e9, 2 * n_params * b / eff)
            total += variants * (5.0 + (max(reps, 5) + 1) * opts.quant_steps * 2 * step)
    if opts.quality:  # measured on 2 busy cores: ~20-60 s per variant at the default sizes
        total += 20.0 + variants * (15.0 if opts.quick else 45.0)
    if not opts.float:
        return total
    for b in opts.batch_sizes:
        step = max(weight_bytes / 10e9, 2 * n_params * b / eff)
        run = (n - 1) * step + 2 * n_params * b * p / eff
        total += 10.0 + (reps + 0.2) * run * impls  # compile + warm-up + reps
    total += (reps + 1) * 2 * n_params * p / eff * impls  # prefill
    if opts.stages:
        step1 = max(weight_bytes / 10e9, 2 * n_params / eff)
        total += 30.0 + reps * (
            opts.eager_steps * 0.5 + opts.nocache_steps * 2 * n_params * (p + n) / eff + 3 * (n - 1) * step1
        )
    if opts.peer:
        total += 25.0  # load the peer
    if opts.ttft:
        total += reps * 2 * 15.0
    return total


class Ceilings:
    """This machine's ceilings, sampled a few times during a run; the ceiling is the best sample.

    Each sample is the best of max(3, reps) synchronized runs of :func:`jaxlab.tools.profile.measure_bandwidth`
    (a donated x + 1 copy) or :func:`~jaxlab.tools.profile.measure_matmul_flops` (float32 and bfloat16)."""

    METHOD = (
        "each sample is the best of max(3, reps) synchronized runs; samples are taken at the start, after "
        "the compile warm-up and at the end of the run, and the ceiling is the largest (the best this machine "
        "showed during the run); bandwidth = (read + write bytes) / time of a donated x + 1 over float32 x; "
        "read bandwidth (CPU, with jaxlab's kernels) = bytes / time of the best of 5 reads of the same size by the "
        "kernels' threads, the array in 2 MB pages where the host gives them (measure_read_bandwidth); "
        "compute = 2 n^3 / time of an n x n float32 matmul at Precision.HIGHEST (and the same in bfloat16, "
        "float32 accumulation: what accelerators publish their peaks in; XLA:CPU computes it in float32); "
        "published = the chip's datasheet peaks per jax device (jaxlab.tools.hardware), None on a CPU"
    )

    def __init__(self, opts: Options):
        self.copy_bytes = opts.bandwidth_mib << 20
        self.n = opts.matmul_n
        self.repeats = max(3, opts.reps)
        self.bandwidth: list[float] = []
        self.read: list[float] = []
        self.matmul: list[float] = []
        self.matmul_bf16: list[float] = []

    def sample_matmul(self) -> float:
        from jaxlab.tools import profile

        self.matmul.append(profile.measure_matmul_flops(self.n, repeats=self.repeats))
        return self.matmul[-1]

    def sample_all(self) -> None:
        """One sample of each: bandwidth, float32 matmul, bfloat16 matmul (in this order)."""
        import jax.numpy as jnp

        from jaxlab.tools import profile

        self.bandwidth.append(profile.measure_bandwidth(self.copy_bytes, repeats=self.repeats))
        read = measure_read_bandwidth(self.copy_bytes, repeats=max(5, self.repeats))
        if read is not None:
            self.read.append(read)
        self.sample_matmul()
        self.matmul_bf16.append(profile.measure_matmul_flops(self.n, jnp.bfloat16, repeats=self.repeats))

    def result(self, chip) -> dict:
        """The ``"ceilings"`` part of the report (``chip``: :func:`jaxlab.tools.hardware.chip_for`'s answer)."""
        return {
            "bandwidth_bytes_per_s": max(self.bandwidth),
            "bandwidth_samples": self.bandwidth,
            "bandwidth_copy_bytes": self.copy_bytes,
            "read_bandwidth_bytes_per_s": max(self.read) if self.read else None,
            "read_bandwidth_samples": self.read,
            "matmul_flops_per_s": max(self.matmul),
            "matmul_samples": self.matmul,
            "matmul_n": self.n,
            "ridge_flop_per_byte": max(self.matmul) / max(self.bandwidth),
            "matmul_bf16_flops_per_s": max(self.matmul_bf16),
            "matmul_bf16_samples": self.matmul_bf16,
            "published": published_peaks(chip),
            "method": self.METHOD,
        }


def add_rooflines(res: dict, ceilings: dict) -> None:
    """Fill in the ceiling-relative numbers of the prefill and decode results (after the ceilings are final)."""
    from jaxlab.tools.profile import Roofline

    bw, peak = ceilings["bandwidth_bytes_per_s"], ceilings["matmul_flops_per_s"]
    pub = ceilings.get("published")
    roof = Roofline(bw, peak)
    pre = res["prefill"]
    pre["matmul_ceiling_pct"] = compute_pct(pre["flops_model"], pre["ours_s"]["median"], peak)
    pre["peer_matmul_ceiling_pct"] = (
        compute_pct(pre["flops_model"], pre["peer_s"]["median"], peak) if pre["peer_s"] else None
    )
    pre["published_flops_pct"] = (
        compute_pct(pre["flops_model"], pre["ours_s"]["median"], pub["flops_per_s"]) if pub else None
    )
    for d in res["decode"]:
        step_s = d["ours_step_s"]["median"]
        nbytes, flops = d["bytes_per_step"], d["flops_per_step"]
        d["bw_roofline_pct"] = bandwidth_roofline_pct(nbytes, step_s, bw)
        d["roofline_bound"] = roof.bound(flops, nbytes)
        d["roofline_pct"] = 100.0 * roof.fraction(flops, nbytes, step_s)
        d["published_bw_pct"] = bandwidth_roofline_pct(nbytes, step_s, pub["bandwidth_bytes_per_s"]) if pub else None


def add_quant_rooflines(rows: list[dict], ceilings: dict) -> None:
    """The same for the quantized decode rows (measured bandwidth, and the published one on a known chip)."""
    pub = ceilings["published"]
    for r in rows:
        step_s = r["step_s"]["median"]
        r["bw_roofline_pct"] = bandwidth_roofline_pct(r["bytes_per_step"], step_s, ceilings["bandwidth_bytes_per_s"])
        read = ceilings.get("read_bandwidth_bytes_per_s")
        r["read_roofline_pct"] = bandwidth_roofline_pct(r["bytes_per_step"], step_s, read) if read else None
        r["published_bw_pct"] = (
            bandwidth_roofline_pct(r["bytes_per_step"], step_s, pub["bandwidth_bytes_per_s"]) if pub else None
        )
