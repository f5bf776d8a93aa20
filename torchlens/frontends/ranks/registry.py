"""Which ``torchlens run`` jobs are running on this machine, for the JupyterLab sidebar.

``torchlens run`` registers itself when it starts (``register``) and, when it
ends, marks its entry ended (``finish``: the entry gains ``"ended": <epoch s>``);
the Jupyter server extension lists the running ones with ``live_runs``, the
recently finished ones with ``finished_runs``, and their newest
``RUN_DIR/live.json`` (``torchlens run`` replaces that file about once a
second; docs/MULTINODE.md). The ended mark is what lets the sidebar show a job
that started and ended between two of its polls: a finished entry is listed
for ``KEEP_FINISHED_S`` (the ``MAX_FINISHED`` newest), then deleted by a reader.

The registry is one directory per user (``registry_dir``), mode 0700, one
0600 JSON file per run::

    {"format": "torchlens-run-entry", "version": 1, "run_id": "8c1f0e27a4b9d3e1",
     "run_dir": "/abs/runs/exp1", "collector": "127.0.0.1:41233",
     "pid": 4242, "pid_start": 1732400000.12, "host": "gpu7",
     "command": ["torchrun", "--nproc-per-node", "4", "train.py"], "started": 1732400001.5}

It lives in the home directory, not in ``$XDG_RUNTIME_DIR``: the Jupyter
server (started by JupyterHub or systemd) and the terminal that runs
``torchlens run`` (an ssh login) often do not share that variable, and both
must find the same place. A home directory shared by several machines holds
entries of other hosts: they are skipped, never cleaned, as their pids mean
nothing here.

An entry not marked ended is stale when its pid is gone or is now another process (its start
time differs from ``pid_start``): a ``torchlens run`` killed with SIGKILL
leaves one. Readers skip and delete stale entries. Nothing read here is
executed: entries, live.json and manifest.json are JSON, opened without
following links, only regular files owned by this user, size-capped
(``formats.input_files.read_capped``); every value is checked for type
and length before it is passed on (``live_status``, the typed manifest).
The secret of a run is never in an entry.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import stat
import time
from typing import Any

import msgspec

from torchlens.formats.run_folder.files import (
    LIVE_FORMAT,
    read_live_status,
    read_private_json,
)
from torchlens.formats.run_folder.manifest import ManifestError, read_manifest

ENV_DIR = "TORCHLENS_RUNS_DIR"
ENTRY_FORMAT = "torchlens-run-entry"
MAX_ENTRY_BYTES = 64 << 10
MAX_LIVE_BYTES = 16 << 20
#: rank rows a job shows in the sidebar (the world size is said beside them)
MAX_RANKS = 64
MAX_TEXT = 2000
#: a garbled entry (not one being written: those are renamed into place whole) is
#: deleted once this old
GARBLED_AFTER_S = 60.0
#: how long the sidebar keeps showing a run this server saw running after its
#: ``torchlens run`` went away without marking its entry ended (``RecentRuns``)
KEEP_ENDED_S = 60.0
#: how long a finished run (its entry marked ended) stays listed, then is deleted
KEEP_FINISHED_S = 15 * 60.0
#: the finished runs listed at most, newest first
MAX_FINISHED = 5

#: the rank fields passed on: number fields (int or float, or null), then text fields
RANK_NUMBERS = ("rank", "node", "restart", "steps", "step_ms", "data_ms", "allocated",
                "reserved", "frag", "largest_free", "peak_allocated", "peak_reserved", "rss",
                "peak_rss")
RANK_TEXTS = ("host", "state", "source", "error")


def registry_dir() -> str:
    """``$TORCHLENS_RUNS_DIR``, else ``~/.cache/torchlens/runs`` (why not XDG: above)."""
    return os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache",
                                                   "torchlens", "runs")


def _own_dir(path: str) -> str:
    """Create ``path`` 0700 (parents too); refuse one that is another user's or a link."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory of this user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def process_start(pid: int) -> float | None:
    """The start time of process ``pid`` (epoch s), None when it is gone or a zombie."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except psutil.Error:
        return None


def register(run_id: str, run_dir: str, collector: str, command: list[str]) -> str | None:
    """Add this process's run to the registry; returns the entry's path.

    None (and no exception) when the registry cannot be written: the run goes
    on, the sidebar just does not list it.
    """
    pid = os.getpid()
    entry = {"format": ENTRY_FORMAT, "version": 1, "run_id": run_id,
             "run_dir": os.path.abspath(run_dir), "collector": collector, "pid": pid,
             "pid_start": process_start(pid), "host": socket.gethostname(),
             "command": list(command), "started": time.time()}
    try:
        folder = _own_dir(registry_dir())
        path = os.path.join(folder, f"{run_id}.json")
        tmp = os.path.join(folder, f".{run_id}.{pid}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entry, fh)
        os.replace(tmp, path)  # readers see the whole entry or none
        return path
    except OSError:
        return None


def unregister(path: str | None) -> None:
    """Remove an entry ``register`` made (nothing when it made none)."""
    if path:
        with contextlib.suppress(OSError):
            os.remove(path)


def finish(path: str | None, now: float | None = None) -> None:
    """Mark an entry ``register`` made as ended (``"ended"``: the time), so the
    sidebar lists the finished run for ``KEEP_FINISHED_S``; nothing when it
    made none, and no exception when the entry cannot be rewritten (it is
    removed then, as ``unregister`` does)."""
    if not path:
        return
    raw = read_private_json(path, MAX_ENTRY_BYTES)
    if _entry(raw) is None:
        unregister(path)
        return
    raw["ended"] = time.time() if now is None else now
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.end")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(raw, fh)
        os.replace(tmp, path)  # readers see the running entry or the ended one
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        unregister(path)


def _number(v: Any) -> int | float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return v if math.isfinite(v) else None


def _text(v: Any, limit: int = MAX_TEXT) -> str | None:
    return v[:limit] if isinstance(v, str) else None


class RegistryEntry(msgspec.Struct, frozen=True):
    """A registry entry's checked fields (the module docstring's file)."""

    run_id: str
    run_dir: str
    collector: str | None
    pid: int
    pid_start: int | float | None
    host: str | None
    command: list[str]
    started: int | float | None
    #: when ``torchlens run`` ended (``finish``), None while it runs
    ended: int | float | None = None


class SidebarRank(msgspec.Struct):
    """One rank of a live status as the sidebar gets it: ``RANK_NUMBERS`` (finite
    numbers or None), then ``RANK_TEXTS`` (cut text or None)."""

    rank: int | float | None = None
    node: int | float | None = None
    restart: int | float | None = None
    steps: int | float | None = None
    step_ms: int | float | None = None
    data_ms: int | float | None = None
    allocated: int | float | None = None
    reserved: int | float | None = None
    frag: int | float | None = None
    largest_free: int | float | None = None
    peak_allocated: int | float | None = None
    peak_reserved: int | float | None = None
    rss: int | float | None = None
    peak_rss: int | float | None = None
    host: str | None = None
    state: str | None = None
    source: str | None = None
    error: str | None = None


class SidebarStatus(msgspec.Struct):
    """The checked content of a live.json (``live_status``)."""

    t: int | float | None
    age_s: float | None
    run_id: str | None
    world_size: int | float | None
    verdict: str
    #: the verdict's kind (``Finding.code``): what the sidebar decides by
    verdict_code: str | None
    #: the ranks the verdict names (``Finding.ranks``): which rank rows it marks
    verdict_ranks: list[int]
    ended: bool
    restarts: int
    dropped: int | float
    ranks: list[SidebarRank]


class LiveRun(msgspec.Struct):
    """One run as the endpoint answers it: the entry's fields, its state and live status."""

    run_id: str
    run_dir: str
    collector: str | None
    pid: int
    command: list[str]
    started: int | float | None
    state: str
    live: SidebarStatus | None
    stopped: str | None = None
    #: when the run ended (the entry's ``ended``, else when this server saw it go)
    ended: int | float | None = None


def _entry(raw: Any) -> RegistryEntry | None:
    """The checked fields of a registry entry, or None when it is not one."""
    if not isinstance(raw, dict) or raw.get("format") != ENTRY_FORMAT:
        return None
    pid, run_id, run_dir = raw.get("pid"), _text(raw.get("run_id"), 64), _text(raw.get("run_dir"))
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not run_id \
            or not run_dir or not os.path.isabs(run_dir):
        return None
    command = raw.get("command")
    words = [w[:MAX_TEXT] for w in command if isinstance(w, str)][:256] \
        if isinstance(command, list) else []
    return RegistryEntry(run_id=run_id, run_dir=run_dir,
                         collector=_text(raw.get("collector"), 300), pid=pid,
                         pid_start=_number(raw.get("pid_start")),
                         host=_text(raw.get("host"), 300), command=words,
                         started=_number(raw.get("started")), ended=_number(raw.get("ended")))


def _status(raw: Any, now: float | None = None) -> SidebarStatus | None:
    """``live_status``, typed."""
    if not isinstance(raw, dict) or raw.get("format") != LIVE_FORMAT \
            or not isinstance(raw.get("ranks"), list):
        return None
    now = time.time() if now is None else now
    rows = raw["ranks"]
    order = raw.get("order")
    if len(rows) > MAX_RANKS and isinstance(order, list) \
            and all(isinstance(i, int) and 0 <= i < len(rows) for i in order):
        # the ranks in trouble and the slowest (run_verdict.show_order) are the
        # ones worth the room when a job has more ranks than the sidebar shows
        rows = [rows[i] for i in sorted(order[:MAX_RANKS])]
    ranks = [SidebarRank(**{k: _number(row.get(k)) for k in RANK_NUMBERS},
                         **{k: _text(row.get(k), 300 if k != "error" else MAX_TEXT)
                            for k in RANK_TEXTS})
             for row in rows[:MAX_RANKS]
             if isinstance(row, dict) and _number(row.get("rank")) is not None]
    t = _number(raw.get("t"))
    restarts = raw.get("restarts")
    named = raw.get("verdict_ranks")
    named = [r for r in named if isinstance(r, int) and not isinstance(r, bool)][:MAX_RANKS] \
        if isinstance(named, list) else []
    return SidebarStatus(
        t=t, age_s=None if t is None else max(0.0, now - t),
        run_id=_text(raw.get("run_id"), 64), world_size=_number(raw.get("world_size")),
        verdict=_text(raw.get("verdict")) or "", verdict_code=_text(raw.get("verdict_code"), 64),
        verdict_ranks=named, ended=raw.get("ended") is True,
        restarts=len(restarts) if isinstance(restarts, list) else 0,
        dropped=_number(raw.get("dropped")) or 0, ranks=ranks)


def live_status(raw: Any, now: float | None = None) -> dict[str, Any] | None:
    """The checked content of a live.json document, or None when it is not one.

    A partial or garbled file is None (the run shows as "starting"). Only the
    documented fields pass, each of its type (numbers finite, text cut to
    ``MAX_TEXT``): what the endpoint answers has one shape whatever the file held.
    """
    return msgspec.to_builtins(_status(raw, now))


def _run(entry: RegistryEntry, now: float) -> LiveRun:
    """One run as the endpoint answers it: the entry's fields and its live status."""
    live = _status(read_live_status(entry.run_dir, MAX_LIVE_BYTES), now)
    if live is not None and live.run_id not in (None, entry.run_id):
        live = None  # a live.json of another run (the folder reused): not this one's
    state = "starting" if live is None else ("ended" if live.ended else "running")
    return LiveRun(run_id=entry.run_id, run_dir=entry.run_dir, collector=entry.collector,
                   pid=entry.pid, command=entry.command, started=entry.started,
                   state=state, live=live)


def _is_this_host(entry: RegistryEntry) -> bool:
    return entry.host in (None, socket.gethostname())


def _alive(entry: RegistryEntry) -> bool:
    """The entry's pid is still the process that registered (same start time)."""
    started = process_start(entry.pid)
    if started is None:
        return False
    return entry.pid_start is None or abs(started - entry.pid_start) < 0.5


def live_runs(folder: str | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """The registered runs of this host whose ``torchlens run`` is alive, oldest first.

    Each is the entry's fields plus ``state`` ("starting" while its live.json
    is missing, partial or garbled; "running"; "ended" once live.json says so)
    and ``live`` (``live_status``, or None). Stale entries are deleted.
    Never raises for what it finds on disk.
    """
    return msgspec.to_builtins(_scan(folder, now)[0])


def finished_runs(folder: str | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """The runs of this host that ended within ``KEEP_FINISHED_S`` (their entry
    marked ended by ``finish``), newest first, at most ``MAX_FINISHED``: state
    "ended", their last live status, the manifest's "stopped" line and
    ``ended`` (when). Older finished entries are deleted."""
    return msgspec.to_builtins(_scan(folder, now)[1])


def _scan(folder: str | None, now: float | None) -> tuple[list[LiveRun], list[LiveRun]]:
    """The registry's running runs (oldest first) and recently finished ones
    (newest first, ``MAX_FINISHED`` at most); deletes stale, garbled and old
    finished entries of this host."""
    folder = folder or registry_dir()
    now = time.time() if now is None else now
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return [], []
        names = sorted(n for n in os.listdir(folder)
                       if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return [], []
    runs, finished = [], []
    for name in names:
        path = os.path.join(folder, name)
        entry = _entry(read_private_json(path, MAX_ENTRY_BYTES))
        if entry is None:
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime > GARBLED_AFTER_S:
                    os.remove(path)
            continue
        if not _is_this_host(entry):
            continue
        if entry.ended is not None:
            if now - entry.ended > KEEP_FINISHED_S:
                with contextlib.suppress(OSError):
                    os.remove(path)
            else:
                finished.append(entry)
            continue
        if not _alive(entry):
            with contextlib.suppress(OSError):
                os.remove(path)
            continue
        runs.append(_run(entry, now))
    runs.sort(key=lambda r: (r.started or 0.0, r.run_id))
    finished.sort(key=lambda e: (-(e.ended or 0.0), e.run_id))
    return runs, [_ended(e, now, e.ended) for e in finished[:MAX_FINISHED]]


def _ended(entry: RegistryEntry, now: float, ended: float | None,
           last: SidebarStatus | None = None) -> LiveRun:
    """A run that ended: state "ended", its final live status (``last`` when the
    folder has none), the manifest's "stopped" line once the folder was
    written, and, when the live status does not say, the ranks the manifest's
    verdict names."""
    final = _run(entry, now)
    live = final.live or last
    try:
        manifest = read_manifest(entry.run_dir, private=True)
    except ManifestError:  # not written yet, or not one to trust
        manifest = None
    stopped = _text(manifest.stopped) if manifest is not None else None
    if live is not None and manifest is not None and not live.verdict_ranks \
            and live.verdict_code is not None and live.verdict_code == manifest.verdict_code:
        live = msgspec.structs.replace(live, verdict_ranks=[
            r for r in manifest.verdict_ranks if isinstance(r, int)][:MAX_RANKS])
    return msgspec.structs.replace(final, state="ended", live=live, stopped=stopped,
                                   ended=ended)


class RecentRuns:
    """``live_runs`` and ``finished_runs``, plus, for ``keep_s``, the runs this
    server saw running whose entry went away unmarked (their ``torchlens run``
    was killed) or was removed (one per server).

    Such a run is listed with state "ended" and its last live status, re-read
    from its folder when the final live.json is there, with the manifest's
    "stopped" line when the run folder was written. A finished run whose entry
    is marked ended is listed whether or not this server saw it running, so a
    job shorter than the sidebar's poll shows once it ended.
    """

    def __init__(self, folder: str | None = None, keep_s: float = KEEP_ENDED_S) -> None:
        self.folder = folder
        self.keep_s = keep_s
        self.seen: dict[str, LiveRun] = {}
        self.ended: dict[str, LiveRun] = {}

    def runs(self, now: float | None = None) -> list[dict[str, Any]]:
        """The running runs (oldest first), then those that ended (newest first), as
        the endpoint answers them (JSON)."""
        now = time.time() if now is None else now
        running, finished = _scan(self.folder, now)
        ids = {r.run_id for r in running}
        done = {r.run_id for r in finished}
        for run_id, last in list(self.seen.items()):
            if run_id not in ids:
                del self.seen[run_id]
                if run_id not in done:
                    self.ended[run_id] = self._gone(last, now)
        self.seen.update((r.run_id, r) for r in running)
        for run_id, run in list(self.ended.items()):
            if run_id in ids or run_id in done or now - (run.ended or 0.0) > self.keep_s:
                del self.ended[run_id]
        ended = sorted([*finished, *self.ended.values()],
                       key=lambda r: (-(r.ended or 0.0), r.run_id))
        return msgspec.to_builtins(running + ended[:MAX_FINISHED])

    @staticmethod
    def _gone(last: LiveRun, now: float) -> LiveRun:
        entry = RegistryEntry(run_id=last.run_id, run_dir=last.run_dir,
                              collector=last.collector, pid=last.pid, pid_start=None,
                              host=None, command=last.command, started=last.started)
        return _ended(entry, now, now, last.live)
