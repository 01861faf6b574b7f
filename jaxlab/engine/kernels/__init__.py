"""Kernels: Pallas kernels behind the model's attention switch (``Policy(attention="pallas")``, ``--attention
pallas``), and jaxlab's own CPU kernels behind XLA:CPU's few-row steps.

* :mod:`~jaxlab.engine.kernels.common` — where a kernel runs (TPU, GPU/Triton, interpret mode), the
  online-softmax update (both attention kernels and the XLA path over pages use it), and lowering or compiling for a chip
  that is not attached (``compiling_for``);
* :mod:`~jaxlab.engine.kernels.rmsnorm` — a first kernel: grid, ``BlockSpec`` and refs on something small;
* :mod:`~jaxlab.engine.kernels.flash` — flash attention over the contiguous cache (prefill, and decode with it);
* :mod:`~jaxlab.engine.kernels.paged_attention` — ragged paged attention over the paged cache, each row
  reading only its own pages (scalar-prefetched page table on TPU, a loop over pages on GPU);
* :mod:`~jaxlab.engine.kernels.deltanet` — Gated DeltaNet (Qwen3.5's linear attention) in chunks, the state
  carried across the chunk axis in VMEM;
* :mod:`~jaxlab.engine.kernels.cpu` — C++ through the XLA FFI (sources in ``cc/``, built on first use): the int8 and
  float32 products of a decode step's few rows, and attention for a few queries a row through the page table or over
  the contiguous cache's float32 slots, used where a program is lowered for a CPU that has AVX-512 VNNI
  (``jax.lax.platform_dependent``), XLA's code everywhere else, and under ``jax.vmap`` and differentiation.

Each kernel equals its XLA reference, the model's attention or the engine's delta rule (tests/engine/kernels). On a
CPU the Pallas kernels run in interpret mode: correct, and slow (each grid point is one step of a loop; nothing is
fused across them).
"""

from jaxlab.engine.kernels.common import compiling_for, lower, variant_for
from jaxlab.engine.kernels.deltanet import gated_delta_pallas
from jaxlab.engine.kernels.flash import flash_attention
from jaxlab.engine.kernels.paged_attention import paged_attention
from jaxlab.engine.kernels.rmsnorm import rms_norm

__all__ = [
    "compiling_for",
    "flash_attention",
    "gated_delta_pallas",
    "lower",
    "paged_attention",
    "rms_norm",
    "variant_for",
]
