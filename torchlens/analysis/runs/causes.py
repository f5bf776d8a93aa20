"""Why a rank is late in a multi-rank run: the part of its step breakdown that
stands out, by the one slow-rank rule (``analysis.ranks.slow.cause_of``).

A slow rank makes the others wait inside collectives, so its own step time
looks normal; what differs is how its step is made up. Per rank, take the
median over its profiled steps of each role of the ``%%torchprof`` step
breakdown (``analysis.trace.steps``: the TensorBoard plugin's roles); compare it
with the median of the same role over the other ranks. The *likely cause* is
the role ``cause_of`` picks: the largest excess (rank - others, per step) that
is at least 0.5 ms and 5% of the median rank's step time, where the rank
spends at least 1.2x the others' time. The wait it caused is counted per
collective, not on the same steps, so it does not enter the rule here.

Roles considered: data loading, CPU execution, GPU kernels, memcpy, memset
and CUDA runtime calls. ``comm`` and ``other`` are left out: waiting for the
slow rank is exactly what fills them on the other ranks (a gloo collective's
wait counts as ``other``), so they say who waited, not why.
"""

from __future__ import annotations

from statistics import median

import msgspec
from msgspec import UnsetType

from torchlens.analysis.ranks.slow import PartTime, cause_of, part_phrase
from torchlens.analysis.runs.rows import StepRow, StragglerRow
from torchlens.model.findings import WARNING, Finding
from torchlens.model.units import format_ms

#: the roles that can be a cause, in the order ties are broken
ROLES = ("dataloader", "cpu_exec", "kernel", "memcpy", "memset", "runtime")


def role_medians(step_rows: list[StepRow]) -> dict[int, dict[str, float]]:
    """Per rank: the median over its steps of each role's µs, and of ``dur_us``."""
    by_rank: dict[int, list[StepRow]] = {}
    for row in step_rows:
        by_rank.setdefault(row.rank, []).append(row)
    return {rank: {key: float(median(float(getattr(r, key) or 0.0) for r in rows))
                   for key in ("dur_us", *(f"{role}_us" for role in ROLES))}
            for rank, rows in by_rank.items()}


def likely_cause(rank: int, medians: dict[int, dict[str, float]]) -> PartTime | None:
    """The role that makes ``rank`` late (module docstring), or ``None``:
    its ``part``, ``own_ms`` (its median per step), ``others_ms`` (the median
    over the other ranks), ``excess_ms`` and ``ratio``."""
    others = [m for r, m in medians.items() if r != rank]
    if rank not in medians or not others:
        return None
    mine = medians[rank]
    step_us = median(m["dur_us"] for m in medians.values())
    parts = []
    for role in ROLES:
        key = f"{role}_us"
        theirs = float(median(m[key] for m in others))
        parts.append(PartTime(role, mine[key] / 1e3, theirs / 1e3, (mine[key] - theirs) / 1e3))
    return cause_of(parts, step_us / 1e3)


def cause_part(row: StragglerRow) -> PartTime | None:
    """A ``with_causes`` row's cause as the slow-rank sentence takes it."""
    if not row.cause or not isinstance(row.cause_us, float) \
            or not isinstance(row.cause_others_us, float):
        return None
    own, theirs = row.cause_us / 1e3, row.cause_others_us / 1e3
    return PartTime(row.cause, own, theirs, own - theirs)


def with_causes(stragglers: list[StragglerRow], step_rows: list[StepRow]) -> list[StragglerRow]:
    """``straggler_rows`` with ``cause`` (a role or ``None``), ``cause_us``,
    ``cause_others_us`` and ``cause_words`` (``slow.part_phrase``) for every
    rank that arrived last at least once; ``wait_per_step_us``: the wait of
    one other rank for it per profiled step of its own (``None`` without
    steps), as the slow-rank sentence counts it."""
    medians = role_medians(step_rows)
    steps: dict[int, int] = {}
    for step in step_rows:
        steps[step.rank] = steps.get(step.rank, 0) + 1
    out = []
    for s in stragglers:
        cause = likely_cause(s.rank, medians) if s.last else None
        n = steps.get(s.rank)
        each = s.caused_us if isinstance(s.caused_each_us, UnsetType) else s.caused_each_us
        row = msgspec.structs.replace(
            s, cause=cause.part if cause else None,
            cause_us=cause.own_ms * 1e3 if cause else None,
            cause_others_us=cause.others_ms * 1e3 if cause else None)
        part = cause_part(row)  # the figures as the row holds them, as every view reads them
        out.append(msgspec.structs.replace(
            row, cause_words=part_phrase(part) if part else None,
            wait_per_step_us=each / n if n and each is not None else None))
    return out


def with_verdict(stragglers: list[StragglerRow], verdict: Finding) -> list[StragglerRow]:
    """``with_causes``' rows when a run folder's step records judged the slow
    rank (``verdict``: ``slow.slow_rank_finding``'s finding): the cause of the
    rank it names is the verdict's (its figures: measured over more steps than
    the few profiled ones, and the one every view gives), and no other rank
    gets one, so the table never names a second cause or ratio beside the
    verdict's; a verdict of no slow rank leaves every rank without one. The
    named rank's wait is the verdict's too, per step over its steps; a
    stalling rank's also per stall (``caused_mean_us``: each stall is a
    collective it arrived last at, and the verdict says how long the others
    waited at one), so its row shows the wait the verdict names. A
    slow-rank verdict without a ``rank`` figure (saved by an older torchlens)
    leaves the rows as they are."""
    rank = verdict.value("rank")
    if verdict.severity == WARNING and not isinstance(rank, int):
        return stragglers
    part = verdict.value("cause")
    own = verdict.value(f"{part}_ms") if part else None
    theirs = verdict.value("others_median_ms")
    said = (PartTime(part, own, theirs, own - theirs)
            if part and own is not None and theirs is not None else None)
    waited = verdict.value("wait_per_step_ms")
    # a stalling rank's verdict has no per-step part figures: its stalls are its cause
    stalls = verdict.value("stalls")
    per_stall = verdict.value("waited_ms") if stalls else None
    stall_words = (f"{stalls} stalls of {format_ms(verdict.value('stall_ms'))} over its "
                   f"usual step in the last {verdict.value('steps_compared')} steps"
                   if part and said is None and stalls else None)
    out = []
    for s in stragglers:
        mine = said if s.rank == rank else None
        named = s.rank == rank and (mine is not None or stall_words is not None)
        row = msgspec.structs.replace(
            s, cause=part if named else None,
            cause_us=mine.own_ms * 1e3 if mine else None,
            cause_others_us=mine.others_ms * 1e3 if mine else None,
            cause_words=(part_phrase(mine) if mine else stall_words) if named else None)
        if s.rank == rank and waited is not None:
            # one wait figure per rank and window: the verdict's, over its steps;
            # the profiled collectives' per-collective wait would be a second one
            row = msgspec.structs.replace(
                row, wait_per_step_us=waited * 1e3, caused_each_us=None,
                caused_mean_us=per_stall * 1e3 if named and per_stall is not None else None)
            if named and per_stall is not None:
                # all together over the same steps as per stall: the profiled
                # collectives' sum (a stall rarely falls in a profiled step) beside
                # the verdict's per-stall wait read as 11.2 ms in all, 111.7 ms each
                row = msgspec.structs.replace(row, caused_us=per_stall * stalls * 1e3)
        out.append(row)
    return out
