"""Collectives across ranks: who arrived last, who waited, and at what bandwidth
(which ranks stand out: ``analysis.runs.slow_ranks``).

Per rank (in a worker process, from one ``Trace``)
--------------------------------------------------
``rank_collectives(trace)`` lists every collective of the trace in issue
order, found by ``analysis.trace.collectives.collective_events`` (its module
docstring has the rules: one collective per ``c10d::``/``record_param_comms``/
backend-span family, gloo work spans paired with their issue, NCCL kernels
attached through their launch), over the whole trace rather than one step:

- ``seq``: 0-based position in the trace, by issue time;
- ``name``: the canonical kind (``allreduce``, ``broadcast``, ``allgather``,
  ``reducescatter``, ``alltoall``, ``reduce``, ``gather``, ``scatter``,
  ``barrier``, ``send``, ``recv``, ``sendrecv``);
- ``t0``: unix seconds when this rank issued it (its outermost host op; a
  NCCL kernel launched outside any host collective counts from its launch);
- ``t1``: unix seconds at the end of its last host span, gloo/nccl span or
  NCCL kernel; unix seconds as ``events.unix_origin`` converts trace times
  (``baseTimeNanoseconds``, when the trace has one, plus the raw ``ts``);
- ``dur_us``: ``t1 - t0`` in µs (from the trace's µs, not the rounded seconds);
- ``bytes``: the message size S of nccl-tests (``doc/PERFORMANCE.md``): the
  whole array, so for ``allgather``/``gather`` the gathered output and for
  every other kind the input. From ``record_param_comms`` (``Out msg nelems``
  for the gathering kinds, else ``In msg nelems``, times its ``dtype``'s
  size); else, with ``record_shapes``, the largest tensor argument of any of
  its events (``_allgather_base_``'s output, ``_reduce_scatter_base_``'s
  input, the larger of ``alltoall_base_``'s two); else ``None``;
- ``kernel_us``: the summed duration of its NCCL kernels, ``None`` when it
  has none (gloo, CPU);
- ``k0``: unix seconds when its first NCCL kernel started on the GPU (Kineto
  writes GPU times on the host clock), ``None`` when it has none;
- ``group``: ``record_param_comms``' ``Group size``, ``None`` when not
  recorded; ``pg``: its ``Process Group Name`` (or id), ``None`` when not
  recorded.

``collective_table(trace)`` is the same as columns (one plain list per key,
names coded against a short vocabulary, ``t1`` left to be ``t0 + dur_us``,
``k0`` sent as ``kernel_start_us``, µs after ``t0``):
that is what travels from a worker, since a long trace can hold a great
many collectives. It pickles to about 40 bytes per collective (measured on
100,000 copies of a100_ddp's collectives: 38 B, where the list of dicts
takes 72 B; 21 collectives take about 1 KB). ``records(table)`` turns it
back into ``rank_collectives``' list.

Across ranks (``{rank: [figures per trace]}``, each with ``"collectives"``)
--------------------------------------------------------------------------
Collectives are matched by ``(trace, seq)``: ``trace`` is the step number
where every trace holds one step (a run folder: step N meets step N of the
other ranks, even when a rank's other step is unreadable), else the position
of the trace among the rank's inputs (``trace_keys``). A matched collective is compared only when every rank that has it
agrees on its name and, for the kinds whose count every rank must pass alike
(``SAME_SIZE``), on its size where known; otherwise the row is a
*mismatch* (a sentence naming who did what) and nothing in it is paired.
Ranks whose trace has fewer collectives are ``missing`` from the later rows.
Matching is over all of a rank's collectives in one sequence: runs that use
several process groups in different orders on different ranks show up as
mismatches.

- arrival (``arrived_by``): when every rank has NCCL kernels for it, each
  rank's ``k0``, its first NCCL kernel's start on the GPU (``"kernel"``);
  else each rank's ``t0``, when its host issued the call (``"host"``). NCCL
  is asynchronous: the host enqueues and moves on, so its issue time says
  when the CPU got there, not when the GPU did (a rank whose GPU is still busy
  with the backward's kernels issues early and arrives late); its kernel
  starts when its stream reaches the collective and then waits inside for
  the others. ``issued`` keeps every rank's ``t0``. The *last* rank and each
  rank's *wait* (``last arrival - its arrival`` in µs, 0 for the last) are
  ``analysis.ranks.arrivals.last_arrival``'s (ties: the lowest rank). Clocks
  of different machines are compared as they are (``clock`` aligns them):
  an offset between them reads as waiting.
- ``dur_us``: the shortest time any rank spent in the collective, counted on
  its NCCL kernels when every rank has them (``timed_by: "kernel"``), else
  from issue to end (``"host"``). The last rank to arrive waits least, so the
  shortest time is the closest to the exchange itself; ``span_us`` is from
  the first host issue to the last end.
- ``algbw_GBps`` = bytes / ``dur_us`` (GB/s, 1e9 B); ``busbw_GBps`` =
  algbw x ``busbw_factor(name, n)``, nccl-tests' factors: allreduce
  2(n-1)/n; allgather, reducescatter, alltoall, gather, scatter (n-1)/n;
  broadcast, reduce, send, recv, sendrecv 1; ``None`` for other kinds. ``n``
  is the group size the traces record, else the run's world size, else the
  number of ranks read. ``bytes`` is the largest any rank reports (they are
  equal for the ``SAME_SIZE`` kinds).

"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from msgspec import UnsetType

from torchlens.analysis.ranks.arrivals import last_arrival
from torchlens.analysis.ranks.slow import rank_list
from torchlens.analysis.runs.rows import CollectiveRow
from torchlens.analysis.trace.collectives import (
    DTYPE_BYTES,
    argument_bytes,
    collective_events,
)
from torchlens.analysis.trace.events import event_text, unix_origin
from torchlens.model import Trace
from torchlens.model.run_figures import Collective, CollectiveTable, RankFigures

#: Kinds whose message size every rank must pass alike (NCCL takes one count).
SAME_SIZE = frozenset({"allreduce", "broadcast", "reduce", "allgather", "reducescatter"})
#: Kinds whose message size S is the gathered output (nccl-tests).
GATHERING = frozenset({"allgather", "gather"})
#: ``collective_table``'s columns besides ``names`` (``t1`` is ``t0 + dur_us``, not sent).
COLUMNS = ("name", "t0", "dur_us", "bytes", "kernel_us", "kernel_start_us", "group", "pg")


# ---------------------------------------------------------------- one rank
#: what each ``arrived_by`` means, under the collectives table
_ARRIVED_BY_WORDS = {
    "kernel": "kernel = each rank's arrival is its first NCCL kernel's start on the GPU "
              "(NCCL is asynchronous: the host enqueues the call and moves on)",
    "host": "host = when its host issued the call",
}


def arrived_by_note(kinds: Iterable[str | None]) -> str:
    """The note under a collectives table: what its ``arrived_by`` values mean,
    only those it holds (a gloo job on the CPU has no NCCL kernel: its note
    says nothing of NCCL), and that ``run.collectives()`` keeps the host issue
    times."""
    present = set(kinds)
    held = [k for k in _ARRIVED_BY_WORDS if k in present]
    if held == ["host"]:
        words = ("host = when each rank's host issued the call (no rank's trace holds a "
                 "GPU kernel for these collectives: they ran on the host, e.g. gloo)")
    elif "host" in held:
        words = "; ".join(_ARRIVED_BY_WORDS[k] for k in held) + \
            " (no NCCL kernel on every rank)"
    else:
        words = "; ".join(_ARRIVED_BY_WORDS[k] for k in held)
    return (f"arrived by: {words}. " if held else "") + \
        "run.collectives() keeps the host issue times as issued."


def collective_table(trace: Trace) -> CollectiveTable:
    """The trace's collectives as columns (module docstring): ``names`` (the
    vocabulary), ``name`` (codes into it) and one list per other key of
    ``rank_collectives``, all in issue order."""
    base_s = unix_origin(trace)
    ev = trace.events
    cats = ev.categories["cat"]
    kernel_cat = cats.index("kernel") if "kernel" in cats else -2
    vocabulary: dict[str, int] = {}
    out: dict[str, list[Any]] = {key: [] for key in COLUMNS}
    dur, cat = ev["dur"], ev["cat"]
    for c in collective_events(trace):
        members = c["members"]
        kernels = [m for m in members if cat[m] == kernel_cat]
        out["name"].append(vocabulary.setdefault(c["name"], len(vocabulary)))
        out["t0"].append(base_s + c["ts"] / 1e6)
        out["dur_us"].append(float(c["end"] - c["ts"]))
        out["bytes"].append(_message_bytes(trace, c["name"], members))
        out["kernel_us"].append(float(np.nan_to_num(dur[kernels]).sum()) if kernels else None)
        out["kernel_start_us"].append(float(c["k0"] - c["ts"]) if "k0" in c else None)
        out["group"].append(_first(ev.at("group_size", m) for m in members))
        pg = [event_text(trace, "pg_name", m) for m in members]
        out["pg"].append(next((p for p in pg if p), None))
    return CollectiveTable(names=list(vocabulary), **out)


def records(table: CollectiveTable) -> list[Collective]:
    """``collective_table``'s columns as one record per collective, with ``seq``."""
    names, t0, dur = table.names, table.t0, table.dur_us
    k0 = table.kernel_start_us or [None] * len(t0)
    return [Collective(seq=i, name=names[code], t0=t0[i], t1=t0[i] + dur[i] / 1e6,
                       dur_us=dur[i], k0=None if k0[i] is None else t0[i] + k0[i] / 1e6,
                       bytes=table.bytes[i], kernel_us=table.kernel_us[i],
                       group=table.group[i], pg=table.pg[i])
            for i, code in enumerate(table.name)]


def rank_collectives(trace: Trace) -> list[Collective]:
    """Every collective of one rank's trace in issue order (module docstring)."""
    return records(collective_table(trace))


def _first(values: Iterable[Any]) -> int | None:
    """The first non-negative integer (a recorded count), else ``None``."""
    for v in values:
        if int(v) >= 0:
            return int(v)
    return None


def _message_bytes(trace: Trace, name: str, members: list[int]) -> int | None:
    """nccl-tests' S of one collective (module docstring)."""
    ev = trace.events
    for m in members:
        size = DTYPE_BYTES.get(event_text(trace, "dtype", m).lower())
        if size is None:
            continue
        n_in, n_out = int(ev.at("in_nelems", m)), int(ev.at("out_nelems", m))
        n = (n_out if n_out >= 0 else n_in) if name in GATHERING else (
            n_in if n_in >= 0 else n_out)
        if n >= 0:
            return n * size
    best = None
    for m in members:
        size = _largest_argument(event_text(trace, "input_dims", m), event_text(trace, "input_types", m))
        if size is not None and (best is None or size > best):
            best = size
    return best


def _largest_argument(dims: str, types: str) -> int | None:
    """Bytes of the largest tensor argument of a known dtype, ``None`` if none."""
    return max((n for n in argument_bytes(dims, types) if n is not None), default=None)


# ---------------------------------------------------------------- the run
def busbw_factor(name: str, n: int) -> float | None:
    """nccl-tests' bus bandwidth factor for ``n`` ranks (module docstring)."""
    if n < 1:
        return None
    if name == "allreduce":
        return 2 * (n - 1) / n
    if name in ("allgather", "reducescatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    if name in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        return 1.0
    return None


def trace_keys(ranks: RankFigures) -> dict[tuple[int, int], int]:
    """``{(rank, i): key}``: which traces of the ranks meet each other.

    Where every trace holds one ``ProfilerStep`` (a ``torchlens run`` or
    ``%ddp_check --profile`` folder: a trace per profiled step), the key is
    that step's number, so a rank whose step-4 trace is unreadable still has
    its step 9 meet the others' step 9. Otherwise it is the trace's position
    among the rank's inputs (``figures["trace"]``, else the list position)."""
    pos: dict[tuple[int, int], int] = {}
    step: dict[tuple[int, int], int | None] = {}
    for rank, per_rank in ranks.items():
        for i, figures in enumerate(per_rank):
            numbers = {int(s["step"]) for s in figures.step_list() if "step" in s}
            pos[(rank, i)] = figures.place(i)
            step[(rank, i)] = next(iter(numbers)) if len(numbers) == 1 else None
    if step and all(v is not None for v in step.values()):
        return {k: int(v) for k, v in step.items() if v is not None}
    return pos


def collective_tables(ranks: RankFigures) -> dict[int, dict[int, list[Collective]]]:
    """``{rank: {trace key: records}}`` of the ranks' figures that carry
    collectives (``trace_keys``)."""
    keys = trace_keys(ranks)
    out: dict[int, dict[int, list[Collective]]] = {}
    for rank in sorted(ranks):
        for i, figures in enumerate(ranks[rank]):
            table = figures.collectives
            if isinstance(table, UnsetType):
                continue
            recs = table if isinstance(table, list) else records(table)
            out.setdefault(rank, {})[keys[(rank, i)]] = recs
    return out


def _disagreement(what: dict[int, Any], unit: str = "") -> str:
    groups: dict[Any, list[int]] = {}
    for rank, value in what.items():
        groups.setdefault(value, []).append(rank)
    return "; ".join(f"{value}{unit} on {rank_list(rs)}" for value, rs in groups.items())


def collective_rows(ranks: RankFigures, world_size: int | None = None) -> list[CollectiveRow]:
    """One row per ``(trace, seq)`` across ranks (module docstring), in that order.

    Keys: ``trace``, ``step`` (``trace_steps``: the ``ProfilerStep`` number
    of a one-step trace, else ``None``), ``seq`` (the position in its trace),
    ``name`` (``None`` when the names differ),
    ``mismatch`` (``None``, or what differs), ``ranks`` (how many have it),
    ``missing`` (ranks with that trace but fewer collectives), ``bytes``,
    ``n``, ``arrivals`` (``{rank: unix s}``), ``arrived_by`` (``kernel``: the
    first NCCL kernel's start on the GPU, ``host``: the host's issue),
    ``issued`` (``{rank: t0}``), ``last_rank``, ``waits_us``
    (``{rank: µs}``), ``max_wait_us`` (last minus first arrival),
    ``total_wait_us`` (all waits summed), ``dur_us``, ``timed_by``,
    ``span_us``, ``algbw_GBps``, ``busbw_GBps``. The timing keys are ``None``
    on a mismatch; ``last_rank`` and the waits need two ranks.
    """
    tables = collective_tables(ranks)
    steps = trace_steps(ranks)
    fallback_n = world_size or len(ranks)
    rows: list[CollectiveRow] = []
    for trace in sorted({t for per in tables.values() for t in per}):
        have = {r: per[trace] for r, per in tables.items() if trace in per}
        for seq in range(max(len(recs) for recs in have.values())):
            at = {r: recs[seq] for r, recs in have.items() if seq < len(recs)}
            rows.append(_row(trace, steps.get(trace), seq, at, [r for r in have if r not in at],
                             fallback_n))
    return rows


def trace_steps(ranks: RankFigures) -> dict[int, int]:
    """``{trace key: step}`` for the traces that hold one ``ProfilerStep`` and
    the same one on every rank that has it (``trace_keys``); a trace of several
    steps, or whose ranks disagree, has none."""
    keys = trace_keys(ranks)
    seen: dict[int, set[int]] = {}
    for rank, per_rank in ranks.items():
        for i, figures in enumerate(per_rank):
            numbers = {int(s["step"]) for s in figures.step_list() if "step" in s}
            seen.setdefault(keys[(rank, i)], set()).update(
                numbers if len(numbers) == 1 else {-1, -2})
    return {t: next(iter(n)) for t, n in seen.items() if len(n) == 1}


def _row(trace: int, step: int | None, seq: int, at: dict[int, Collective],
         missing: list[int], fallback_n: int) -> CollectiveRow:
    names = {r: c.name for r, c in at.items()}
    sizes = {r: c.bytes for r, c in at.items() if c.bytes is not None}
    mismatch = None
    if len(set(names.values())) > 1:
        mismatch = "names differ: " + _disagreement(names)
    elif next(iter(names.values())) in SAME_SIZE and len(set(sizes.values())) > 1:
        mismatch = "sizes differ: " + _disagreement(sizes, " B")
    row = CollectiveRow(
        trace=trace, step=step, seq=seq,
        name=next(iter(names.values())) if len(set(names.values())) == 1 else None,
        mismatch=mismatch, ranks=len(at), missing=missing,
        bytes=max(sizes.values()) if sizes and not mismatch else None)
    if mismatch:
        return row
    groups = [c.group for c in at.values() if c.group]
    n = max(groups) if groups else fallback_n
    on_gpu = all(c.k0 is not None for c in at.values())
    arrivals = {r: (c.k0 if on_gpu and c.k0 is not None else c.t0) for r, c in at.items()}
    issued = {r: c.t0 for r, c in at.items()}
    by_kernel = all(c.kernel_us is not None for c in at.values())
    dur = min(((c.kernel_us or 0.0) if by_kernel else c.dur_us) for c in at.values())
    row.arrived_by = "kernel" if on_gpu else "host"
    row.issued = issued
    row.n, row.arrivals, row.dur_us = n, arrivals, dur
    row.timed_by = "kernel" if by_kernel else "host"
    row.span_us = (max(c.t1 for c in at.values()) - min(issued.values())) * 1e6
    if len(at) >= 2:
        set_last(row, arrivals)
    if row.bytes is not None and dur > 0:
        algbw = row.bytes / dur / 1e3  # B/µs = MB/s; /1e3 -> GB/s
        factor = busbw_factor(str(row.name), n)
        row.algbw_GBps, row.busbw_GBps = algbw, algbw * factor if factor is not None else None
    return row


def set_last(row: CollectiveRow, arrivals: dict[int, float]) -> None:
    """``row``'s last rank and waits from ``arrivals`` (``ranks.arrivals.last_arrival``)."""
    last = last_arrival(arrivals)
    row.last_rank, row.waits_us = last.last_rank, last.waits_us
    row.max_wait_us, row.total_wait_us = last.max_wait_us, last.total_wait_us
