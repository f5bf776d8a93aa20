"""The series of a job a notebook runs or watches, for the Jupyter server's ``/metrics``.

``%ddp_check --profile --metrics`` has no collector, and ``torchlens.watch(...,
metrics=True)`` sees the collector's feed, not its snapshot; both hold what
that snapshot holds for the verdict (each rank's newest step records and
summaries, its node and host, how it ended). ``NotebookRun`` keeps that and
makes the one ``RunView`` (``verdict.run_view``) and the same families
``torchlens run --metrics`` exports (``metrics.metric_families``): one rule,
one set of names, whichever way the job was started.

``family_table`` is what the Jupyter server accepts from a kernel: the
families' names, types and help text are the server's own, only the samples
come from the kernel (``frontends.server.notebook_metrics`` checks them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from torchlens.analysis.ranks.metrics import Family, Histogram, metric_families
from torchlens.analysis.ranks.slow import SlowRank
from torchlens.analysis.ranks.verdict import LiveStatus, RunView, run_view
from torchlens.model.findings import INFO, Finding
from torchlens.model.messages import RankInfo, RankSnapshot
from torchlens.model.records import StepRecord, StepSummary

#: the newest step records / summaries kept per rank: the collector's own
#: window (``capture.ranks.collector.KEEP_STEPS``), so the figures are the same
KEEP_STEPS = 64
KEEP_SUMMARIES = 16


def family_table() -> dict[str, tuple[str, str]]:
    """Every family ``metric_families`` writes: name -> (type, help)."""
    slow = SlowRank(None, None, Finding(INFO, ""), 0.0, 0.0, 0.0, 0.0, 0)
    empty = RunView(Finding(INFO, ""), [], slow, [], [], 0, [], 0, 0)
    return {f.name: (f.kind, f.help) for f in metric_families(empty, "", {}, {})}


def ended_state(reason: str) -> str:
    """A rank's state (``verdict.rank_state``'s words) from how ``%ddp_check``'s
    launcher or the watch's feed says it ended: ``finished``; killed, or gone
    without a result: ``lost``; its agent ended it; else (an error) ``failed``."""
    words = reason.lower()
    if words.startswith("finished"):
        return "finished"
    if words.startswith("ended by its agent"):
        return "ended by its agent"
    if words.startswith(("killed", "lost", "its process ended", "sent no result")):
        return "lost"
    return "failed"


@dataclass
class RankWhere:
    """What the feed and the collector's status say of a rank beside its steps."""

    node: int | None = None
    host: str | None = None
    state: str | None = None
    restart: int | None = None


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


class NotebookRun:
    """What one job's series need, fed as a ``RankFeed`` is (steps, summaries, ends)."""

    def __init__(self, run: str, world_size: int,
                 where: Mapping[str, int | str | None] | None = None) -> None:
        """``where``: the ``node`` and ``host`` of every rank when the launcher knows
        them (``%ddp_check`` without ``--nnodes``: this machine, node 0, and its
        heartbeats say neither); a rank's own heartbeat or the collector's status wins."""
        self.run = run
        self.world_size = world_size
        where = where or {}
        node, host = where.get("node"), where.get("host")
        self.where = RankWhere(node=node if isinstance(node, int) else None,
                               host=host if isinstance(host, str) else None)
        self.steps: dict[int, list[StepRecord]] = {}
        self.summaries: dict[int, list[StepSummary]] = {}
        self.histograms: dict[int, Histogram] = {}
        self.rows: dict[int, RankWhere] = {}
        self.seen: dict[int, float] = {}  # rank -> unix time of its newest news

    def heartbeat(self, rank: int, t: float, node: int | None = None,
                  host: str | None = None) -> None:
        row = self.rows.setdefault(rank, RankWhere())
        if node is not None:
            row.node = node
        if host is not None:
            row.host = host
        self.seen[rank] = max(self.seen.get(rank, 0.0), t)

    def add_steps(self, rank: int, records: Iterable[StepRecord]) -> None:
        records = list(records)
        kept = self.steps.setdefault(rank, [])
        kept.extend(records)
        del kept[:-KEEP_STEPS]
        steps = [rec.t1 - rec.t0 for rec in records if not rec.window]
        if steps:
            self.histograms[rank] = self.histograms.get(rank, Histogram()).add(steps)
        if records:
            self.heartbeat(rank, records[-1].t1)

    def add_summary(self, rank: int, summary: StepSummary | Any) -> None:
        """A profiled step's summary (or its decoded JSON, from ``%ddp_check``)."""
        try:
            summary = StepSummary.of(summary)
        except msgspec.ValidationError:
            return
        kept = self.summaries.setdefault(rank, [])
        kept.append(summary)
        del kept[:-KEEP_SUMMARIES]

    def ended(self, rank: int, reason: str, t: float | None) -> None:
        self.rows.setdefault(rank, RankWhere()).state = ended_state(reason)
        if t is not None:
            self.heartbeat(rank, t)

    def take_status(self, status: LiveStatus | None) -> None:
        """The collector's own rows (``verdict.live_status``): its state, node,
        host and restart count win over what the feed let this guess."""
        if status is None:
            return
        for row in status.ranks:
            mine = self.rows.setdefault(row.rank, RankWhere())
            for key in ("node", "host", "state", "restart"):
                if getattr(row, key) is not None:
                    setattr(mine, key, getattr(row, key))
        if isinstance(status.world_size, int) and status.world_size > self.world_size:
            self.world_size = status.world_size

    def view(self) -> RunView:
        """The verdict and rows, as ``torchlens run``'s collector would judge them."""
        world = max([self.world_size, *(r + 1 for r in self.rows),
                     *(r + 1 for r in self.steps)])
        ranks: list[RankInfo | None] = []
        for r in range(world):
            row = self.rows.get(r)
            if row is None and r not in self.steps:
                ranks.append(None)
                continue
            row = row or RankWhere()
            ranks.append(RankInfo(rank=r, node=_first(row.node, self.where.node),
                                  host=_first(row.host, self.where.host),
                                  incarnation=row.restart or 0, shared_run_dir=True,
                                  steps_sent=self.histograms.get(r, Histogram()).count))
        view = run_view(RankSnapshot(
            world_size=world, ranks=ranks, lost_after_s=math.inf,
            steps=[list(self.steps.get(r, [])) for r in range(world)],
            summaries=[list(self.summaries.get(r, [])) for r in range(world)]))
        for row in view.ranks:
            where = self.rows.get(row.rank)
            if where is not None and where.state is not None:
                row.state = where.state
        return view

    def families(self, now: float) -> list[Family]:
        """The run's series now (``now``: unix time, for each rank's heartbeat age)."""
        ages = {r: max(0.0, now - t) for r, t in self.seen.items()}
        return metric_families(self.view(), self.run, dict(self.histograms), ages)
