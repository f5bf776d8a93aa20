"""JSON bytes to the typed ``KinetoTrace``, or an ``InputError`` saying what they are.

The fast path is one typed ``msgspec`` decode. A trace whose events carry
values of unexpected types is decoded event by event (dropping and counting
only the odd ones), Chrome's bare-array format is accepted, and JSON that is
not a trace (an allocator snapshot, a memory-timeline export, any object
without ``traceEvents``) is named in the error instead of failing deep inside.
"""

from __future__ import annotations

import re

import msgspec

from torchlens.formats.kineto.schema import Event, KinetoTrace
from torchlens.formats.text import first_bad_utf8_byte
from torchlens.model import InputError


def decode(data: bytes, source: str) -> KinetoTrace:
    """Typed decode; on odd events fall back to event-by-event, counting losses."""
    try:
        try:
            top = msgspec.json.decode(data, type=KinetoTrace | list[msgspec.Raw])
        except msgspec.ValidationError:
            return _decode_leniently(data, source)
        if isinstance(top, list):
            return _from_json_array(top, source)
    except msgspec.DecodeError as exc:
        bad = first_bad_utf8_byte(data)
        if bad is not None:
            raise InputError(_not_utf8(source, bad)) from None
        raise InputError(
            f"{source}: not valid JSON ({exc}); the file may be cut short."
        ) from None
    except RecursionError:
        raise InputError(
            f"{source}: JSON nested deeper than this reader follows (thousands of levels; "
            "a trace's values are a few levels deep): the file is damaged or not a "
            "trace; export it again."
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError(_not_utf8(source, exc.start)) from None
    if top.traceEvents is None:
        raise InputError(f"{source}: {_what_is_it(data)}")
    return top


def _not_utf8(source: str, offset: int) -> str:
    return (f"{source}: not UTF-8 text (byte {offset}): the file is damaged or not "
            "a trace; copy or export it again.")


def _decode_leniently(data: bytes, source: str) -> KinetoTrace:
    """Slow path for traces with values of unexpected types in some events."""
    try:
        doc = msgspec.json.decode(data)
    except msgspec.ValidationError as exc:  # a number no float or 64-bit int holds
        raise InputError(f"{source}: {_out_of_range(data, exc)}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(f"{source}: {_what_is_it(data)}")
    good, bad = [], 0
    for ev in doc["traceEvents"]:
        try:
            good.append(msgspec.json.decode(msgspec.json.encode(ev), type=Event))
        except msgspec.ValidationError:
            bad += 1
    doc["traceEvents"] = []
    try:
        top = msgspec.convert(doc, KinetoTrace, strict=False)
    except msgspec.ValidationError as exc:  # msgspec names the field: "at $.traceName"
        raise InputError(f"{source}: a top-level field has the wrong type ({exc}); "
                         "fix or remove that field.") from None
    top.traceEvents = good
    if bad:
        good.append(Event(ph="__malformed__", id=bad))
    return top


#: A JSON member whose number has 20+ digits or a 3-digit exponent.
_HUGE_NUMBER = re.compile(rb'"([^"\\]{1,64})"\s*:\s*(-?\d{20,}|-?[\d.]+[eE][+-]?\d{3,})')


def _out_of_range(data: bytes, exc: Exception) -> str:
    """Name the field whose number is out of range (msgspec's path elides it)."""
    for m in _HUGE_NUMBER.finditer(data):
        text = m.group(2)
        if len(text.lstrip(b"-")) >= 20 or float(text) in (float("inf"), float("-inf")):
            shown = text[:24].decode() + ("..." if len(text) > 24 else "")
            return (f'field "{m.group(1).decode("utf-8", "replace")}" holds {shown}, a number '
                    "too large for a float or a 64-bit integer; fix or remove that value.")
    return f"a number out of range ({exc}); fix or remove that value."


def _from_json_array(items: list[msgspec.Raw], source: str) -> KinetoTrace:
    """Chrome's bare-array trace format, or say what else the list is."""
    if items and bytes(items[0]).lstrip()[:1] == b"{":
        events = []
        bad = 0
        for r in items:
            try:
                events.append(msgspec.json.decode(bytes(r), type=Event))
            except msgspec.ValidationError:
                bad += 1
        if bad:  # counted as the object form counts them
            events.append(Event(ph="__malformed__", id=bad))
        return KinetoTrace(traceEvents=events)
    if not items:
        raise InputError(f"{source}: an empty JSON list, not a Kineto trace.")
    raise InputError(
        f"{source}: a JSON list of {len(items)} rows like {bytes(items[0])[:40]!r}: "
        "this looks like an export_memory_timeline raw file, not a Kineto trace; "
        "use prof.export_chrome_trace(...) for a trace."
    )


def _what_is_it(data: bytes) -> str:
    """One phrase naming what a JSON object that is not a trace looks like."""
    try:
        keys = list(msgspec.json.decode(data, type=dict[str, msgspec.Raw]))
    except msgspec.MsgspecError:
        return "not a Kineto trace (no traceEvents)."
    if {"segments", "device_traces"} & set(keys):
        return (
            "an allocator memory snapshot, not a Kineto trace; "
            "open it with the memory tools (%gpumem / torchlens report)."
        )
    shown = ", ".join(keys[:6]) or "none"
    return (
        f"not a Kineto trace: no traceEvents list (top-level keys: {shown}). "
        "Export one with prof.export_chrome_trace(path)."
    )
