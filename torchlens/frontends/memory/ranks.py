"""A folder of per-rank allocator snapshots as one result (``torchlens.load(FOLDER)``,
``torchlens report FOLDER``, ``torchlens.load_snapshots(RUN_DIR)``).

Which file is which rank: ``formats.snapshot_set``. Each snapshot is read as
``torchlens.load(X.pickle)`` reads it (``api.load_gpumem``: no pickle global is
loaded) and analysed alone; ``analysis.memory.ranks`` puts them side by side.
A rank whose file cannot be read is named in the notes, not fatal.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from torchlens.analysis.memory.ranks import analyze_ranks
from torchlens.frontends.memory.api import load_gpumem
from torchlens.frontends.result import Result
from torchlens.model import InputError, Profile
from torchlens.model.memory_figures import MemoryRanks
from torchlens.model.payloads import MemoryRanksPayload

SCHEMA_VERSION = 1


class MemoryRanksResult(Result):
    """Every rank's memory: ``ranks()`` (DataFrame: peak, when, top category and site),
    ``verdict`` (the imbalance named), ``to_json()``; displayed, its report."""

    @property
    def figures(self) -> MemoryRanks:
        """Every rank's peak, the imbalance and its verdict
        (``model.memory_figures.MemoryRanks``)."""
        return self.analysis()

    @property
    def verdict(self) -> str:
        """The imbalance in one sentence (which rank, how far above the median, what)."""
        return str(self.figures.verdict)

    def ranks(self) -> Any:  # a DataFrame, one row per rank
        """Per rank: peak and end allocated, when the peak was, the category and site
        holding most of it (categories are inferred from stacks)."""
        import pandas as pd

        rows = [{"rank": r.rank, "peak": r.peak, "end": r.end,
                 "when_us" if r.clock == "us" else "when_entry":
                     r.x if r.clock == "us" else r.entry,
                 "top_category": r.top_category.name if r.top_category else None,
                 "top_category_bytes": r.top_category.bytes if r.top_category else None,
                 "top_site": r.top_site.name if r.top_site else None, "source": r.source}
                for r in self.figures.ranks]
        return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()

    def to_json(self) -> dict[str, Any]:
        f = self.figures
        return {"schema": SCHEMA_VERSION, "kind": "memranks",
                "root": self.profile.payload.root,  # type: ignore[union-attr]
                **msgspec.to_builtins(f), "verdict": str(f.verdict),
                "verdict_code": f.verdict.code}


def load_ranks(root: str, paths: dict[int, str], **options: Any) -> MemoryRanksResult:
    """The snapshots ``paths`` ({rank: file}) of folder ``root`` as one result."""
    analyses, problems = {}, []
    for rank, path in sorted(paths.items()):
        try:
            analyses[rank] = load_gpumem(path, **options).analysis()
        except InputError as exc:
            problems.append(f"rank {rank}: {exc} (left out)")
    if not analyses:
        raise InputError(f"{root}: no rank snapshot could be read ({problems[0]})")
    rel = {r: os.path.relpath(p, root) for r, p in paths.items()}
    figures = analyze_ranks(analyses, rel)
    figures.notes = problems + figures.notes
    name = os.path.basename(os.path.normpath(root))
    profile = Profile(kind="memranks", title=f"{name}: memory of {len(analyses)} ranks",
                      source=root, payload=MemoryRanksPayload(root=root, analysis=figures))
    return MemoryRanksResult(profile)


def load_snapshots(folder: str, **options: Any) -> MemoryRanksResult:
    """Every rank's snapshot in ``folder`` (the naming rule of
    ``formats.snapshot_set``), a run folder's ``rank<r>/oom.pickle`` included."""
    from torchlens.formats.snapshot_set import snapshot_set

    if not os.path.isdir(folder):
        raise InputError(f"{folder}: not a folder. Pass the folder of per-rank snapshots.")
    paths = snapshot_set(folder, in_run=True)
    if not paths:
        raise InputError(f"{folder}: no per-rank snapshot (rank<N>/*.pickle, or *.pickle "
                         "files named with rank<N>, e.g. rank0.pickle)")
    return load_ranks(folder, paths, **options)
