"""Who arrived last at a collective: the one rule, for one profiled step of
``%ddp_check --profile`` (``collective_arrivals``) and for a multi-rank run's
matched collectives (``analysis.runs.collectives``, ``analysis.runs.clock``).

A collective completes only when every rank has entered it, so the rank that
enters last holds the others up: its arrival is the latest; ties go to the
lowest rank. Each rank waited from its own arrival to the last one.

A rank's arrival (``arrivals``, how: ``arrived_by``): when every rank's record
of the collective has ``k0``, its first NCCL kernel's start on the GPU
(``"kernel"``); else ``t0``, when its host issued the call (``"host"``). NCCL
is asynchronous: the host enqueues and moves on, so its issue says when the
CPU got there, not when the GPU did (a rank whose GPU is still busy with its
backward issues early and arrives late); the kernel starts when the stream
reaches it and then waits inside for the others. One way for all ranks of a
collective, since a kernel start and a host issue of two ranks do not
compare. ``issued`` keeps every rank's ``t0``.

The summaries of one step (one per rank, docs/RANK_PROFILE.md) are matched by
``seq``, the collective's index within the step, which is the same on every
rank when the ranks issue the same collectives. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torchlens.model.records import StepSummary, SummaryCollective

#: ``arrived_by`` in words: what a rank's arrival is.
ARRIVED_BY = {"kernel": "its NCCL kernel's start on the GPU",
              "host": "when its host issued the call"}


@dataclass(frozen=True)
class LastArrival:
    """Who entered a collective last and what the others waited: the last
    rank (ties: the lowest) and when it arrived (unix s), per rank the µs it
    waited for it (0 for the last), the last arrival minus the first (µs)
    and the waits summed (µs)."""

    last_rank: int
    last_t0: float
    waits_us: dict[int, float]
    max_wait_us: float
    total_wait_us: float


def last_arrival(arrivals: Mapping[int, float]) -> LastArrival:
    """``arrivals``: rank -> when it entered the collective (unix s)."""
    last_t0 = max(arrivals.values())
    waits = {r: (last_t0 - t) * 1e6 for r, t in arrivals.items()}
    return LastArrival(last_rank=min(r for r, t in arrivals.items() if t == last_t0),
                       last_t0=last_t0, waits_us=waits,
                       max_wait_us=(last_t0 - min(arrivals.values())) * 1e6,
                       total_wait_us=sum(waits.values()))


def arrival_times(at: Mapping[int, SummaryCollective]) -> tuple[dict[int, float], str]:
    """``at``: rank -> its record of one collective (``t0``, and ``k0`` where
    its trace has a NCCL kernel for it). Returns (rank -> arrival in unix s,
    ``arrived_by``), by the module docstring's rule."""
    on_gpu = all(isinstance(c.k0, float) for c in at.values())
    if on_gpu:
        return {r: float(c.k0) for r, c in at.items()}, "kernel"  # type: ignore[arg-type]
    return {r: float(c.t0) for r, c in at.items()}, "host"


@dataclass(frozen=True)
class CollectiveArrival:
    """One collective (``seq``) of a step across ranks: ``name`` (the last
    arrival's), ``ranks`` in order, ``arrivals`` (unix s, per rank),
    ``arrived_by``, ``issued`` (unix s, per rank), ``lanes`` (lane index per
    rank), ``last_rank``, ``last_arrival`` (unix s) and ``spread_ms`` (last
    arrival minus first; 0 when one rank has it)."""

    seq: int
    name: str
    ranks: list[int]
    arrivals: list[float]
    arrived_by: str
    issued: list[float]
    lanes: list[int]
    last_rank: int
    last_arrival: float
    spread_ms: float


def collective_arrivals(summaries: Mapping[int, StepSummary]) -> list[CollectiveArrival]:
    """One row per ``seq`` of the step: the arrivals in rank order and the last
    one, in ``seq`` order. ``summaries``: rank -> that rank's summary of the same step."""
    by_seq: dict[int, dict[int, SummaryCollective]] = {}
    for rank, summary in summaries.items():
        for coll in summary.collectives or []:
            # the first of a seq on one rank: a repeat would be a malformed summary
            by_seq.setdefault(coll.seq, {}).setdefault(int(rank), coll)
    rows = []
    for seq in sorted(by_seq):
        arrived = by_seq[seq]
        ranks = sorted(arrived)
        times, how = arrival_times({r: arrived[r] for r in ranks})
        last = last_arrival(times)
        rows.append(CollectiveArrival(
            seq=seq, name=arrived[last.last_rank].name, ranks=ranks,
            arrivals=[times[r] for r in ranks], arrived_by=how,
            issued=[float(arrived[r].t0) for r in ranks],
            lanes=[arrived[r].lane for r in ranks],
            last_rank=last.last_rank, last_arrival=last.last_t0,
            spread_ms=last.max_wait_us / 1e3))
    return rows
