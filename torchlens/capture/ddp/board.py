"""--strict's fast path: ranks compare collective fingerprints through shared memory.

Every rank of a %ddp_check is a process the launcher spawned on this host, so
they can all map one small file (in ``/dev/shm`` when it exists). Going
through the kernel-hosted TCPStore instead costs a round trip through the
kernel process per collective (about 2 ms on a loaded 2-core machine); a look
at a mapped page costs microseconds.

Layout: one 64-byte line per rank, holding a ring of ``RING`` entries, each
``(tag, digest)`` as native 64-bit words; the entry of collective ``i`` is
``i % RING`` with ``tag = i + 1`` (0: never written). A rank publishes ``i``
only after it has seen every peer's ``i - 1``, so no peer is ever more than
one collective ahead of a reader and the entry a reader looks at cannot be
overwritten while it waits (any ``RING >= 2`` would do).

Memory order: the writer stores the digest, then the tag. On x86-64 (TSO)
stores become visible in program order and loads are not reordered with
loads, so a reader that sees the tag also sees the digest. Correctness does
not rest on that: the digest mixes in the index, so a stale or torn digest
reads as a difference, and every difference is checked again against the
full fingerprints in the store before anything is reported.

Why not ``multiprocessing.shared_memory``: on Python 3.11 its resource
tracker also tracks segments that other processes merely attach to, and
unlinks or warns about them when those processes exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import tempfile
import time
from typing import Any

RING = 4
ENTRY = struct.Struct("QQ")  # native: aligned 8-byte stores and loads
RANK_BYTES = 64  # one cache line per rank: a writer does not disturb other ranks' lines
SPIN_S = 50e-6  # peers usually arrive within tens of microseconds of each other
FIRST_NAP_S = 50e-6
MAX_NAP_S = 500e-6  # bounds how late a waiting rank notices a peer that was slow


def create(world_size: int, fallback_dir: str) -> str:
    """A zeroed board file for ``world_size`` ranks (mode 0600); returns its path.

    ``/dev/shm`` keeps it in memory; elsewhere the launcher's private temp
    dir does (the file is tiny and its pages stay in the page cache).
    """
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else fallback_dir
    fd, path = tempfile.mkstemp(prefix="torchlens-ddp-", suffix=".board", dir=where)
    try:
        os.ftruncate(fd, world_size * RANK_BYTES)
    finally:
        os.close(fd)
    return path


def remove(path: str) -> None:
    """Delete the board file (the launcher's cleanup; a no-op if already gone)."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def digest(index: int, op: str, shapes: Any, dtypes: Any) -> int:
    """64-bit digest of what must match across ranks, salted with the index."""
    text = f"{index}|{op}|{shapes}|{dtypes}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class FingerprintBoard:
    """One rank's view of the mapped board: publish own digests, wait for peers'."""

    def __init__(self, path: str, rank: int, world_size: int) -> None:
        with open(path, "r+b") as fh:
            self.map = mmap.mmap(fh.fileno(), world_size * RANK_BYTES)
        self.rank, self.world_size = rank, world_size

    @staticmethod
    def _offset(rank: int, index: int) -> int:
        return rank * RANK_BYTES + (index % RING) * ENTRY.size

    def publish(self, index: int, value: int) -> None:
        off = self._offset(self.rank, index)
        # digest first, tag second: the tag is what peers wait for (see module doc)
        struct.pack_into("Q", self.map, off + 8, value)
        struct.pack_into("Q", self.map, off, index + 1)

    def wait(self, index: int, value: int, peers: list[int],
             budget_s: float) -> tuple[list[int], list[int]]:
        """Wait up to ``budget_s`` for ``peers``' entries of ``index``.

        Returns (peers still absent, peers whose digest differs). Spins with
        ``sched_yield`` first, then naps that grow to ``MAX_NAP_S``, so a
        long wait (a peer still computing) costs little CPU.
        """
        tag = index + 1
        pending, differ = list(peers), []
        now = time.perf_counter()
        spin_until, end, nap = now + SPIN_S, now + budget_s, FIRST_NAP_S
        while True:
            waiting = []
            for r in pending:
                off = self._offset(r, index)
                seen, other = ENTRY.unpack_from(self.map, off)
                if seen == tag and other != value:
                    seen, other = ENTRY.unpack_from(self.map, off)  # a digest in flight
                if seen < tag:
                    waiting.append(r)
                elif seen != tag or other != value:
                    differ.append(r)
            pending = waiting
            if not pending:
                return [], differ
            now = time.perf_counter()
            if now >= end:
                return pending, differ
            if now < spin_until:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(2 * nap, MAX_NAP_S)

    def close(self) -> None:
        self.map.close()
