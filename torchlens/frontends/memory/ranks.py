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

from torchlens.analysis.memory.ranks import analyze_ranks
from torchlens.frontends.memory.api import load_gpumem
from torchlens.frontends.result import Result
from torchlens.model import InputError, Profile
from torchlens.model.findings import as_finding
from torchlens.model.payloads import MemoryRanksPayload

SCHEMA_VERSION = 1


class MemoryRanksResult(Result):
    """Every rank's memory: ``ranks()`` (DataFrame: peak, when, top category and site),
    ``verdict`` (the imbalance named), ``to_json()``; displayed, its report."""

    @property
    def figures(self) -> dict[str, Any]:
        return self.analysis()

    @property
    def verdict(self) -> str:
        """The imbalance in one sentence (which rank, how far above the median, what)."""
        return str(as_finding(self.figures["verdict"]))

    def ranks(self) -> Any:  # a DataFrame, one row per rank
        """Per rank: peak and end allocated, when the peak was, the category and site
        holding most of it (categories are inferred from stacks)."""
        import pandas as pd

        rows = [{"rank": r["rank"], "peak": r["peak"], "end": r["end"],
                 "when_us" if r["clock"] == "us" else "when_entry":
                     r["x"] if r["clock"] == "us" else r["entry"],
                 "top_category": (r["top_category"] or {}).get("name"),
                 "top_category_bytes": (r["top_category"] or {}).get("bytes"),
                 "top_site": (r["top_site"] or {}).get("name"), "source": r["source"]}
                for r in self.figures["ranks"]]
        return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "kind": "memranks",
                "root": self.profile.payload.root,  # type: ignore[union-attr]
                **self.figures, "verdict": self.verdict,
                "verdict_code": as_finding(self.figures["verdict"], code="memory_ranks").code}


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
    figures["notes"] = problems + figures["notes"]
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
