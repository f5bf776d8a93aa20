"""``result.diff(other)`` on memory results and ``torchlens diff A.pickle B.pickle``:
a ``memdiff`` result (``analysis.memory.diff``). ``loading.diff`` picks this
diff or the run diff from its two inputs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from torchlens.analysis.memory import diff as memdiff
from torchlens.frontends.result import Result
from torchlens.model import Profile
from torchlens.model.memory_figures import ChangeRow, MemoryDiff
from torchlens.model.payloads import MemoryDiffPayload

if TYPE_CHECKING:  # a memory result's diff() makes this module's result
    from torchlens.frontends.memory.api import MemoryResult

DIFF_SCHEMA_VERSION = 1
_ROW = ("name, status (added|removed|grew|shrank|small|same), a_bytes, b_bytes (alive at "
        "each side's peak), delta = b - a, delta_pct (null when a_bytes is 0), categories, "
        "function; largest |delta| first")
#: The ``torchlens diff --json`` document of two memory results, key by key.
MEMORY_DIFF_JSON_SCHEMA = {
    "schema": "torchlens-memory-diff, integer version",
    "kind": "memdiff",
    "a": "A's source (a snapshot file, a .tlprof or the capture's title)",
    "b": "B's source",
    "thresholds": "{same_pct, small_share, small_bytes}: a change within same_pct % of A's "
                  "bytes is same; beyond it but within small_bytes (small_share of the "
                  "larger peak) small; grew and shrank exceed both",
    "figures": "{peak, start, end}: allocated bytes, each {a, b, delta, pct}",
    "categories": f"what was alive at each peak by category: {_ROW}",
    "category_from": "who named the categories: inferred from stacks, torch's memory "
                     "profiler (a --categories torch capture) or your regexes; per side "
                     "when they differ",
    "category_note": "the same as the sentence the views show",
    "sites": f"the same by site (the user's line): {_ROW}",
    "summary": "how many categories have each status",
    "sides": "{a, b}: measured_on, clock, peak_known, events, made_by, missing",
    "timelines": "{x_label, a, b}: each side's allocated bytes over one shared x axis",
    "notes": "plain sentences: what a side could not answer, unlike sides",
    "verdict_code": "the verdict's kind (a finding's code): memory_diff",
    "verdict": "one sentence: the peak A -> B and the category and site that grew most",
}


def _source(r: MemoryResult, ms: bool = False) -> str:
    """A file's path; a capture's title and when it was taken (two captures share a
    title); ``ms``: to the millisecond, for two captures taken in the same second."""
    import time

    p = r.profile
    if p.source and os.path.exists(p.source):
        return p.source
    when = time.strftime("%H:%M:%S", time.localtime(p.created_at)) if p.created_at else ""
    if when and ms:
        when += f".{int(p.created_at * 1000) % 1000:03d}"
    return f"{p.title or p.source or 'capture'}" + (f", taken {when}" if when else "")


class MemoryDiffResult(Result):
    """Memory result B against A: ``categories()``, ``sites()``, ``figures()`` as
    DataFrames, ``verdict``, ``regressed(pct)``, ``to_json()``; displayed, its report."""

    @classmethod
    def of(cls, a: MemoryResult, b: MemoryResult, **thresholds: float) -> MemoryDiffResult:
        d = memdiff.diff_memory(a.analysis(), b.analysis(), **thresholds)
        la, lb = _source(a), _source(b)
        if la == lb:  # two captures in one second would read as the same side
            la, lb = _source(a, ms=True), _source(b, ms=True)
        profile = Profile(kind="memdiff", title=f"torchlens diff: {Path(la).name} -> "
                          f"{Path(lb).name}", source=lb,
                          payload=MemoryDiffPayload(a=la, b=lb, diff=d))
        return cls(profile)

    @property
    def diff(self) -> MemoryDiff:
        """The diff's figures, rows and verdict (``model.memory_figures.MemoryDiff``)."""
        return self.analysis()

    @property
    def verdict(self) -> str:
        """One sentence: the peak A -> B and what grew (or fell) most."""
        return str(self.diff.verdict)

    def regressed(self, pct: float) -> bool | None:
        """Whether B's peak is more than ``pct`` % above A's (None when A's peak is 0)."""
        return memdiff.regressed(self.diff, pct)

    @staticmethod
    def _frame(rows: list[ChangeRow]) -> Any:
        import pandas as pd

        return pd.DataFrame(msgspec.to_builtins(rows),
                            columns=["name", "status", "a_bytes", "b_bytes", "delta",
                                     "delta_pct", "categories", "function"])

    def categories(self) -> Any:
        """Alive at each peak per inferred category: bytes in A and B, change, status."""
        return self._frame(self.diff.categories)

    def sites(self) -> Any:
        """Alive at each peak per site (the user's line): bytes in A and B, change, status."""
        return self._frame(self.diff.sites)

    def figures(self) -> Any:
        """Peak, start and end allocated of A and B (DataFrame indexed by figure)."""
        import pandas as pd

        return pd.DataFrame(msgspec.to_builtins(self.diff.figures)).T

    def to_json(self) -> dict[str, Any]:
        """The ``torchlens diff --json`` document (``MEMORY_DIFF_JSON_SCHEMA``)."""
        p = self.profile.payload
        d = self.diff
        return {"schema": DIFF_SCHEMA_VERSION, "kind": "memdiff",
                "a": p.a, "b": p.b,  # type: ignore[union-attr]
                **msgspec.to_builtins(d), "verdict": str(d.verdict),
                "verdict_code": d.verdict.code}
