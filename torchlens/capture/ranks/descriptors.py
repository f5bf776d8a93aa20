"""``torchlens run``'s own file descriptors: a reserve for the moments it must
open files, and a watch on how close the process came to its limit.

The collector's store (torch's ``TCPStore``, served in this process) takes a
descriptor for every connection anyone opens to its port. When they reach the
process's ``RLIMIT_NOFILE`` (a flood of idle connections, or more ranks than
``ulimit -n``), every other open in the process fails with ``EMFILE``: the
command's pipes, the live feed's files, the run folder. ``Reserve`` holds a
few descriptors (``/dev/null``) taken before the store listens, given back
just before an open that must not fail (starting the command, writing the
run folder), so the job starts and the folder is written however full the
table is. ``DescriptorWatch`` samples ``/proc/self/fd`` (at most once a
second) and keeps the fullest the table was, so the run can say what ran out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

#: descriptors held back for the opens that must not fail
RESERVE = 16
#: how often ``DescriptorWatch.check`` counts the open descriptors
CHECK_S = 1.0
#: a table this full (a share of the limit) counts as exhausted
FULL_SHARE = 0.98


class Reserve:
    """Descriptors held open (``/dev/null``) to be given back when needed."""

    def __init__(self, n: int = RESERVE) -> None:
        self.fds: list[int] = []
        self.take(n)

    def take(self, n: int = RESERVE) -> int:
        """Hold up to ``n`` more descriptors; how many it got (fewer when the table is full)."""
        got = 0
        while got < n:
            try:
                self.fds.append(os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            except OSError:
                break
            got += 1
        return got

    def release(self) -> None:
        """Give every held descriptor back to the process."""
        while self.fds:
            with contextlib.suppress(OSError):
                os.close(self.fds.pop())


def limit() -> int | None:
    """The process's soft ``RLIMIT_NOFILE``; None when unlimited or unknown."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def count_open(sockets_from: int = 0) -> tuple[int, int] | None:
    """(open descriptors, how many of them are sockets) of this process; None
    where ``/proc`` cannot say. The sockets are counted only when at least
    ``sockets_from`` are open (else 0: a link read per descriptor). Listing
    the folder takes a descriptor itself: with none left it raises
    ``OSError`` (``EMFILE``)."""
    try:
        names = os.listdir("/proc/self/fd")
    except FileNotFoundError:
        return None
    sockets = 0
    for name in names if len(names) >= sockets_from else ():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                sockets += 1
    return len(names), sockets


@dataclasses.dataclass
class Exhaustion:
    """The fullest the descriptor table was while it was full."""

    limit: int
    peak: int  #: the most descriptors open at one check
    sockets: int  #: how many of them were sockets (connections to the store, mostly); -1: not counted
    since: str  #: the local time it was first seen full (HH:MM:SS)
    checks: int  #: how many checks found it full


class DescriptorWatch:
    """Counts this process's open descriptors at most every ``every_s`` seconds
    and keeps when and how full the table was once it reached the limit."""

    def __init__(self, every_s: float = CHECK_S) -> None:
        self.every_s = every_s
        self.limit = limit()
        self.full: Exhaustion | None = None
        self._next = 0.0
        self._spare = Reserve(1)  # the descriptor the count itself takes

    def check(self) -> None:
        """Count now if due; never raises (a check that fails counts nothing)."""
        now = time.monotonic()
        if self.limit is None or now < self._next:
            return
        self._next = now + self.every_s
        self._spare.release()
        try:
            counted = count_open(int(self.limit * FULL_SHARE))
        except OSError:  # not even one descriptor free: full, its sockets uncounted
            counted = (self.limit, -1)
        except Exception:  # noqa: BLE001 - a watch of torchlens' own never ends the job
            counted = None
        finally:
            self._spare.take(1)
        if counted is None:
            return
        n, sockets = min(counted[0], self.limit), counted[1]  # the limit lowered after opens
        if n < self.limit * FULL_SHARE:
            return
        if self.full is None:
            self.full = Exhaustion(self.limit, n, sockets, time.strftime("%H:%M:%S"), 0)
        self.full.checks += 1
        if n > self.full.peak or (n == self.full.peak and sockets > self.full.sockets):
            self.full.peak, self.full.sockets = n, sockets

    def close(self) -> None:
        """Give back the descriptor held for the count."""
        self._spare.release()
