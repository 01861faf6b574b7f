"""What the kernels share: where they run, the online-softmax update, and lowering for a chip that is not here.

Pallas writes one kernel body in JAX and lowers it three ways:

* **TPU** (Mosaic): blocks are copied from HBM into VMEM by a pipeline the grid drives; small integer arrays
  (a page table) can be *scalar-prefetched* into SMEM before the grid starts, so block index maps can read them;
  block shapes' last two dimensions must be multiples of (8, 128) or the whole array dimension.
* **GPU** (Triton): each grid point is one program on the GPU, all running at once (no grid axis is
  sequential, so a reduction loops inside the kernel); block and value shapes must be powers of two.
* **interpret**: the body run as ordinary JAX operations, on any backend (the CPU here). It checks the
  logic, not the speed: every grid point becomes one step of a loop on the host device.

:func:`online_softmax` is the flash-attention trick: a softmax over keys read a block at a time, keeping a running
maximum ``m``, a running sum ``total`` and an unnormalised output ``acc``. It is the one copy of that update: both
attention kernels fold their blocks with it (through :func:`online_update`, which adds the block's scores and mask),
and so does the XLA path over pages (:func:`jaxlab.engine.paged.read_pages`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp

MASK_VALUE = -1e30  # a hidden key's score wherever attention is computed; finite, so no NaN where none is seen
VARIANTS = ("tpu", "gpu")
MIN_DOT = 16  # the smallest matrix dimension Triton's tl.dot takes: GPU blocks are padded up to it
#: The chip a TPU kernel is lowered for when no TPU is attached (Colab's free TPU today)
TPU_KIND = "TPU v5 lite"


#: Pallas lowers the kernels' GPU variant through Triton (``compiler_params``: Triton's parameters; jax 0.10's
#: default GPU lowering, Mosaic GPU, is for Hopper and later), which needs compute capability 8.0 (Ampere, A100)
#: or later; Colab's T4 is 7.5.
PALLAS_MIN_COMPUTE_CAPABILITY = (8, 0)


def compute_capability(device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, from ``device.compute_capability`` ("8.0"); None when the device
    has no such attribute (ROCm, a CPU, an older jaxlib) or it does not parse."""
    raw = getattr(device, "compute_capability", None)
    try:
        major, minor = (str(raw).split(".") + ["0"])[:2]
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def gpu_too_old(device) -> str | None:
    """Why the kernels cannot compile on ``device`` (a GPU below :data:`PALLAS_MIN_COMPUTE_CAPABILITY`, or one
    that does not say), or None: a TPU, a CPU, or a recent GPU."""
    if getattr(device, "platform", "") not in ("gpu", "cuda", "rocm"):
        return None
    cc = compute_capability(device)
    if cc is not None and cc >= PALLAS_MIN_COMPUTE_CAPABILITY:
        return None
    said = getattr(device, "compute_capability", None) or "no compute capability"
    return f"this GPU reports {said}, and Pallas's Triton kernels need compute capability 8.0 (A100 or later)"


#: The platform programs are being built for when it is not this process's backend (:func:`compiling_for`).
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxlab_kernel_target", default=None)


@contextlib.contextmanager
def compiling_for(platform: str):
    """Trace the kernels for ``platform`` ("tpu", "gpu") instead of this process's backend: a program compiled
    for a TPU that is not attached (:mod:`jaxlab.bench.chip_compile`) must hold the TPU variant, lowered through
    Mosaic, not the variant this CPU would interpret."""
    token = _TARGET.set(platform)
    try:
        yield
    finally:
        _TARGET.reset(token)


def variant_for(backend: str | None = None) -> tuple[str, bool]:
    """(kernel variant, interpret?) for a backend (default: the one :func:`compiling_for` names, else JAX's): a
    TPU runs the TPU variant compiled, a GPU the GPU (Triton) variant compiled, anything else the GPU variant in
    interpret mode (fewer grid steps than the TPU variant's page-by-page grid, so it simulates faster)."""
    target = backend or _TARGET.get()
    backend = (target or jax.default_backend()).lower()
    if backend == "tpu":
        return "tpu", False
    if backend in ("gpu", "cuda", "rocm"):
        why = None if target else gpu_too_old(jax.devices()[0])
        if why is not None:  # a T4: the same kernel, interpreted (correct, slow) instead of a Triton error
            import warnings

            from jaxlab.errors import FallbackWarning

            warnings.warn(f"{why}: the kernels run in interpret mode (correct, slow)", FallbackWarning, stacklevel=3)
            return "gpu", True
        return "gpu", False
    return "gpu", True


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return variant


def matmul_precision(dtype, precision=None):
    """The kernels' matmul precision: ``precision`` (default HIGHEST: float32 matmuls in full float32) for float32
    inputs; DEFAULT for narrower ones (bfloat16), where HIGHEST asks for float32 passes that Mosaic has no lowering
    for (it refuses the kernel: "Bad lhs type", measured with ``jaxlab compile --chip v5e-1``) and a bfloat16
    product summed in float32 is the same at DEFAULT."""
    if jnp.dtype(dtype) != jnp.float32:
        return jax.lax.Precision.DEFAULT
    return jax.lax.Precision.HIGHEST if precision is None else precision


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


#: XLA:CPU sums the rows of an array of fewer elements than this in another order than the rows of a larger one
#: (measured on jax 0.10.2: rows of 576 sum alike in 8 rows or more, not in 7), so a decode row's norms and softmax,
#: and then its tokens, would depend on how many rows ran beside it (benchmarks/NOTES.md section 14).
ALIKE_ELEMENTS = 4096


def rows_alike(fn, x):
    """``fn`` (a function of each row of ``x [..., S]`` along its last axis: a norm, a softmax) computed as XLA:CPU
    computes it for an array of at least :data:`ALIKE_ELEMENTS` elements: a smaller ``x`` gets copies of zeros beside
    it (a new leading axis, so rows split over devices move nothing), which ``fn`` computes and this drops again. So a
    row's result is the same bits whether it ran alone or beside others: what lets the engine decode in small row
    buckets and stay batch-invariant. The whole function runs on the copies, not only its sum: XLA:CPU also emits the
    element-wise work around a small reduction differently. Symbolic shapes (``jax.export``) run as they are."""
    if not all(isinstance(d, int) for d in x.shape) or x.size >= ALIKE_ELEMENTS:
        return fn(x)
    copies = -(-ALIKE_ELEMENTS // max(x.size, 1))
    return fn(jnp.pad(x[None], ((0, copies - 1),) + ((0, 0),) * x.ndim))[0]


#: The softmaxes the XLA paths compute through :func:`rows_alike` (attention's, and the engine's logprobs).
SOFTMAX = functools.partial(jax.nn.softmax, axis=-1)
LOG_SOFTMAX = functools.partial(jax.nn.log_softmax, axis=-1)


def row_sum(x):
    return jnp.sum(x, axis=-1, keepdims=True)


def online_softmax(m, total, acc, s, values, visible=None, alike: bool = False):
    """Fold one block of scores into a running softmax: the update itself, whatever computed the scores.

    s [..., Q, K] float32 scores (hidden keys already at :data:`MASK_VALUE`); m, total [..., Q, 1] and acc
    [..., Q, D] float32 the running maximum, sum and unnormalised output; ``values(p)`` the block's weights p
    [..., Q, K] times its values -> [..., Q, D]. Returns the new (m, total, acc); the output is ``acc / total`` once
    every block is in. A block that raises the maximum rescales what came before by ``exp(m_old - m_new)``.
    With ``visible`` [..., Q, K], a hidden key's weight is exactly 0, so a query that sees nothing in the block
    adds nothing (the kernels); without it a hidden key weighs ``exp(MASK_VALUE - m)``: 0 once the query has
    seen a key, 1 while it has seen none, which the first visible key's rescaling then wipes out. ``alike``: the
    block's sum as :func:`rows_alike` computes it (the XLA path; a kernel body keeps its own shapes)."""
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - m_new)
    if visible is not None:
        p = jnp.where(visible, p, 0.0)
    corr = jnp.exp(m - m_new)
    block_sum = rows_alike(row_sum, p) if alike else row_sum(p)
    return m_new, total * corr + block_sum, acc * corr + values(p)


def online_update(m, total, acc, q, k, v, visible, *, scale: float, dtype, precision, v_transposed: bool = False):
    """One block of keys folded into a running softmax, as the kernels see it: the block's scores, the mask, then
    :func:`online_softmax`.

    q [Q, D], k [K, D], v [K, D] (or [D, K] with ``v_transposed``), visible [Q, K] bool; m, total [Q, 1] and
    acc [Q, D] float32 -> the new (m, total, acc)."""
    s = jax.lax.dot_general(
        q.astype(dtype),
        k.astype(dtype),
        (((1,), (1,)), ((), ())),
        precision=precision,
        preferred_element_type=jnp.float32,
    )  # [Q, K]
    s = jnp.where(visible, s * scale, MASK_VALUE)
    contract = (((1,), (1,)), ((), ())) if v_transposed else (((1,), (0,)), ((), ()))

    def values(p):  # [Q, K] -> [Q, D]
        return jax.lax.dot_general(
            p.astype(dtype), v.astype(dtype), contract, precision=precision, preferred_element_type=jnp.float32
        )

    return online_softmax(m, total, acc, s, values, visible)


def reference_attention(q, k, v, q_pos, k_pos):
    """What the kernels compute, as ``jnp`` operations XLA compiles (the model's formula: scores, the position rule,
    softmax, values): q [N, Q, D] at q_pos [N, Q] over k, v [N, S, D] at k_pos [N, S] -> [N, Q, D]. The baseline of
    ``jaxlab bench --kernels`` and of notebook 13."""
    s = jnp.einsum("nqd,nsd->nqs", q, k, precision="highest") * q.shape[-1] ** -0.5
    visible = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])
    p = jax.nn.softmax(jnp.where(visible, s, MASK_VALUE), axis=-1)
    return jnp.einsum("nqs,nsd->nqd", p, v, precision="highest")


def finish(total, acc):
    """acc / total, and 0 where a query saw no key at all (total = 0: a padding query)."""
    return jnp.where(total > 0, acc / jnp.where(total > 0, total, 1.0), 0.0)


def compiler_params(variant: str):
    """What ``pallas_call`` needs to pick the lowering: Triton's parameters on a GPU (jax's default GPU
    lowering is Mosaic GPU, for Hopper and later), Mosaic's on a TPU."""
    if variant == "gpu":
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=4, num_stages=2)
    return None


@contextlib.contextmanager
def lowering_for(platform: str):
    """Lower for a chip that is not attached: a TPU kernel's lowering asks the device for its kind (VMEM size,
    tiling), so an abstract TPU device (:data:`TPU_KIND`) stands in; a GPU kernel lowers to Triton IR without one."""
    if platform == "tpu":
        from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

        mesh = AbstractMesh(
            (1,),
            ("x",),
            (AxisType.Explicit,),
            abstract_device=AbstractDevice(device_kind=TPU_KIND, num_cores=1, platform="tpu"),
        )
        with use_abstract_mesh(mesh):
            yield
    else:
        yield


def lower(fn, platform: str, *args) -> str:
    """The StableHLO text of ``fn(*args)`` (arrays or ``jax.ShapeDtypeStruct``) exported for ``platform``
    ("tpu" or "cuda") from this machine: proof that a kernel lowers there, without the chip. The kernel's
    custom call (``tpu_custom_call`` or Triton's) is in the text."""
    from jax import export

    checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")] if platform == "cuda" else []
    with lowering_for(platform):
        exported = export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args)
    return exported.mlir_module()
