"""The C heap's bytes in use, for judging memory creep on the CPU.

Why not RSS: RSS counts pages the process touched and the C allocator kept,
so it rises on every rank alike while tensors come and go, and falls rarely;
a rank that keeps 1 MiB more per step hides in it. glibc's ``mallinfo2``
counts the bytes handed out and not yet freed (``uordblks``, in the arenas,
plus ``hblkhd``, in blocks of their own ``mmap``): it falls when memory is
freed, as CUDA's "allocated" does. Elsewhere (macOS, musl, a glibc older than
2.33 without ``mallinfo2``) there is no such figure: ``heap_in_use`` returns
None and creep is judged on RSS, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


class _Mallinfo2(ctypes.Structure):
    # glibc's struct mallinfo2: ten size_t fields, in this order
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    fn.restype = _Mallinfo2
    fn.argtypes = []
    return fn


_READ = _mallinfo2()


def heap_in_use() -> int | None:
    """Bytes the C allocator has handed out and not had back (all arenas and
    mmapped blocks); None where glibc's ``mallinfo2`` is not there."""
    if _READ is None:
        return None
    info = _READ()
    return int(info.uordblks + info.hblkhd)
