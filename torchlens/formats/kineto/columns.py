"""The last step of trace ingest, shared by its Python and native paths.

Both paths hand over every column of docs/TRACE_TABLE.md already converted
(text as codes into labels, numbers as numpy), with timestamps still absolute,
categories still as written in the file and ``device``/``stream`` as raw
``args`` values. ``finish`` does what depends on the whole table: the time
origin, the normalized categories, which rows are GPU activity, and the
metadata (process and thread names) of the ``M`` events.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchlens.formats.kineto.schema import Event
from torchlens.model import Table
from torchlens.model.table import Sparse

#: Kineto categories, old names and case variants -> the normalized name.
CATEGORIES = {
    c: c
    for c in (
        "cpu_op user_annotation gpu_user_annotation cuda_runtime cuda_driver "
        "kernel gpu_memcpy gpu_memset cuda_sync cpu_instant_event "
        "python_function ac2g fwdbwd trace overhead"
    ).split()
}
CATEGORIES.update(
    operator="cpu_op", runtime="cuda_runtime", memcpy="gpu_memcpy",
    memset="gpu_memset",
)
#: Categories whose pid is a device and tid a stream.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
ROW_PHASES = ("X", "i", "I", "s", "f", "t")
FLOW_PHASES = ("s", "f", "t")
KEPT_PHASES = frozenset(ROW_PHASES + ("M",))
#: Column order of the events table (the same whichever path built it).
ORDER = (
    "name cat ph ts dur pid tid external_id correlation flow_id device stream "
    "input_dims input_types call_stack flops bytes collective dtype pg_name "
    "in_nelems out_nelems group_size addr mem_bytes total_allocated "
    "total_reserved device_type device_id"
).split()


@dataclass
class RawColumns:
    """What a path hands to ``finish``: rows are the non-``M`` events."""

    cols: dict[str, np.ndarray]
    cats: dict[str, list[str]]
    #: ``names[i]``: row i's name (only read for rows without a category)
    names: Any
    meta_events: list[Event]
    pid_labels: dict[str, str] = field(default_factory=dict)
    tid_labels: dict[str, str] = field(default_factory=dict)
    unparsed: Counter = field(default_factory=Counter)


#: A duration longer than this (11.6 days) is no profiled event's: a damaged value
#: (a ``dur`` of 1e300 would make sums infinite and ``analyze --json`` fail).
MAX_DUR_US = 1e12
#: A timestamp past this (2**53 µs after 1970, the year 2255) is damaged too:
#: float64 no longer holds its microseconds, nor int64 its nanoseconds much later.
MAX_TS_US = float(2**53)


def _sane_times(cols: dict[str, np.ndarray], cats: dict[str, list[str]]
                ) -> tuple[np.ndarray | None, Counter]:
    """Rows whose ``ts`` and ``dur`` are times (None: all), and the others by reason,
    each reason naming the first such event."""
    ts, dur = cols["ts"], cols["dur"]
    with np.errstate(invalid="ignore"):
        bad_ts = ~(np.abs(ts) <= MAX_TS_US) & ~np.isnan(ts)  # NaN: no ts, kept as before
        bad_dur = ~(np.abs(dur) <= MAX_DUR_US)
    dropped: Counter = Counter()
    if not (bad_ts.any() or bad_dur.any()):
        return None, dropped
    for bad, what in ((bad_ts, '"ts" past the year 2255 or not finite'),
                      (bad_dur, '"dur" over 11 days or not finite')):
        rows = np.flatnonzero(bad)
        if len(rows):
            code = int(cols["name"][rows[0]])
            name = cats["name"][code] if code >= 0 else "?"
            dropped[f"{what} (first: {name!r})"] += len(rows)
    return ~(bad_ts | bad_dur), dropped


def finish(raw: RawColumns) -> tuple[Table, dict[str, Any]]:
    """The events table and its meta from one path's converted columns.

    Rows whose time is no time (``_sane_times``) are left out and counted in
    ``meta["dropped"]``, so every view of the trace agrees on what it holds."""
    cols, cats = dict(raw.cols), dict(raw.cats)
    keep, dropped = _sane_times(cols, cats)
    names = raw.names
    if keep is not None:
        cols = {k: (v.dense() if isinstance(v, Sparse) else v)[keep] for k, v in cols.items()}
        names = [raw.names[i] for i in np.flatnonzero(keep).tolist()]
    ts_abs = cols["ts"]
    t0 = float(np.nanmin(ts_abs)) if len(ts_abs) else 0.0
    cols["ts"] = ts_abs - t0
    cat_codes, cat_labels = cols["cat"], cats["cat"]
    cols["cat"], cats["cat"] = _normalize_categories(cat_codes, cat_labels, names)
    gpu_codes = [cats["cat"].index(c) for c in GPU_CATEGORIES if c in cats["cat"]]
    is_gpu = np.isin(cols["cat"], gpu_codes)
    device, stream = cols["device"], cols["stream"]
    cols["device"] = np.where(is_gpu, np.where(device >= 0, device, cols["pid"]), -1)
    cols["stream"] = np.where(is_gpu, np.where(stream >= 0, stream, cols["tid"]), -1)

    meta: dict[str, Any] = {"t0_us": t0, "pid_labels": raw.pid_labels,
                            "tid_labels": raw.tid_labels}
    meta.update(_metadata(raw.meta_events, raw.pid_labels, raw.tid_labels))
    meta["unparsed_values"] = dict(raw.unparsed)
    meta["dropped"] = dict(dropped)
    counts = np.bincount(cat_codes[cat_codes >= 0], minlength=len(cat_labels))
    meta["raw_categories"] = {
        lab: int(c) for lab, c in zip(cat_labels, counts.tolist(), strict=True)
        if lab.lower() not in CATEGORIES
    }
    table = Table({k: held(cols[k], k) for k in ORDER},
                  {k: cats[k] for k in ORDER if k in cats})
    return table, meta


#: the columns most events leave unset, and the value an unset row holds: held
#: ``Sparse`` when few rows set them (collectives, memory events, FLOPs)
SPARSE_FILLS: dict[str, Any] = {
    "flops": np.nan, "bytes": -1, "collective": -1, "dtype": -1, "pg_name": -1,
    "in_nelems": -1, "out_nelems": -1, "group_size": -1, "addr": -1, "mem_bytes": 0,
    "total_allocated": -1, "total_reserved": -1, "device_type": -1, "device_id": -1}


def held(column: Any, name: str) -> Any:
    """``column`` as the table holds it: ``Sparse`` when it is one of
    ``SPARSE_FILLS`` and few rows set it (already ``Sparse``: as it is)."""
    if isinstance(column, Sparse) or name not in SPARSE_FILLS:
        return column
    return Sparse.of(column, SPARSE_FILLS[name]) or column


def _normalize_categories(
    codes: np.ndarray, labels: list[str], names: Any
) -> tuple[np.ndarray, list[str]]:
    """Map raw categories to the normalized set; unknown ones become ``other``.

    An event without a category is a memory instant if named ``[memory]``
    (older exports), else ``other``.
    """
    normalized = [CATEGORIES.get(lab.lower(), "other") for lab in labels]
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
