"""Where each file of a run folder is, and the one careful way to open one.

Every name of the folder's layout (``docs/RANK_PROFILE.md``, "Run folder")
is here and nowhere else: the writers (``%ddp_check --profile``, ``torchlens
run``, the ranks, the live feed) and the readers build their paths with it.

Every file of the folder is read through ``formats.input_files`` (the one
guarded open): ``read_private_json`` is why a reader in the Jupyter server
can open a folder it was only told about (a regular file, not more than a
limit, not reached through a link and owned by this user).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any

from torchlens.formats.input_files import MAX_JSON_BYTES, read_capped

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


def read_private_json(path: str, limit: int) -> Any:
    """``path`` read as ``input_files.read_capped(private=True)`` does, as JSON; None when it is
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
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(status, fh, allow_nan=False, default=str)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk leaves no partial file behind
            os.unlink(tmp)
        raise


def copy_run(source: str, dest: str) -> None:
    """The run folder ``source`` copied into ``dest``, less what only a running
    ``torchlens run`` needs (its secret and its spool)."""
    shutil.copytree(source, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(SECRET_FILE, SPOOL_DIR))
