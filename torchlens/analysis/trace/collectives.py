"""The collectives of a trace, found once by one set of rules: a rank's step
summary (``analysis.ranks.summary``) keeps those of its step, the multi-rank
analyses (``analysis.runs``) read a whole trace's.

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
  collective is a collective by itself, at its launch time. A kernel whose
  launch is not in the trace (a launch call the profiler dropped or did not
  record) joins the earliest host collective issued before it that has no
  kernel yet and no host backend (gloo, mpi, ucc), of the same kind or any
  kind for NCCL's ``SendRecv`` kernel: NCCL runs a communicator's
  collectives in issue order, so counting it apart would count that
  collective twice. Only a kernel with no such host collective (one that
  began before the trace did) is a collective by itself, at its start.

So ``dur`` is from the issue to the end of the last backend span or kernel of
that collective the trace shows.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from functools import lru_cache

import numpy as np

from torchlens.analysis.trace.events import (
    COMM_KERNEL,
    LAUNCH_CATEGORIES,
    category_mask,
    enclosing,
    event_text,
    host_spans,
    lookup,
    name_mask,
    phase_mask,
)
from torchlens.model import Trace

#: Host events that are, or are part of, a collective.
HOST_COLLECTIVE = re.compile(
    r"^(?:c10d::|_?c10d_functional::|gloo:|nccl:|mpi:|ucc:|record_param_comms$)")
_BACKEND = re.compile(r"^(?:gloo|nccl|mpi|ucc):")
_WAIT = re.compile(r"wait", re.I)
#: Backends whose work runs on the host: their collectives launch no NCCL kernel.
_HOST_BACKEND = re.compile(r"^(?:gloo|mpi|ucc):")
#: NCCL kernel kinds that may run any collective (NCCL's p2p kernel runs
#: alltoall and, in some versions, every collective: sampled_rank-0's allreduces).
_ANY_KIND = frozenset({"sendrecv", "send", "recv", ""})
#: Canonical collective kinds, longer words first so ``allreduce`` is not ``reduce``.
_VOCABULARY = ("reducescatter", "allreduce", "allgather", "alltoall", "broadcast",
               "barrier", "reduce", "gather", "scatter", "sendrecv", "send", "recv")
#: Element sizes by the dtype names of ``record_param_comms`` and ``Input type``.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "int64": 8,
    "long int": 8, "int": 4, "int32": 4, "short": 2, "short int": 2, "int16": 2,
    "byte": 1, "unsigned char": 1, "uint8": 1, "char": 1, "signed char": 1, "int8": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

@lru_cache(maxsize=4096)
def canonical_kind(text: str) -> str:
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
    ``members`` (every row of it: host spans, backend spans, kernels) and,
    where it has NCCL kernels, ``k0`` (table µs: the first one's start on the
    GPU, which is when the rank arrived at it; the host only enqueues).
    ``host`` is ``host_spans(trace)`` (computed when not given).
    """
    if host is None:
        host = host_spans(trace)
    ev = trace.events
    hrows = np.flatnonzero(host & name_mask(trace, HOST_COLLECTIVE))
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
    said = {c: (names[c], canonical_kind(names[c]), bool(_BACKEND.match(names[c])))
            for c in set(name_codes)}
    arg_said = {c: (canonical_kind(args[c]), bool(_WAIT.search(args[c])), bool(args[c]))
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
                 "host_end": end, "members": [rows_l[i] for i in members],
                 "gloo": any(_HOST_BACKEND.match(w[0]) for w in words)}
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
            issue["gloo"] = issue["gloo"] or span["gloo"]
        else:
            counted.append(span)

    _attach_kernels(trace, kernels, counted, thread, end_of)
    if len(kernels):
        is_kernel = np.zeros(len(ts), bool)
        is_kernel[kernels] = True
        for c in counted:
            starts = [float(ts[m]) for m in c["members"] if is_kernel[m]]
            if starts:  # when it started on the GPU: what "arrived" means on NCCL
                c["k0"] = min(starts)
    counted.sort(key=lambda c: c["ts"])
    return counted


def _attach_kernels(trace: Trace, kernels: np.ndarray, counted: list[dict],
                    thread: np.ndarray, end_of: np.ndarray) -> None:
    """NCCL kernels extend the host collective that launched them (module docstring)."""
    if len(kernels) == 0:
        return
    ev = trace.events
    ts = ev["ts"]
    launch = np.flatnonzero(category_mask(trace, *LAUNCH_CATEGORIES)
                            & phase_mask(trace, "X") & (ev["correlation"] >= 0))
    launch_of = lookup(ev["correlation"][launch], launch, ev["correlation"][kernels])
    # host collectives per thread, by start, to find the one around a launch
    by_thread: dict[int, list[dict]] = {}
    for c in counted:
        by_thread.setdefault(int(thread[c["row"]]), []).append(c)
    for lst in by_thread.values():
        lst.sort(key=lambda c: c["ts"])
    starts = {t: np.array([c["ts"] for c in lst]) for t, lst in by_thread.items()}
    nowhere = np.zeros(0)
    with_kernel: set[int] = set()
    alone: list[tuple[int, float]] = []
    unlaunched: list[int] = []
    for i, k in enumerate(kernels.tolist()):
        if launch_of[i] < 0:
            unlaunched.append(k)
            continue
        rt = int(launch_of[i])
        at = float(ts[rt])
        lst = by_thread.get(int(thread[rt]), [])
        j = int(np.searchsorted(starts.get(int(thread[rt]), nowhere), at, side="right")) - 1
        if j >= 0 and at <= lst[j]["host_end"]:
            _extend(lst[j], k, end_of)
            with_kernel.add(id(lst[j]))
        else:
            alone.append((k, at))
    # a kernel whose launch the trace lacks runs the earliest host collective
    # issued before it that has no kernel yet: NCCL runs a communicator's
    # collectives in issue order, and counting it apart would make it a second one
    waiting = sorted((c for c in counted if id(c) not in with_kernel
                      and not c.get("gloo")), key=lambda c: c["ts"])
    for k in sorted(unlaunched, key=lambda r: float(ts[r])):
        kind = canonical_kind(event_text(trace, "name", k))
        owner = next((c for c in waiting if c["ts"] <= float(ts[k])
                      and (c["name"] == kind or kind in _ANY_KIND)), None)
        if owner is None:
            alone.append((k, float(ts[k])))
            continue
        waiting.remove(owner)
        _extend(owner, k, end_of)
    for k, at in alone:
        name = canonical_kind(event_text(trace, "name", k)) or "nccl"
        counted.append({"row": k, "name": name,
                        "ts": at, "end": max(at, float(end_of[k])), "members": [k]})


def _extend(owner: dict, kernel: int, end_of: np.ndarray) -> None:
    owner["end"] = max(owner["end"], float(end_of[kernel]))
    owner["members"] = owner["members"] + [kernel]


def collective_bytes(trace: Trace, members: list[int]) -> int | None:
    """Payload bytes: ``record_param_comms``' element count and dtype, else the
    input shape and type of a member (gloo spans with ``record_shapes``)."""
    ev = trace.events
    for m in members:
        n, dtype = int(ev.at("in_nelems", m)), event_text(trace, "dtype", m).lower()
        if n >= 0 and dtype in DTYPE_BYTES:
            return n * DTYPE_BYTES[dtype]
    for m in members:
        size = _shape_bytes(event_text(trace, "input_dims", m),
                            event_text(trace, "input_types", m))
        if size is not None:
            return size
    return None


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
        size = DTYPE_BYTES.get(str(dtype).lower())
        ok = size is not None and isinstance(shape, list) and all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape)
        out.append(math.prod(shape) * size if ok else None)  # type: ignore[operator]
    return out


def _shape_bytes(dims: str, types: str) -> int | None:
    """Bytes of the first argument when it is a tensor of a known dtype."""
    sizes = argument_bytes(dims, types)
    return sizes[0] if sizes else None


