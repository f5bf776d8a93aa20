"""Each rank's ``steps.jsonl`` and ``summaries.jsonl``: one JSON record a line.

``steps.jsonl`` holds every step record of the rank (every start of it with
``torchlens run``: ``restart`` says which, 0 for the first), one
``model.records.StepRecord`` a line in its JSON; ``summaries.jsonl`` its
profiled-step summaries (``torchlens run`` only). A writer may pass a record
already encoded (bytes, as the collector spooled it): it is written as it is,
not decoded again.

A line that is not a record (the last line of a file cut short) is skipped
by the readers: the records before it still count.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torchlens.formats.input_files import RefusedFile, read_lines
from torchlens.formats.run_folder.files import STEPS, SUMMARIES, rank_dir
from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, RestartEntry
from torchlens.model.compiled import CompileLog
from torchlens.model.records import ScalerStep, StepRecord, without_setup

Record = dict[str, Any]


def _write(path: str, records: Iterable[StepRecord | Record | bytes], mode: str = "wb") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as fh:
        for rec in records:
            if isinstance(rec, StepRecord):
                rec = rec.to_json().encode()
            fh.write(rec if isinstance(rec, bytes) else json.dumps(rec).encode())
            fh.write(b"\n")


#: what decoding one damaged line can raise (a value of the wrong type, a number
#: out of range, a nest deeper than the parser follows): the line is skipped
_BAD_LINE = (ValueError, TypeError, OverflowError, RecursionError, KeyError, AttributeError)


def _lines(path: str) -> Iterator[bytes]:
    """The file's lines, read through ``input_files.read_lines`` (a regular file in
    its rank folder; an overlong line comes back empty, a damaged line); none
    when it is not there or refused (a link out of the run folder, a FIFO)."""
    try:
        yield from read_lines(path, within=os.path.dirname(os.path.dirname(path)) or ".")
    except (OSError, RefusedFile):
        return


def _read(path: str) -> Iterator[Record]:
    for line in _lines(path):
        try:
            rec = json.loads(line.decode("utf-8", errors="replace"))
        except _BAD_LINE:
            continue
        if isinstance(rec, dict):
            yield rec


def write_steps(run_dir: str, rank: int,
                records: Iterable[StepRecord | Record | bytes]) -> None:
    """``rank<r>/steps.jsonl``: the rank's step records, in order."""
    _write(os.path.join(rank_dir(run_dir, rank), STEPS), records)


def append_steps(run_dir: str, rank: int, records: Iterable[StepRecord]) -> None:
    """Add records to the end of ``rank<r>/steps.jsonl``: a run whose launcher
    writes the folder at its end keeps, so, what its ranks did when that
    launcher dies first (a notebook kernel that died: the folder then has
    steps but no manifest, and its report says the run was cut off)."""
    _write(os.path.join(rank_dir(run_dir, rank), STEPS), records, mode="ab")


def write_summaries(run_dir: str, rank: int, summaries: Iterable[Record | bytes]) -> None:
    """``rank<r>/summaries.jsonl``: the rank's profiled-step summaries, in order."""
    _write(os.path.join(rank_dir(run_dir, rank), SUMMARIES), summaries)


def iter_steps(run_dir: str, rank: int) -> Iterator[StepRecord]:
    """The rank's step records one at a time (a long run has millions), its
    set-up windows left out (``model.records.without_setup``: ``torchlens run``
    writes every record the rank sent); none when it has no ``steps.jsonl``."""
    yield from without_setup(_records(os.path.join(rank_dir(run_dir, rank), STEPS)))


#: path -> lines of its last full read that were not a step record (cut short,
#: damaged): a reader skips them and the run's report names them (``damaged``)
_DAMAGED: dict[str, int] = {}


def _records(path: str) -> Iterator[StepRecord]:
    bad = 0
    for line in _lines(path):
        try:
            rec = StepRecord.from_json(line)
        except _BAD_LINE:
            bad += 1
            continue
        yield rec
    _DAMAGED[path] = bad


def damaged(run_dir: str, rank: int) -> int:
    """How many lines of the rank's ``steps.jsonl`` its last full read skipped."""
    return _DAMAGED.get(os.path.join(rank_dir(run_dir, rank), STEPS), 0)


def read_steps(run_dir: str, rank: int) -> list[StepRecord]:
    """Every step record of the rank."""
    return list(iter_steps(run_dir, rank))


def read_summaries(run_dir: str, rank: int) -> list[Record]:
    """Every profiled-step summary of the rank."""
    return list(_read(os.path.join(rank_dir(run_dir, rank), SUMMARIES)))


@dataclass
class CollectedSteps:
    """Every step record of every rank of a ``torchlens run`` folder, cut to what a
    chart over time needs: per rank, columns ``restart``, ``step``, ``t0``, ``t1``,
    ``label`` (None for a training step; ``StepRecord.label`` for a span a
    framework labelled, an evaluation or a checkpoint), ``skipped`` (the
    optimizer steps the loss scaler skipped in it) and ``recompiled`` (it
    recompiled: a compile a failed guard made)."""

    ranks: dict[int, dict[str, list[Any]]]
    restarts: list[RestartEntry]  # the manifest's (``analysis.ranks.restarts.Restart``)
    started: float | None  # when the collector started (unix s)


def collected_steps(run_dir: str, manifest: Manifest,
                    seen: Callable[[int, StepRecord], None] | None = None
                    ) -> CollectedSteps | None:
    """The step records of a ``torchlens run`` folder; None for a folder of another
    writer (its traces hold its profiled steps). ``seen(rank, record)``: each
    record as it is read, for a reader that wants more than the columns."""
    if manifest.source != SOURCE_RUN:
        return None
    return CollectedSteps(_columns(run_dir, [e.rank for e in manifest.ranks], seen),
                          list(manifest.restarts), manifest.started)


def ranks_with_steps(run_dir: str) -> list[int]:
    """The ranks whose ``rank<r>/steps.jsonl`` is in the folder, sorted: who
    recorded steps, where no manifest says it."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    found = (re.fullmatch(r"rank(\d+)", n) for n in names)
    return sorted(int(m.group(1)) for m in found
                  if m and os.path.isfile(os.path.join(run_dir, m.group(0), STEPS)))


def steps_without_manifest(run_dir: str,
                           seen: Callable[[int, StepRecord], None] | None = None
                           ) -> CollectedSteps | None:
    """``collected_steps`` of a folder whose manifest is missing or damaged: the
    records are each rank's own file, whole without it; what only the
    manifest holds is left out (the restarts' times, when the collector
    started: the chart's zero is then the first step). None without any
    ``rank<r>/steps.jsonl``."""
    ranks = ranks_with_steps(run_dir)
    return CollectedSteps(_columns(run_dir, ranks, seen), [], None) if ranks else None


def _columns(run_dir: str, ranks: list[int], seen: Callable[[int, StepRecord], None] | None
             ) -> dict[int, dict[str, list[Any]]]:
    out: dict[int, dict[str, list[Any]]] = {}
    for rank in ranks:
        cols: dict[str, list[Any]] = {"restart": [], "step": [], "t0": [], "t1": [],
                                      "label": [], "skipped": [], "recompiled": []}
        for rec in iter_steps(run_dir, rank):
            if seen is not None:
                seen(rank, rec)
            cols["restart"].append(rec.start)
            cols["step"].append(rec.step)
            cols["t0"].append(rec.t0)
            cols["t1"].append(rec.t1)
            cols["label"].append(rec.label if rec.labelled else None)
            cols["skipped"].append(rec.scaler.skipped if isinstance(rec.scaler, ScalerStep)
                                   else 0)
            cols["recompiled"].append(isinstance(rec.compiled, CompileLog) and any(
                f.recompile_reason for f in rec.compiled.frames))
        out[rank] = cols
    return out
