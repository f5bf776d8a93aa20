"""One loader for every file torchlens reads: ``torchlens.load`` and the command line;
and ``diff``, the one way in for both kinds of diff (memory or run, from the inputs).

Why one: with two loaders, ``torchlens report X.pickle`` could read an allocator
snapshot that ``torchlens.load(X.pickle)`` refuses. Both call ``load``,
so what one reads the other reads, with the same messages.

What a path is, first match wins:

- a folder of per-rank allocator snapshots and no traces (the naming rule:
  ``formats.snapshot_set``): one memory result of every rank
  (``memory.ranks.load_ranks``);
- a list, or a folder: the per-rank traces of a run (``runs.api.load_run``);
- ``.tlprof``: a saved result, back as the result its capture gave (a
  ``%%torchprof`` result with ``ops()``, ``kernels()`` and ``steps()``, a
  ``MemoryResult``, a ``DdpResult``; ``saved_result``);
- ``.pickle`` / ``.pkl``: an allocator snapshot (``memory.api.load_gpumem``; no
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

from torchlens.formats.file_kind import file_kind
from torchlens.formats.input_files import check_file, check_zip
from torchlens.frontends.result import Result
from torchlens.model import InputError, Profile, load_profile
from torchlens.model.errors import PathNotFoundError

#: what a path may be, for the message of one that does not exist
ACCEPTS = ("a run folder (torchlens run's, or one of per-rank traces), a Kineto trace "
           "(.json, .json.gz), a saved result (.tlprof) or an allocator snapshot (.pickle)")


def missing_path(path: Any) -> PathNotFoundError:
    """The one-line error of an input path that does not exist, and what is read."""
    return PathNotFoundError(f"{path}: no such file or folder. Check the path; torchlens "
                             f"reads {ACCEPTS}.")


def load(path: Any, *, one_trace: str = "run", fork: bool = False) -> Any:
    """Read what ``path`` holds (see the module doc).

    Returns the saved result (``.tlprof``), a ``MemoryResult`` (snapshot), a
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
        raise missing_path(path)
    from torchlens.formats.run_folder.manifest import folder_of_manifest

    run_dir = folder_of_manifest(p)  # a run's manifest named alone: the run
    if run_dir is not None:
        p = Path(run_dir)
    if p.is_dir():
        from torchlens.formats.snapshot_set import snapshot_set

        ranks = snapshot_set(str(p))  # None for a run of traces: read as before
        if ranks is not None:
            from torchlens.frontends.memory.ranks import load_ranks

            return load_ranks(str(p), ranks)
        return _load_run(str(p), fork)
    check_file(p)  # a FIFO or a device named as a file: refused here, in one line
    if p.suffix == ".jsonl":  # a run folder's records, one JSON document a line
        folder = p.parent.parent if p.parent.name.startswith("rank") else p.parent
        raise InputError(
            f"{path}: a .jsonl file holds records, one JSON document a line (a run folder's "
            "rank<r>/steps.jsonl or live.jsonl), not a trace or a result; read the run "
            f"folder it belongs to: torchlens report {folder}")
    kind = file_kind(p)
    if kind == "tlprof":
        check_zip(p)  # its members' inflated sizes, before any is read
        return saved_result(load_profile(p))
    if kind == "snapshot":
        from torchlens.frontends.memory.api import load_gpumem

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
    if run.nothing_read:
        # a refused file says why, the bound and how to raise it
        why = "; ".join(f"{q.kind}: {Path(q.path).name}" + (
            f" ({q.message.rstrip('.')})" if q.message.startswith("refused") else "")
            for q in run.problems[:5])
        where = (f"{inputs}: no usable per-rank trace in this folder" if isinstance(inputs, str)
                 and os.path.isdir(inputs) else
                 f"{', '.join(map(str, [inputs] if isinstance(inputs, str) else inputs[:3]))}"
                 ": no usable trace")
        raise InputError(f"{where} ({why or 'empty'})")
    return run


def saved_result(profile: Profile) -> Result | Profile:
    """A saved capture as the result its capture handed back, so ``res.ops()``
    works on ``torchlens.load("x.tlprof")`` as on the cell's own result; any
    other saved kind (a diff, a run's analysis) as its Profile."""
    if profile.kind == "gpumem":
        from torchlens.frontends.memory.api import MemoryResult

        return MemoryResult(profile)
    if profile.kind == "ddp_check":
        from torchlens.frontends.ddp.api import DdpResult

        return DdpResult(profile)
    if profile.kind in ("torchprof", "trace"):
        return Result(profile)
    return profile


def as_profile(loaded: Any) -> Profile:
    """The Profile of what ``load`` returned (a result holds one)."""
    return loaded if isinstance(loaded, Profile) else loaded.profile


def diff(a: Any, b: Any, *, workers: int | None = None, **thresholds: float) -> Any:
    """B against A: a ``MemoryDiffResult`` for two memory results (or snapshot files,
    or saved ``%%gpumem`` results), else the trace diff of two runs (``DiffResult``)."""
    from torchlens.frontends.memory.api import as_memory
    from torchlens.frontends.memory.diff import MemoryDiffResult

    ma, mb = as_memory(a), as_memory(b)
    if ma is not None and mb is not None:
        return MemoryDiffResult.of(ma, mb, **thresholds)
    if ma is not None or mb is not None:
        mem, other = ("A", "B") if ma is not None else ("B", "A")
        raise InputError(f"{mem} is a memory result (a snapshot or a %%gpumem result) and "
                         f"{other} is not: diff two snapshots, or two runs / traces")
    from torchlens.frontends.runs.api import diff_runs

    return diff_runs(a, b, workers=workers, **thresholds)
