"""What ``torchlens run`` spools while its run goes on (``.spool/`` in the run
folder), and the run folder rebuilt from it when the command died before
writing the folder (SIGKILL, the OOM killer, a lost machine).

The collector appends each slot's step batches and profiled-step summaries
as they arrive (``slot<N>.steps.jsonl``, ``slot<N>.summaries.jsonl``: one
JSON body a line), writes each slot's hello once it is read
(``slot<N>.hello.json``: which rank, node and host the slot is, its start),
and the command writes ``command.json`` at its start (its pid and that
process's start time, its host, the run id, the command line). At the end of
a run the command writes the folder from these and removes ``.spool``; when
it never got there, ``rebuild`` writes what the spool holds: each rank's step
records and summaries, and a manifest that says the folder was rebuilt, from
how many records, and that how the run ended is unknown. Nothing the spool
does not hold is made up: no verdict, no exit code, no state per rank.

Every spooled file is read through the guarded open (``formats.input_files``):
a line past the cap is counted as damaged and skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Iterator

import msgspec

from torchlens.formats.input_files import read_file_bytes, read_lines
from torchlens.formats.run_folder import files
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    NodeEntry,
    RankEntry,
    write_manifest,
)
from torchlens.formats.run_folder.write import RankFiles, write_run_folder
from torchlens.model.messages import Hello
from torchlens.model.records import StepRecord, decode_batch

COMMAND = "command.json"
_SLOT_FILE = re.compile(r"slot(\d+)\.hello\.json$")
#: the most slots a rebuild reads (a rank's every restart is one)
MAX_SLOTS = 65_536


class SpoolCommand(msgspec.Struct, kw_only=True):
    """The ``torchlens run`` process that owns a spool (``command.json``)."""

    pid: int
    #: that process's start time (epoch s): a pid reused by another process differs
    pid_start: float | None = None
    host: str = ""
    run_id: str = ""
    started: float | None = None
    command: list[str] = []


def hello_path(spool: str, slot: int) -> str:
    return os.path.join(spool, f"slot{slot}.hello.json")


def write_hello(spool: str, slot: int, hello: Hello) -> None:
    """Spool a slot's hello (once, when the collector registers the slot)."""
    with open(hello_path(spool, slot), "wb") as fh:
        fh.write(msgspec.json.encode(hello))


def write_command(spool: str, command: SpoolCommand) -> None:
    os.makedirs(spool, exist_ok=True)
    with open(os.path.join(spool, COMMAND), "wb") as fh:
        fh.write(msgspec.json.encode(command))


def read_command(spool: str) -> SpoolCommand | None:
    """The spool's ``command.json``; None when missing or not one."""
    try:
        return msgspec.json.decode(read_file_bytes(os.path.join(spool, COMMAND), within=spool),
                                   type=SpoolCommand)
    except (OSError, msgspec.MsgspecError):
        return None


def command_alive(command: SpoolCommand | None) -> bool | None:
    """Whether the spool's ``torchlens run`` process still runs: True or False on
    this host (its pid, with the same start time); None when it ran on another
    host (nothing here can tell) or the spool does not say."""
    if command is None or not isinstance(command.pid, int) or command.pid <= 0:
        return None
    if command.host and command.host != socket.gethostname():
        return None
    try:
        import psutil

        started = psutil.Process(command.pid).create_time()
    except Exception:  # noqa: BLE001 - gone, a zombie, or not ours to read: not running
        return False
    return command.pid_start is None or abs(started - command.pid_start) < 0.5


def spool_dir(run_dir: str) -> str:
    return os.path.join(run_dir, files.SPOOL_DIR)


def needs_rebuild(run_dir: str) -> bool:
    """A run folder with a spool that holds hellos and no manifest: its command
    died before writing it (or is still running: the caller asks)."""
    spool = spool_dir(run_dir)
    if os.path.exists(os.path.join(run_dir, files.MANIFEST)) or not os.path.isdir(spool):
        return False
    return any(_SLOT_FILE.match(name) for name in os.listdir(spool))


def _hellos(spool: str) -> list[tuple[int, Hello]]:
    out = []
    for name in sorted(os.listdir(spool))[:MAX_SLOTS * 4]:
        m = _SLOT_FILE.match(name)
        if m is None:
            continue
        try:
            hello = msgspec.json.decode(read_file_bytes(os.path.join(spool, name), within=spool),
                                        type=Hello)
        except (OSError, msgspec.MsgspecError):
            continue
        out.append((int(m.group(1)), hello))
        if len(out) >= MAX_SLOTS:
            break
    return out


def _lines(spool: str, slot: int, kind: str) -> Iterator[bytes]:
    path = os.path.join(spool, f"slot{slot}.{kind}.jsonl")
    for line in read_lines(path, within=spool):
        line = line.strip()
        if line:
            yield line


def _steps(spool: str, slots: list[int], counted: list[int]) -> Iterator[StepRecord]:
    """A rank's spooled step records, every start in order (``restart`` its index)."""
    for incarnation, slot in enumerate(slots):
        for batch in _lines(spool, slot, "steps"):
            try:
                recs, _ = decode_batch(batch)
            except ValueError:
                continue
            counted[0] += sum(not r.labelled for r in recs)
            for rec in recs:
                yield rec.replace(restart=incarnation)


def _summaries(spool: str, slots: list[int], counted: list[int]) -> Iterator[bytes]:
    for slot in slots:
        for line in _lines(spool, slot, "summaries"):
            counted[0] += 1
            yield line


def rebuild(run_dir: str, now: float | None = None) -> Manifest | None:
    """Write ``run_dir``'s rank files and manifest from its spool (module
    docstring); None when the spool holds no hello. The spool and the run's
    secret (useless once its collector is gone) are removed afterwards."""
    spool = spool_dir(run_dir)
    hellos = _hellos(spool)
    if not hellos:
        return None
    command = read_command(spool)
    by_rank: dict[int, list[tuple[int, Hello]]] = {}
    for slot, hello in hellos:
        by_rank.setdefault(hello.rank, []).append((slot, hello))
    counts: dict[int, tuple[list[int], list[int]]] = {}
    ranks = []
    for rank in sorted(by_rank):
        slots = sorted(by_rank[rank], key=lambda sh: (sh[1].t or 0.0, sh[0]))
        last = slots[-1][1]
        steps, summaries = [0], [0]
        counts[rank] = (steps, summaries)
        ranks.append(RankFiles(
            RankEntry(rank=rank, node=last.node, host=last.host, pid=last.pid,
                      local_rank=last.local_rank, device=last.device, restart=last.restart),
            steps=_steps(spool, [s for s, _ in slots], steps),
            summaries=_summaries(spool, [s for s, _ in slots], summaries)))
    world = max([h.world_size or 0 for _, h in hellos] + [max(by_rank) + 1])
    nodes: dict[tuple[int | None, str | None], NodeEntry] = {}
    for f in ranks:
        e = f.entry
        nodes.setdefault((e.node, e.host), NodeEntry(node=e.node, host=e.host)).ranks.append(e.rank)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now or time.time()))
    manifest = Manifest(
        source=SOURCE_RUN, world_size=world, created=now or time.time(),
        run_id=command.run_id if command else None,
        command=list(command.command) if command else [],
        started=command.started if command else None,
        stopped=("unknown: torchlens run ended before it wrote this folder (killed, or its "
                 "machine went down); rebuilt from its spool, so how the ranks ended and "
                 "the exit code are not known"),
        nodes=list(nodes.values()))
    write_run_folder(run_dir, manifest, ranks)
    for e in manifest.ranks:
        steps, summaries = counts[e.rank]
        e.steps, e.summaries = steps[0], summaries[0]
    total = sum(c[0][0] for c in counts.values())
    manifest.notes = [
        f"rebuilt from torchlens run's spool on {when}: {total} step records of "
        f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'}, what the collector had received when its command ended; "
        "steps the ranks ran after that, and their goodbyes, are not here"]
    write_manifest(run_dir, manifest)  # again, with the counts and the note
    shutil.rmtree(spool, ignore_errors=True)
    try:
        os.remove(os.path.join(run_dir, files.SECRET_FILE))
    except OSError:
        pass
    return manifest
