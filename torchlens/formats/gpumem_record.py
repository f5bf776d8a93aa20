"""What a ``%%gpumem`` capture keeps in the snapshot ``.pickle`` it exports.

torch's snapshot format is a dict; its readers (``torch.cuda._memory_viz``,
pytorch.org/memory_viz, Mosaic) read the keys they know and ignore the rest. A
capture's export adds one more, ``RECORD_KEY``: what the capture measured that
the format has no place for: the device it measured on (a CPU capture's sizes
are the CPU allocator's, never rounded to CUDA blocks; its ``segments`` in the
file are the allocator model's, for memory_viz, and its own are none), the
cell numbers of the kernel's cell files (sites read ``cell [4] line 3``), the
``--repeat`` runs, the memory_stats around the cell and how the history was
recorded. Reading it back gives the live result's figures, its leaks included.

A file is untrusted: every field is checked (type and range) and a record that
fails is not used; the file is then read as any snapshot, with one line saying so.
Builtins only (dicts, lists, str, int, float, bool, None): the safe loader reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from torchlens.model import GpumemPayload
from torchlens.model.snapshot import Snapshot

RECORD_KEY = "torchlens_capture"
VERSION = 1

#: payload fields carried as they are, with the check each must pass
_PLAIN = {
    "start_us": "int?", "end_us": "int?", "repeat": "int", "alloc_conf": "str",
    "history": "bool", "history_error": "str", "user_recording": "bool",
    "history_entries": "int?", "history_full": "bool?", "categories_error": "str",
}


def _ok(value: Any, kind: str) -> bool:
    if kind.endswith("?") and value is None:
        return True
    kind = kind.rstrip("?")
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, str)


class CaptureRecord(msgspec.Struct, kw_only=True):
    """What a capture's export adds to its snapshot under ``RECORD_KEY``
    (``msgspec.to_builtins`` gives the builtins the file holds)."""

    version: int
    measured_on: str
    device: int
    max_entries: int
    cells: dict[str, int]
    runs: list[list[int]]
    stats_before: dict[str, int | float]
    stats_after: dict[str, int | float]
    unmeasured: list[str]
    error: dict[str, str] | None
    # the payload fields of ``_PLAIN``, carried as they are
    start_us: int | None = None  # the optional ones ("int?", "bool?") may be absent
    end_us: int | None = None
    repeat: int
    alloc_conf: str
    history: bool
    history_error: str
    user_recording: bool
    history_entries: int | None = None
    history_full: bool | None = None
    categories_error: str


def make_record(p: GpumemPayload, unmeasured: list[str],
                error: dict[str, str] | None) -> CaptureRecord:
    """The record of a capture ``p`` (its profile's ``unmeasured`` lines and ``error``)."""
    return CaptureRecord(
        version=VERSION, measured_on=p.measured_on, device=p.recorded.device,
        max_entries=p.recorded.max_entries, cells=dict(p.cells),
        runs=[list(r) for r in p.runs], stats_before=dict(p.stats_before),
        stats_after=dict(p.stats_after), unmeasured=list(unmeasured), error=error,
        **{name: getattr(p, name) for name in _PLAIN})


def _check(rec: Any) -> str:
    """What is wrong with a record read from a file ('' when nothing)."""
    if not isinstance(rec, dict) or rec.get("version") != VERSION:
        return "not a version-1 record"
    if rec.get("measured_on") not in ("cpu", "cuda"):
        return "measured_on is neither cpu nor cuda"
    for name, kind in {**_PLAIN, "device": "int", "max_entries": "int"}.items():
        if not _ok(rec.get(name), kind):
            return f"{name} is {type(rec.get(name)).__name__}"
    cells, runs = rec.get("cells"), rec.get("runs")
    if not isinstance(cells, dict) or not all(
            isinstance(k, str) and _ok(v, "int") for k, v in cells.items()):
        return "cells is not a map of file names to cell numbers"
    if not isinstance(runs, list) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 and all(_ok(x, "int") for x in r)
            for r in runs):
        return "runs is not a list of (start_us, end_us)"
    for name in ("stats_before", "stats_after"):
        stats = rec.get(name)
        if not isinstance(stats, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                for k, v in stats.items()):
            return f"{name} is not a map of memory_stats names to numbers"
    if not isinstance(rec.get("unmeasured"), list) or not all(
            isinstance(x, str) for x in rec["unmeasured"]):
        return "unmeasured is not a list of lines"
    err = rec.get("error")
    if err is not None and not (isinstance(err, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in err.items())):
        return "error is not a dict of lines"
    if rec["device"] < 0 or rec["max_entries"] < 1:
        return "device or max_entries out of range"
    return ""


@dataclasses.dataclass
class Restored:
    """A capture read back: its snapshot as the capture held it, its payload, and
    what the profile said was not measured and how the cell ended."""

    snapshot: Snapshot
    payload: GpumemPayload
    unmeasured: list[str]
    error: dict[str, str] | None


def restore(snap: Snapshot, display: GpumemPayload) -> tuple[Restored | None, str]:
    """The capture a loaded snapshot was exported from, with the loader's display
    options (``display``: simulate, capacity, top, alloc_conf when given); (None, '')
    for a snapshot without a record, (None, why) for one whose record is damaged."""
    rec = snap.extra.get(RECORD_KEY)
    if rec is None:
        return None, ""
    why = _check(rec)
    if why:
        return None, (f"The file's {RECORD_KEY} record (what torchlens' export adds) is "
                      f"damaged ({why}): it is read as a plain snapshot.")
    r = msgspec.convert(rec, CaptureRecord)  # checked above: the types hold
    own = msgspec.structs.replace(
        snap, extra={k: v for k, v in snap.extra.items() if k != RECORD_KEY})
    if r.measured_on == "cpu":  # the file's segments are the allocator model's:
        own.segments, own.allocator_settings = [], {}  # the CPU allocator keeps none
    recorded = dataclasses.replace(display.recorded, device=r.device,
                                   max_entries=r.max_entries)
    fields = {name: getattr(r, name) for name in _PLAIN}
    if display.alloc_conf:  # the loader's --alloc-conf: the "what if" it asked for
        fields["alloc_conf"] = display.alloc_conf
    payload = dataclasses.replace(
        display, measured_on=r.measured_on, recorded=recorded,
        stats_before=r.stats_before, stats_after=r.stats_after,
        runs=[(int(a), int(b)) for a, b in r.runs], cells=r.cells, **fields)
    return Restored(own, payload, r.unmeasured, r.error), ""
