"""--strict's fast path: ranks compare collective fingerprints through shared memory.

Every rank of a %ddp_check is a process the launcher spawned on this host, so
they can all map one small file (in ``/dev/shm`` when it exists). Going
through the kernel-hosted TCPStore instead costs a round trip through the
kernel process per collective (--strict added about 2 ms per all_reduce that
way on the shared 2-core machine); a look at a mapped page costs microseconds.

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

Waiting: a rank whose peer has not written yet blocks in ``select`` on its
own wake FIFO (in the launcher's private temp dir), and every rank, after
writing an entry, puts a byte in each peer's FIFO. The waiter drains its FIFO
before it looks at the board one last time and blocks, so a wake-up cannot be
lost (the write syscall comes after the entry's stores). Measured on the
2-core machine: spinning (even with ``sched_yield``) or napping made the
late peer later, since the waiter took the CPU the peer needed or slept past
its arrival.

Why not ``multiprocessing.shared_memory``: on Python 3.11 its resource
tracker also tracks segments that other processes merely attach to, and
unlinks or warns about them when those processes exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import select
import struct
import tempfile
import time
from typing import Any

from torchlens.capture.ddp.options import BoardSpec

RING = 4
ENTRY = struct.Struct("QQ")  # native: aligned 8-byte stores and loads
RANK_BYTES = 64  # one cache line per rank: a writer does not disturb other ranks' lines


def create(world_size: int, tmpdir: str) -> BoardSpec:
    """A zeroed board file (mode 0600) and one wake FIFO per rank.

    The file goes to ``/dev/shm`` when it exists (in memory), else to
    ``tmpdir``, the launcher's private temp dir, where the FIFOs always go.
    Returns what a worker needs to attach: the file and the FIFOs.
    """
    wake = [os.path.join(tmpdir, f"wake-rank{r}") for r in range(world_size)]
    for fifo in wake:  # first: if this fails, there is no file outside tmpdir to leak
        os.mkfifo(fifo, 0o600)
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tmpdir
    fd, path = tempfile.mkstemp(prefix="torchlens-ddp-", suffix=".board", dir=where)
    try:
        os.ftruncate(fd, world_size * RANK_BYTES)
    except BaseException:
        remove(path)
        raise
    finally:
        os.close(fd)
    return BoardSpec(file=path, wake=wake)


def remove(path: str) -> None:
    """Delete the board file (the launcher's cleanup; a no-op if already gone)."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def digest(index: int, op: str, shapes: Any, dtypes: Any, module: str | None = None) -> int:
    """64-bit digest of what must match across ranks, salted with the index
    (``module``: the FSDP module whose parameters the collective moves)."""
    text = f"{index}|{op}|{shapes}|{dtypes}" + (f"|{module}" if module else "")
    text = text.encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class FingerprintBoard:
    """One rank's view of the mapped board: publish own digests, wait for peers'."""

    def __init__(self, spec: BoardSpec, rank: int, world_size: int) -> None:
        with open(spec.file, "r+b") as fh:
            self.map = mmap.mmap(fh.fileno(), world_size * RANK_BYTES)
        self.rank, self.world_size = rank, world_size
        # O_RDWR on a FIFO never blocks and never fails for want of a reader
        # (Linux), and holding the own FIFO open for writing means select never
        # sees an end-of-file when peers close theirs.
        self.wake = [os.open(path, os.O_RDWR | os.O_NONBLOCK) for path in spec.wake]
        self.own = self.wake[rank]
        self.peer_wake = [fd for r, fd in enumerate(self.wake) if r != rank]

    @staticmethod
    def _offset(rank: int, index: int) -> int:
        return rank * RANK_BYTES + (index % RING) * ENTRY.size

    def publish(self, index: int, value: int) -> None:
        off = self._offset(self.rank, index)
        # digest first, tag second: the tag is what peers wait for (see module doc)
        struct.pack_into("Q", self.map, off + 8, value)
        struct.pack_into("Q", self.map, off, index + 1)
        for fd in self.peer_wake:
            try:
                os.write(fd, b"\0")
            except BlockingIOError:  # full: the peer has wake-ups pending anyway
                pass

    def _look(self, index: int, value: int, pending: list[int],
              differ: list[int]) -> list[int]:
        """Peers of ``pending`` still absent; those whose digest differs go to ``differ``."""
        tag = index + 1
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
        return waiting

    def wait(self, index: int, value: int, peers: list[int],
             budget_s: float) -> tuple[list[int], list[int]]:
        """Wait up to ``budget_s`` for ``peers``' entries of ``index``.

        Returns (peers still absent, peers whose digest differs).
        """
        differ: list[int] = []
        pending = self._look(index, value, peers, differ)
        if not pending:
            return [], differ
        end = time.monotonic() + budget_s
        while True:
            self._drain()  # before the last look: a byte written after it wakes select
            pending = self._look(index, value, pending, differ)
            left = end - time.monotonic()
            if not pending or left <= 0:
                return pending, differ
            select.select([self.own], [], [], left)

    def _drain(self) -> None:
        try:
            while len(os.read(self.own, 4096)) == 4096:
                pass
        except BlockingIOError:  # empty
            pass

    def close(self) -> None:
        for fd in self.wake:
            os.close(fd)
        self.map.close()
