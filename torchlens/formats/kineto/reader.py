"""Kineto JSON (plain or gzip) to the columnar ``Trace`` of docs/TRACE_TABLE.md.

Why this shape: a 100k-event trace decoded into dicts costs seconds and hundreds
of MB. Two paths avoid that and give equal tables: a small C scanner
(``scan.c``, used when it was built) writes the columns without a Python
object per event; the Python path decodes with msgspec into typed Structs
holding only the fields we use and pours them into numpy. Traces the scanner
does not take (odd types, unknown phases) go the Python path, which counts by
reason in ``meta["dropped"]`` every event it cannot use; the profiler's own
record counts (out-of-range, blocklisted, ...) are kept in
``meta["trace_stats"]``, so a report can say what is missing instead of
silently showing less.

A file larger than ``pieces.STREAM_ABOVE`` is read in pieces
(``formats.kineto.pieces``): the same table, in memory bounded by the table
rather than three times the file; the file is read whole when that path
cannot take it.

Bad input raises ``InputError`` with one line saying what was wrong and what to
do; no parser traceback reaches the user.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from torchlens.formats.input_files import RefusedFile, inflate_bytes, read_json_bytes
from torchlens.formats.kineto.columns import finish
from torchlens.formats.kineto.decode import decode
from torchlens.formats.kineto.native import native_columns
from torchlens.formats.kineto.pieces import load_in_pieces, streams
from torchlens.formats.kineto.python_reader import python_columns, usable_events
from torchlens.model import InputError, Trace

_RECORD_COUNTS = re.compile(r"Record counts: (.*)")
_STAT_ITEM = re.compile(r"\s*([^=,]+?)\s*=\s*(\d+)")


def load_trace(path: str | Path) -> Trace:
    """Read a Kineto trace file (``.json`` or gzip, by content) into a ``Trace``;
    the file is opened and inflated through ``formats.input_files`` (a regular
    file only, its JSON no larger than ``inflate_cap()``)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file. Check the path.")
    if path.is_dir():
        raise InputError(
            f"{path}: is a folder; give one trace file (.json or .json.gz)."
        )
    try:
        if streams(path):
            got = load_in_pieces(str(path))
            if got is not None:
                return _trace(*got, Counter(), str(path))
        data = read_json_bytes(path)
    except RefusedFile:
        raise
    except (EOFError, zlib.error) as exc:
        raise InputError(
            f"{path}: truncated or damaged gzip file ({exc}); "
            "copy or export the trace again."
        ) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}).") from None
    return ingest_bytes(data, str(path))


def ingest_bytes(data: bytes, source: str) -> Trace:
    """Parse trace bytes (plain JSON or gzip); ``source`` names them in messages."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = inflate_bytes(data, source)
        except RefusedFile:
            raise
        except (EOFError, OSError, zlib.error) as exc:
            raise InputError(
                f"{source}: truncated or damaged gzip file ({exc}); "
                "copy or export the trace again."
            ) from None
    dropped: Counter = Counter()
    native = native_columns(data)
    if native is not None:
        columns, raw = native
    else:
        raw = decode(data, source)
        events, dropped, pulled = usable_events(raw.traceEvents or [])
        if not events:
            raise InputError(
                f"{source}: the trace has no events (traceEvents is empty"
                + (f"; {sum(dropped.values())} unusable" if dropped else "")
                + "). Profile code that runs inside the profiler's active steps."
            )
        columns = python_columns(events, pulled or {})
    del data
    return _trace(columns, raw, dropped, source)


def _trace(columns: Any, raw: Any, dropped: Counter, source: str) -> Trace:
    """The ``Trace`` of one path's columns and the file's other top-level members."""
    events_table, meta = finish(columns)
    dropped.update(meta.pop("dropped", {}))
    if not len(events_table):
        raise InputError(
            f"{source}: no event has a usable time ("
            + "; ".join(f"{why}: {n}" for why, n in dropped.items())
            + "); fix or remove those values, or export the trace again."
        )
    meta.update(
        source=source,
        schemaVersion=raw.schemaVersion,
        distributedInfo=raw.distributedInfo,
        deviceProperties=raw.deviceProperties or [],
        displayTimeUnit=raw.displayTimeUnit,
        traceName=raw.traceName,
        # ts + this (as µs) is unix time; rank summaries align lanes by it
        baseTimeNanoseconds=raw.baseTimeNanoseconds,
        # the recording machine (torch >= 2.4): ranks on one host share a clock
        host_name=raw.host_name if isinstance(raw.host_name, str) else None,
        dropped=dict(dropped),
        trace_stats=_trace_stats(raw.INFO),
        profiler_messages=[
            str(m) for key in ("WARNING", "ERROR") for m in (getattr(raw, key) or [])
        ],
    )
    return Trace(events_table, meta)


def _trace_stats(info: Any) -> dict[str, int]:
    """The profiler's own counts, e.g. ``Out-of-range``, from its log lines."""
    stats: dict[str, int] = {}
    for line in info if isinstance(info, list) else []:
        m = _RECORD_COUNTS.search(str(line))
        if m:
            for k, v in _STAT_ITEM.findall(m.group(1)):
                stats[k] = int(v)
    return stats
