"""One rank's profiled step as the bounded JSON summary of docs/RANK_PROFILE.md.

It runs inside the training process after every profiled step, so it works on
the numpy columns of the events table and builds no pandas frame (the step's
numbers come from the functions ``step_breakdown`` is made of).

Times. The events table counts ``ts`` in µs from ``meta["t0_us"]`` (the
earliest raw ``ts``). Newer Kineto writes raw ``ts`` as µs since
``baseTimeNanoseconds`` (a unix time rounded down to whole seconds: base plus
ts is ``time.time()`` at the event, checked on torch 2.13 here), older Kineto
writes unix µs and no base. So unix seconds = base/1e9 + (t0_us + ts)/1e6,
with base 0 when the trace has none. (Some older shared traces carry a base
while their ts count from another clock, e.g. a100_ddp's lands 52 days after
its base; nothing in such a file tells, so they are taken as written.)

The step's events: host spans that start inside the host ``ProfilerStep#N``
span, and the GPU work they launched (by correlation), wherever it runs. Not
the plugin's widened step window: when the GPU lags the host, most of step
N's host code runs before that window opens, and its collectives must stay
in step N on every rank for ``seq`` to match.

Memory, modelled: ``allocated`` counts the blocks a CUDA caching allocator
would hand out (requests rounded up to 512 B), as ``allocated_bytes`` does,
not the bytes the program asked for.

Collectives: one event per collective, so that none is counted twice and the
``seq`` of a collective is the same on every rank.

- Host events named ``c10d::<op>``, ``[_]c10d_functional::<op>``,
  ``record_param_comms`` and the backends' own spans ``gloo:<op>``,
  ``nccl:<op>``, ``mpi:<op>``, ``ucc:<op>`` are grouped per thread by nesting:
  a NCCL call is ``c10d::allreduce_`` > ``record_param_comms`` >
  ``nccl:all_reduce`` on the calling thread, and the outermost one is the
  collective (``t0`` = when this rank issued it, which is what "who arrived
  last" compares). ``record_param_comms`` of a ``wait`` (newer torch names it,
  older torch leaves it unnamed and without a backend span inside) and
  ``*wait*`` ops are not collectives.
- Gloo runs the work on its own threads: torch 2.13 records ``c10d::allreduce_``
  (a few µs, the enqueue) on the calling thread and ``gloo:all_reduce`` (the
  exchange) on a gloo thread, not nested. A backend span that nests under no
  issuing op is paired with the earliest unpaired issuing op of the same kind
  that started before it and has no backend span of its own (gloo starts work
  in the order it was issued); paired, it only extends that collective's
  ``dur``. A backend span with nothing to pair is a collective by itself (old
  traces record only ``gloo:all_reduce``).
- NCCL kernels (``^nccl``) are the GPU side: linked through their launch
  (correlation -> runtime call -> the outermost host collective around it) they
  extend that collective's ``dur``; a kernel whose launch lies in no host
  collective is a collective by itself, at its launch time when known.

So ``dur`` is from the issue to the end of the last backend span or kernel of
that collective the trace shows.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from torchlens.analysis.memory.allocator import OOM, CachingAllocator
from torchlens.analysis.trace.ops import (
    COMM_KERNEL,
    DEVICE_CATEGORIES,
    LAUNCH_CATEGORIES,
    category_mask,
    enclosing,
    name_mask,
    op_calls,
    phase_mask,
)
from torchlens.analysis.trace.steps import (
    ROLES,
    _device_aware_steps,
    _role_spans,
    _time_per_role,
    step_rows,
)
from torchlens.model import Trace

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

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_HOST_COLLECTIVE = re.compile(
    r"^(?:c10d::|_?c10d_functional::|gloo:|nccl:|mpi:|ucc:|record_param_comms$)")
_BACKEND = re.compile(r"^(?:gloo|nccl|mpi|ucc):")
_WAIT = re.compile(r"wait", re.I)
#: Canonical collective kinds, longer words first so ``allreduce`` is not ``reduce``.
_VOCABULARY = ("reducescatter", "allreduce", "allgather", "alltoall", "broadcast",
               "barrier", "reduce", "gather", "scatter", "sendrecv", "send", "recv")
#: Element sizes by the dtype names of ``record_param_comms`` and ``Input type``.
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "int64": 8,
    "long int": 8, "int": 4, "int32": 4, "short": 2, "short int": 2, "int16": 2,
    "byte": 1, "unsigned char": 1, "uint8": 1, "char": 1, "signed char": 1, "int8": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def summarize(trace: Trace, *, rank: int, step: int, trace_rel: str,
              cuda_memory: dict | None = None) -> dict:
    """The profiled-step summary of RANK_PROFILE.md; at most ``LIMIT_BYTES`` as ``encode``d."""
    base_s = _unix_origin(trace)
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
    }
    tail = {
        "top_ops": _top_ops(trace, member),
        "memory": _memory(trace, span, cuda_memory),
    }
    return _fit(head, tail, ops, colls, rows, base_s, _lane_labels(trace))


def encode(summary: dict) -> bytes:
    """The summary as sent: ``json.dumps`` defaults (ASCII, spaced separators), the
    largest usual encoding, so the bound holds for any compacter one too."""
    return json.dumps(summary).encode()


# ----------------------------------------------------------------------- times
def _unix_origin(trace: Trace) -> float:
    """Unix seconds at table ``ts == 0`` (see the module docstring)."""
    base = trace.meta.get("baseTimeNanoseconds")
    try:
        base_s = int(base) / 1e9 if base is not None else 0.0
    except (TypeError, ValueError):
        base_s = 0.0
    return base_s + float(trace.meta.get("t0_us", 0.0)) / 1e6


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
    breakdown: dict[str, Any]


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
        numbers = np.array([int(_STEP.match(names[c]).group(1)) for c in ev["name"][rows]])
        hit = np.flatnonzero(numbers == step)
        i = int(hit[-1]) if len(hit) else int(np.flatnonzero(numbers == numbers.max())[-1])
        starts, ends = _device_aware_steps(trace, rows)
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
    per_role = _time_per_role(np.array([start]), np.array([end]), _role_spans(trace))[0]
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
    at = _launch_of(ev["correlation"][launch], launch, ev["correlation"][gpu])
    linked = at >= 0
    member[gpu[linked]] = member[at[linked]]
    g = gpu[~linked]
    member[g] = (ts[g] >= span.start) & (ts[g] < max(span.end, span.host_end))
    return member


def _launch_of(corr: np.ndarray, launch: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The launch row with each queried correlation id, -1 where none."""
    out = np.full(len(queries), -1, np.int64)
    if len(corr) == 0 or len(queries) == 0:
        return out
    order = np.argsort(corr, kind="stable")
    corr, launch = corr[order], launch[order]
    pos = np.clip(np.searchsorted(corr, queries), 0, len(corr) - 1)
    hit = (corr[pos] == queries) & (queries >= 0)
    out[hit] = launch[pos[hit]]
    return out


# ---------------------------------------------------------------------- events
def _candidates(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the events a timeline shows: host spans and GPU work.

    Runtime calls, Python frames and flow arrows are left out: they are the
    bulk of a trace and the breakdown already times the runtime.
    """
    x = phase_mask(trace, "X")
    host = x & category_mask(trace, "cpu_op", "user_annotation") & ~name_mask(trace, _STEP)
    gpu = x & category_mask(trace, "kernel", "gpu_memcpy", "gpu_memset")
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
    coll |= host & name_mask(trace, _HOST_COLLECTIVE)
    out[coll[rows]] = 4
    return out


def _lane_labels(trace: Trace) -> dict[str, Any]:
    return {"tid": trace.meta.get("tid_labels") or {}, "pid": trace.meta.get("pid_labels") or {}}


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
    depth = _depths(trace, rows[host[rows]], rows[pick])
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


def _depths(trace: Trace, host_rows: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Host spans enclosing each chosen row on its thread (0 for GPU rows).

    Pointer jumping over the parent links (each round doubles the distance
    covered) rather than walking up one level at a time: spans that overlap
    without nesting chain up as deep as the trace is long.
    """
    ev = trace.events
    if len(host_rows) == 0:
        return np.zeros(len(chosen), np.int64)
    thread = ev["pid"][host_rows] * (1 << 32) + ev["tid"][host_rows]
    up = enclosing(ev["ts"][host_rows], np.nan_to_num(ev["dur"][host_rows]), thread,
                   np.ones(len(host_rows), bool))
    depth = (up >= 0).astype(np.int64)
    while (up >= 0).any():
        has = up >= 0
        safe = np.where(has, up, 0)
        depth = np.where(has, depth + depth[safe], depth)
        up = np.where(has, up[safe], -1)
    pos = np.minimum(np.searchsorted(host_rows, chosen), len(host_rows) - 1)
    return np.where(host_rows[pos] == chosen, depth[pos], 0)


def _lane_key(trace: Trace, row: int) -> tuple[int, int, int]:
    """(0, pid, tid) for host threads, (1, device, stream) for GPU streams."""
    ev = trace.events
    if ev["stream"][row] >= 0:
        return (1, int(ev["device"][row]), int(ev["stream"][row]))
    return (0, int(ev["pid"][row]), int(ev["tid"][row]))


def _lane_names(keys: list[tuple[int, int, int]], labels: dict[str, Any]) -> list[str]:
    """``cpu <tid>`` / ``stream <s>``; pid or device added only when they differ."""
    pids = {k[1] for k in keys if k[0] == 0}
    devices = {k[1] for k in keys if k[0] == 1}
    out = []
    for is_gpu, a, b in keys:
        if is_gpu:
            out.append(f"gpu{a} stream {b}" if len(devices) > 1 else f"stream {b}")
        else:
            tid = labels["tid"].get(str(b), b)
            pid = labels["pid"].get(str(a), a)
            out.append(f"cpu {pid}:{tid}" if len(pids) > 1 else f"cpu {tid}")
    return [s[:NAME_CHARS] for s in out]


# ----------------------------------------------------------------- collectives
@lru_cache(maxsize=4096)
def _canonical(text: str) -> str:
    """``c10d::allreduce_``, ``gloo:all_reduce``, ``ncclKernel_AllReduce_...`` -> allreduce."""
    squashed = re.sub(r"[^a-z]", "", text.split("(")[0].lower())
    for word in _VOCABULARY:
        if word in squashed:
            return word
    return ""


def collective_events(trace: Trace, host: np.ndarray | None = None) -> list[dict]:
    """Every collective of the whole trace by the module docstring's rules, by ``ts``.

    One dict per collective: ``row`` (its outermost event: the issuing host op,
    an unpaired backend span, or a NCCL kernel launched outside any host
    collective), ``name`` (the canonical kind, e.g. ``allreduce``), ``ts`` (its
    issue time, table µs; a lone kernel's launch time when known), ``end``
    (table µs: the end of its last host span, paired backend span or kernel)
    and ``members`` (every row of it: host spans, backend spans, kernels).
    ``host`` is ``_candidates``' host mask (computed when not given).
    ``analysis.multirank.collectives`` reads a whole trace's collectives
    through this; ``summarize`` keeps those of its step.
    """
    if host is None:
        host = _candidates(trace)[0]
    ev = trace.events
    hrows = np.flatnonzero(host & name_mask(trace, _HOST_COLLECTIVE))
    kernels = np.flatnonzero(name_mask(trace, COMM_KERNEL) & category_mask(trace, "kernel")
                             & phase_mask(trace, "X"))
    if len(hrows) == 0 and len(kernels) == 0:
        return []
    ts = ev["ts"]
    end_of = ts + np.nan_to_num(ev["dur"])
    thread = ev["pid"] * (1 << 32) + ev["tid"]

    # nesting among the collective-named host events of a thread
    parent = enclosing(ts[hrows], np.nan_to_num(ev["dur"][hrows]), thread[hrows],
                       np.ones(len(hrows), bool)) if len(hrows) else np.zeros(0, np.int64)
    root = np.arange(len(hrows))
    while True:
        up = parent[root]
        if not (up >= 0).any():
            break
        root = np.where(up >= 0, up, root)
    # what each distinct name and "Collective name" says, looked up once
    names, args = trace.events.categories["name"], trace.events.categories["collective"]
    name_codes, arg_codes = ev["name"][hrows].tolist(), ev["collective"][hrows].tolist()
    said = {c: (names[c], _canonical(names[c]), bool(_BACKEND.match(names[c])))
            for c in set(name_codes)}
    arg_said = {c: (_canonical(args[c]), bool(_WAIT.search(args[c])), bool(args[c]))
                for c in set(arg_codes) if c >= 0}
    no_arg = ("", False, False)
    family: dict[int, list[int]] = {}
    for i, r in enumerate(root.tolist()):
        family.setdefault(r, []).append(i)
    rows_l, ts_l, end_l = hrows.tolist(), ts[hrows].tolist(), end_of[hrows].tolist()

    issues: list[dict] = []
    spans: list[dict] = []
    for r, members in family.items():
        words = [said[name_codes[i]] for i in members]
        arg_words = [arg_said.get(arg_codes[i], no_arg) for i in members]
        backend = [w[2] for w in words]
        top_name = said[name_codes[r]][0]
        if _WAIT.search(top_name) or any(a[1] for a in arg_words) or (
                top_name == "record_param_comms" and not any(a[2] for a in arg_words)
                and not any(backend)):
            continue  # a wait (older torch leaves its record_param_comms unnamed)
        kind_word = ""
        for word in [a[0] for a in arg_words] + [w[1] for w in words]:
            if word:
                kind_word = word
                break
        if not kind_word:
            continue
        end = max(end_l[i] for i in members)
        entry = {"row": rows_l[r], "name": kind_word, "ts": ts_l[r], "end": end,
                 "host_end": end, "members": [rows_l[i] for i in members]}
        if all(backend):
            spans.append(entry)
        else:
            entry["has_backend"] = any(backend)
            issues.append(entry)

    issues.sort(key=lambda e: e["ts"])
    spans.sort(key=lambda e: e["ts"])
    counted = list(issues)
    waiting: dict[str, deque[dict]] = {}
    for e in issues:
        if not e["has_backend"]:
            waiting.setdefault(e["name"], deque()).append(e)
    for span in spans:
        queue = waiting.get(span["name"])
        if queue and queue[0]["ts"] <= span["ts"]:
            issue = queue.popleft()
            issue["end"] = max(issue["end"], span["end"])
            issue["members"] = issue["members"] + span["members"]
        else:
            counted.append(span)

    _attach_kernels(trace, kernels, counted, thread, end_of)
    counted.sort(key=lambda c: c["ts"])
    return counted


def _collectives(trace: Trace, host: np.ndarray, member: np.ndarray) -> list[dict]:
    """Every collective of the step, in host order (module docstring)."""
    # collective_events is sorted (stably) by ts: filtering keeps that order
    chosen = [c for c in collective_events(trace, host) if member[c["row"]]]
    for seq, c in enumerate(chosen):
        c["seq"] = seq
        c["lane"] = _lane_key(trace, c["row"])
        # only what can be sent is worth the look-up
        c["bytes"] = _collective_bytes(trace, c["members"]) if seq < MAX_COLLECTIVES else None
    return chosen


def _attach_kernels(trace: Trace, kernels: np.ndarray, counted: list[dict],
                    thread: np.ndarray, end_of: np.ndarray) -> None:
    """NCCL kernels extend the host collective that launched them; the others count alone."""
    if len(kernels) == 0:
        return
    ev = trace.events
    ts = ev["ts"]
    launch = np.flatnonzero(category_mask(trace, *LAUNCH_CATEGORIES)
                            & phase_mask(trace, "X") & (ev["correlation"] >= 0))
    launch_of = _launch_of(ev["correlation"][launch], launch, ev["correlation"][kernels])
    # host collectives per thread, by start, to find the one around a launch
    by_thread: dict[int, list[dict]] = {}
    for c in counted:
        by_thread.setdefault(int(thread[c["row"]]), []).append(c)
    for lst in by_thread.values():
        lst.sort(key=lambda c: c["ts"])
    starts = {t: np.array([c["ts"] for c in lst]) for t, lst in by_thread.items()}
    nowhere = np.zeros(0)
    for i, k in enumerate(kernels.tolist()):
        at = float(ts[k])
        owner = None
        if launch_of[i] >= 0:
            rt = int(launch_of[i])
            at = float(ts[rt])
            lst = by_thread.get(int(thread[rt]), [])
            j = int(np.searchsorted(starts.get(int(thread[rt]), nowhere), at, side="right")) - 1
            if j >= 0 and at <= lst[j]["host_end"]:
                owner = lst[j]
        if owner is not None:
            owner["end"] = max(owner["end"], float(end_of[k]))
            owner["members"] = owner["members"] + [k]
        else:
            counted.append({"row": k, "name": _canonical(_text(trace, "name", k)) or "nccl",
                            "ts": at, "end": max(at, float(end_of[k])), "members": [k]})


def _collective_bytes(trace: Trace, members: list[int]) -> int | None:
    """Payload bytes: ``record_param_comms``' element count and dtype, else the
    input shape and type of a member (gloo spans with ``record_shapes``)."""
    ev = trace.events
    for m in members:
        n, dtype = int(ev["in_nelems"][m]), _text(trace, "dtype", m).lower()
        if n >= 0 and dtype in _DTYPE_BYTES:
            return n * _DTYPE_BYTES[dtype]
    for m in members:
        size = _shape_bytes(_text(trace, "input_dims", m), _text(trace, "input_types", m))
        if size is not None:
            return size
    return None


def _text(trace: Trace, column: str, row: int) -> str:
    code = int(trace.events[column][row])
    return trace.events.categories[column][code] if code >= 0 else ""


def argument_bytes(dims: str, types: str) -> list[int | None]:
    """Bytes of each argument of an op (its ``input_dims`` / ``input_types``
    text): ``None`` where it is not a tensor of a known dtype."""
    if not dims or not types:
        return []
    try:
        dims_v, types_v = json.loads(dims), json.loads(types)
    except ValueError:
        return []
    if not isinstance(dims_v, list) or not isinstance(types_v, list):
        return []
    out: list[int | None] = []
    for shape, dtype in zip(dims_v, types_v, strict=False):
        size = _DTYPE_BYTES.get(str(dtype).lower())
        ok = size is not None and isinstance(shape, list) and all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape)
        out.append(math.prod(shape) * size if ok else None)  # type: ignore[operator]
    return out


def _shape_bytes(dims: str, types: str) -> int | None:
    """Bytes of the first argument when it is a tensor of a known dtype."""
    sizes = argument_bytes(dims, types)
    return sizes[0] if sizes else None


# ---------------------------------------------------------------- op and memory
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


def _memory(trace: Trace, span: _Span, cuda_memory: dict | None) -> dict[str, Any] | None:
    """The allocator's own counters, or the CPU ``[memory]`` events replayed through
    the caching-allocator model up to the step's end (peak within the step)."""
    if cuda_memory is not None:
        return {"allocated": _int(cuda_memory.get("allocated")),
                "reserved": _int(cuda_memory.get("reserved")),
                "inactive_split": _int(cuda_memory.get("inactive_split")),
                "largest_free": _int(cuda_memory.get("largest_free")),
                "peak_allocated": _int(cuda_memory.get("peak_allocated")),
                "source": "cuda"}
    ev = trace.events
    rows = np.flatnonzero(name_mask(trace, re.compile(r"^\[memory\]$"))
                          & (ev["device_type"] == 0) & (ev["mem_bytes"] != 0))
    if len(rows) == 0:
        return None
    rows = rows[np.argsort(ev["ts"][rows], kind="stable")]
    rows = rows[ev["ts"][rows] < span.host_end]
    before = int(np.searchsorted(ev["ts"][rows], span.host_start, side="left"))
    model = CachingAllocator(record_history=False)
    live: dict[int, Any] = {}
    addrs, sizes = ev["addr"][rows].tolist(), ev["mem_bytes"][rows].tolist()
    for i, (addr, size) in enumerate(zip(addrs, sizes, strict=True)):
        if i == before:
            model.stats.reset_peaks()
        if size > 0:
            old = live.pop(addr, None)
            if old is not None:  # a free the trace missed: the address is reused
                model.free(old)
            block = model.malloc(size)
            if not isinstance(block, OOM):  # an OOM leaves nothing to free later
                live[addr] = block
        else:
            block = live.pop(addr, None)
            if block is not None:  # else allocated before the trace began
                model.free(block)
    if before >= len(rows):
        model.stats.reset_peaks()
    stats = model.stats
    return {"allocated": stats.current("allocated_bytes"),
            "reserved": stats.current("reserved_bytes"),
            "inactive_split": stats.current("inactive_split_bytes"),
            "largest_free": max(model.small.largest_free(), model.large.largest_free()),
            "peak_allocated": stats.peak("allocated_bytes"),
            "source": "modelled"}


# ------------------------------------------------------------------- the bound
def _fit(head: dict, tail: dict, ops: list[dict], colls: list[dict], rows: np.ndarray,
         base_s: float, labels: dict[str, Any]) -> dict:
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
                    "seq": c["seq"], "bytes": c["bytes"]}, c) for c in colls]
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


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
