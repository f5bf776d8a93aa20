"""%ddp_check --nnodes: the ranks start under torch's elastic agent (torchrun).

The kernel still hosts the run's store (the torchlens channel: payload,
heartbeats, fingerprints, results), but on a socket it binds itself, as the
collector of ``torchlens run`` does (``store.host_store``): loopback
unless the user names an interface, because ``TCPStore`` alone would listen
on every interface. It starts ONE child, the local node's agent::

    python -m torch.distributed.run --nnodes N --nproc-per-node K
        --rdzv-backend c10d --rdzv-endpoint H:P --rdzv-id RUN_ID --max-restarts 0
        -m torchlens.capture.ddp.worker --elastic STORE_HOST STORE_PORT DIR

in a session of its own (``child.start``), the run's key in its environment
only. Every other node runs the same command with ``TORCHLENS_RUN_ID`` and
``TORCHLENS_RUN_SECRET_FILE`` (a 0600 file the user copies there, or that is
already there on a shared file system) in front: ``other_nodes`` builds it.

The ranks are not the kernel's children, so their state comes from what they
report: a rank has ended when its result is in the store (exit code 0, or 1
with its error), or, for a rank of this host killed before it could send
one, when its process is gone (``vanished``; its exit code from the agent's
log when the agent names it); the agent's own exit says when the local node
failed.
Ending the run is ``child.end`` (the agent's session: the agent ends its
workers) and then ``child.end_leftovers`` for any local rank still alive
(their pids and hosts came in their heartbeats); a rank whose agent dies
ends itself (the worker's parent check).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from typing import Any

from torchlens.capture.channel.signing import ENV_RUN_ID, ENV_SECRET_FILE, RunKey
from torchlens.model.messages import DdpHeartbeat, Hello
from torchlens.model.rank_report import RankReport


@dataclass(frozen=True)
class ElasticSpec:
    """What the user chose for a multi-node run (validated by the front end)."""

    nnodes: int
    nproc_per_node: int
    rdzv_endpoint: str
    #: where the kernel's store listens: an address or an interface name
    host: str = "127.0.0.1"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def store_address(bound: str) -> str:
    """The address other nodes use to reach a store bound to ``bound``."""
    if bound in ("0.0.0.0", "::"):
        return socket.getfqdn()
    return bound


def agent_command(spec: ElasticSpec, run_id: str, entry: str, store_host: str,
                  store_port: int, stack_dir: str, python: str = sys.executable) -> list[str]:
    """The torchrun command every node runs (the same on every node)."""
    return [python, "-m", "torch.distributed.run", "--nnodes", str(spec.nnodes),
            "--nproc-per-node", str(spec.nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", spec.rdzv_endpoint, "--rdzv-id", run_id,
            "--max-restarts", "0", "--monitor-interval", "0.1",
            "-m", entry, "--elastic", store_host, str(store_port), stack_dir]


def agent_env(key: RunKey) -> dict[str, str]:
    """The local agent's additions to the environment: the key (never argv)."""
    env = dict(key.env())
    env["TORCHLENS_SYS_PATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


@dataclass
class AgentPlace:
    """Where torch's elastic agent started a rank: its node, its rank on that
    node, the agent's restart count, and the host."""

    node: int
    local_rank: int
    restart: int
    hostname: str


def rank_args(argv: list[str]) -> tuple[list[str], AgentPlace]:
    """A rank's ``--elastic HOST PORT DIR`` -> the usual worker argv and where
    the rank runs, from the environment torch's elastic agent gives each worker."""
    host, port, stack_dir = argv
    env = os.environ
    where = AgentPlace(node=int(env.get("GROUP_RANK", "0")), local_rank=int(env["LOCAL_RANK"]),
                       restart=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                       hostname=socket.gethostname())
    if not os.path.isdir(stack_dir):  # another node: the kernel's folder is not here
        import tempfile

        stack_dir = tempfile.mkdtemp(prefix="torchlens-rank-")
    return [host, port, env["RANK"], env["WORLD_SIZE"], stack_dir], where


def other_nodes(key: RunKey, secret_file: str, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment additions) for every other node: the secret by file."""
    return command, {ENV_RUN_ID: key.run_id, ENV_SECRET_FILE: secret_file}


def hint(spec: ElasticSpec, bound: str, argv: list[str], env: dict[str, str]) -> str:
    """The lines printed for the user: what to run on every other node, and where."""
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv)
    where = (f"the kernel's store listens on {bound} only (loopback): other nodes on other "
             "machines cannot reach it; name an interface with --host (e.g. --host eth0)"
             if bound.startswith("127.") or bound == "::1"
             else f"the kernel's store listens on {bound}")
    return (f"%ddp_check --nnodes {spec.nnodes}: this machine is one of {spec.nnodes} nodes "
            f"of {spec.nproc_per_node} ranks each (world size {spec.world_size}); {where}.\n"
            f"Copy {env[ENV_SECRET_FILE]} to the same path on every other node (mode 0600; "
            "on a shared file system it is already there), then run there:\n  " + line)


def rank_codes(results: dict[int, RankReport], n: int) -> list[int | None]:
    """Per rank: None while it runs, 0 when it reported success, 1 with an error."""
    return [None if r not in results else (1 if results[r].error is not None else 0)
            for r in range(n)]


def vanished(last_hb: list[DdpHeartbeat | None], results: dict[int, Any]) -> list[int]:
    """Ranks of this host whose process is gone (or a zombie) without a result.

    A rank killed by a signal (SIGKILL, the out-of-memory killer, a segfault)
    sends nothing; it is not the kernel's child, so no exit code says it
    ended. Its pid came in its heartbeats; a pid started after that heartbeat
    is another process (reused), so the rank is gone too.
    """
    import psutil

    here = socket.gethostname()
    out = []
    for rank, hb in enumerate(last_hb):
        if rank in results or not hb or hb.host != here or not isinstance(hb.pid, int):
            continue
        try:
            p = psutil.Process(hb.pid)
            gone = (p.status() == psutil.STATUS_ZOMBIE
                    or p.create_time() > float(hb.t or 0.0) + 1.0)
        except psutil.Error:
            gone = True
        if gone:
            out.append(rank)
    return out


#: torch's elastic agent logs the first failed worker of its node as it sees it
#: ("failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: ..."), and every
#: failed worker in the summary it prints when it gives up ("exitcode  : -9 (pid: 4242)")
_AGENT_FAILURE = re.compile(r"exitcode\s*:\s*(-?\d+)\)?(?: local_rank: \d+)? \(pid: (\d+)\)")


def agent_exit_codes(log_path: str) -> dict[int, int]:
    """pid -> exit code of the workers the local agent's log names as failed.

    Best effort: the agent names its node's failed workers once it has stopped
    them all, in a format of torch's that may change; a rank not named here
    ended with an unknown code.
    """
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return {}
    return {int(pid): int(code) for code, pid in _AGENT_FAILURE.findall(text)}


def local_ranks(last_hb: list[DdpHeartbeat | None]) -> list[Hello]:
    """This host's ranks (each one's last heartbeat: its process and when it beat),
    as ``child.end_leftovers`` takes them."""
    here = socket.gethostname()
    return [Hello(rank=r, host=hb.host, pid=hb.pid, t=hb.t)
            for r, hb in enumerate(last_hb) if hb and hb.host == here]
