"""Kineto JSON (plain or gzip) to the columnar ``Trace`` of docs/ARCHITECTURE.md.

Why this shape: a 100k-event trace decoded into dicts costs seconds and hundreds
of MB; decoded with msgspec into typed Structs holding only the fields we use,
then poured into numpy columns with interned strings, it costs a fraction of
that (see benchmarks/RESULTS.md). Every event the ingest cannot use is counted
by reason in ``meta["dropped"]``, and the profiler's own record counts
(out-of-range, blocklisted, ...) are kept in ``meta["trace_stats"]``, so a
report can say what is missing instead of silently showing less.

Bad input raises ``InputError`` with one line saying what was wrong and what to
do; no parser traceback reaches the user.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from collections import Counter
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchlens.model import InputError, Table, Trace

from ._column_values import (
    Absent,
    float_column,
    id_column,
    int_column,
    intern,
    intern_dense,
    intern_raw,
    present_rows,
    without,
)
from ._kineto_decode import decode
from ._kineto_schema import Args, Event

#: Kineto categories, old names and case variants -> the normalized name.
_CATEGORIES = {
    c: c
    for c in (
        "cpu_op user_annotation gpu_user_annotation cuda_runtime cuda_driver "
        "kernel gpu_memcpy gpu_memset cuda_sync cpu_instant_event "
        "python_function ac2g fwdbwd trace overhead"
    ).split()
}
_CATEGORIES.update(
    operator="cpu_op", runtime="cuda_runtime", memcpy="gpu_memcpy",
    memset="gpu_memset",
)
#: Categories whose pid is a device and tid a stream.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
_ROW_PHASES = ("X", "i", "I", "s", "f", "t")
_FLOW_PHASES = ("s", "f", "t")
_KEPT_PHASES = frozenset(_ROW_PHASES + ("M",))
_FLOW_PHASES_SET = frozenset(_FLOW_PHASES)


def _puller(field: str) -> Any:
    """``rows -> [row.<field> for row in rows]`` for one fixed field.

    Written out per field because Python 3.11 specializes a literal attribute
    load inside a comprehension: about 1.5x faster than ``map(attrgetter)``
    on a trace's 100k records. ``field`` comes from our own Struct
    definitions, never from input.
    """
    assert field.isidentifier()
    scope: dict[str, Any] = {}
    exec(f"def pull(rows):\n    return [r.{field} for r in rows]", scope)  # noqa: S102
    return scope["pull"]


#: One puller per ``Event`` and ``Args`` field.
_PULL = {f.name: _puller(f.name)
         for struct in (Event, Args) for f in msgspec.structs.fields(struct)}
#: ``Args`` field names and the JSON key each is encoded under.
_ARG_KEYS = [(f.name, f'"{f.encode_name}":'.encode())
             for f in msgspec.structs.fields(Args)]
_ARGS_ENCODER = msgspec.json.Encoder()
_RECORD_COUNTS = re.compile(r"Record counts: (.*)")
_STAT_ITEM = re.compile(r"\s*([^=,]+?)\s*=\s*(\d+)")


def load_trace(path: str | Path) -> Trace:
    """Read a Kineto trace file (``.json`` or gzip, by content) into a ``Trace``."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file. Check the path.")
    if path.is_dir():
        raise InputError(
            f"{path}: is a folder; give one trace file (.json or .json.gz)."
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror}).") from None
    return ingest_bytes(data, str(path))


def ingest_bytes(data: bytes, source: str) -> Trace:
    """Parse trace bytes (plain JSON or gzip); ``source`` names them in messages."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise InputError(
                f"{source}: truncated or damaged gzip file ({exc}); "
                "copy or export the trace again."
            ) from None
    raw = decode(data, source)
    events, dropped, pulled = _usable_events(raw.traceEvents or [])
    if not events:
        raise InputError(
            f"{source}: the trace has no events (traceEvents is empty"
            + (f"; {sum(dropped.values())} unusable" if dropped else "")
            + "). Profile code that runs inside the profiler's active steps."
        )
    events_table, meta = _columns(events, pulled or {})
    meta.update(
        source=source,
        schemaVersion=raw.schemaVersion,
        distributedInfo=raw.distributedInfo,
        deviceProperties=raw.deviceProperties or [],
        displayTimeUnit=raw.displayTimeUnit,
        traceName=raw.traceName,
        dropped=dict(dropped),
        trace_stats=_trace_stats(raw.INFO),
        profiler_messages=[
            str(m) for key in ("WARNING", "ERROR") for m in (getattr(raw, key) or [])
        ],
    )
    return Trace(events_table, meta)


def _usable_events(
    events: list[Event],
) -> tuple[list[Event], Counter, dict[str, list[Any]] | None]:
    """Row events, with metadata (``M``) kept too and the rest counted by reason.

    The usual trace (only known phases, every ``ts`` a number) is recognised
    from two C-level passes, whose pulled fields are returned for reuse; only
    odd traces pay the per-event check (and return None for them).
    """
    dropped: Counter = Counter()
    ph, ts = _PULL["ph"](events), _PULL["ts"](events)
    phases = set(ph)
    if phases <= _KEPT_PHASES and set(map(type, ts)) <= {float}:
        if not phases - {"M"}:
            return [], dropped, None
        return events, dropped, {"ph": ph, "ts": ts}
    rows = []
    for ev in events:
        ph = ev.ph
        if ph in _ROW_PHASES:
            ts = ev.ts
            if type(ts) is not float and not _number_like(ts):
                dropped["no usable ts"] += 1
                continue
            rows.append(ev)
        elif ph == "M":
            rows.append(ev)
        elif ph == "__malformed__":
            dropped["malformed event"] += int(ev.id or 0)
        else:
            dropped[f"unsupported ph {ph!r}"] += 1
    if all(ev.ph == "M" for ev in rows):
        return [], dropped, None
    return rows, dropped, None


def _number_like(v: Any) -> bool:
    if isinstance(v, (int, float)):
        return math.isfinite(v)
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _present_args(args: list[Args]) -> set[str]:
    """Names of the ``Args`` fields set in at least one event.

    ``Args`` omits its defaults when encoded, so one C-level encode of all the
    decoded args (a few bytes per event) names exactly the keys in use; absent
    fields then cost no per-event pass at all.
    """
    blob = _ARGS_ENCODER.encode(args)
    return {name for name, key in _ARG_KEYS if key in blob}


def _columns(events: list[Event],
             pulled: dict[str, list[Any]]) -> tuple[Table, dict[str, Any]]:
    """Pour events into numpy columns; ``M`` events go into the returned meta.

    Each field is pulled once with ``_PULL`` (``pulled`` holds the
    ones already pulled) and converted by numpy or pandas in C; Python-level
    loops only run for the rare odd values.
    """
    phases = pulled.get("ph") or _PULL["ph"](events)
    ts_list = pulled.get("ts")
    meta_events: list[Event] = []
    if "M" in phases:
        at = [i for i, p in enumerate(phases) if p == "M"]
        meta_events = [events[i] for i in at]
        if at[-1] - at[0] + 1 == len(at):  # one block (usually the head or tail)
            cut = slice(at[0], at[-1] + 1)
            events, phases = without(events, cut), without(phases, cut)
            ts_list = None if ts_list is None else without(ts_list, cut)
        else:
            keep = [p != "M" for p in phases]
            events, phases = list(compress(events, keep)), list(compress(phases, keep))
            ts_list = None if ts_list is None else list(compress(ts_list, keep))
    evs = events
    n = len(evs)
    args = _PULL["args"](evs)
    present = _present_args(args)
    unparsed: Counter = Counter()
    pid_labels: dict[str, str] = {}
    tid_labels: dict[str, str] = {}

    def ev_field(name: str) -> list[Any]:
        return _PULL[name](evs)

    nothing = Absent([None] * n)

    def arg(name: str) -> list[Any]:
        return _PULL[name](args) if name in present else nothing

    def either(first: str, second: str) -> list[Any]:
        if second not in present:
            return arg(first)
        if first not in present:
            return arg(second)
        a, b = arg(first), arg(second)
        return [x if x is not None else y for x, y in zip(a, b, strict=True)]

    cols: dict[str, np.ndarray] = {}
    cats: dict[str, list[str]] = {}

    def text(name: str, values: list[Any]) -> None:
        cols[name], cats[name] = intern(values)

    def ints(name: str, values: list[Any], default: int = -1) -> np.ndarray:
        cols[name] = int_column(values, default, name, unparsed)
        return cols[name]

    ts_abs = float_column(ev_field("ts") if ts_list is None else ts_list, np.nan)
    t0 = float(np.nanmin(ts_abs))
    names = ev_field("name")
    cols["name"], cats["name"] = intern_dense(names)
    raw_cats = ev_field("cat")
    cat_codes, cat_labels = intern_dense(raw_cats)
    cols["cat"], cats["cat"] = _normalize_categories(cat_codes, cat_labels, names)
    cols["ph"], cats["ph"] = intern_dense(
        phases if "I" not in phases else ["i" if p == "I" else p for p in phases])
    cols["ts"] = ts_abs - t0
    cols["dur"] = float_column(ev_field("dur"), 0.0)
    cols["pid"] = id_column(ev_field("pid"), pid_labels)
    cols["tid"] = id_column(ev_field("tid"), tid_labels)
    ints("external_id", either("external_id", "external_id_lc"))
    ints("correlation", arg("correlation"))
    cols["flow_id"] = np.full(n, -1, np.int64)
    if not _FLOW_PHASES_SET.isdisjoint(cats["ph"]):  # else no event has a flow id
        ids = ev_field("id")
        flows = [i for i in present_rows(ids) if phases[i] in _FLOW_PHASES]
        if flows:
            cols["flow_id"][flows] = int_column([ids[i] for i in flows], -1, "flow_id",
                                                unparsed)

    gpu_codes = [cats["cat"].index(c) for c in GPU_CATEGORIES if c in cats["cat"]]
    is_gpu = np.isin(cols["cat"], gpu_codes)
    device = int_column(arg("device"), -1, "device", unparsed)
    stream = int_column(arg("stream"), -1, "stream", unparsed)
    cols["device"] = np.where(is_gpu, np.where(device >= 0, device, cols["pid"]), -1)
    cols["stream"] = np.where(is_gpu, np.where(stream >= 0, stream, cols["tid"]), -1)

    cols["input_dims"], cats["input_dims"] = intern_raw(arg("input_dims"))
    cols["input_types"], cats["input_types"] = intern_raw(arg("input_types"))
    text("call_stack", arg("call_stack"))
    cols["flops"] = float_column(either("flops", "flops_uc"), np.nan)
    ints("bytes", arg("bytes"))
    text("collective", arg("collective"))
    text("dtype", arg("dtype"))
    text("pg_name", either("pg_name", "pg_id"))
    for name in ("in_nelems", "out_nelems", "group_size", "addr"):
        ints(name, arg(name))
    ints("mem_bytes", arg("mem_bytes"), default=0)
    for name in ("total_allocated", "total_reserved", "device_type", "device_id"):
        ints(name, arg(name))

    meta: dict[str, Any] = {"t0_us": t0, "pid_labels": pid_labels,
                            "tid_labels": tid_labels}
    meta.update(_metadata(meta_events, pid_labels, tid_labels))
    meta["unparsed_values"] = dict(unparsed)
    counts = np.bincount(cat_codes[cat_codes >= 0], minlength=len(cat_labels))
    meta["raw_categories"] = {
        lab: int(c) for lab, c in zip(cat_labels, counts.tolist(), strict=True)
        if lab.lower() not in _CATEGORIES
    }
    return Table(cols, cats), meta


def _normalize_categories(
    codes: np.ndarray, labels: list[str], names: list[Any]
) -> tuple[np.ndarray, list[str]]:
    """Map raw categories to the normalized set; unknown ones become ``other``.

    An event without a category is a memory instant if named ``[memory]``
    (older exports), else ``other``.
    """
    normalized = [_CATEGORIES.get(lab.lower(), "other") for lab in labels]
    out_labels = sorted(set(normalized) | {"other", "cpu_instant_event"})
    lut = np.asarray([out_labels.index(c) for c in normalized] + [-1], np.int32)
    out = lut[codes]  # code -1 picks the trailing -1
    missing = np.flatnonzero(out < 0)
    if len(missing):
        mem, other = out_labels.index("cpu_instant_event"), out_labels.index("other")
        out[missing] = [mem if names[i] == "[memory]" else other for i in missing]
    return out, out_labels


def _metadata(meta_events: list[Event], pid_labels: dict[str, str],
              tid_labels: dict[str, str]) -> dict[str, Any]:
    """Process and thread names (and process labels such as ``GPU 0``)."""
    inverse_pid = {v: int(k) for k, v in pid_labels.items()}
    inverse_tid = {v: int(k) for k, v in tid_labels.items()}

    def key(v: Any, inverse: dict[str, int]) -> str:
        return str(v if isinstance(v, int) else inverse.get(str(v), v))

    process_names: dict[str, str] = {}
    process_labels: dict[str, str] = {}
    thread_names: dict[str, str] = {}
    for e in meta_events:
        a = e.args
        pid = key(e.pid, inverse_pid)
        if e.name == "process_name" and a.meta_name is not None:
            process_names[pid] = str(a.meta_name)
        elif e.name == "process_labels" and a.labels is not None:
            process_labels[pid] = str(a.labels)
        elif e.name == "thread_name" and a.meta_name is not None:
            thread_names[f"{pid}:{key(e.tid, inverse_tid)}"] = str(a.meta_name)
    return {"process_names": process_names, "process_labels": process_labels,
            "thread_names": thread_names}


def _trace_stats(info: Any) -> dict[str, int]:
    """The profiler's own counts, e.g. ``Out-of-range``, from its log lines."""
    stats: dict[str, int] = {}
    for line in info if isinstance(info, list) else []:
        m = _RECORD_COUNTS.search(str(line))
        if m:
            for k, v in _STAT_ITEM.findall(m.group(1)):
                stats[k] = int(v)
    return stats
