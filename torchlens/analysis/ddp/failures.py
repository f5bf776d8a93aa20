"""How the ranks of a ``%ddp_check`` run ended: which reported, which went
silent and why, the hang, the crashed workers and their CUDA out-of-memory
snapshots (the checklist's "hang", "crashed worker" and "out of memory"
lines; ``analysis.ddp.checks`` holds the rest).

Pure functions over the run's ``DdpRun`` payload.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from torchlens.formats.fingerprints import describe_collective
from torchlens.formats.locations import (
    CellNames,
    is_user_file,
    label_cells_in,
    location_label,
)
from torchlens.model import DdpRun
from torchlens.model.findings import FAILED, INFO, NA, PASSED, Finding
from torchlens.model.messages import LastCollective
from torchlens.model.rank_report import RankReport, report_from
from torchlens.model.units import format_seconds


def rank_results(rec: DdpRun) -> list[RankReport | None]:
    """Each rank's own report, None for a rank that sent none."""
    return [report_from(r) for r in rec.ranks or []]


def why_silent(rec: DdpRun, silent: list[int]) -> tuple[str, str]:
    """Why ranks sent no report, and which checklist line tells more.

    A rank reports when its step ends or raises; it says nothing when the
    hang detector or an interrupt stopped it, or when it died of a signal.
    """
    codes = rec.exit_codes or []
    died = [r for r in silent if r < len(codes) and codes[r] is not None and codes[r] < 0]
    who = ", ".join(f"rank {r}" for r in silent)
    if rec.hang or rec.outcome == "hang":
        return f"{who} stopped by the hang detector before reporting", "see the hang line"
    if rec.outcome == "interrupted" or rec.interrupted:
        return f"{who} stopped by the interrupt before reporting", "run the check to its end"
    if rec.outcome == "startup_timeout":
        return f"{who} did not start in time", "see the ranks' logs in the rank table"
    if died:
        return f"{who} died before reporting", "see the crashed-worker line"
    return f"{who} sent no report", "see the crashed-worker line"


def ended_how(rec: DdpRun) -> dict[int, str]:
    out: dict[int, str] = {}
    for r, res in enumerate(rank_results(rec)):
        if res is not None and res.error is not None:
            out[r] = f"it raised {res.error.type} first"
        elif res is not None:
            out[r] = "it finished without it"
    return out


_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def _user_frame_in(stack: str, cells: CellNames | None = None) -> str:
    """The innermost frame of the user's own code in a faulthandler dump, or ''.

    faulthandler writes the most recent call first; the worker's own threads
    (heartbeat) hold no user frame, so the first user frame is where the
    user's code is now.
    """
    for m in _STACK_FRAME.finditer(stack or ""):
        if is_user_file(m.group(1)):
            return f"{location_label(m.group(1), m.group(2), cells)} in {m.group(3)}"
    return ""


def check_hang(rec: DdpRun) -> Finding:
    hang = rec.hang
    if not hang:
        if rec.outcome == "interrupted":
            return Finding(NA, "the run was interrupted before it could be judged", title="hang")
        return Finding(PASSED, "every rank kept making progress until it ended", title="hang")
    statuses = [st or {} for st in hang.status]
    stacks = [label_cells_in(st, rec.cells) for st in hang.stacks]
    counts = [int(st.get("collectives") or 0) for st in statuses]
    # The rank(s) holding the others up have issued fewer collectives than
    # the rest, which wait in the one the laggards never reached. (Whether a
    # rank is *inside* a collective the heartbeat cannot say: gloo's ops
    # return at once and the wait is in Python, outside the dispatch.)
    most = max(counts, default=0)
    behind = [r for r in range(len(statuses)) if counts[r] < most]
    waiting = [r for r in range(len(statuses)) if counts[r] == most] if behind else []
    parts = []
    for r, st in enumerate(statuses):
        last = st.get("last")
        phase = st.get("phase", "?")
        where = _user_frame_in(hang.stacks[r] if r < len(stacks) else "",
                               rec.cells)
        at = f", now at {where}" if where else ""
        if last:
            parts.append(f"rank {r} is stuck at or after {describe_collective(_last(last))} "
                         f"(phase {phase}){at}")
        else:
            parts.append(f"rank {r} has issued no collective (phase {phase}){at}")
    if behind and waiting:
        who = ", ".join(f"rank {r}" for r in behind)
        waits = ", ".join(f"rank {r}" for r in waiting)
        advice = (f"{who} never reached the collective that {waits} wait(s) in: look at "
                  f"where {who} is (its stack below), not at the collective; a rank-dependent "
                  "branch, loop or data loader keeps it away")
    else:
        advice = (f"every rank issued {most} collective(s): they wait in a collective their "
                  "peers do not join, or all block in their own code; compare the ranks' "
                  "lines and stacks below and the collective sequence line; rerun with --strict")
    return Finding(FAILED,
                   f"no rank made progress for {format_seconds(hang.after_s)}: " + "; ".join(parts),
                   advice=advice, title="hang",
                   details={"stacks": stacks, "behind": behind, "waiting": waiting})


_SIGTERM = 15
_SIGNALS = {-6: "SIGABRT", -9: "SIGKILL", -11: "SIGSEGV", -_SIGTERM: "SIGTERM"}


def check_crash(rec: DdpRun) -> Finding:
    results = rank_results(rec)
    codes = rec.exit_codes or []
    ended = rec.ended_at or []
    errors = [(r, res.error) for r, res in enumerate(results)
              if res is not None and res.error is not None]
    strict = [e for _, e in errors if e.type == "CollectiveMismatch"]
    if errors and len(strict) == len(errors):
        return Finding(NA,
                       "every rank was stopped by --strict (see the collective sequence line)",
                       title="crashed worker")
    deaths = [(r, c) for r, c in enumerate(codes)
              if c is not None and c < 0 and not (results[r] if r < len(results) else None)]
    if not errors and not deaths:
        if rec.hang:
            return Finding(PASSED,
                           "no rank raised or died before the hang detector stopped them",
                           title="crashed worker")
        return Finding(PASSED, "no rank raised or died", title="crashed worker")
    # Every failure with its time: a rank's error carries ``t``; a rank that
    # died of a signal sent nothing, its time is when the launcher saw it end.
    failures: list[tuple[float | None, int, str]] = []
    for r, err in errors:
        failures.append((err.t, r, f"rank {r} raised {err.type}: "
                         f"{err.message} (during {err.phase or 'its step'})"))
    # A launcher (torchrun's agent, ours) ends the surviving ranks with SIGTERM
    # once one fails. A rank found gone is timed by its last heartbeat, 0.2 s
    # apart, so such a rank can look earlier than the one that failed: while
    # any rank failed otherwise, a SIGTERM is a consequence and goes last.
    stopped = {r for r, c in deaths if c == -_SIGTERM} if any(
        c != -_SIGTERM for _, c in deaths) or errors else set()
    for r, c in deaths:
        sig = _SIGNALS.get(c, f"signal {-c}")
        text = (f"rank {r} was stopped by its launcher with SIGTERM" if r in stopped
                else f"rank {r} died with {sig}")
        failures.append((ended[r] if r < len(ended) else None, r, text
                         + (" (gloo aborts on mismatched shapes/dtypes)" if c == -6 else "")))
    timed = all(t is not None for t, _, _ in failures)
    if timed:
        failures.sort(key=lambda f: (f[1] in stopped, f[0], f[1]))
        t0 = rec.t0 or min(t for t, _, _ in failures)
        parts = [f"{text} at {format_seconds(t - t0, signed=True)}" for t, _, text in failures]
    else:
        failures.sort(key=lambda f: f[1] in stopped)
        parts = [text for _, _, text in failures]
    first = failures[0][1]
    err = dict(errors).get(first)
    tb = (err.traceback if err is not None else "") or next(
        (e.traceback for _, e in errors if e.traceback), "")
    if len(failures) == 1:
        advice = "fix this rank first (traceback below)" if err is not None else (
            "the rank was killed by a signal: see its log in the rank table")
    elif timed:
        advice = (f"rank {first} failed first; the others failed after it, usually because "
                  f"their peer went away. Fix rank {first} first"
                  + (" (traceback below)" if err is not None
                     else " (see its log in the rank table)"))
    else:
        advice = ("which rank failed first is not known (a rank's time is missing): fix the "
                  "error that is not about a closed connection or a timeout first")
    return Finding(FAILED, "; ".join(parts), advice=advice, title="crashed worker",
                   details={"traceback": label_cells_in(tb, rec.cells),
                            "first": first if timed else None,
                            "ranks": [r for _, r, _ in failures]})


def check_oom(rec: DdpRun) -> Finding | None:
    """Where each rank that ran out of CUDA memory left its allocator snapshot,
    or why it left none (cudaMallocAsync, CUDA never started, the snapshot's
    own error: ``capture.ranks.oom``); None when no rank ran out.

    Not a failure of its own (the crashed-worker line is that): what to open."""
    outcomes = [(r, res.oom_snapshot) for r, res in enumerate(rank_results(rec))
                if res is not None and res.oom_snapshot is not None]
    if not outcomes:
        return None
    parts, saved = [], []
    for r, oom in outcomes:
        if oom.path:
            saved.append(oom.path)
            parts.append(f"rank {r} ran out of CUDA memory; its allocator snapshot is in "
                         f"{oom.path}")
        else:
            parts.append(f"rank {r} ran out of CUDA memory; no allocator snapshot was saved: "
                         f"{oom.why or 'no reason given'}")
    advice = (f"%gpumem --load {saved[0]} shows what held the memory at the OOM" if saved else
              "the OOM message in the crashed-worker line is what there is")
    return Finding(INFO, "; ".join(parts), advice=advice, title="out of memory",
                   details={"ranks": {r: msgspec.to_builtins(oom) for r, oom in outcomes}})


def _last(value: Any) -> LastCollective | None:
    """A hang status's last collective (its heartbeat's), None when it is not one."""
    try:
        return msgspec.convert(value, LastCollective)
    except msgspec.ValidationError:
        return None
