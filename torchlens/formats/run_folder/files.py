"""Where each file of a run folder is, and the one careful way to open one.

Every name of the folder's layout (``docs/RANK_PROFILE.md``, "Run folder")
is here and nowhere else: the writers (``%ddp_check --profile``, ``torchlens
run``, the ranks, the live feed) and the readers build their paths with it.

``read_capped`` is why a reader in the Jupyter server can open a folder it
was only told about: the file must be regular (a FIFO put in its place
cannot stall the server), not more than a limit, and with ``private`` not
reached through a link and owned by this user.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from typing import Any

from torchlens.model.units import format_bytes

#: the run's manifest: its ``format`` (``file_kind.RUN_FORMAT``) marks a folder as a torchlens run
MANIFEST = "manifest.json"
#: per rank, under ``rank<r>/``: every step record, and every profiled-step summary
STEPS = "steps.jsonl"
SUMMARIES = "summaries.jsonl"
#: a profiled step's Kineto trace (the rank writes it), and the allocator
#: snapshot a rank takes on a CUDA OutOfMemoryError
STEP_TRACE = "step{step:05d}.pt.trace.json"
OOM_SNAPSHOT = "oom.pickle"
#: ``torchlens run``'s live feed: every frame (one JSON line each), and the
#: newest frame's status alone (``capture.ranks.feed`` writes both)
LIVE_FEED, LIVE_STATUS = "live.jsonl", "live.json"
LIVE_FORMAT = "torchlens-live"
#: ``torchlens run`` only, while it runs: the run's secret for the other
#: nodes, and where the collector spools what the ranks sent
SECRET_FILE = "run.secret"
SPOOL_DIR = ".spool"
#: ``torchlens run`` on a terminal: the command's own output
LOG_FILE = "command.log"
#: an exported folder (``--export DIR/``): the result itself
RESULT_FILE = "result.tlprof"
#: the largest manifest or live status read (a 4,096-rank manifest is a few MB)
MAX_JSON_BYTES = 64 << 20


def rank_dir(run_dir: str, rank: int) -> str:
    """``RUN_DIR/rank<r>``: the rank's traces, step records and summaries."""
    return os.path.join(run_dir, f"rank{rank}")


def step_trace(run_dir: str, rank: int, step: int) -> str:
    """Where a rank writes the trace of its profiled step ``step``."""
    return os.path.join(rank_dir(run_dir, rank), STEP_TRACE.format(step=step))


def rank_traces(run_dir: str, rank: int) -> list[str]:
    """The rank's traces on disk, relative to the run folder, sorted (what the
    manifest lists)."""
    folder = rank_dir(run_dir, rank)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(os.path.join(f"rank{rank}", n) for n in names if n.endswith(".json"))


def oom_snapshot(run_dir: str, rank: int) -> str | None:
    """The rank's OOM snapshot relative to the run folder, None when it took none."""
    if os.path.exists(os.path.join(rank_dir(run_dir, rank), OOM_SNAPSHOT)):
        return os.path.join(f"rank{rank}", OOM_SNAPSHOT)
    return None


def read_capped(path: str, limit: int = MAX_JSON_BYTES, private: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    ``private``: also refuse a link and a file of another user. Raises
    OSError (a missing file: FileNotFoundError) or ValueError saying why.
    O_NONBLOCK: a FIFO is refused without blocking on its open.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if private else 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if private and st.st_uid != os.getuid():
            raise ValueError("owned by another user")
        if st.st_size > limit:
            raise ValueError(f"larger than {format_bytes(limit)}")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {format_bytes(limit)}")
    return data


def read_private_json(path: str, limit: int) -> Any:
    """``path`` read as ``read_capped(private=True)`` does, as JSON; None when it is
    missing, refused or not JSON (the sidebar shows what it can, never raises)."""
    try:
        return json.loads(read_capped(path, limit, private=True))
    except (OSError, ValueError, RecursionError):
        return None


def read_live_status(run_dir: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The run's newest live status (``live.json``) as JSON, unchecked (the reader
    checks every field: ``frontends.ranks.registry.live_status``); None when
    it is missing, partial or refused."""
    return read_private_json(os.path.join(run_dir, LIVE_STATUS), limit)


def write_live_status(run_dir: str, status: dict[str, Any]) -> None:
    """Replace ``live.json`` whole: a reader sees the old status or the new one."""
    path = os.path.join(run_dir, LIVE_STATUS)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(status, fh, allow_nan=False, default=str)
    os.replace(tmp, path)


def copy_run(source: str, dest: str) -> None:
    """The run folder ``source`` copied into ``dest``, less what only a running
    ``torchlens run`` needs (its secret and its spool)."""
    shutil.copytree(source, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(SECRET_FILE, SPOOL_DIR))
