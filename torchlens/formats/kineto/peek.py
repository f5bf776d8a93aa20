"""A trace file's top-level members without parsing its events: the peek.

Why a peek and not ``load_trace``: deciding the rank of a 100 MB trace must
not cost a full parse (``formats.run_folder.sources.discover`` places every
file of a run by its ``distributedInfo``). Kineto writes the small top-level
members around the huge ``traceEvents`` list; torch 2.13's
``export_chrome_trace`` (and every shared trace that has one) writes
``distributedInfo`` before it, older writers may put members after it. So the
peek parses the members in the head of the (decompressed) stream one by one
until ``traceEvents`` opens, and in the tail finds where that list closes and
parses the members after it; both windows start at 64 KB and grow only when a
member is larger. A tail that does not close the JSON means the file was cut
short. A gzip file has no random access, so its stream is inflated once
(output thrown away except the two windows), but never parsed.

``read_json``: a trace file read once, its JSON bytes and its peek verdict
together. A run's worker process places a file and reads its events from one
read, so each file is inflated once, in parallel, and never in the notebook's
process. The verdict must be the one ``peek`` gives, word for word, so the
fast path is taken only when everything is ordinary: one whole gzip member
(or plain JSON) whose head and tail parse. Anything else (a damaged, cut or
multi-member gzip file, a head or tail that does not parse, an unreadable
file) returns no bytes and ``peek``'s own verdict, read from the file as
``discover`` would read it; the caller then reads the trace from the path.
So does a file large enough to be read in pieces (``pieces.streams``): its
bytes are never held whole.
"""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from torchlens.formats.file_kind import RUN_FORMAT
from torchlens.formats.input_files import (
    RefusedFile,
    inflate_cap,
    inflate_pieces,
    json_too_large,
    open_guarded,
)

#: first size of the head and tail windows
PEEK_BYTES = 64 * 1024
#: a head longer than this without ``traceEvents`` is not a trace
HEAD_CAP = 16 * 1024 * 1024
#: members after ``traceEvents`` longer than this are taken for a cut file
TAIL_CAP = 4 * 1024 * 1024
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


@dataclass
class Peek:
    """The top-level members of a trace other than ``traceEvents``, or why not."""

    members: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None  # a Problem kind when the file is not a usable trace
    message: str = ""


def peek(path: str | Path, within: str | None = None) -> Peek:
    """Read just enough of a trace file (plain or gzip) to know its top-level members.

    Opened through ``input_files.open_guarded`` (``within``: the run folder it
    must lie in); a refused file is an "unreadable" verdict saying why, and
    nothing of it is read."""
    try:
        with open_guarded(path, within=within) as fh:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                return _peek_gzip(fh, inflate_cap())
            fh.seek(0)
            return _peek_plain(fh, os.fstat(fh.fileno()).st_size)
    except RefusedFile as exc:
        return _refused(exc)
    except OSError as exc:
        return Peek(kind="unreadable", message=f"cannot read it ({exc.strerror or exc}).")


def _refused(exc: RefusedFile) -> Peek:
    return Peek(kind="unreadable", message=f"refused: {exc.why}.")


def peek_bytes(data: bytes) -> Peek:
    """``peek`` of a (plain) trace already in memory."""
    return _peek_plain(io.BytesIO(data), len(data))


@dataclass
class _Head:
    """The head's verdict: members before the events and where the list opens."""

    members: dict[str, Any]
    events_at: int  # byte offset of the ``[`` that opens the events
    bare: bool  # Chrome's bare-array format: the file is the list


def _peek_plain(fh: BinaryIO, size: int) -> Peek:
    buf = b""
    while True:
        want = min(size, max(PEEK_BYTES, 2 * len(buf)))
        more = fh.read(want - len(buf))
        buf += more
        head = _parse_head(buf, eof=len(buf) >= size or not more)
        if head is not None:
            break
        if len(buf) >= HEAD_CAP:
            return _head_too_long()
    if isinstance(head, Peek):
        return head
    window = PEEK_BYTES
    while True:
        start = max(head.events_at, size - window)
        fh.seek(start)
        members = _parse_tail(fh.read(size - start), head.bare)
        if members is not None:
            return Peek({**head.members, **members})
        if start == head.events_at or window >= TAIL_CAP:
            return _cut(size)
        window *= 4


def _peek_gzip(fh: BinaryIO, cap: int) -> Peek:
    """Inflate once (``input_files.inflate_pieces``: its cap and ratio bound),
    keeping only the head (until it is parsed) and the last bytes."""
    head_buf = bytearray()
    head: _Head | Peek | None = None
    next_try = PEEK_BYTES
    tail = bytearray()
    total = 0
    try:
        for out in inflate_pieces(fh, str(getattr(fh, "name", "")), cap):
            total += len(out)
            if head is None:
                head_buf += out
                if len(head_buf) >= next_try:
                    head = _parse_head(bytes(head_buf), eof=False)
                    if isinstance(head, Peek):
                        return head
                    if head is None and len(head_buf) >= HEAD_CAP:
                        return _head_too_long()
                    next_try = 2 * len(head_buf)
            tail += out
            if len(tail) > 2 * TAIL_CAP:
                del tail[:-TAIL_CAP]
    except RefusedFile as exc:
        return _refused(exc)
    except zlib.error as exc:
        return Peek(kind="unreadable",
                    message=f"damaged gzip data ({exc}); copy or export it again.")
    except EOFError:
        return Peek(kind="truncated", message=(
            f"the gzip stream stops early (after {fh.tell()} compressed bytes, {total} "
            "bytes of JSON): the file was "
            "cut short; copy or export it again."))
    if head is None:
        head = _parse_head(bytes(head_buf), eof=True)
    if isinstance(head, Peek):
        return head
    assert head is not None  # eof=True always decides
    window = min(PEEK_BYTES, len(tail))
    while True:
        start = max(head.events_at, total - window)
        members = _parse_tail(bytes(tail[len(tail) - (total - start):]), head.bare)
        if members is not None:
            return Peek({**head.members, **members})
        if start == head.events_at or window >= len(tail):
            return _cut(total)
        window = min(4 * window, len(tail))


def _cut(size: int, where: str = "inside traceEvents") -> Peek:
    return Peek(kind="truncated", message=(
        f"the JSON stops {where} (after {size} bytes): the file was cut short while "
        "being written or copied; export or copy it again."))


def _head_too_long() -> Peek:
    return Peek(kind="not a trace", message=(
        f"no traceEvents list in its first {HEAD_CAP // (1024 * 1024)} MB; "
        "a Kineto trace opens it near the start."))


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _ran_out(exc: json.JSONDecodeError, s: str) -> bool:
    """Whether a decode error comes from the text stopping, not from bad JSON."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(s) - 8


def _parse_head(data: bytes, eof: bool) -> _Head | Peek | None:
    """The members before ``traceEvents``; None when more bytes are needed."""
    # surrogateescape keeps one character per undecodable byte, so offsets in
    # the text map back to byte offsets in the file
    s = data.decode("utf-8", "surrogateescape")
    i = _ws(s, 1 if s.startswith("\ufeff") else 0)
    early = "before traceEvents"
    if i >= len(s):
        if not eof:
            return None
        return Peek(kind="not a trace", message="the file is empty." if not data
                    else "the file holds only whitespace.")
    if s[i] == "[":
        j = _ws(s, i + 1)
        if j >= len(s):
            return None if not eof else _cut(len(data), early)
        if s[j] in "{]":
            return _Head({}, _offset(s, i), bare=True)
        return Peek(kind="not a trace", message=(
            f"a JSON list of rows like {s[j:j + 30]!r}, not a Kineto trace (an "
            "export_memory_timeline raw file looks like this)."))
    if s[i] != "{":
        return Peek(kind="not a trace", message=f"not JSON (it starts with {s[i:i + 24]!r}).")
    members: dict[str, Any] = {}
    i += 1
    try:
        while True:
            i = _ws(s, i)
            if s[i] == "}":
                return Peek(kind="not a trace", message=_what_it_is(members))
            if members:
                if s[i] != ",":
                    raise json.JSONDecodeError("Expecting ',' delimiter", s, i)
                i = _ws(s, i + 1)
            if s[i] != '"':
                raise json.JSONDecodeError("Expecting property name", s, i)
            key, i = _DECODER.raw_decode(s, i)
            i = _ws(s, i)
            if s[i] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", s, i)
            i = _ws(s, i + 1)
            if key == "traceEvents":
                if s[i] != "[":
                    return Peek(kind="not a trace", message=(
                        f"its traceEvents is not a list (it starts with {s[i:i + 20]!r})."))
                return _Head(members, _offset(s, i), bare=False)
            members[key], i = _DECODER.raw_decode(s, i)
    except IndexError:  # the text stopped between tokens
        return None if not eof else _cut(len(data), early)
    except RecursionError:
        return Peek(kind="not a trace", message="JSON nested too deeply to be a trace.")
    except json.JSONDecodeError as exc:
        if _ran_out(exc, s):
            return None if not eof else _cut(len(data), early)
        return Peek(kind="not a trace", message=(
            f"not valid JSON ({exc.msg} at byte {_offset(s, exc.pos)})."))


def _offset(s: str, i: int) -> int:
    return len(s[:i].encode("utf-8", "surrogateescape"))


def _what_it_is(members: dict[str, Any]) -> str:
    keys = list(members)
    if members.get("format") == RUN_FORMAT:
        return "a torchlens run folder's manifest, not a trace."
    if {"segments", "device_traces"} & set(keys):
        return "an allocator memory snapshot, not a Kineto trace."
    shown = ", ".join(keys[:6]) or "none"
    return f"JSON without a traceEvents list (top-level keys: {shown}), not a Kineto trace."


_LIST_CLOSE = re.compile(r"\][ \t\n\r]*[,}]")
_BARE_END = re.compile(r"[}\[][ \t\n\r]*\][ \t\n\r]*$")


def _parse_tail(data: bytes, bare: bool) -> dict[str, Any] | None:
    """The members after ``traceEvents`` if ``data`` (the file's end) closes the
    JSON, else None.

    The list's close is the earliest ``]`` after which the rest parses as
    ``, "key": value ... }`` to the very end; a ``]`` inside an event fails at
    once, since more events follow it.
    """
    s = data.decode("utf-8", "surrogateescape")
    if bare:
        return {} if _BARE_END.search(s) else None
    for m in _LIST_CLOSE.finditer(s):
        k = m.start() - 1
        while k >= 0 and s[k] in _WS:
            k -= 1
        if k >= 0 and s[k] not in "}[":  # the events list ends with an event or is empty
            continue
        members = _members_to_end(s, m.end() - 1)
        if members is not None:
            return members
    return None


def _members_to_end(s: str, i: int) -> dict[str, Any] | None:
    members: dict[str, Any] = {}
    try:
        while s[i] == ",":
            i = _ws(s, i + 1)
            if s[i] != '"':
                return None
            key, i = _DECODER.raw_decode(s, i)
            i = _ws(s, i)
            if s[i] != ":":
                return None
            members[key], i = _DECODER.raw_decode(s, _ws(s, i + 1))
            i = _ws(s, i)
    except (IndexError, RecursionError, json.JSONDecodeError):
        return None
    return members if s[i] == "}" and _ws(s, i + 1) == len(s) else None



def safe_peek(path: str, within: str | None = None) -> Peek:
    """``peek``, with any unexpected error as an "unreadable" verdict."""
    try:
        return peek(path, within)
    except Exception as exc:  # noqa: BLE001 - one odd file must not stop the whole run
        return Peek(kind="unreadable", message=f"could not be read ({exc!r}).")


def read_json(path: str | Path, within: str | None = None) -> tuple[bytes | None, Peek]:
    """The file's JSON bytes (``None`` off the fast path) and its peek verdict;
    read through ``input_files.open_guarded``, its JSON no larger than
    ``inflate_cap()``."""
    name = str(path)
    cap = inflate_cap()
    from torchlens.formats.kineto.pieces import streams

    if streams(name):  # read in pieces by ``load_trace``: never whole in memory here
        return None, safe_peek(name, within)
    try:
        with open_guarded(name, within=within) as fh:
            size = os.fstat(fh.fileno()).st_size
            gz = fh.read(2) == b"\x1f\x8b"
            if not gz and size > cap:
                return None, _refused(json_too_large(name, cap))
            fh.seek(0)
            data = fh.read(cap + 1)
    except RefusedFile as exc:
        return None, _refused(exc)
    except OSError:
        return None, safe_peek(name, within)
    if gz:
        # in pieces, the ratio checked against what was consumed so far: a bomb
        # is refused past RATIO_FLOOR, not after inflating ratio x the whole file
        try:
            data = b"".join(inflate_pieces(io.BytesIO(data), name, cap))
        except RefusedFile as exc:
            return None, _refused(exc)
        except (zlib.error, EOFError):
            return None, safe_peek(name, within)  # damaged, or cut short
    elif len(data) > cap:
        return None, _refused(json_too_large(name, cap))
    try:
        seen = peek_bytes(data)
    except Exception:  # noqa: BLE001 - peek's own path says what is wrong
        seen = Peek(kind="unreadable")
    if seen.kind is not None:
        return None, safe_peek(name, within)
    return data, seen
