"""One rank's profiled step as the bounded JSON summary of docs/RANK_PROFILE.md.

It runs inside the training process after every profiled step, so it works on
the numpy columns of the events table and builds no pandas frame (the step's
numbers come from the functions ``step_breakdown`` is made of).

Times: ``t0``/``t1`` are unix seconds, by ``events.unix_origin``.

The step's events: host spans that start inside the host ``ProfilerStep#N``
span, and the GPU work they launched (by correlation), wherever it runs. Not
the plugin's widened step window: when the GPU lags the host, most of step
N's host code runs before that window opens, and its collectives must stay
in step N on every rank for ``seq`` to match.

Memory: the allocator's counters, or modelled on a CPU run (``step_memory``).

Collectives: those of the step among the trace's collectives, found by
``analysis.trace.collectives`` (its docstring gives the rules), so that the
``seq`` of a collective is the same on every rank. ``t0`` is when the host
issued it; ``k0`` (only where the trace has a NCCL kernel of it) when its
first kernel started on the GPU, which is the arrival
``analysis.ranks.arrivals`` compares (as ``analysis.runs.collectives`` does).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from torchlens.analysis.ranks.step_memory import step_memory
from torchlens.analysis.trace.collectives import (
    HOST_COLLECTIVE,
    collective_bytes,
    collective_events,
)
from torchlens.analysis.trace.comm_overlap import overlap_of_rows
from torchlens.analysis.trace.events import (
    COMM_KERNEL,
    DEVICE_CATEGORIES,
    LAUNCH_CATEGORIES,
    STEP_MARKER,
    category_mask,
    host_spans,
    lookup,
    name_mask,
    nesting_depths,
    phase_mask,
    unix_origin,
)
from torchlens.analysis.trace.ops import op_calls
from torchlens.analysis.trace.steps import (
    ROLES,
    device_aware_steps,
    role_spans,
    step_rows,
    time_per_role,
)
from torchlens.model import Trace
from torchlens.model.records import CollectiveOverlap, StepOverlap

MAX_OPS = 400
MAX_COLLECTIVES = 256
MAX_TOP = 20
LIMIT_BYTES = 64 * 1024
#: Longest name sent: longer ones are mangled templates no view can show whole.
NAME_CHARS = 200
#: The last resort for a hostile ``trace_rel`` when nothing else is left to cut.
TRACE_CHARS = 1000

BREAKDOWN_KEYS = ("kernel_us", "memcpy_us", "memset_us", "runtime_us", "dataloader_us",
                  "cpu_exec_us", "other_us", "comm_us")
KINDS = ("op", "kernel", "memcpy", "memset", "collective")



def summarize(trace: Trace, *, rank: int, step: int, trace_rel: str,
              cuda_memory: dict | None = None) -> dict:
    """The profiled-step summary of RANK_PROFILE.md; at most ``LIMIT_BYTES`` as ``encode``d."""
    base_s = unix_origin(trace)
    span = _step_span(trace, step)
    host, gpu = _candidates(trace)
    member = _members(trace, span)
    rows = np.flatnonzero((host | gpu) & member)
    kind = _kinds(trace, rows, host)
    colls = _collectives(trace, host, member)
    ops = _ops(trace, rows, kind, host)
    counts = np.bincount(kind, minlength=len(KINDS)).tolist()
    head = {
        "rank": int(rank), "step": int(step), "trace": str(trace_rel),
        "t0": _round(base_s + min(span.host_start, span.start) / 1e6, 6),
        "t1": _round(base_s + max(span.end, span.host_end if math.isfinite(span.host_end)
                                  else span.end) / 1e6, 6),
        "step_ms": _round(span.dur_us / 1e3, 3),
        "breakdown": span.breakdown,
        "events": int(len(rows)),
        "kinds": dict(zip(KINDS, counts, strict=True)),
        "overlap": msgspec.to_builtins(_overlap(trace, np.flatnonzero(gpu & member))),
    }
    tail = {
        "top_ops": _top_ops(trace, member),
        "memory": msgspec.to_builtins(
            step_memory(trace, span.host_start, span.host_end, cuda_memory)),
    }
    return _fit(head, tail, ops, colls, rows, base_s, _lane_labels(trace))


def encode(summary: dict) -> bytes:
    """The summary as sent: ``json.dumps`` defaults (ASCII, spaced separators), the
    largest usual encoding, so the bound holds for any compacter one too."""
    return json.dumps(summary).encode()


@dataclass(frozen=True)
class _Span:
    """The chosen step: its host ``ProfilerStep#N`` span and the plugin's step
    (``start``/``end``: widened to the device work it launched, never before the
    previous step's end), whose ``dur_us`` and roles are ``step_breakdown``'s."""

    host_start: float
    host_end: float
    start: float
    end: float
    dur_us: float
    breakdown: dict[str, float]


def _step_span(trace: Trace, step: int) -> _Span:
    """``ProfilerStep#<step>`` when there is one, else the highest N; without
    steps the whole trace, its roles timed by the same rule.

    ``step_breakdown``'s own numbers, from the functions it is made of: its
    DataFrame of every step cost more than the rest of a small step's summary.
    """
    ev = trace.events
    rows = step_rows(trace)
    if len(rows):
        names = trace.events.categories["name"]
        numbers = np.array([int(STEP_MARKER.match(names[c]).group(1)) for c in ev["name"][rows]])
        hit = np.flatnonzero(numbers == step)
        i = int(hit[-1]) if len(hit) else int(np.flatnonzero(numbers == numbers.max())[-1])
        starts, ends = device_aware_steps(trace, rows)
        start, end = float(starts[i]), float(ends[i])
        host_start = float(ev["ts"][rows[i]])
        host_end = host_start + float(np.nan_to_num(ev["dur"][rows[i]]))
    else:
        ts, ends = ev["ts"], ev["ts"] + ev["dur"]
        if len(ts) == 0 or not np.isfinite(ts).any():
            return _Span(0.0, 0.0, 0.0, 0.0, 0.0, dict.fromkeys(BREAKDOWN_KEYS, 0.0))
        start = float(np.nanmin(ts))
        end = float(np.nanmax(np.where(np.isfinite(ends), ends, ts)))
        # the whole trace is the step: every event of it, the last instant included
        host_start, host_end = start, math.inf
    per_role = time_per_role(np.array([start]), np.array([end]), role_spans(trace))[0]
    values = dict(zip([f"{r}_us" for r in ROLES] + ["other_us"], per_role.tolist(), strict=True))
    return _Span(host_start, host_end, start, end, end - start,
                 {k: _round(values[k], 1) for k in BREAKDOWN_KEYS})


def _members(trace: Trace, span: _Span) -> np.ndarray:
    """Rows of the step (module docstring); GPU work whose launch is not in the
    trace belongs where it runs, in the widened span."""
    ev = trace.events
    ts = ev["ts"]
    member = (ts >= span.host_start) & (ts < span.host_end)
    gpu = np.flatnonzero(category_mask(trace, *DEVICE_CATEGORIES))
    if len(gpu) == 0:
        return member
    launch = np.flatnonzero(category_mask(trace, *LAUNCH_CATEGORIES)
                            & phase_mask(trace, "X") & (ev["correlation"] >= 0))
    at = lookup(ev["correlation"][launch], launch, ev["correlation"][gpu])
    linked = at >= 0
    member[gpu[linked]] = member[at[linked]]
    g = gpu[~linked]
    member[g] = (ts[g] >= span.start) & (ts[g] < max(span.end, span.host_end))
    return member


# ---------------------------------------------------------------------- events
def _candidates(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the events a timeline shows: host spans and GPU work.

    Runtime calls, Python frames and flow arrows are left out: they are the
    bulk of a trace and the breakdown already times the runtime.
    """
    host = host_spans(trace)
    gpu = phase_mask(trace, "X") & category_mask(trace, "kernel", "gpu_memcpy", "gpu_memset")
    return host, gpu


def _kinds(trace: Trace, rows: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Index into ``KINDS`` of each row."""
    ev = trace.events
    cats = trace.events.categories["cat"]
    cat = ev["cat"][rows]
    out = np.zeros(len(rows), np.int64)
    for name, k in (("kernel", 1), ("gpu_memcpy", 2), ("gpu_memset", 3)):
        if name in cats:
            out[cat == cats.index(name)] = k
    coll = name_mask(trace, COMM_KERNEL) & category_mask(trace, "kernel")
    coll |= host & name_mask(trace, HOST_COLLECTIVE)
    out[coll[rows]] = 4
    return out


@dataclass(frozen=True)
class _LaneLabels:
    """The trace's own names of its threads and processes, by number (as text)."""

    tid: dict[str, str]
    pid: dict[str, str]


def _lane_labels(trace: Trace) -> _LaneLabels:
    return _LaneLabels(trace.meta.get("tid_labels") or {}, trace.meta.get("pid_labels") or {})


def _ops(trace: Trace, rows: np.ndarray, kind: np.ndarray, host: np.ndarray) -> list[dict]:
    """The ``MAX_OPS`` longest events, longest first (so cutting the list keeps the
    longest), each with its lane key and nesting depth on its thread."""
    ev = trace.events
    dur = np.nan_to_num(ev["dur"][rows], nan=0.0)
    n = min(MAX_OPS, len(rows))
    if n == 0:
        return []
    pick = np.argpartition(-dur, n - 1)[:n] if n < len(rows) else np.arange(len(rows))
    pick = pick[np.lexsort((ev["ts"][rows][pick], -dur[pick]))]
    depth = nesting_depths(trace, rows[host[rows]], rows[pick])
    names = trace.events.categories["name"]
    out = []
    for p, d in zip(pick.tolist(), depth.tolist(), strict=True):
        r = int(rows[p])
        code = int(ev["name"][r])
        out.append({
            "row": r,
            "name": names[code][:NAME_CHARS] if code >= 0 else "",
            "ts": float(ev["ts"][r]), "dur": float(dur[p]),
            "lane": _lane_key(trace, r), "depth": int(d), "kind": KINDS[kind[p]],
        })
    return out


def _lane_key(trace: Trace, row: int) -> tuple[int, int, int]:
    """(0, pid, tid) for host threads, (1, device, stream) for GPU streams."""
    ev = trace.events
    if ev["stream"][row] >= 0:
        return (1, int(ev["device"][row]), int(ev["stream"][row]))
    return (0, int(ev["pid"][row]), int(ev["tid"][row]))


def _lane_names(keys: list[tuple[int, int, int]], labels: _LaneLabels) -> list[str]:
    """``cpu <tid>`` / ``stream <s>``; pid or device added only when they differ."""
    pids = {k[1] for k in keys if k[0] == 0}
    devices = {k[1] for k in keys if k[0] == 1}
    out = []
    for is_gpu, a, b in keys:
        if is_gpu:
            out.append(f"gpu{a} stream {b}" if len(devices) > 1 else f"stream {b}")
        else:
            tid = labels.tid.get(str(b), b)
            pid = labels.pid.get(str(a), a)
            out.append(f"cpu {pid}:{tid}" if len(pids) > 1 else f"cpu {tid}")
    return [s[:NAME_CHARS] for s in out]


def _overlap(trace: Trace, rows: np.ndarray) -> StepOverlap:
    """The step's communication overlapped by compute, per collective
    (``analysis.trace.comm_overlap``), µs to 0.1: ``collectives`` is None when
    the step ran no GPU work (``gpu`` false: a CPU run has nothing to time)."""
    got = overlap_of_rows(trace, rows)
    if got["collectives"] is None:
        return StepOverlap(gpu=bool(got["gpu"]))
    return StepOverlap(gpu=True, collectives={
        name: CollectiveOverlap(communication_us=_round(c["communication_us"], 1),
                                overlapped_us=_round(c["overlapped_us"], 1))
        for name, c in got["collectives"].items()})


# ----------------------------------------------------------------- collectives
def _collectives(trace: Trace, host: np.ndarray, member: np.ndarray) -> list[dict]:
    """Every collective of the step, in host order (module docstring)."""
    # collective_events is sorted (stably) by ts: filtering keeps that order
    chosen = [c for c in collective_events(trace, host) if member[c["row"]]]
    for seq, c in enumerate(chosen):  # ``k0``: collective_events' first NCCL kernel start
        c["seq"] = seq
        c["lane"] = _lane_key(trace, c["row"])
        # only what can be sent is worth the look-up
        c["bytes"] = collective_bytes(trace, c["members"]) if seq < MAX_COLLECTIVES else None
    return chosen


# ---------------------------------------------------------------------- top ops
def _top_ops(trace: Trace, member: np.ndarray) -> list[dict]:
    """The ``MAX_TOP`` op names of the step with the most self time (op-table rules)."""
    calls = op_calls(trace)
    ev = trace.events
    keep = member[calls.rows]
    keep &= ev["name"][calls.rows] >= 0
    codes = ev["name"][calls.rows][keep]
    if len(codes) == 0:
        return []
    n = int(codes.max()) + 1
    self_us = np.bincount(codes, weights=calls.self_us[keep], minlength=n)
    total_us = np.bincount(codes, weights=np.nan_to_num(ev["dur"][calls.rows][keep]), minlength=n)
    count = np.bincount(codes, minlength=n)
    present = np.flatnonzero(count)
    best = present[np.lexsort((present, -self_us[present]))][:MAX_TOP]
    names = ev.categories["name"]
    return [{"name": names[c], "calls": int(count[c]), "self_ms": _round(self_us[c] / 1e3, 3),
             "total_ms": _round(total_us[c] / 1e3, 3)} for c in best.tolist()]


# ------------------------------------------------------------------- the bound
def _fit(head: dict, tail: dict, ops: list[dict], colls: list[dict], rows: np.ndarray,
         base_s: float, labels: _LaneLabels) -> dict:
    """The summary within ``LIMIT_BYTES``: fewer ops (shortest out first), then fewer
    collectives (the last out first, so ``seq`` still matches across ranks). Top-op
    names are cut to ``NAME_CHARS`` (and then, only a hostile path left, ``trace`` to
    ``TRACE_CHARS``) first when the rest alone is over the limit, since leaving out
    ops and collectives could not help then.

    How many fit is read off each item's encoded size (measured once, with its
    lane number among all lanes, which no subset exceeds), not found by
    encoding the whole document again and again: that cost more than the rest
    of a large step's summary.
    """
    colls = colls[:MAX_COLLECTIVES]
    every_lane = sorted({o["lane"] for o in ops} | {c["lane"] for c in colls})
    lane_of = {k: i for i, k in enumerate(every_lane)}
    op_items = [({"name": o["name"], "t0": _round(base_s + o["ts"] / 1e6, 6),
                  "dur": _round(o["dur"] / 1e6, 7), "lane": o["lane"], "depth": o["depth"],
                  "kind": o["kind"]}, o) for o in ops]
    coll_items = [({"name": c["name"][:NAME_CHARS], "t0": _round(base_s + c["ts"] / 1e6, 6),
                    "dur": _round((c["end"] - c["ts"]) / 1e6, 7), "lane": c["lane"],
                    "seq": c["seq"], "bytes": c["bytes"],
                    **({"k0": _round(base_s + c["k0"] / 1e6, 6)} if "k0" in c else {})}, c)
                  for c in colls]
    in_step = np.zeros(len(rows) and int(rows.max()) + 1, bool)
    in_step[rows] = True
    top = tail["top_ops"]

    def build(k_ops: int, k_colls: int) -> dict:
        sent_ops = sorted(op_items[:k_ops], key=lambda it: (it[1]["ts"], -it[1]["dur"]))
        sent_colls = coll_items[:k_colls]
        keys = sorted({it[0]["lane"] for it in sent_ops} | {it[0]["lane"] for it in sent_colls})
        lane = {k: i for i, k in enumerate(keys)}
        sent = {it[1]["row"] for it in sent_ops}
        for _, c in sent_colls:
            sent.update(c["members"])
        sent_rows = np.fromiter(sent, np.int64, len(sent))
        sent_rows = sent_rows[sent_rows < len(in_step)]
        doc = dict(head)
        doc["dropped"] = int(len(rows) - in_step[sent_rows].sum())
        doc["lanes"] = _lane_names(keys, labels)
        doc["ops"] = [dict(item, lane=lane[item["lane"]]) for item, _ in sent_ops]
        doc["collectives"] = [dict(item, lane=lane[item["lane"]]) for item, _ in sent_colls]
        doc.update(tail)
        doc["top_ops"] = top
        return doc

    def item_sizes(items: list[tuple[dict, dict]]) -> np.ndarray:
        return np.array([len(encode(dict(item, lane=lane_of[item["lane"]]))) + 2
                         for item, _ in items], np.int64)  # + the ", " before it

    def most(items: list[tuple[dict, dict]], fits: Any, room: int) -> int:
        """How many of ``items`` (a prefix) fit in ``room`` bytes, checked by ``fits``."""
        k = int(np.searchsorted(np.cumsum(item_sizes(items)), room, side="right"))
        return k if fits(k) else _largest(fits, k)  # not expected: sizes are upper bounds

    n_ops, n_colls = len(op_items), len(coll_items)
    doc = build(n_ops, n_colls)
    if _size(doc) <= LIMIT_BYTES:
        return doc
    if _size(build(0, 0)) > LIMIT_BYTES:
        # no number of ops or collectives left out could make this fit
        top = [dict(t, name=t["name"][:NAME_CHARS]) for t in top]
        if _size(build(0, 0)) > LIMIT_BYTES:
            head["trace"] = head["trace"][:TRACE_CHARS]
        doc = build(n_ops, n_colls)
        if _size(doc) <= LIMIT_BYTES:
            return doc
    lanes_bytes = len(encode(_lane_names(every_lane, labels)))  # lanes the items may add
    room = LIMIT_BYTES - _size(build(0, n_colls)) - lanes_bytes
    if room >= 0:
        n_ops = most(op_items, lambda k: _size(build(k, n_colls)) <= LIMIT_BYTES, room)
    else:
        n_ops = 0
        room = LIMIT_BYTES - _size(build(0, 0)) - lanes_bytes
        n_colls = most(coll_items, lambda k: _size(build(0, k)) <= LIMIT_BYTES, max(room, 0))
    doc = build(n_ops, n_colls)
    _size(doc)
    return doc


def _size(doc: dict) -> int:
    """Set ``doc["bytes"]`` to the size of ``encode(doc)``, its own digits included."""
    doc["bytes"] = 0
    bare = len(encode(doc)) - 1  # without the 0's digit
    n = bare + 1
    while bare + len(str(n)) != n:
        n = bare + len(str(n))
    doc["bytes"] = n
    return n


def _largest(fits: Any, n: int) -> int:
    """The largest k in [0, n] with ``fits(k)`` (``fits`` is monotone), 0 if none."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _round(value: float, digits: int) -> float | None:
    """Rounded, or None for NaN/inf (not JSON)."""
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None
