"""The command ``torchlens run`` starts (torchrun), and making sure nothing outlives it.

The child runs in a session of its own: a Ctrl-C in the terminal reaches
``torchlens run`` only, which then ends the child's process group (SIGTERM:
torchrun's agent ends its workers; SIGKILL after ``GRACE_S``). torchrun
starts every worker in a session of its own too, so ending the agent's group
does not reach a worker whose agent could not end it: ``end_leftovers`` kills
the attached ranks of this host that are still alive (their pids came in
their hellos; a pid is only killed while it is the process that said hello,
checked by its start time).

The command's output is relayed, not inherited: torch's profiler prints
``USDT: ... profiler_start`` on every profiled step of every rank, and the
same rule that keeps it out of a notebook (``capture.trace.native_output.
NOISE``) keeps it out of the terminal and the log file. Everything else
passes through line by line, as it comes. Relayed, the command never writes
to our stdout itself: when its reader goes away (``torchlens run ... | head``)
the relay drops the lines and keeps draining, and the training job runs on
(inherited, its next ``print`` would raise BrokenPipeError in a rank).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from torchlens.capture.trace.native_output import NOISE
from torchlens.model.messages import Hello

GRACE_S = 15.0
#: after the command ended: how long the relay may take to pass on what is left
RELAY_WAIT_S = 5.0
#: the command's last lines kept in memory (``proc.tail``): what a failed job
#: said is shown with the verdict, whether its output went to a log or not
TAIL_KEPT = 200
#: how torchlens' own one-line messages in a rank start (an integration
#: skipped, not attached): ``proc.own`` keeps them, for the terminal
OWN_LINE = b"torchlens: "


def _relay(source: Any, out_fd: int, close_out: bool, tail: deque[str],
           own: deque[str]) -> None:
    """Pass ``source``'s lines to ``out_fd`` as they come, torch's noise left out;
    the last ones kept in ``tail`` too, torchlens' own lines in ``own``."""
    try:
        for line in iter(source.readline, b""):
            if not NOISE.match(line):
                text = line.decode("utf-8", "replace").rstrip("\n")
                tail.append(text)
                if line.startswith(OWN_LINE):
                    own.append(text)
                with contextlib.suppress(OSError):  # our own output closed: keep draining
                    os.write(out_fd, line)
    finally:
        source.close()
        if close_out:
            os.close(out_fd)


def _out_fd(stream: Any, fallback: int) -> int:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return fallback


def start(command: list[str], env: dict[str, str],
          log: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own session with ``env`` added to this environment;
    its output goes to the file ``log`` when given, else to ours (stdout to our
    stdout, stderr to our stderr, each through a relay). ``wait_relay(proc)``
    after it ended; ``proc.tail``: its last lines (stdout and stderr as they
    came); ``proc.own``: the lines of torchlens' own in it (``OWN_LINE``),
    taken from the left by their reader."""
    if log is None:
        proc = subprocess.Popen(command, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
        pairs = [(proc.stdout, _out_fd(sys.stdout, 1), False),
                 (proc.stderr, _out_fd(sys.stderr, 2), False)]
    else:
        proc = subprocess.Popen(command, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pairs = [(proc.stdout, out, True)]
    tail: deque[str] = deque(maxlen=TAIL_KEPT)
    own: deque[str] = deque(maxlen=TAIL_KEPT)
    relays = [threading.Thread(target=_relay, args=(*pair, tail, own), daemon=True,
                               name="torchlens-run-output") for pair in pairs]
    for relay in relays:
        relay.start()
    proc.relays = relays  # type: ignore[attr-defined]
    proc.tail = tail  # type: ignore[attr-defined]
    proc.own = own  # type: ignore[attr-defined]
    return proc


def wait_relay(proc: subprocess.Popen[bytes], timeout: float = RELAY_WAIT_S) -> None:
    """Wait until the relay has passed on the command's last lines (it ends when
    every process that holds the pipe has ended)."""
    deadline = time.monotonic() + timeout
    for relay in getattr(proc, "relays", ()):
        relay.join(timeout=max(0.0, deadline - time.monotonic()))


def end(proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> int | None:
    """End the child's process group: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything left in its group
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return proc.returncode


def end_leftovers(hellos: list[Hello], wait_s: float = 5.0) -> list[int]:
    """Kill attached ranks of this host that still run; returns their pids."""
    import socket

    import psutil

    here = socket.gethostname()
    alive = []
    for hello in hellos:
        if hello.host != here or hello.pid is None:
            continue
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(hello.pid)
            # the pid's start is before its hello: the same process, not a reused pid
            if p.create_time() <= (hello.t or 0.0) + 1.0:
                alive.append(p)
    deadline = time.monotonic() + wait_s
    for p in alive:  # their agent ends them first, when it can
        with contextlib.suppress(psutil.Error):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    killed = []
    for p in alive:
        with contextlib.suppress(psutil.Error):
            if p.is_running():
                p.kill()
                killed.append(p.pid)
    return killed
