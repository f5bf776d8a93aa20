"""The ranks' processes of a %ddp_check: start them (directly, or under
torch's elastic agent), end them, and read what they leave in the run's temp
dir (their stacks on a hang, their logs).

Why ``subprocess.Popen([python, -m, worker])`` with ``start_new_session=True``
rather than ``multiprocessing``'s spawn context: both fork+exec a fresh
interpreter (no fork of the kernel's threads), but multiprocessing's spawn
re-imports the parent's ``__main__`` in each child (the kernel's, or pytest's)
and cannot put a child in its own process group atomically. A new session per
worker means one ``killpg`` ends the worker and anything it started, and a
SIGINT meant for the kernel never reaches the ranks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ddp import elastic
from torchlens.capture.ranks import torchrun as child
from torchlens.model.messages import DdpHeartbeat

STACK_WAIT_S = 0.6
AGENT_EXIT_S = 20.0  # --nnodes: how long a finished run's agent gets to end by itself


def spawn_ranks(procs: list[subprocess.Popen[bytes]], entry: str, port: int | None,
                world_size: int, key: RunKey, tmpdir: str) -> None:
    """Start ``world_size`` ranks running ``python -m entry``, each appended to
    ``procs`` as it starts (so a failed start still ends the ones before it)."""
    n = world_size
    for rank in range(n):
        env = dict(os.environ)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
                   RANK=str(rank), LOCAL_RANK=str(rank),
                   TORCHLENS_SYS_PATH=os.pathsep.join(p for p in sys.path if p))
        # The secret goes by environment only: argv is readable by every
        # local user in /proc/*/cmdline, a process's environ only by its owner.
        env.update(key.env())
        env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share the cores
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d store-wait warnings
        log = open(os.path.join(tmpdir, f"log-rank{rank}.txt"), "wb")  # noqa: SIM115
        with log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", entry, "127.0.0.1",
                 str(port), str(rank), str(n), tmpdir],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True))


def start_agent(procs: list[subprocess.Popen[bytes]], spec: Any, key: RunKey, entry: str,
                sock: Any, port: int | None, tmpdir: str,
                on_other_nodes: Any) -> tuple[list[str], dict[str, str]]:
    """--nnodes: the local node's elastic agent (appended to ``procs``), and the
    command for the others (returned, and handed to ``on_other_nodes``)."""
    bound = sock.getsockname()[0]
    argv = elastic.agent_command(spec, key.run_id, entry,
                                 elastic.store_address(bound), int(port), tmpdir)
    secret = key.write_secret(os.path.join(tmpdir, "run.secret"))
    other_nodes = elastic.other_nodes(key, secret, argv)
    procs.append(child.start(argv, elastic.agent_env(key),
                             log=os.path.join(tmpdir, "log-agent.txt")))
    print(elastic.hint(spec, bound, *other_nodes), file=sys.stderr, flush=True)
    if on_other_nodes is not None:
        on_other_nodes(*other_nodes)
    return other_nodes


def end_ranks(procs: list[subprocess.Popen[bytes]], killed: set[int], under_agent: bool,
              all_ended: bool, last_hb: list[DdpHeartbeat | None]) -> None:
    """End every worker's process group: TERM, then KILL what is left. The pid
    of each process still running is added to ``killed``. ``all_ended``: under
    the agent, every rank has a result or is known gone."""
    if under_agent:
        for p in procs:
            if all_ended:
                # Every rank ended: the agent ends by itself, after meeting
                # the other agents at their exit barrier (killed before it,
                # they would wait it out: 300 s) or, when a worker failed,
                # after logging which workers failed with what exit code
                # (``elastic.agent_exit_codes``: a killed rank's only trace).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=AGENT_EXIT_S)
            if p.poll() is None:
                killed.add(p.pid)
            child.end(p, grace_s=5.0)  # the agent ends its workers on SIGTERM
        child.end_leftovers(elastic.local_ranks(last_hb), wait_s=1.0)
        return
    for p in procs:
        if p.poll() is None:
            killed.add(p.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def read_stacks(pids: list[int], world_size: int, tmpdir: str) -> list[str]:
    """faulthandler in each live worker writes every thread's Python stack:
    each rank's, as text ("" where it wrote none)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(STACK_WAIT_S)
    stacks = []
    for rank in range(world_size):
        path = os.path.join(tmpdir, f"stack-rank{rank}.txt")
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                stacks.append(fh.read())
        except OSError:
            stacks.append("")
    return stacks


def log_tail(tmpdir: str, rank: int, limit: int = 4000) -> str:
    """The last ``limit`` bytes of a rank's log (its stdout and stderr)."""
    path = os.path.join(tmpdir, f"log-rank{rank}.txt")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
