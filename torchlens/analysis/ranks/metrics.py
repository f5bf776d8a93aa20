"""The series ``torchlens run --metrics`` exports to Prometheus (docs/METRICS.md).

Pure: ``metric_families`` turns the collector's ``RunView`` (the figures the
terminal and the watch show), each rank's step-time histogram and heartbeat
age into metric families; ``render.metrics_text`` writes them in Prometheus's
text format. Names are in base units (seconds, bytes, ratios) and counters
end in ``_total``.

Cardinality is bounded by the world size: a family has one series per rank
(``torchlens_step_seconds``: one per bucket per rank), per rank and phase or
state, or one per job; never per op, kernel or step. Labels hold nothing of
the job's code or data: ``run`` (the run folder's name), ``rank``, ``node``,
``host``, and ``phase``, ``state`` or ``cause``, whose values are fixed words.

Why ``run`` and not ``job``: Prometheus gives every scraped series the
target's ``job`` label (the scrape config's name); a ``job`` label of ours
would be renamed ``exported_job`` at scrape.

The step-time histogram counts every step the collector received, not only
the newest ones it keeps: ``StepHistograms.take`` is fed each poll with what
each slot (a start of a rank) sent since the last one. Its quantiles are
interpolated within a bucket (every 33 ms step of a run reads ~37 ms at
p50), so the median a dashboard shows is ``torchlens_step_median_seconds``,
the terminal's own figure; the histogram is for SLO ratios.

The allocator's series are exported only when the CUDA caching allocator
measured them (``source == "cuda"``): a CPU run's figures are modelled (a
profiled step replayed), which the terminal marks with ``~``; exported, they
would read as measured and trip the fragmentation alert on every CPU run.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchlens.analysis.ranks.steps import PHASES
from torchlens.analysis.ranks.verdict import RankRow, RunView, is_peer_stopped
from torchlens.model.records import StepRecord

#: step-time bucket bounds (seconds): a 5 ms step to a minute-long one
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: a rank's state as Prometheus sees it (``analysis.ranks.verdict.rank_state``'s words;
#: a silent rank is up until it is lost: the gauges of its heartbeat age say the rest)
STATES = {"running": "up", "silent": "up", "finished": "ended", "ended by its agent": "ended",
          "ended: peer failed": "ended", "interrupted": "ended", "failed": "failed", "lost": "lost",
          "waiting": "waiting"}
STATE_VALUES = ("up", "ended", "failed", "lost", "waiting")


def prometheus_state(state: str) -> str:
    """A rank's state as Prometheus sees it: a rank torchrun reports killed by a
    signal (SIGTERM: its agent ended it) sent no goodbye, lost; one that exited
    non-zero failed."""
    if state in STATES:
        return STATES[state]
    if is_peer_stopped(state):  # a peer's failure ended it
        return "ended"
    if state.startswith("killed by "):
        return "ended" if state.startswith("killed by signal 15 ") else "lost"
    return "failed" if state.startswith("exit code ") else "ended"
#: the slow rank's cause when no measured part explains the wait
UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class Histogram:
    """One rank's step times: cumulative counts per ``BUCKETS`` bound (then +Inf), their sum."""

    buckets: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    total_s: float = 0.0

    @property
    def count(self) -> int:
        return self.buckets[-1]

    def add(self, seconds: Iterable[float]) -> Histogram:
        per_bucket = [0] * (len(BUCKETS) + 1)
        total = self.total_s
        for s in seconds:
            per_bucket[bisect.bisect_left(BUCKETS, s)] += 1
            total += s
        out, running = [], 0
        for old, new in zip(self.buckets, per_bucket, strict=True):
            running += new
            out.append(old + running)
        return Histogram(tuple(out), total)


@dataclass
class StepHistograms:
    """Every rank's step-time histogram over all its starts.

    ``add`` takes each batch of step records as the collector keeps it
    (``Collector.listeners``), so every step is counted once, however many
    arrive between two scrapes: the collector's step count is no cursor (it
    leaves out labelled spans and takes set-up windows back once a rank steps).
    A scrape reads ``ranks`` from another thread: each ``add`` replaces a
    rank's frozen ``Histogram`` whole, so a reader that copies ``ranks``
    (``dict(...)``) never sees half an update. Set-up windows (``window``:
    before a start's first ``torchlens.step()``) and labelled spans (an
    evaluation, a checkpoint) are not training steps and are not counted.
    """

    ranks: dict[int, Histogram] = field(default_factory=dict)

    def add(self, rank: int, records: Iterable[StepRecord]) -> None:
        """Count the training steps among ``records``, a batch ``rank`` sent."""
        steps = [rec.t1 - rec.t0 for rec in records if not rec.window and not rec.labelled]
        if steps:
            self.ranks[rank] = self.ranks.get(rank, Histogram()).add(steps)


@dataclass
class Family:
    """One metric family: its samples as (name suffix, labels, value)."""

    name: str
    kind: str  # counter, gauge, histogram
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: Any, suffix: str = "") -> None:
        if value is not None:
            self.samples.append((suffix, labels, float(value)))


def _ms(value: Any) -> float | None:
    return None if value is None else value / 1e3


def rank_labels(run: str, row: RankRow) -> dict[str, str]:
    """A rank's labels: its run, rank, node and host (empty when not known yet)."""
    return {"run": run, "rank": str(row.rank), "node": "" if row.node is None else str(row.node),
            "host": str(row.host or "")}


def metric_families(view: RunView, run: str, histograms: Mapping[int, Histogram],
                    heartbeat_age: Mapping[int, float]) -> list[Family]:
    """The series of one run (names and meanings: docs/METRICS.md).

    ``histograms``: each rank's step times (``StepHistograms.ranks``);
    ``heartbeat_age``: seconds since each rank's heartbeat last changed, on the
    collector's clock, at the time of the scrape.
    """
    step = Family("torchlens_step_seconds", "histogram",
                  "Step time of every step the rank sent (torchlens.step() to the next)")
    steps = Family("torchlens_steps_total", "counter",
                   "Steps the rank sent, over all its starts (set-up windows left out)")
    median = Family("torchlens_step_median_seconds", "gauge",
                    "Median step time over the rank's newest steps (the terminal's figure)")
    phase = Family("torchlens_step_phase_seconds", "gauge",
                   "Median time per step in each phase, over the rank's newest steps")
    allocated = Family("torchlens_memory_allocated_bytes", "gauge",
                       "Bytes allocated by the CUDA caching allocator (latest step)")
    reserved = Family("torchlens_memory_reserved_bytes", "gauge",
                      "Bytes reserved by the CUDA caching allocator (latest step)")
    rss = Family("torchlens_memory_rss_bytes", "gauge", "Resident set size of the rank's process")
    frag = Family("torchlens_fragmentation_ratio", "gauge",
                  "Inactive split bytes / reserved bytes of the CUDA caching allocator")
    largest = Family("torchlens_largest_free_block_bytes", "gauge",
                     "Largest free block of the CUDA caching allocator (profiled steps)")
    creep = Family("torchlens_memory_creep_bytes_per_step", "gauge",
                   "Memory growth per step of a rank whose memory creeps (only those ranks)")
    age = Family("torchlens_heartbeat_age_seconds", "gauge",
                 "Seconds since the rank's heartbeat last changed (collector's clock)")
    state = Family("torchlens_rank_state", "gauge",
                   "1 for the rank's state (up, ended, failed, lost, waiting), 0 for the others")
    restarts = Family("torchlens_restarts_total", "counter",
                      "Times the rank was started again by its elastic agent")
    slow = Family("torchlens_slow_rank", "gauge",
                  "1 for the rank the others wait for, with its cause (absent when none)")
    wait = Family("torchlens_slow_rank_wait_seconds", "gauge",
                  "Median time per step the other ranks wait for the rank late most often")
    skew = Family("torchlens_step_skew_ratio", "gauge",
                  "(slowest rank's median step - median over ranks) / median over ranks")
    world = Family("torchlens_world_size", "gauge", "Ranks in the job")
    attached = Family("torchlens_ranks_attached", "gauge", "Ranks that said hello to the collector")
    dropped = Family("torchlens_dropped_messages_total", "counter",
                     "Messages the collector dropped (bad signature, not JSON, replays)")
    creeping = {c.rank: c.bytes_per_step for c in view.creep}
    for row in view.ranks:
        r = row.rank
        labels = rank_labels(run, row)
        hist = histograms.get(r)
        if hist is not None:
            for bound, count in zip((*BUCKETS, float("inf")), hist.buckets, strict=True):
                step.add({**labels, "le": _le(bound)}, count, "_bucket")
            step.add(labels, hist.total_s, "_sum")
            step.add(labels, hist.count, "_count")
        steps.add(labels, hist.count if hist is not None else 0)
        median.add(labels, _ms(row.step_ms))
        for p in (*PHASES, "other"):
            phase.add({**labels, "phase": p}, _ms(row.figure(f"{p}_ms")))
        if row.source == "cuda":  # a CPU run's allocator is modelled, not measured
            allocated.add(labels, row.allocated)
            reserved.add(labels, row.reserved)
            frag.add(labels, row.frag)
            largest.add(labels, row.largest_free)
        rss.add(labels, row.rss)
        creep.add(labels, creeping.get(r))
        age.add(labels, heartbeat_age.get(r))
        now = prometheus_state(row.state)
        for s in STATE_VALUES:
            state.add({**labels, "state": s}, 1 if s == now else 0)
        restarts.add(labels, row.restart or 0)
    job = {"run": run}
    if view.slow.rank is not None and view.slow.rank < len(view.ranks):
        labels = rank_labels(run, view.ranks[view.slow.rank])
        slow.add({**labels, "cause": view.slow.cause or UNEXPLAINED}, 1)
    if view.slow.steps:
        wait.add(job, view.slow.gap_ms / 1e3)
        skew.add(job, view.slow.skew_pct / 100)
    world.add(job, view.world_size)
    attached.add(job, view.attached)
    dropped.add(job, view.dropped)
    return [step, steps, median, phase, allocated, reserved, rss, frag, largest, creep, age, state,
            restarts, slow, wait, skew, world, attached, dropped]


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (``1.0``, ``+Inf``): Prometheus 3
    rewrites ``le`` so on ingestion, so rules match on either version."""
    return "+Inf" if bound == float("inf") else repr(float(bound))
