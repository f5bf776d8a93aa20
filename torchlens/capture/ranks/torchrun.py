"""The command ``torchlens run`` starts (torchrun), and making sure nothing outlives it.

The child runs in a session of its own: a Ctrl-C in the terminal reaches
``torchlens run`` only, which then ends the child's process group (SIGTERM:
torchrun's agent ends its workers; SIGKILL after ``GRACE_S``). torchrun
starts every worker in a session of its own too, so ending the agent's group
does not reach a worker whose agent could not end it: ``end_leftovers`` kills
the attached ranks of this host that are still alive (their pids came in
their hellos; a pid is only killed while it is the process that said hello,
checked by its start time).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

GRACE_S = 15.0


def start(command: list[str], env: dict[str, str],
          log: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own session with ``env`` added to this environment;
    its output goes to the file ``log`` when given, else to ours."""
    if log is None:
        return subprocess.Popen(command, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    with open(log, "wb") as fh:
        return subprocess.Popen(command, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


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


def end_leftovers(hellos: list[dict[str, Any]], wait_s: float = 5.0) -> list[int]:
    """Kill attached ranks of this host that still run; returns their pids."""
    import socket

    import psutil

    here = socket.gethostname()
    alive = []
    for hello in hellos:
        if hello.get("host") != here or not isinstance(hello.get("pid"), int):
            continue
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(hello["pid"])
            # the pid's start is before its hello: the same process, not a reused pid
            if p.create_time() <= float(hello.get("t") or 0) + 1.0:
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
