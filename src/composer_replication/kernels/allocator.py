"""Keep freed chunk tiles from lingering in glibc's heap (CPU only, Linux/glibc only).

The chunked and fused losses allocate and free the same few (chunk, V) tiles (16–40 MiB each) once per
chunk. glibc serves blocks above ``M_MMAP_THRESHOLD`` with ``mmap`` and returns them on ``free``, but
its threshold is *dynamic*: the first time an mmapped block is freed, the threshold rises to that
block's size (up to 32 MiB), so every later tile comes from the heap, where fragmentation keeps
freed tiles resident. Measured (B=2, T=128, V=151936, fused GJSD, see
docs/benchmarks/largevocab.md): 1.00 GiB above inputs with the dynamic threshold, 0.73 GiB with a
fixed one, of which 0.51 GiB is the head's weight gradient.

`pin_mmap_threshold` fixes the threshold (``mallopt(M_MMAP_THRESHOLD, …)``, which also disables
the dynamic adjustment), once per process, the first time a chunked/fused loss runs. The setting
is process-wide: large blocks are then always mmapped and unmapped, which costs page faults (a few
percent of these losses' CPU time) and returns memory to the OS promptly. Set
``COMPOSER_REPLICATION_MALLOC_TUNE=0`` to leave the allocator alone (e.g. under jemalloc/tcmalloc,
where it does nothing anyway).
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["pin_mmap_threshold"]

_M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
_DEFAULT_THRESHOLD = 4 * 2**20
_done = False


def pin_mmap_threshold(threshold_bytes: int = _DEFAULT_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (once per process). Returns True when the setting was applied now."""
    global _done
    if _done:
        return False
    _done = True
    if not sys.platform.startswith("linux") or os.environ.get("COMPOSER_REPLICATION_MALLOC_TUNE") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
