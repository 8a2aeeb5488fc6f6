"""Process settings of the host CPU that the training step's speed depends on.

glibc's ``malloc`` serves blocks above its mmap threshold (128 KiB, raised dynamically up to 32 MiB)
with fresh ``mmap`` pages and gives freed memory at the top of its heap back to the system. A CPU
training step allocates and frees the same tens of megabytes of activations every step, so each step
pays for the kernel zeroing and page-faulting those pages again: on this project's 2-core machine
about 7-12% of the MoCo v3 ``vit_micro`` step (``benchmarks/levers.py``, glibc's own allocator vs
this one; README "Training speed"). ``cache_freed_memory`` makes glibc keep them for reuse instead,
which is what tcmalloc or jemalloc (the usual ``LD_PRELOAD`` advice for PyTorch on CPUs) do.
The numbers computed are unchanged: only where the memory comes from.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h) and the values applied.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 256 << 20  # blocks below this come from the heap, which keeps them once freed
TRIM_THRESHOLD = 1 << 30  # free memory kept at the top of the heap before any is given back
TOP_PAD = 64 << 20  # the heap grows by this much more than asked, in fewer system calls

_applied: dict[str, int] | None = None


def _glibc():
    """The C library if it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (musl and macOS's libc have no such symbol)
        return libc
    except (OSError, AttributeError):
        return None


def cache_freed_memory() -> dict[str, int] | None:
    """Have glibc keep freed blocks up to 256 MiB in the heap for reuse (idempotent, process-wide).

    Returns the settings applied, or None where the C library is not glibc (nothing is changed there).
    """
    global _applied
    if _applied is not None:
        return _applied
    libc = _glibc()
    if libc is None:
        return None
    settings = {"M_MMAP_THRESHOLD": (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, TRIM_THRESHOLD), "M_TOP_PAD": (M_TOP_PAD, TOP_PAD)}
    _applied = {name: value for name, (param, value) in settings.items() if libc.mallopt(param, value) == 1}
    return _applied

