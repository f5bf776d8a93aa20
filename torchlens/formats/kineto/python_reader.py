"""The Python path of trace ingest: msgspec records -> converted columns.

It reads every trace, including the odd ones the native scanner hands back
(values of unexpected types, unknown phases, events without a timestamp),
and counts what it drops; so it is also the reference the native path is
tested against. Each field is pulled once per trace with a comprehension and
converted by numpy in C; Python-level loops run only for rare odd values.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from itertools import compress
from typing import Any

import msgspec
import numpy as np

from torchlens.formats.kineto.columns import (
    FLOW_PHASES,
    KEPT_PHASES,
    ROW_PHASES,
    RawColumns,
)
from torchlens.formats.kineto.schema import Args, Event
from torchlens.formats.kineto.values import (
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

_FLOW_PHASES_SET = frozenset(FLOW_PHASES)


def _puller(field: str) -> Any:
    """``rows -> [row.<field> for row in rows]`` for one fixed field.

    Written out per field because Python 3.11 specializes a literal attribute
    load inside a comprehension: about 1.5x faster than ``map(attrgetter)``
    on a trace's 100k records. ``field`` comes from our own Struct
    definitions, never from input.
    """
    assert field.isidentifier()
    scope: dict[str, Callable[[list[Any]], list[Any]]] = {}
    exec(f"def pull(rows):\n    return [r.{field} for r in rows]", scope)  # noqa: S102
    return scope["pull"]


#: One puller per ``Event`` and ``Args`` field.
_PULL = {f.name: _puller(f.name)
         for struct in (Event, Args) for f in msgspec.structs.fields(struct)}
#: ``Args`` field names and the JSON key each is encoded under.
_ARG_KEYS = [(f.name, f'"{f.encode_name}":'.encode())
             for f in msgspec.structs.fields(Args)]
_ARGS_ENCODER = msgspec.json.Encoder()


def usable_events(
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
    if phases <= KEPT_PHASES and set(map(type, ts)) <= {float}:
        if not phases - {"M"}:
            return [], dropped, None
        return events, dropped, {"ph": ph, "ts": ts}
    rows = []
    for ev in events:
        ph = ev.ph
        if ph in ROW_PHASES:
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


def python_columns(events: list[Event], pulled: dict[str, list[Any]]) -> RawColumns:
    """Pour events into converted columns; ``M`` events are set apart."""
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
    raw = RawColumns({}, {}, None, meta_events)
    cols, cats, unparsed = raw.cols, raw.cats, raw.unparsed

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

    def text(name: str, values: list[Any]) -> None:
        cols[name], cats[name] = intern(values)

    def ints(name: str, values: list[Any], default: int = -1) -> None:
        cols[name] = int_column(values, default, name, unparsed)

    cols["ts"] = float_column(ev_field("ts") if ts_list is None else ts_list, np.nan)
    raw.names = ev_field("name")
    cols["name"], cats["name"] = intern_dense(raw.names)
    cols["cat"], cats["cat"] = intern_dense(ev_field("cat"))
    cols["ph"], cats["ph"] = intern_dense(
        phases if "I" not in phases else ["i" if p == "I" else p for p in phases])
    cols["dur"] = float_column(ev_field("dur"), 0.0)
    cols["pid"] = id_column(ev_field("pid"), raw.pid_labels)
    cols["tid"] = id_column(ev_field("tid"), raw.tid_labels)
    ints("external_id", either("external_id", "external_id_lc"))
    ints("correlation", arg("correlation"))
    cols["flow_id"] = np.full(n, -1, np.int64)
    if not _FLOW_PHASES_SET.isdisjoint(cats["ph"]):  # else no event has a flow id
        ids = ev_field("id")
        flows = [i for i in present_rows(ids) if phases[i] in _FLOW_PHASES_SET]
        if flows:
            cols["flow_id"][flows] = int_column([ids[i] for i in flows], -1, "flow_id",
                                                unparsed)
    ints("device", arg("device"))
    ints("stream", arg("stream"))
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
    return raw
