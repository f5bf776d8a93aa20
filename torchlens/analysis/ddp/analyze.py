"""Everything a ``ddp_check`` report shows, computed once from a Profile.

The checklist (``analysis.ddp``), the per-rank and per-collective rows, and
the heartbeats as plain records: the HTML report, the text view and
``DdpResult`` read the same ``DdpAnalysis``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import msgspec

from torchlens.analysis.ddp import checks as ddp
from torchlens.analysis.ddp.failures import rank_results
from torchlens.analysis.ddp.fsdp import rank_figures, rank_row
from torchlens.formats.fingerprints import describe_collective
from torchlens.model import DdpRun, Profile
from torchlens.model.findings import Finding
from torchlens.model.messages import DdpHeartbeat, MemoryReading
from torchlens.model.rank_report import RankReport

MAX_COLLECTIVE_ROWS = 400  # per rank, in the report's collective table


@dataclass
class RankRow:
    """One rank in the report's ranks table (``rank_rows``); ``fsdp`` its FSDP
    cells (``fsdp.rank_row``), empty without FSDP."""

    rank: int
    pid: int | None
    device: str
    exit: str
    collectives: int | None
    steps_s: float | None
    rss: int | None
    tensor: int | None
    error: str
    fsdp: dict[str, int | str | None] = field(default_factory=dict)

    def cells(self) -> dict[str, int | float | str | None]:
        """The row as the table reads it: a column per field, the FSDP cells last."""
        return {"rank": self.rank, "pid": self.pid, "device": self.device, "exit": self.exit,
                "collectives": self.collectives, "steps_s": self.steps_s, "rss": self.rss,
                "tensor": self.tensor, "error": self.error, **self.fsdp}


@dataclass
class CollectiveRow:
    """One collective a rank issued: its index, op, tensors in words, source line,
    the FSDP module whose parameters it moves, step, when it was called (unix s)
    and how long the call took (ms; None where not timed)."""

    rank: int
    index: int | None
    op: str | None
    tensors: str
    line: str | None
    module: str | None
    step: int | None
    t: float | None
    call_ms: float | None


@dataclass
class DdpAnalysis:
    """The checklist, its one-line summary, and the rows of each table."""

    run: DdpRun
    checklist: list[Finding]
    summary: str
    heartbeats: list[DdpHeartbeat]
    rank_rows: list[RankRow]
    collective_rows: list[CollectiveRow]

    def item(self, name: str) -> Finding | None:
        """The checklist line of the check called ``name``."""
        return next((i for i in self.checklist if name in (i.title, i.code)), None)


def heartbeats(profile: Profile) -> list[DdpHeartbeat]:
    """The ``heartbeats`` table as typed heartbeats (NaN, the table's missing value, as None;
    an integer column with a gap, which the table holds as floats, as integers)."""
    if "heartbeats" not in profile.tables:
        return []
    return [msgspec.convert({k: _cell(k, v) for k, v in row.items()}, DdpHeartbeat, strict=False)
            for row in profile.tables["heartbeats"].to_pandas().to_dict("records")]


def _cell(key: str, value: Any) -> Any:
    """A table cell as the heartbeat had it: NaN as None, a flag the table
    holds as a number (its column had gaps) as a bool."""
    if isinstance(value, float) and math.isnan(value):
        return None
    return bool(value) if key == "in_collective" and value is not None else value


def rank_rows(run: DdpRun) -> list[RankRow]:
    """One row per rank: pid, device, exit, collectives, step time, peak memory, error
    (and with FSDP: shards, gathered peak, optimizer state).

    ``collectives``: how many the rank issued, None where nothing counted them
    (--profile without --strict: the per-op recorder is off). ``steps_s``: the
    rank's median step in seconds: with --profile each ``torchlens.step()``
    step (the function ran once, as the whole loop), else each call of the
    function."""
    out = []
    n = run.world_size
    prof = run.profiling
    counted = prof is None or run.strict
    results = rank_results(run)
    fsdp = rank_figures(results, run.fingerprints or [])
    for r in range(n):
        res = (results[r] if r < len(results) else None) or RankReport(rank=r)
        peak = (run.memory_peak[r] if r < len(run.memory_peak) else None) or MemoryReading()
        if prof is not None:
            recs = prof.steps[r] if r < len(prof.steps) else []
            times = [rec.t1 - rec.t0 for rec in recs]
        else:
            times = [s.seconds for s in res.steps if s.end and s.seconds is not None]
        err = res.error
        code = run.exit_codes[r] if r < len(run.exit_codes) else None
        out.append(RankRow(
            rank=r, pid=res.pid, device=res.device or "",
            exit="killed" if r in run.killed else ("" if code is None else str(code)),
            collectives=(len(run.fingerprints[r]) if r < len(run.fingerprints) else 0)
            if counted else None,
            steps_s=median(times) if times else None,
            rss=peak.rss, tensor=peak.tensor_bytes,
            error=f"{err.type}: {err.message}" if err is not None else "",
            fsdp=rank_row(fsdp.get(r))))
    return out


def collective_rows(run: DdpRun, limit: int | None = MAX_COLLECTIVE_ROWS) -> list[CollectiveRow]:
    """Every rank's collectives (the first ``limit`` of each): op, tensors, line, call time."""
    rows = []
    for r, fps in enumerate(run.fingerprints):
        for fp in (fps or [])[:limit]:
            tensors = describe_collective(msgspec.structs.replace(fp, line="", op="",
                                                                  module=None))
            call_s = fp.call_time
            rows.append(CollectiveRow(
                rank=r, index=fp.index, op=fp.op,
                tensors=tensors.split(" ", 1)[-1].strip(), line=fp.line,
                module=fp.module_name,  # FSDP: whose parameters it moves
                step=fp.step, t=fp.t,
                call_ms=None if call_s is None else call_s * 1e3))
    return rows


def analyze(profile: Profile) -> DdpAnalysis:
    """The analysis of a ``kind="ddp_check"`` profile."""
    run: DdpRun = profile.payload  # type: ignore[assignment]
    items = ddp.checklist(run)
    return DdpAnalysis(run, items, ddp.summary(items, run), heartbeats(profile),
                       rank_rows(run), collective_rows(run))
