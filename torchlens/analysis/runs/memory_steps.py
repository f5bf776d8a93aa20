"""Each rank's memory over its steps, for a run folder's report: the chart's
points and, per rank, where it started, where it ended and how fast it grew.

Read from the step records' ``mem`` (``model.records.StepMemory``), one
record at a time as the front end reads the folder (``MemorySteps.add``).

Definitions (bytes):

- Figure (``source``), one for every rank so they compare: the CUDA
  allocator's ``allocated`` where every rank sent it, else the C heap in use
  (``heap``, a CPU rank on glibc) where every rank sent it, else RSS. A
  memory creep's own figure (the manifest's ``source``) is taken first, so
  the chart shows what the creep rule measured.
- Window: the steps the growth is fitted over. With a memory creep, the
  steps its rule fitted (``analysis.ranks.steps``: the collector keeps each
  rank's newest records, leaves out the newest step and a warm-up; the
  creep's ``steps`` are the last of those): the rank's last step but one,
  back ``steps`` steps. Without one, as that rule reads a whole run: after
  the first 20% of the steps, the newest left out.
- Per rank: ``start_bytes`` at its first step; ``end_bytes`` at the
  window's last step (the newest step is read as the job ends, after the
  loop let go of what it kept: a leak of 100 MiB reads as a drop there);
  ``growth_per_step``: the least-squares slope over the window's
  steps (the creep rule's, so a creeping rank's figure is its finding's).
"""

from __future__ import annotations

from collections.abc import Sequence

from torchlens.analysis.ranks.steps import WARMUP
from torchlens.formats.run_folder.manifest import CreepEntry
from torchlens.model.payloads import RankMemory, RunMemory
from torchlens.model.records import StepRecord

#: points drawn per rank (evenly thinned beyond, first and last kept)
MAX_POINTS = 400
#: each source's words on the chart and in the table
LABELS = {"allocated": "allocated (CUDA)", "heap": "C heap in use", "rss": "RSS"}
_CREEP_SOURCES = {"cuda": "allocated", "heap": "heap", "rss": "rss"}


class MemorySteps:
    """Collects each rank's memory per step (``add``, a record at a time) and
    gives the report's figures (``figures``)."""

    def __init__(self) -> None:
        #: rank -> [(step, allocated, heap, rss)] in the order read
        self.rows: dict[int, list[tuple[int, int | None, int | None, int | None]]] = {}

    def add(self, rank: int, rec: StepRecord) -> None:
        """One step record of ``rank`` (set-up windows and labelled spans are left out)."""
        if rec.window or rec.labelled:
            return
        m = rec.mem
        row = self.rows.setdefault(rank, [])
        if m is None:
            return
        heap = m.heap if isinstance(m.heap, int) else None
        allocated = m.allocated if m.source == "cuda" else None
        row.append((rec.step, allocated, heap, m.rss))

    def last_steps(self) -> dict[int, int]:
        """Each rank's last step with memory."""
        return {r: rows[-1][0] for r, rows in self.rows.items() if rows}

    def figures(self, creeps: Sequence[CreepEntry] = ()) -> RunMemory | None:
        """The chart's and the table's figures (the module docstring); None
        when no rank's records hold memory."""
        ranks = {r: rows for r, rows in sorted(self.rows.items()) if rows}
        if not ranks:
            return None
        source = _source(ranks, creeps)
        column = {"allocated": 1, "heap": 2, "rss": 3}[source]
        series = {r: [(s, float(row[column])) for row in rows
                      if (s := row[0]) is not None and row[column] is not None]
                  for r, rows in ranks.items()}
        series = {r: pts for r, pts in series.items() if pts}
        if not series:
            return None
        window = _window(series, creeps)
        out = []
        creeping = {c.rank for c in creeps}
        for r, pts in series.items():
            fit = [p for p in pts if window and window[0] <= p[0] <= window[1]]
            end = fit[-1] if fit else pts[-1]
            out.append(RankMemory(
                rank=r, first_step=pts[0][0], last_step=end[0],
                start_bytes=pts[0][1], end_bytes=end[1],
                growth_per_step=_slope(fit) if len(fit) >= 3 else None,
                creeps=r in creeping, step=[p[0] for p in _thin(pts)],
                bytes=[p[1] for p in _thin(pts)]))
        return RunMemory(source=source, label=LABELS[source],
                         window=list(window) if window else None, ranks=out)


def _source(ranks: dict[int, list[tuple[int, int | None, int | None, int | None]]],
            creeps: Sequence[CreepEntry]) -> str:
    for c in creeps:
        if c.source in _CREEP_SOURCES:
            return _CREEP_SOURCES[c.source]
    for name, column in (("allocated", 1), ("heap", 2)):
        if all(any(row[column] is not None for row in rows) for rows in ranks.values()):
            return name
    return "rss"


def _window(series: dict[int, list[tuple[int, float]]],
            creeps: Sequence[CreepEntry]) -> tuple[int, int] | None:
    """The steps the growth is fitted over (the module docstring)."""
    for c in creeps:
        pts = series.get(c.rank) if c.rank is not None else None
        if pts and len(pts) >= 2 and c.steps:
            last = pts[-2][0]  # the newest step is left out
            return last - c.steps + 1, last
    longest = max(series.values(), key=len)
    kept = longest[:-1][int((len(longest) - 1) * WARMUP):]
    return (kept[0][0], kept[-1][0]) if len(kept) >= 3 else None


def _slope(points: list[tuple[int, float]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def _thin(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(points) <= MAX_POINTS:
        return points
    every = len(points) / (MAX_POINTS - 1)
    kept = [points[int(i * every)] for i in range(MAX_POINTS - 1)]
    return [*kept, points[-1]]
