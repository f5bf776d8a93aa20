"""What ``torchlens run`` says about a running (or ended) torchrun job.

Pure functions over the collector's snapshot (``capture.ranks.collector.
Collector.snapshot``: per-rank hello, heartbeat and bye, the step records
and summaries of docs/RANK_PROFILE.md). The numbers come from
``analysis.ranks.steps`` (slow rank, memory creep, the per-rank table); this
module adds each rank's state, the lost nodes, and the verdict that leads
the terminal summary.

A rank's state:

- ``waiting``: no hello yet (the collector knows the world size from the others);
- ``running``: its heartbeat changed within ``silence.SILENT_AFTER_S`` (a
  heartbeat missed; the collector's clock);
- ``silent``: its heartbeat is older than that, but not older than
  ``lost_after_s``: it may come back (a stopped process, a long pause); the
  live verdict says for how long and what the others did meanwhile
  (``silence.silent_now``);
- ``finished`` / ``failed`` (an uncaught exception) / ``ended by its agent``
  (SIGTERM: torchrun ends a node's workers when one fails): it said so in its bye;
- ``lost``: its bye says its elastic agent died, or it stopped sending
  without a bye (for ``lost_after_s``, or the run ended);
- ``stopped when rank 1 went away`` (``peer_stopped``; ``ended: peer failed``,
  ``PEER_FAILED``, in an older run folder): it raised only because a peer
  went away (gloo's "Connection closed by peer", ``crash.peer_gone``) while
  another rank, the one named, failed of its own error, was lost or ended by
  its agent: the consequence, not the cause (``peer_failed``), so only the
  cause reads ``failed``;
- ``interrupted`` (``INTERRUPTED``): the user stopped the run (Ctrl-C or
  SIGTERM to ``torchlens run``) and the rank's agent ended it (its bye says
  SIGTERM): not ``ended by its agent`` on its own, which reads as torchrun
  ending a node's workers when one failed (``interrupted_states``).

Each rank's row and state are of its latest start; the restarts by the
elastic agent, one per restart of the job, come from ``analysis.ranks.restarts``.

Lost ranks are grouped by node (``GROUP_RANK``, and host) and each group says
the step the ranks were in when they went silent (their last heartbeat's
``steps_done``, the index of the step then running).

The verdict (a ``Finding``), first match wins: a lost node; a failed rank
(the one that raised first); a rank silent now; a rank that went silent and came back
(``analysis.ranks.silence``); the slow rank (``analysis.ranks.slow.slow_rank``
over the last steps every rank has, its one window, in its words); a rank whose memory
creeps; with no slow rank, a job whose every rank waits on its input
(``analysis.ranks.input_bound``), gradients synchronised too often or in
too many small buckets (``analysis.ranks.ddp_config``), or a graph break in
every compiled step (``analysis.ranks.job_wide``); else no slow rank, with
the step-time skew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from statistics import median
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from torchlens.analysis.ranks.collector_notes import failure_finding
from torchlens.analysis.ranks.crash import (
    left_early,
    peer_gone,
    peer_gone_words,
    stopped_when,
    uneven_words,
)
from torchlens.analysis.ranks.ddp_config import parameter_sync
from torchlens.analysis.ranks.job_wide import job_wide
from torchlens.analysis.ranks.restarts import Restart, world_restarts
from torchlens.analysis.ranks.silence import (
    SILENT_AFTER_S,
    now_leads,
    silent_now,
    silent_spells,
    since_silent,
)
from torchlens.analysis.ranks.silence import leads as silence_leads
from torchlens.analysis.ranks.slow import (
    WINDOW,
    SlowRank,
    creep_leads,
    rank_list,
    slow_rank,
)
from torchlens.analysis.ranks.steps import (
    MemoryCreep,
    Steps,
    creep_window,
    memory_creep,
    per_rank_memory,
    rank_table,
)
from torchlens.formats.run_folder.manifest import Manifest, RestartEntry
from torchlens.model.findings import (
    FAILED,
    FAILED_RANK,
    INFO,
    LOST_NODE,
    MEMORY_CREEP,
    NO_STEPS,
    SEVERITIES,
    SLOW_RANK,
    UNEVEN_INPUTS,
    WAITING,
    WARNING,
    Figure,
    Finding,
    as_finding,
)
from torchlens.model.messages import RankInfo, RankSnapshot
from torchlens.model.records import StepRecord, StepSummary, without_setup
from torchlens.model.units import format_bytes


@dataclass
class LostNode:
    node: int | None
    host: str | None
    ranks: list[int]
    step: int | None
    why: str
    words: str
    #: every rank of the node went silent (or its agent died); False: other
    #: ranks of the node went on, so these ranks were lost, not their node
    whole_node: bool = True


@dataclass
class RankRow:
    """One rank of a ``RunView``: who and where it is, its state (the module
    docstring), the restart it is in, the error it raised, the training steps
    it sent, and the per-rank table's figures (``analysis.ranks.steps.rank_table``:
    median step and phase times in ms over the verdict's window, the latest
    and peak allocator figures, fragmentation and RSS); None: not measured."""

    rank: int
    node: int | None = None
    host: str | None = None
    state: str = "waiting"
    restart: int | None = None
    error: str | None = None
    steps: int | None = None
    step_ms: float | None = None
    other_ms: float | None = None
    data_ms: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    collective_ms: float | None = None
    save_ms: float | None = None
    eval_ms: float | None = None
    allocated: int | None = None
    reserved: int | None = None
    frag: float | None = None
    largest_free: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    rss: int | None = None
    peak_rss: int | None = None
    source: str | None = None

    def figure(self, name: str) -> Any:
        """The field called ``name`` (a phase's ``<phase>_ms``), None when there is none."""
        return getattr(self, name, None) if name in _ROW_FIELDS else None


_ROW_FIELDS = frozenset(f.name for f in fields(RankRow))


@dataclass
class RunView:
    """Everything the terminal summary and the manifest show (numbers only)."""

    verdict: Finding
    ranks: list[RankRow]
    slow: SlowRank
    creep: list[MemoryCreep]
    lost: list[LostNode]
    dropped: int
    restarts: list[Restart]  # one per restart of the job (``analysis.ranks.restarts``)
    attached: int
    world_size: int
    notes: list[str] = field(default_factory=list)
    #: row indices, the ones to show first when not all fit (``show_order``)
    order: list[int] = field(default_factory=list)
    #: step time over every rank: median, min, max (ms), for the rows not shown
    spread: tuple[float, float, float] | None = None
    #: the ranks that went silent and came back, in words (``analysis.ranks.silence``)
    spells: list[str] = field(default_factory=list)


#: the state of a rank that raised only because a peer went away, as an older
#: torchlens wrote it (module docstring); now ``peer_stopped``'s words
PEER_FAILED = "ended: peer failed"
#: how ``peer_stopped``'s state starts
PEER_STOPPED = "stopped when "


def peer_stopped(gone: str) -> str:
    """The state of a rank that raised only because ``gone`` (``rank 1``,
    ``ranks 1, 3``) went away: ``stopped when rank 1 went away``."""
    return f"{PEER_STOPPED}{gone} went away"


def is_peer_stopped(state: str | None) -> bool:
    """Whether ``state`` is of a rank that raised only because a peer went away."""
    return state == PEER_FAILED or (state or "").startswith(PEER_STOPPED)
#: the state of a rank ended because the user stopped the run (module docstring)
INTERRUPTED = "interrupted"
#: rank states that lead the per-rank rows (something to look at)
_FIRST = ("failed", "lost", "silent", "ended by its agent", PEER_FAILED, "waiting")


def show_order(rows: list[RankRow], slow: int | None) -> list[int]:
    """Rows in the order a user should see them when they do not all fit: ranks in
    trouble, the slow rank, then by median step time, slowest first."""
    def key(i: int) -> tuple[int, float, int]:
        row = rows[i]
        state = PEER_FAILED if is_peer_stopped(row.state) else row.state
        first = _FIRST.index(state) if state in _FIRST else len(_FIRST) + 1
        if row.rank == slow and first > len(_FIRST):
            first = len(_FIRST)
        return (first, -(row.step_ms or 0.0), row.rank)

    return sorted(range(len(rows)), key=key)


def rank_state(info: RankInfo | None, lost_after_s: float, ended: bool) -> str:
    """One rank's state (definitions: the module docstring)."""
    if info is None:
        return "waiting"
    bye = info.bye
    if bye is not None:
        reason = bye.reason
        return {"exit": "finished", "exception": "failed", "SIGTERM": "ended by its agent",
                "agent died": "lost"}.get(reason or "", str(reason))
    if ended or info.silent_s > lost_after_s:
        return "lost"
    return "silent" if info.silent_s > SILENT_AFTER_S else "running"


def interrupted_states(states: list[str], interrupted: bool) -> list[str]:
    """``states`` of a run the user stopped (``interrupted``): each rank its
    agent ended as ``INTERRUPTED`` (module docstring); unchanged otherwise."""
    if not interrupted:
        return list(states)
    return [INTERRUPTED if s == "ended by its agent" else s for s in states]


def peer_failed(states: list[str], errors: list[str | None],
                ranks: list[int] | None = None) -> list[str]:
    """``states`` with each ``failed`` rank whose error says a peer went away
    read as ``stopped when rank 1 went away`` (``peer_stopped``), when another
    rank stopped first of its own: it failed of its own error, was lost or
    was ended by its agent; those ranks are named, the ones that failed of
    their own error when there are any. With no such rank (every error names
    a gone peer) nothing is changed: no rank is known to be the cause. A
    state an older torchlens wrote (``PEER_FAILED``) is read the same way.
    ``ranks``: each state's rank (default: its index)."""
    def own(state: str, error: str | None) -> bool:
        return state in ("lost", "ended by its agent") or (
            state == "failed" and not peer_gone(error))

    pairs = list(zip(states, errors, strict=True))
    causes = [i for i, (s, e) in enumerate(pairs) if own(s, e)]
    if not causes:
        return list(states)
    raised = [i for i in causes if pairs[i][0] == "failed"]
    who = list(range(len(pairs))) if ranks is None else list(ranks)
    gone = peer_stopped(rank_list([who[i] for i in raised or causes]))
    return [gone if (s == "failed" or s == PEER_FAILED) and peer_gone(e) else s
            for s, e in pairs]


def _step_now(info: RankInfo) -> int | None:
    step = info.heartbeat.steps_done
    return step if step is not None else info.steps_sent


def _reason(info: RankInfo) -> str | None:
    return info.bye.reason if info.bye is not None else None


def _error(info: RankInfo | None) -> str | None:
    return info.bye.error if info is not None and info.bye is not None else None


def _others_did(ranks: list[RankInfo | None], states: list[str], infos: list[RankInfo],
                records: list[list[StepRecord]] | None) -> str:
    """What the lost ranks' node-mates did since the lost ranks' last heartbeat
    (``silence.since_silent``): "went on" when their steps advanced; "wait for
    it" when every one still runs and none of their steps ended; "" when that
    is not known, or they ended without going on (a peer that timed out
    waiting for it did not go on)."""
    node, host = infos[0].node, infos[0].host
    here = [(i, s) for i, s in zip(ranks, states, strict=True)
            if i is not None and (i.node, i.host) == (node, host) and s != "lost"]
    last = min(infos, key=lambda i: i.silent_s)  # the newest sign of any of them
    judged = [(i, (records[i.rank] if records is not None and i.rank < len(records) else []))
              for i, s in here if s != "silent"]
    waiting, went_on, _ = since_silent(last, judged)
    if went_on:
        return "went on"
    if here and len(waiting) == len(here) and all(s == "running" for _, s in here):
        return "wait for it" if len(infos) == 1 else "wait for them"
    return ""


def lost_nodes(ranks: list[RankInfo | None], states: list[str],
               records: list[list[StepRecord]] | None = None) -> list[LostNode]:
    """Lost ranks grouped by node, with where they stopped. A node whose other
    ranks went on (said goodbye, failed, still run) was not lost: those ranks
    were (killed or hung: ``kill -9``, the OOM killer), and the words say so,
    with what the node's other ranks did since (``records``: each rank's step
    records, which say whether they advanced)."""
    groups: dict[tuple[int | None, str | None], list[RankInfo]] = {}
    alive: set[tuple[int | None, str | None]] = set()
    for info, state in zip(ranks, states, strict=True):
        if info is None:
            continue
        key = (info.node, info.host)
        if state == "lost":
            groups.setdefault(key, []).append(info)
        else:
            alive.add(key)
    out = []
    for (node, host), infos in sorted(groups.items(), key=lambda kv: min(i.rank for i in kv[1])):
        numbers = sorted(i.rank for i in infos)
        steps = [s for s in (_step_now(i) for i in infos) if s is not None]
        step = min(steps) if steps else None
        died = any(_reason(i) == "agent died" for i in infos)
        where = f"node {node}" if node is not None else "a node"
        label = f"{where} (host {host})" if host else where
        who = ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(map(str, numbers))
        at = f" at step {step}" if step is not None else ""
        if (node, host) in alive and not died:
            did = _others_did(ranks, states, infos, records)
            others = f", and {label}'s other ranks {did}" if did else ""
            why = f"no goodbye{others}: killed (kill -9, the OOM killer) or hung"
            out.append(LostNode(node, host, numbers, step, why,
                                f"{who}: {'it' if len(numbers) == 1 else 'they'} stopped "
                                f"sending{at} ({why})", whole_node=False))
            continue
        why = "their elastic agent died" if died else "no heartbeat, no goodbye"
        out.append(LostNode(node, host, numbers, step, why,
                            f"{label}: {who} stopped sending{at} ({why})"))
    return out


def no_step_words(attached: int, world_size: int | None, why: str) -> str:
    """An ended run's words when no rank recorded a step; ``why``: what the
    reader should know (how ranks attach, or why these could not)."""
    if not attached:
        return f"no step recorded: no rank attached: {why}"
    return (f"no step recorded: {attached} of {world_size or '?'} ranks attached, "
            f"none ran a step ({why})")


def _verdict(snap: RankSnapshot, lost: list[LostNode], failed: list[RankRow],
             attached: int, slow: SlowRank, creep: list[MemoryCreep],
             ended: bool = False, rows: list[RankRow] | None = None,
             starved: Finding | None = None, drift: Finding | None = None) -> Finding:
    """What leads the summary (the order: the module docstring)."""
    if lost:
        where, what = lost[0].words.split(": ", 1)
        if not lost[0].whole_node:
            return Finding(FAILED, f"{where} was lost: {what}",
                           advice="the other ranks' data is kept; look at torchrun's exit "
                                  "codes (-9: killed) and the kernel log (dmesg) for the "
                                  "OOM killer", code=LOST_NODE)
        return Finding(FAILED, f"{where} was lost: {what}",
                       advice="the other ranks' data is kept; look at that node's torchrun "
                              "log and network", code=LOST_NODE)
    if failed:
        row = failed[0]
        rows = rows or []
        left = left_early(rows, {r.rank: r.steps for r in rows})
        if left:
            quit_ = [r.rank for r in failed]
            return Finding(FAILED, uneven_words(left, quit_, {r.rank: r.steps for r in rows},
                                                row.error),
                           tuple(Figure("rank", r) for r in left[:1]),
                           advice="give every rank the same number of batches "
                                  "(DistributedSampler(drop_last=True)) or wrap the loop in "
                                  "DDP's join() context",
                           details={"ranks": left}, code=UNEVEN_INPUTS)
        if peer_gone(row.error):  # no rank said why: its peer's words, not gloo's page
            return Finding(FAILED, stopped_when(f"rank {row.rank}", None, row.error),
                           (Figure("rank", row.rank),),
                           advice="look at the other ranks' logs for the one that ended first",
                           code=FAILED_RANK)
        return Finding(FAILED, f"rank {row.rank} failed: {row.error or 'an exception'}",
                       (Figure("rank", row.rank),),
                       advice=f"look at rank {row.rank}'s traceback: its [rank{row.rank}]: "
                              "lines in the command's output (command.log in the run folder "
                              "when it ran on a terminal)", code=FAILED_RANK)
    if not any(snap.steps):
        how = ("a torchrun rank attaches when it starts, any other at its first "
               "torchlens.step()")
        if ended:  # nothing more will come: not "waiting"
            return Finding(WARNING, no_step_words(attached, snap.world_size, how),
                           (Figure("attached", attached),), code=NO_STEPS)
        return Finding(INFO, f"waiting for steps: {attached} of {snap.world_size or '?'} "
                       f"ranks attached ({how})", (Figure("attached", attached),), code=WAITING)
    if drift is not None:  # the replicas no longer train one model: before any speed
        return drift
    # a creep leads a weak slow rank, and one whose memory creeps too when its
    # cause is one a leak makes: a leaking rank's allocations (fresh pages every
    # step) slow its compute, and its growing heap lengthens its collections. A
    # rank slow at loading data or saving is slow for that reason, leak or not
    if creep and (slow.rank is None or creep_leads(slow.finding, [c.rank for c in creep])):
        return creep_finding(creep[0], creep[1:])
    if starved is not None and slow.rank is None:  # every rank waits on input alike
        return starved
    return slow.finding


def creep_finding(c: MemoryCreep, more: list[MemoryCreep] | None = None,
                  window: tuple[int, int] | None = None) -> Finding:
    """A rank's memory creep as the finding every view gives (the terminal's
    verdict, a run folder's report); ``more``: the other ranks whose memory
    creeps too, named in the same sentence (a leak on every rank), their
    numbers in ``details["ranks"]`` (no one ``rank`` figure stands for them).
    The steps are those the rule fitted (the last ones measured, not the
    leak's whole length, the window compared); ``window``: their first and last
    step, where the creep does not carry them."""
    def span_of(x: MemoryCreep, window: tuple[int, int] | None = None) -> str:
        first, last = window or (x.first_step, x.last_step)
        return creep_window(x.steps, first, last)

    span = span_of(c, window)
    if not more:
        return Finding(WARNING, f"rank {c.rank}'s memory creeps: "
                       f"{format_bytes(c.bytes_per_step, signed=True)} per step {span}",
                       (Figure("rank", c.rank), Figure("bytes_per_step", c.bytes_per_step, "B"),
                        Figure("steps", c.steps)),
                       f"look for tensors kept across steps on rank {c.rank} (losses kept "
                       "with their graph, growing lists)", code=MEMORY_CREEP)
    every = [c, *more]
    fastest = max(every, key=lambda x: x.bytes_per_step)
    slowest = min(every, key=lambda x: x.bytes_per_step)
    ranks = rank_list([x.rank for x in every])
    if fastest is not c:
        span = span_of(fastest, window if (fastest.steps, fastest.last_step) == (
            c.steps, c.last_step) else None)
    # alike on every rank (within 10%): one figure for each; else the fastest
    rate = (f"{format_bytes(fastest.bytes_per_step, signed=True)} per step on each rank"
            if slowest.bytes_per_step >= 0.9 * fastest.bytes_per_step else
            f"up to {format_bytes(fastest.bytes_per_step, signed=True)} per step "
            f"(rank {fastest.rank})")
    return Finding(WARNING, f"{ranks}'s memory creeps: {rate} {span}",
                   (Figure("ranks_creeping", len(every)),
                    Figure("bytes_per_step", fastest.bytes_per_step, "B"),
                    Figure("steps", fastest.steps)),
                   f"look for tensors kept across steps on {ranks} (losses kept with their "
                   "graph, growing lists)", details={"ranks": sorted(x.rank for x in every)},
                   code=MEMORY_CREEP)


def steps_found_by(ranks: list[RankInfo | None]) -> str:
    """How the ranks' steps were found (their heartbeats' ``steps_by``), one
    phrase when they agree: "steps: optimizer.step() of Adam"; "" before any."""
    said: dict[str, list[int]] = {}
    for info in ranks:
        by = info.heartbeat.steps_by if info is not None else None
        if by:
            said.setdefault(by, []).append(info.rank)  # type: ignore[union-attr]
    if len(said) <= 1:
        return "".join(f"steps: {by}" for by in said)
    return "steps: " + "; ".join(f"{rank_list(r)}: {by}" for by, r in said.items())


def summary_dicts(summaries: list[list[StepSummary]]) -> list[list[Any]]:
    """The summaries as the JSON builtins ``analysis.ranks.steps`` reads them."""
    return [msgspec.to_builtins(sums) for sums in summaries]


def table_row(row: RankRow, figures: Any) -> RankRow:
    """``row`` with the figures of its ``steps.rank_table`` row (a dict) beside
    its own fields."""
    for k, v in figures.items():
        if k != "rank" and k in _ROW_FIELDS:
            setattr(row, k, v)
    return row


def run_view(snap: RankSnapshot | Any, ended: bool = False,
             interrupted: bool = False) -> RunView:
    """The verdict, per-rank rows and lost nodes of one collector snapshot (a
    ``RankSnapshot``, or the same as JSON builtins); ``interrupted``: the user
    stopped the run (its ranks' states: ``interrupted_states``)."""
    snap = RankSnapshot.of(snap)
    ranks = snap.ranks
    # the collector holds every record a rank sent: set-up windows included
    steps = [list(without_setup(recs)) for recs in snap.steps]
    summaries = summary_dicts(snap.summaries)
    states = interrupted_states([rank_state(i, snap.lost_after_s, ended) for i in ranks],
                                interrupted)
    lost = lost_nodes(ranks, states, steps)
    slow = slow_rank(steps)
    memory = per_rank_memory(steps, summaries)
    creep = memory_creep(steps, summaries, memory=memory)
    table = rank_table(steps, summaries, memory, WINDOW) if steps else []
    rows = []
    for r, (info, state) in enumerate(zip(ranks, states, strict=True)):
        row = RankRow(rank=r, node=info.node if info else None,
                      host=info.host if info else None, state=state,
                      restart=info.incarnation if info else None, error=_error(info))
        if r < len(table):
            table_row(row, table[r])
        if info is not None and info.steps_sent is not None:  # the collector keeps only the newest
            row.steps = info.steps_sent
        rows.append(row)
    attached = sum(i is not None for i in ranks)
    # the rank that raised first leads: the others usually fail because it went
    # away (gloo: "Connection closed by peer"), and lower ranks are not first
    def raised_at(row: RankRow) -> float:
        info = ranks[row.rank]
        t = info.bye.error_t if info is not None and info.bye is not None else None
        return float(t) if t is not None else float("inf")

    failed = sorted((row for row in rows if row.state == "failed"),
                    key=lambda row: (peer_gone(row.error), raised_at(row), row.rank))
    verdict = _verdict(snap, lost, failed, attached, slow, creep, ended, rows,
                       job_wide(steps), parameter_sync(steps))
    spells = silent_spells(snap)
    verdict = silence_leads(verdict, spells)
    verdict = now_leads(verdict, silent_now(ranks, states, steps), snap.lost_after_s)
    for row, state in zip(rows, peer_failed([r.state for r in rows], [r.error for r in rows],
                                            [r.rank for r in rows]), strict=True):
        row.state = state
    notes = []
    if any(i is not None and not i.shared_run_dir for i in ranks):
        far = [str(i.rank) for i in ranks if i is not None and not i.shared_run_dir]
        notes.append(f"ranks {', '.join(far)} could not write the run folder: their profiled "
                     "steps are here as summaries only, their traces stayed on their nodes")
    behind = [(i.rank, i.overwritten) for i in ranks if i is not None and any(i.overwritten)]
    if behind:
        batches = sum(o[0] for _, o in behind)
        sums = sum(o[1] for _, o in behind)
        notes.append(f"the collector fell behind: {batches} step batch(es) and {sums} "
                     f"summary(ies) of rank(s) {', '.join(str(r) for r, _ in behind)} were "
                     "overwritten before it read them (missing from the run folder; a "
                     "collector per node, or fewer profiled steps, keeps up)")
    notes += [s.words for s in spells if s.words not in verdict.sentence]  # said once
    by = steps_found_by(ranks)
    if by:
        notes.insert(0, by)
    times = sorted(r.step_ms for r in rows if r.step_ms is not None)
    spread = (median(times), times[0], times[-1]) if times else None
    restarts = world_restarts(snap.incarnations, snap.world_size)
    return RunView(verdict, rows, slow, creep, lost, snap.dropped,
                   restarts, attached, snap.world_size, notes,
                   show_order(rows, slow.rank), spread, [s.words for s in spells])


class RankStatus(msgspec.Struct, kw_only=True):
    """One rank of the live status (``torchlens.watch``, the sidebar): a
    ``RankRow``'s fields that travel, ``slow`` (the verdict's slow rank) and
    ``ended`` (why it stopped, or None while it runs). Fields in the JSON's order."""

    rank: int
    node: int | None = None
    host: str | None = None
    state: str | None = None
    restart: int | None = None
    error: str | None = None
    steps: int | None = None
    step_ms: float | None = None
    data_ms: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    collective_ms: float | None = None
    other_ms: float | None = None
    allocated: int | None = None
    reserved: int | None = None
    rss: int | None = None
    source: str | None = None
    slow: bool = False
    ended: str | None = None


class LiveStatus(msgspec.Struct, kw_only=True):
    """The run's status as ``torchlens.watch`` and the sidebar show it: the
    verdict (its line, ``verdict_code``, ``verdict_ranks``: the ranks it names,
    and ``severity``), the slow rank and its finding, one ``RankStatus`` per
    rank, ``order`` (``RunView.order``),
    ``spread`` (``RunView.spread``), the restarts, dropped messages and lost
    nodes' words. A finished folder's (``folder_status``) has no ``order`` nor
    ``spread``; a frame's adds ``run_id``, ``t`` and ``ended``. Unset fields
    are left out of the JSON; the rest keep the order the files have."""

    world_size: int | None = None
    attached: int = 0
    verdict: str | None = None
    verdict_code: str | None = None
    verdict_ranks: list[int] = []
    severity: str | None = None
    slow_rank: int | None = None
    slow_finding: Finding | None = None
    notes: list[str] = []
    ranks: list[RankStatus] = []
    order: list[int] | UnsetType = UNSET
    spread: list[float | None] | None | UnsetType = UNSET
    restarts: list[Restart] = []
    dropped: int = 0
    lost: list[str | None] = []
    run_id: str | None | UnsetType = UNSET
    t: float | None | UnsetType = UNSET
    ended: bool | UnsetType = UNSET

    @classmethod
    def of(cls, value: LiveStatus | Any) -> LiveStatus | None:
        """A status from a struct or a frame's JSON; None when it is not one.
        ``order`` and ``spread`` only arrange the table: when they are garbled
        the rest is kept without them."""
        if value is None or isinstance(value, cls):
            return value
        try:
            return msgspec.convert(value, cls)
        except msgspec.ValidationError:
            if not isinstance(value, dict):
                return None
        try:
            return msgspec.convert({k: v for k, v in value.items()
                                    if k not in ("order", "spread")}, cls)
        except msgspec.ValidationError:
            return None

    def verdict_finding(self) -> Finding | None:
        """The verdict as a finding: its line, kind and severity (a finished
        folder's manifest may have the line alone: ``INFO`` then)."""
        if not self.verdict:
            return None
        if self.slow_finding is not None and self.verdict_code == SLOW_RANK:
            return self.slow_finding  # the verdict is the slow rank's finding
        severity = self.severity if self.severity in SEVERITIES else INFO
        return Finding(severity, self.verdict, code=self.verdict_code or "")

    def findings(self) -> list[Finding]:
        """What the status says, as typed findings: the verdict (naming
        ``verdict_ranks`` when its finding names no rank itself), then the
        slow rank's finding when the verdict is another one (a leak that
        leads a straggler). A script reads these by ``code``, ``severity``,
        ``ranks`` and the ``cause`` figure, as ``torchlens analyze --json``'s."""
        out = []
        verdict = self.verdict_finding()
        if verdict is not None:
            named = verdict
            if not verdict.ranks and self.verdict_ranks:
                named = replace(verdict, details={**verdict.details,
                                                  "ranks": list(self.verdict_ranks)})
            out.append(named)
        if self.slow_finding is not None and self.slow_finding is not verdict:
            out.append(self.slow_finding)
        return out

    def to_json(self) -> dict[str, Any]:
        """The status as the JSON builtins the feed and live.json carry."""
        return msgspec.to_builtins(self, enc_hook=_number)


def _number(value: Any) -> Any:
    """A numpy number in a finding's figures as its Python number."""
    item = getattr(value, "item", None)
    if item is None:
        raise NotImplementedError(f"cannot encode {type(value).__name__}")
    return item()


#: what a rank row of the live status carries (``RankStatus``, less ``slow`` and ``ended``)
STATUS_KEYS = tuple(f for f in RankStatus.__struct_fields__ if f not in ("slow", "ended"))
#: rank states that mean it stopped (``rank_state``)
ENDED_STATES = ("finished", "failed", "ended by its agent", PEER_FAILED, INTERRUPTED, "lost")
#: the start of the states an ended job gives a rank from torchrun's exit code
#: (``job_exit.job_ended``): ``killed by signal 9 (SIGKILL)``, ``exit code 2``
EXIT_STATES = ("killed by ", "exit code ")


def has_ended(state: str | None) -> bool:
    """Whether a rank in ``state`` has stopped."""
    return state in ENDED_STATES or (state or "").startswith((*EXIT_STATES, PEER_STOPPED))


def _finite(value: Any) -> Any:
    """None for a float that is not finite: the status is strict JSON (a browser reads it)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _ended(row: RankStatus) -> RankStatus:
    row.ended = ended_reason(row)
    return row


def live_status(view: RunView) -> LiveStatus:
    """The run's status (``LiveStatus``) from one ``RunView``, all plain JSON values."""
    rows = [_ended(RankStatus(**{k: _finite(getattr(row, k)) for k in STATUS_KEYS},
                              slow=row.rank == view.slow.rank)) for row in view.ranks]
    return LiveStatus(
        world_size=view.world_size, attached=view.attached,
        verdict=str(view.verdict), verdict_code=view.verdict.code,
        verdict_ranks=list(view.verdict.ranks), severity=view.verdict.severity,
        slow_rank=view.slow.rank, slow_finding=view.slow.finding,
        notes=list(view.notes), ranks=rows, order=list(view.order),
        spread=None if view.spread is None else [_finite(v) for v in view.spread],
        restarts=list(view.restarts), dropped=view.dropped,
        lost=[n.words for n in view.lost])


def ended_reason(row: RankStatus) -> str | None:
    """Why a status row's rank stopped (its state, and its error), None while it runs."""
    if not has_ended(row.state):
        return None
    if peer_gone(row.error):
        if is_peer_stopped(row.state):
            return f"{row.state} ({peer_gone_words(row.error)})"
        return f"{row.state}: a peer went away ({peer_gone_words(row.error)})"
    return f"{row.state}: {row.error}" if row.error else str(row.state)


def _restarts(saved: list[RestartEntry]) -> list[Restart]:
    """A manifest's restarts as ``Restart`` records; those it cannot read are left out."""
    out = []
    for r in saved:
        try:
            out.append(msgspec.convert(msgspec.to_builtins(r), Restart))
        except msgspec.ValidationError:
            continue
    return out


def folder_status(manifest: Manifest, steps: Steps, summaries: list[list[StepSummary]]
                  ) -> LiveStatus:
    """``live_status`` of a finished run folder (its manifest, and each rank's
    step records and summaries): for ``torchlens.watch`` on a run without a
    live feed. The states are the manifest's; so are the verdict and slow
    rank of a folder whose writer judged the run (``torchlens run``), else
    (``%ddp_check --profile``) they are ``slow_rank``'s over its step records:
    the one verdict every view gives."""
    table = rank_table(steps, summary_dicts(summaries)) if any(steps) else []
    said = manifest.verdict
    saved = manifest.slow_rank or {}
    slow_finding = as_finding(saved.get("finding"))
    severity = slow_finding.severity if slow_finding is not None else None
    slow = saved.get("rank")
    code = manifest.verdict_code
    if not said and sum(1 for s in steps if s) >= 2:
        judged = slow_rank(steps)
        said, severity, slow = str(judged.finding), judged.finding.severity, judged.rank
        slow_finding, code = judged.finding, judged.finding.code
    elif said and code != SLOW_RANK:
        # the verdict is not the slow rank's (a lost node, a failure), or of a kind an
        # older manifest does not say: the slow rank's severity is not its; a failure's
        # is failed, as the report gives it (``failure_finding``)
        failure = failure_finding(manifest)
        severity = failure.severity if failure is not None else None
    rows = []
    for entry in manifest.ranks:
        r = entry.rank
        # the entry's own fields (rank, node, host, state, restart, error, steps); the
        # step and memory figures come from the table
        row = RankStatus(**{k: getattr(entry, k, None) for k in STATUS_KEYS}, slow=r == slow)
        for k, v in table[r].items() if r < len(table) else ():
            if k in STATUS_KEYS and k not in ("rank", "steps"):
                setattr(row, k, _finite(v))
        rows.append(row)
    # a manifest written before these states: a rank a peer's failure ended says
    # "failed", a rank of a run the user stopped "ended by its agent"
    states = interrupted_states(peer_failed([str(r.state) for r in rows],
                                            [r.error for r in rows], [r.rank for r in rows]),
                                bool(manifest.interrupted))
    for row, state in zip(rows, states, strict=True):
        row.state = state if row.state is not None else None
        _ended(row)
    # the ranks the verdict names: the manifest's, or the slow rank judged here
    named = (list(manifest.verdict_ranks) if code == manifest.verdict_code
             else list(slow_finding.ranks) if slow_finding is not None else [])
    return LiveStatus(
        world_size=manifest.world_size, attached=len(rows), verdict=said, verdict_code=code,
        verdict_ranks=named, severity=severity, slow_rank=slow if isinstance(slow, int) else None,
        slow_finding=slow_finding, ranks=rows,
        notes=[n for n in manifest.notes if isinstance(n, str)],
        restarts=_restarts(list(manifest.restarts)), dropped=manifest.dropped_messages or 0,
        lost=[n.words for n in manifest.lost_nodes])
