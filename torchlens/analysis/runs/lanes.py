"""A bounded summary of one rank's trace for the run's joint timeline.

Why bounded: a trace holds 10^4 to 10^6 events and a run 64 ranks or more,
while a browser draws some 10^4 rectangles smoothly and the report must stay
one file under 10 MB. So each worker keeps only what the joint timeline
draws, a few tens of KB per trace (``lane_summary``):

- lanes: every GPU stream of every device (``GPU d · stream s``), from
  kernels, memcpys and memsets; a trace without GPU work (CPU-only) has one
  lane per host thread instead (``thread t``), from its ``cpu_op`` and
  ``user_annotation`` events; plus one ``collectives`` lane with each
  collective of ``collectives.collective_table``'s rules as one bar from its
  issue to its end. At most ``MAX_LANES`` lanes (the busiest);
- events: in each lane its ``LANE_EVENTS`` longest events, plus every member
  of a collective (its NCCL kernels), at most ``MAX_COLLECTIVES`` collectives
  (the first ones);
- ``busy``: what is not kept, as busy time per bin of ``BINS`` equal bins over
  the trace (an event counts in the bin where it starts; share = busy time /
  bin width, capped at 1), so the timeline shows where work ran without
  drawing it event by event.

Kinds (``KINDS``): a GPU event's kind is ``gpu.kind_of`` (HTA's compute,
communication, memory; ``gpu_memcpy``/``gpu_memset`` are memory); host
events are ``cpu``; a collective bar is communication. Times are µs from the
trace's ``ts == 0`` (rounded to 0.1 µs); ``origin_s`` is the unix time of
``ts == 0`` (``events.unix_origin``), which puts every rank on one clock.
Each collective carries its ``seq`` (``-1`` for other events), so ``(trace,
seq)`` names the same collective on every rank, as in ``collectives``.
"""

from __future__ import annotations

import numpy as np

from torchlens.analysis.trace.collectives import collective_events
from torchlens.analysis.trace.events import category_mask, phase_mask, unix_origin
from torchlens.analysis.trace.gpu import GPU_CATEGORIES, MEMORY_CATEGORIES, kind_of
from torchlens.model import Trace
from torchlens.model.run_figures import Busy, LaneSummary

KINDS = ("compute", "communication", "memory", "cpu", "other")
COMPUTE, COMMUNICATION, MEMORY, CPU, OTHER = range(len(KINDS))
#: the longest events kept per lane
LANE_EVENTS = 150
#: collectives kept per trace (the first ones)
MAX_COLLECTIVES = 512
#: lanes kept per trace (the busiest), besides the collectives lane
MAX_LANES = 16
#: bins of the busy time of the events not kept
BINS = 200
COLLECTIVES_LANE = "collectives"
HOST_CATEGORIES = ("cpu_op", "user_annotation")


def _gpu_kind(trace: Trace, rows: np.ndarray) -> np.ndarray:
    labels = trace.events.categories["name"]
    codes = trace.events["name"][rows]
    distinct, inverse = np.unique(codes, return_inverse=True)
    table = np.array([kind_of(labels[c] if c >= 0 else "") for c in distinct], np.int64)
    # gpu.kind_of's indices (compute, communication, memory, other) -> ours
    ours = np.array([COMPUTE, COMMUNICATION, MEMORY, OTHER])[table] if len(table) else table
    kind = ours[inverse.reshape(-1)] if len(rows) else np.zeros(0, np.int64)
    kind[category_mask(trace, *MEMORY_CATEGORIES)[rows]] = MEMORY
    return kind


def _lane_rows(trace: Trace) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """The drawable events: rows, lane index, lane names and kinds."""
    ev = trace.events
    finite = np.isfinite(ev["ts"]) & np.isfinite(ev["dur"]) & phase_mask(trace, "X")
    rows = np.flatnonzero(finite & category_mask(trace, *GPU_CATEGORIES))
    if len(rows):
        a, b = ev["device"][rows], ev["stream"][rows]
        kind = _gpu_kind(trace, rows)
        label = "GPU {} · stream {}"
    else:
        rows = np.flatnonzero(finite & category_mask(trace, *HOST_CATEGORIES))
        a, b = ev["pid"][rows], ev["tid"][rows]
        kind = np.full(len(rows), CPU, np.int64)
        label = "thread {1}"
    pairs = np.stack([a, b], axis=1) if len(rows) else np.zeros((0, 2), np.int64)
    uniq, lane = np.unique(pairs, axis=0, return_inverse=True)
    lane = lane.reshape(-1)
    # the busiest lanes first, at most MAX_LANES of them
    busy = np.bincount(lane, weights=ev["dur"][rows], minlength=len(uniq))
    order = np.argsort(-busy, kind="stable")[:MAX_LANES]
    order = np.sort(order)  # drawn in (device, stream) order
    remap = np.full(len(uniq), -1)
    remap[order] = np.arange(len(order))
    lane = remap[lane]
    keep = lane >= 0
    names = [label.format(int(uniq[i][0]), int(uniq[i][1])) for i in order]
    return rows[keep], lane[keep], names, kind[keep]


def lane_summary(trace: Trace, per_lane: int = LANE_EVENTS) -> LaneSummary:
    """One trace's lanes and bounded events as plain columns (module docstring):
    ``origin_s``, ``span_us``, ``lanes`` (names), ``names`` (event name
    vocabulary), ``lane``, ``t``, ``d`` (µs), ``kind`` (``KINDS`` index),
    ``name`` (vocabulary index), ``seq`` (collective or -1), ``events`` (how
    many the lanes held), ``busy`` (``lane``, ``bin``, ``share``) with ``bin_us``."""
    ev = trace.events
    rows, lane, lanes, kind = _lane_rows(trace)
    seq_of: dict[int, int] = {}
    colls = collective_events(trace)[:MAX_COLLECTIVES]
    for i, c in enumerate(colls):
        for m in c["members"]:
            seq_of[int(m)] = i
    seq = np.array([seq_of.get(int(r), -1) for r in rows], np.int64)
    ts, dur = ev["ts"][rows], ev["dur"][rows]
    start = float(min(ts.min() if len(ts) else np.inf,
                      min((c["ts"] for c in colls), default=np.inf)))
    start = 0.0 if not np.isfinite(start) else start
    end = float(max((ts + dur).max() if len(ts) else start,
                    max((c["end"] for c in colls), default=start)))
    span = max(end - start, 1e-3)

    keep = seq >= 0
    for i in range(len(lanes)):
        mine = np.flatnonzero((lane == i) & ~keep)
        keep[mine[np.argsort(-dur[mine], kind="stable")[:per_lane]]] = True
    bin_us = span / BINS
    rest = ~keep
    b = np.clip(((ts[rest] - start) // bin_us).astype(np.int64), 0, BINS - 1)
    flat = lane[rest] * BINS + b
    busy = np.bincount(flat, weights=dur[rest], minlength=len(lanes) * BINS)
    nz = np.flatnonzero(busy > 0)

    vocabulary: dict[int, int] = {}
    labels = ev.categories["name"]
    k_rows = rows[keep]
    out_lane = lane[keep].tolist()
    out_t = np.round(ts[keep], 1).tolist()
    out_d = np.round(dur[keep], 1).tolist()
    out_kind = kind[keep].tolist()
    out_seq = seq[keep].tolist()
    out_name = [vocabulary.setdefault(int(c), len(vocabulary)) for c in ev["name"][k_rows]]
    # the collectives lane: issue to end of each collective
    c_lane = len(lanes)
    for i, c in enumerate(colls):
        out_lane.append(c_lane)
        out_t.append(round(float(c["ts"]), 1))
        out_d.append(round(float(c["end"] - c["ts"]), 1))
        out_kind.append(COMMUNICATION)
        out_seq.append(i)
        out_name.append(vocabulary.setdefault(int(ev["name"][c["row"]]), len(vocabulary)))
    names = [labels[c] if c >= 0 else "" for c in vocabulary]
    return LaneSummary(
        origin_s=unix_origin(trace), span_us=[round(start, 1), round(end, 1)],
        lanes=lanes + ([COLLECTIVES_LANE] if colls else []), names=[n[:120] for n in names],
        lane=out_lane, t=out_t, d=out_d, kind=out_kind, name=out_name, seq=out_seq,
        events=int(len(rows)), bin_us=bin_us,
        busy=Busy(lane=(nz // BINS).tolist(), bin=(nz % BINS).tolist(),
                  share=np.round(np.minimum(busy[nz] / bin_us, 1.0), 3).tolist()))
