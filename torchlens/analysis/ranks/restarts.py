"""Restarts by torch's elastic agent, one per restart of the job, as a user thinks of them.

The collector of ``torchlens run`` sees processes, not restarts: every process
that attaches takes a slot, and a rank that attaches again is a new
*incarnation* of it (``Collector.incarnations``). torchrun restarts every
worker of the job when one fails (the agents of all nodes meet again at the
rendezvous), so the ranks' second incarnations are one event, not one per
rank. ``TORCHELASTIC_RESTART_COUNT`` cannot group them: an agent counts only
its own node's failures (membership changes do not count), so a node whose
workers were restarted because another node failed keeps its count. Restart
``k`` is therefore every rank's incarnation ``k``.

Why the workers were restarted comes from the goodbyes of incarnation
``k - 1``, first match wins: the rank whose exception came first (its
``error_t``: the ranks that fail after it usually fail because it went away),
a rank whose elastic agent died, a rank that stopped without a goodbye (a
signal: SIGKILL, the out-of-memory killer), else the agents ended every worker
themselves (SIGTERM) for a reason no rank saw: a worker that failed before
its first ``torchlens.step()``, or a node that joined or left.

Times are unix seconds; ``words`` shows them as the local clock of the
machine that runs the analysis (the terminal's, for ``torchlens run``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torchlens.model.messages import Bye, Incarnation
from torchlens.model.units import format_seconds, plural

#: an error message is cut to this many characters in the sentence
ERROR_CHARS = 160


@dataclass
class RankBefore:
    """One rank of a restart: the steps its previous incarnation sent (None: it
    had none), and its agent's restart count now."""

    rank: int
    steps: int | None
    restart_count: int | None


@dataclass
class Restart:
    """One restart of the job's workers."""

    number: int  # 1: the first restart
    ranks: list[int]  # ranks that attached again (all of them once the restart is done)
    world_size: int
    #: when the previous incarnation's last worker stopped (the agent restarts then)
    t: float | None
    #: the first step of the new incarnation (its workers are training again)
    resumed_t: float | None
    cause: str  # "failed" | "agent died" | "no goodbye" | "ended by its agent" | "unknown"
    cause_rank: int | None
    cause_step: int | None  # the step the cause rank was in
    error: str | None
    #: per rank: steps its previous incarnation sent, and its agent's restart count now
    before: list[RankBefore] = field(default_factory=list)
    words: str = ""  # the sentence the terminal, the manifest and the report show
    label: str = ""  # a few words for a chart's marker: "restart 1: rank 1 failed"


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t is not None else "?"


def _end(inc: Incarnation) -> float | None:
    """When an incarnation stopped: its goodbye, else its last heartbeat or step."""
    bye = inc.bye or Bye()
    for t in (bye.t, inc.last_beat, inc.last_t):
        if t is not None:
            return float(t)
    return None


def _step(inc: Incarnation) -> int | None:
    """The step an incarnation was in when it stopped (steps done = the running one)."""
    bye = inc.bye or Bye()
    for s in (bye.steps, inc.steps_done, inc.steps):
        if s is not None:
            return s
    return None


def _cause(previous: list[Incarnation]) -> tuple[str, Incarnation | None]:
    """Why the workers of ``previous`` (one incarnation of every rank) were restarted."""
    def reason(inc: Incarnation) -> str | None:
        return inc.bye.reason if inc.bye is not None else None

    def raised(inc: Incarnation) -> float:
        return (inc.bye.error_t if inc.bye is not None else None) or _end(inc) or 0.0

    failed = [i for i in previous if reason(i) == "exception"]
    if failed:
        return "failed", min(failed, key=lambda i: (raised(i), i.rank))
    died = [i for i in previous if reason(i) == "agent died"]
    if died:
        return "agent died", min(died, key=lambda i: i.rank)
    silent = [i for i in previous if i.bye is None]
    if silent:
        return "no goodbye", min(silent, key=lambda i: (_end(i) or 0.0, i.rank))
    if previous:
        return "ended by its agent", None
    return "unknown", None


_SHORT = {"failed": "rank {r} failed", "agent died": "rank {r}'s agent died",
          "no goodbye": "rank {r} stopped"}


def _because(cause: str, inc: Incarnation | None) -> str:
    if inc is None:
        return ("after the agents stopped every worker; no rank reported an error (a worker "
                "that failed before its first torchlens.step(), or a node that joined or "
                "left)") if cause == "ended by its agent" else "for a reason no rank reported"
    r, step = inc.rank, _step(inc)
    at = f" at step {step}" if step is not None else ""
    if cause == "failed":
        error = str((inc.bye or Bye()).error or "an exception")
        if len(error) > ERROR_CHARS:
            error = error[:ERROR_CHARS - 1] + "…"
        return f"after rank {r} failed{at} ({error})"
    if cause == "agent died":
        node = f" (node {inc.node})" if inc.node is not None else ""
        return f"after rank {r}'s elastic agent died{node}{at}"
    return (f"after rank {r} stopped{at} without a goodbye (killed by a signal, or by the "
            "out-of-memory killer? look at its log)")


def world_restarts(incarnations: list[Incarnation], world_size: int) -> list[Restart]:
    """The job's restarts, from ``Collector.incarnations()`` (one entry per process)."""
    by_number: dict[int, list[Incarnation]] = {}
    for inc in incarnations:
        by_number.setdefault(inc.incarnation, []).append(inc)
    out = []
    for k in sorted(n for n in by_number if n > 0):
        new, previous = by_number[k], by_number.get(k - 1, [])
        ranks = sorted({i.rank for i in new})
        cause, who = _cause(previous)
        ends = [t for t in (_end(i) for i in previous) if t is not None]
        starts = [i.first_t for i in new if i.first_t is not None]
        t = max(ends) if ends else min((i.t for i in new if i.t), default=None)
        resumed = min(starts) if starts else None
        before = {i.rank: i for i in previous}
        world = max([world_size, *(i.world_size or 0 for i in new)])
        restart = Restart(
            number=k, ranks=ranks, world_size=world, t=t, resumed_t=resumed, cause=cause,
            cause_rank=who.rank if who else None, cause_step=_step(who) if who else None,
            error=who.bye.error if who and who.bye else None,
            before=[RankBefore(i.rank, before[i.rank].steps if i.rank in before else None,
                               i.restart_count)
                    for i in sorted(new, key=lambda i: i.rank)])
        restart.words = _words(restart, _because(cause, who))
        restart.label = f"restart {k}" + (f": {_SHORT[cause].format(r=who.rank)}" if who
                                           else "")
        out.append(restart)
    return out


def _words(r: Restart, because: str) -> str:
    if len(r.ranks) == r.world_size:
        who = f"all {plural(r.world_size, 'worker')}"
    else:  # a restart still under way, or a job that changed size
        who = (f"{len(r.ranks)} of {plural(r.world_size, 'worker')} (rank"
               f"{'s' if len(r.ranks) > 1 else ''} {', '.join(map(str, r.ranks))})")
    words = f"the elastic agent restarted {who} at {_clock(r.t)} {because}"
    if r.t is not None and r.resumed_t is not None and r.resumed_t >= r.t:
        words += f"; they were training again {format_seconds(r.resumed_t - r.t)} later"
    return words
