"""The one object that capture produces, analysis reads and render draws.

A ``Profile`` holds only data (numpy tables, JSON-able dicts), never live torch
objects, so a file saved on a GPU box re-renders the same report on a laptop
without torch's GPU build.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlens.model.payloads import PAYLOADS, Payload
from torchlens.model.snapshot import Snapshot
from torchlens.model.table import Table
from torchlens.model.tlprof import read_tlprof, write_tlprof

#: What kind of capture made a profile; decides its payload and report.
KINDS = tuple(PAYLOADS)


@dataclass
class Trace:
    """One process's Kineto trace as columnar events.

    ``events`` has one row per trace event (see ``formats.kineto`` for
    the columns). ``meta`` keeps the trace's top-level facts: ``t0_us`` (the
    absolute time the relative ``ts`` column counts from), ``distributedInfo``,
    ``deviceProperties``, process and thread names, and ``dropped`` (counts of
    events the ingest could not use, by reason) so nothing is dropped silently.
    """

    events: Table
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Profile:
    """A saved, re-renderable result of one capture.

    ``traces`` and ``snapshots`` are keyed by a label such as ``"main"`` or
    ``"rank0"``. ``tables`` holds derived or captured tables that cannot be
    recomputed from the traces (memory series, collective records).
    ``attachments`` keeps raw files byte for byte (e.g. the gzipped Kineto
    trace as exported, so a Perfetto export is exact, not rebuilt from columns).
    ``unmeasured`` lists, in plain words, what could not be measured on the
    machine the capture ran on; reports show it. ``payload`` holds the kind's
    own facts (``model.payloads``: one typed object per kind); left out, it is
    the kind's defaults.
    """

    kind: str
    title: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    payload: Payload | None = None
    created_at: float = field(default_factory=time.time)
    wall_time_s: float | None = None
    source: str = ""
    traces: dict[str, Trace] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    unmeasured: list[str] = field(default_factory=list)
    error: dict[str, str] | None = None
    attachments: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown profile kind {self.kind!r}; one of {KINDS}")
        expected = PAYLOADS[self.kind]
        if self.payload is None:
            self.payload = expected()
        elif not isinstance(self.payload, expected):
            raise TypeError(f"a {self.kind} profile takes a {expected.__name__} payload, "
                            f"not {type(self.payload).__name__}")

    @property
    def trace(self) -> Trace | None:
        """The single trace of a one-process capture (the first one otherwise)."""
        return next(iter(self.traces.values()), None)

    def save(self, path: str | Path) -> str:
        """Write to ``path`` (a ``.tlprof`` file); returns the path."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["traces"] = {key: (t.events, t.meta) for key, t in self.traces.items()}
        return write_tlprof(fields, path)

    @staticmethod
    def load(path: str | Path) -> Profile:
        """Read a ``.tlprof`` file written by this or an earlier torchlens; raises
        ``InputError`` with advice on bad input."""
        fields = read_tlprof(path)
        fields["traces"] = {key: Trace(events, meta)
                            for key, (events, meta) in fields["traces"].items()}
        return Profile(**fields)


def error_record(exc: BaseException | None) -> dict[str, str] | None:
    """``Profile.error`` for an exception: its type, message and full traceback."""
    if exc is None:
        return None
    return {"type": type(exc).__name__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc,
                                                            exc.__traceback__))}
