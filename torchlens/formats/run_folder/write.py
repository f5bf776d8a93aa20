"""The one writer of a run folder's files besides the traces: each rank's
``steps.jsonl`` (and ``summaries.jsonl``) and the ``manifest.json`` that
lists them. ``%ddp_check --profile`` (``capture.ddp.launcher``) and
``torchlens run`` (``frontends.ranks.command``) both hand it the same typed
inputs: a ``RankEntry`` of what they know of each rank, its ``OomOutcome``,
its ``StepRecord``s; what the folder itself holds (the traces, the
allocator snapshot) and the OOM's words are filled in here, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torchlens.formats.run_folder import files, records
from torchlens.formats.run_folder.manifest import Manifest, RankEntry, write_manifest
from torchlens.model.messages import OomOutcome
from torchlens.model.records import StepRecord


@dataclass
class RankFiles:
    """One rank as a writer hands it over: its manifest entry (``traces``,
    ``oom_snapshot`` and ``oom`` are filled by ``write_run_folder``), its CUDA
    out-of-memory if it had one, its step records in order (every start of
    it), and its profiled-step summaries as received (None: the writer keeps
    none, and no ``summaries.jsonl`` is written)."""

    entry: RankEntry
    steps: Iterable[StepRecord | bytes]
    oom: OomOutcome | None = None
    summaries: Iterable[bytes] | None = None


def write_run_folder(run_dir: str, manifest: Manifest, ranks: Iterable[RankFiles]) -> Manifest:
    """Write each rank's records, then ``manifest`` with one entry per rank
    (in the order given, replacing ``manifest.ranks``); returns the manifest."""
    entries = []
    for rank in ranks:
        r = rank.entry.rank
        records.write_steps(run_dir, r, rank.steps)
        if rank.summaries is not None:
            records.write_summaries(run_dir, r, rank.summaries)
        entry = rank.entry
        entry.traces = files.rank_traces(run_dir, r)
        entry.oom_snapshot = files.oom_snapshot(run_dir, r)
        entry.oom = rank.oom.words() if rank.oom is not None else None
        entries.append(entry)
    manifest.ranks = entries
    write_manifest(run_dir, manifest)
    return manifest
