"""The weights in 2 MB pages: placing host arrays where a CPU decode step reads them fastest.

A decode step on a CPU reads every weight once per token (540 MB for SmolLM2-135M in float32, 140 MB in int8).
Linux backs a process's memory with 4 KB pages unless asked otherwise, so such a read crosses 135,000 pages, each
a TLB entry to look up; with 2 MB pages it crosses 270. Transparent huge pages in "madvise" mode (most
distributions' default; ``/sys/kernel/mm/transparent_hugepage/enabled``) give 2 MB pages to memory that asks for
them before it is first touched. XLA's CPU allocator does not ask, so :func:`put` does: it copies the arrays into
one region mapped for them (each array 4 KB-aligned, the region 2 MB-aligned, ``madvise(MADV_HUGEPAGE)`` before the
copy touches it) and places views of that region with ``jax.device_put``, which on a CPU takes an aligned host
array as it is: no second copy (the arrays' buffers *are* the region), and the arrays are uncommitted, as
``device_put``'s always are. The same bytes, so the same results; what changes is how fast a step streams them
(benchmarks/NOTES.md 30).

Where it does not apply, :func:`put` is ``jax.device_put``: another backend or OS, transparent huge pages "never",
``JAXLAB_HUGE_PAGES=0``, fewer than 2 MB of arrays (a test's tiny model), or an array on a device other than the
default one. :func:`status` says which; :func:`huge_page_bytes` how much of this process's memory the kernel holds
in 2 MB pages, :func:`mapping_of` how much of one array's mapping (the kernel may give fewer than asked when free
memory is fragmented).
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

ENV = "JAXLAB_HUGE_PAGES"
HUGE = 2 << 20  # the x86-64 / arm64 transparent huge page
ALIGN = 4096  # each array's offset in the region
MIN_BYTES = HUGE  # below this, one region would be mostly padding: device_put
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class HugePageStatus:
    """Whether :func:`put` maps arrays into 2 MB pages in this process, and why (not)."""

    available: bool
    reason: str


@functools.cache
def status() -> HugePageStatus:
    """Whether :func:`put` maps host arrays into 2 MB pages in this process (decided once), and why (not)."""
    if os.environ.get(ENV, "1") == "0":
        return HugePageStatus(False, f"{ENV}=0")
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return HugePageStatus(False, f"transparent huge pages are a Linux feature (this is {sys.platform})")
    if jax.default_backend() != "cpu":
        return HugePageStatus(False, f"the arrays live on the {jax.default_backend()}, not in host memory")
    try:
        mode = re.search(r"\[(\w+)\]", THP.read_text()).group(1)
    except (OSError, AttributeError):
        return HugePageStatus(False, f"{THP} is unreadable: this kernel has no transparent huge pages")
    if mode == "never":
        return HugePageStatus(False, f"transparent huge pages are off ({THP}: never)")
    return HugePageStatus(True, f"weights mapped into 2 MB pages (transparent huge pages: {mode})")


def huge_page_bytes() -> int | None:
    """Bytes of this process's anonymous memory in 2 MB pages (``AnonHugePages``), or None where unreadable."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return None
    found = re.search(r"AnonHugePages:\s+(\d+) kB", text)
    return int(found.group(1)) * 1024 if found else None


def mapping_of(array) -> dict[str, int] | None:
    """The memory mapping that holds ``array``'s buffer, as ``/proc/self/smaps`` describes it: its ``size``, the
    bytes of it in 2 MB pages (``huge``) and whether it asked for them (``advised``: ``madvise(MADV_HUGEPAGE)``);
    None where unreadable. (A region :func:`put` made is one mapping; the process's total, :func:`huge_page_bytes`,
    also moves with every other allocation. On a busy machine the kernel may grant only part of a region.)"""
    ptr = array.unsafe_buffer_pointer()
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(None, 1)[0].split("-"))
        if lo <= ptr < hi:
            huge = re.search(r"AnonHugePages:\s+(\d+) kB", block)
            flags = re.search(r"VmFlags:([^\n]*)", block)
            advised = bool(flags) and "hg" in flags.group(1).split()
            return {"size": hi - lo, "huge": int(huge.group(1)) * 1024 if huge else 0, "advised": advised}
    return None


def _movable(leaf) -> bool:
    """A host array: numpy, or a jax array on the default CPU device."""
    if isinstance(leaf, jax.Array):
        return not leaf.is_deleted() and leaf.devices() == {jax.devices()[0]} and leaf.nbytes >= ALIGN
    return isinstance(leaf, np.ndarray) and leaf.nbytes >= ALIGN


def put(tree):
    """``jax.device_put(tree)``, with the host arrays (numpy, or jax arrays on the default CPU device) copied into
    one region in 2 MB pages first, so that the placed arrays are views of it. Other leaves are placed as they are."""
    leaves, treedef = jax.tree.flatten(tree)
    picked = [i for i, leaf in enumerate(leaves) if _movable(leaf)] if status().available else []
    offsets, total = {}, 0
    for i in picked:
        offsets[i] = total
        total += -(-leaves[i].nbytes // ALIGN) * ALIGN
    if total < MIN_BYTES:
        return jax.device_put(tree)
    region = mmap.mmap(-1, total + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, np.uint8)
    start = -whole.ctypes.data % HUGE  # the first 2 MB boundary: madvise wants page-aligned spans
    region.madvise(mmap.MADV_HUGEPAGE, start, total)
    staged = list(leaves)
    for i in picked:
        src = np.asarray(leaves[i])
        view = whole[start + offsets[i] : start + offsets[i] + src.nbytes].view(src.dtype).reshape(src.shape)
        np.copyto(view, src)
        staged[i] = view  # device_put keeps it (and through it the region) alive as long as the jax array
    return jax.tree.unflatten(treedef, jax.device_put(staged))
