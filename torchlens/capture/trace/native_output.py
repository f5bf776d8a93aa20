"""Drop the lines torch's C++ side prints to stderr because torchlens started a capture.

torch 2.13's profiler writes ``USDT:... SyncActivityProfilerHandler.cpp:52]
profiler_start`` (and ``STAGE:`` lines at some log levels) on every start and
stop, and its CPU allocator warns ``Memory block of unknown size was allocated
before the profiling started`` for every tensor a recorded cell frees that
was made before it. None of it is the user's, none can be turned off from
Python once torch is loaded (``KINETO_LOG_LEVEL`` and ``TORCH_CPP_LOG_LEVEL``
are read at start-up), and in a notebook it shows in red under every cell.

``quiet_native_noise()`` points file descriptor 2 at a pipe for its block; a
thread passes every line on to the real stderr as it arrives, except those
lines. The user's own output, Python warnings included, still appears, in
order.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: What torch prints for torchlens' own captures (the date/pid parts vary).
NOISE = re.compile(
    rb"^(?:(?:USDT|STAGE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] "
    rb"|\[W\d+ [\d:.]+(?: \d+)? CPUAllocator\.cpp:\d+\] Memory block of unknown size)"
)


def _forward(read_fd: int, out_fd: int) -> None:
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not NOISE.match(line))
        if kept:
            os.write(out_fd, kept)
    if pending and not NOISE.match(pending):
        os.write(out_fd, pending)
    os.close(read_fd)


@contextmanager
def quiet_native_noise() -> Iterator[None]:
    """Filter fd 2 for the block (see the module doc); no-op if fd 2 is unusable."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    thread = threading.Thread(target=_forward, args=(read_fd, saved), daemon=True,
                              name="torchlens-stderr")
    thread.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread sees EOF
        thread.join(timeout=5)
        os.close(saved)
