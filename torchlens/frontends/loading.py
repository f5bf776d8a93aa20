"""One loader for every file torchlens reads: ``torchlens.load`` and the command line.

Why one: ``torchlens report X.pickle`` read an allocator snapshot while
``torchlens.load(X.pickle)`` refused it (issue 21). Both now call ``load``,
so what one reads the other reads, with the same messages.

What a path is, first match wins:

- a folder of per-rank allocator snapshots and no traces (the naming rule:
  ``formats.snapshot_set``): one memory result of every rank
  (``memory_ranks.load_ranks``);
- a list, or a folder: the per-rank traces of a run (``runs.api.load_run``);
- ``.tlprof``: a saved result (``model.load_profile``);
- ``.pickle`` / ``.pkl``: an allocator snapshot (``api.load_gpumem``; no
  pickle global is loaded, the file cannot run code);
- ``.json`` / ``.json.gz``: one Kineto trace;
- any other name, by its first bytes: a zip archive is a ``.tlprof``, a
  pickle a snapshot, anything else is read as a trace (whose reader says
  what is wrong with it).

One Kineto trace is a run of one rank for ``torchlens.load`` (so that
``run.diff(other)`` works), and a ``trace`` Profile for ``torchlens report``
(the single-trace report): ``one_trace`` picks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchlens.model import InputError, Profile, load_profile

_ZIP = b"PK\x03\x04"
_PICKLE = b"\x80"  # protocol 2 and later start with PROTO


def file_kind(path: Path) -> str:
    """What a file holds: ``tlprof``, ``snapshot`` or ``trace`` (see the module doc)."""
    name = path.name.lower()
    if name.endswith(".tlprof"):
        return "tlprof"
    if name.endswith((".pickle", ".pkl")):
        return "snapshot"
    if name.endswith((".json", ".json.gz")):
        return "trace"
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}).") from None
    if head.startswith(_ZIP):
        return "tlprof"
    if head.startswith(_PICKLE):
        return "snapshot"
    if head.lstrip()[:1] in (b"{", b"") or head.startswith(b"\x1f\x8b"):  # JSON, gzip
        return "trace"
    raise InputError(f"{path}: not a file torchlens reads (by its name and first bytes): "
                     "give a saved result (.tlprof), a Kineto trace (.json, .json.gz), an "
                     "allocator snapshot (.pickle) or a run folder.")


def load(path: Any, *, one_trace: str = "run", fork: bool = False) -> Any:
    """Read what ``path`` holds (see the module doc).

    Returns a ``Profile`` (``.tlprof``), a ``MemoryResult`` (snapshot), a
    ``RunResult`` (folder, list, and one trace when ``one_trace="run"``) or,
    with ``one_trace="trace"``, a ``trace`` Profile. ``fork``: the caller runs
    no threads (the command line), run workers may fork. Raises ``InputError``
    for a path that does not exist and a folder with no usable trace.
    """
    if one_trace not in ("run", "trace"):
        raise ValueError(f"one_trace={one_trace!r}: expected 'run' or 'trace'")
    if isinstance(path, (list, tuple)):
        return _load_run(list(path), fork)
    p = Path(os.fspath(path))
    if not p.exists():
        raise InputError(f"{path}: no such file or folder. Check the path.")
    if p.is_dir():
        from torchlens.formats.snapshot_set import snapshot_set

        ranks = snapshot_set(str(p))  # None for a run of traces: read as before
        if ranks is not None:
            from torchlens.frontends.memory.ranks import load_ranks

            return load_ranks(str(p), ranks)
        return _load_run(str(p), fork)
    kind = file_kind(p)
    if kind == "tlprof":
        return load_profile(p)
    if kind == "snapshot":
        from torchlens.frontends.trace.api import load_gpumem

        return load_gpumem(str(p))
    if one_trace == "run":
        return _load_run(str(p), fork)
    from torchlens.formats.kineto import load_trace

    trace = load_trace(p)
    return Profile(kind="trace", title=p.name, source=str(path), traces={"main": trace},
                   created_at=p.stat().st_mtime)


def _load_run(inputs: str | list[Any], fork: bool) -> Any:
    from torchlens.frontends.runs.api import load_run

    run = load_run(inputs, fork=fork)
    if not run.ranks:
        why = "; ".join(f"{q.kind}: {Path(q.path).name}" for q in run.problems[:5])
        where = (f"{inputs}: no usable per-rank trace in this folder" if isinstance(inputs, str)
                 and os.path.isdir(inputs) else
                 f"{', '.join(map(str, [inputs] if isinstance(inputs, str) else inputs[:3]))}"
                 ": no usable trace")
        raise InputError(f"{where} ({why or 'empty'})")
    return run


def as_profile(loaded: Any) -> Profile:
    """The Profile of what ``load`` returned (a result holds one)."""
    return loaded if isinstance(loaded, Profile) else loaded.profile
