"""A large trace file read in pieces: memory bounded by the table, not the file.

The whole-file path holds the file's JSON, the scanner's columns and the
converted table at once: about three times the JSON at its peak (a 1.2 GB
trace took 3.7 GB). Here the JSON streams from the file (a gzip file is
inflated as it streams) and only ``PIECE_BYTES`` of it is in memory at a time:

1. the members before ``"traceEvents": [`` are read as they are;
2. the array's events are cut into pieces at the boundaries between two
   events (a ``}``, a comma, a ``{``), each piece is wrapped as a document of
   its own (``{"traceEvents":[...]}``) and scanned by the C scanner, and its
   columns are converted as the whole-file native path converts them
   (``native._columns``);
3. each piece's text codes are renumbered into the labels of the whole trace
   (first appearance, as the whole-file path numbers them), its number
   columns kept; the columns are joined once at the end, one at a time;
4. the last piece is the rest of the file: its events, the array's ``]``, the
   members after it; scanned as one document, its other members are those.

The table equals the whole-file path's, column for column
(``tests/formats/test_ingest_pieces.py`` checks every shared trace cut into
pieces of a few KB). A cut that falls inside a string (a name holding
``},{``) leaves a piece that is no JSON document: the scanner refuses it, and
so does anything else this reader cannot take (no C scanner, no
``traceEvents`` array, a piece the native path declines): ``load_in_pieces``
then returns None and the caller reads the file whole, which handles and
words every odd case.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

from torchlens.formats.input_files import (
    inflate_pieces,
    json_too_large,
    open_guarded,
    streamed_cap,
)
from torchlens.formats.kineto import native
from torchlens.formats.kineto.columns import RawColumns, held
from torchlens.formats.kineto.schema import KinetoTrace
from torchlens.model.table import Sparse

#: JSON bytes scanned at a time: the reader's memory beyond the table is a
#: small multiple of this
PIECE_BYTES = 32 << 20
#: a file (or a gzip file's compressed bytes, times ``GZIP_RATIO``) above this
#: is read in pieces; smaller ones whole, the faster way for them
STREAM_ABOVE = 256 << 20
#: how much a trace's JSON is larger than its gzip file, about
GZIP_RATIO = 10
#: the members before the events may hold this much before the reader gives up
MAX_HEAD = 64 << 20
#: a piece may grow to this many times ``PIECE_BYTES`` while no cut is found
MAX_GROWTH = 4

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_NEXT_EVENT = re.compile(rb"\s*,\s*\{")


def streams(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is large enough to be read in pieces (``STREAM_ABOVE``)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return False  # a FIFO, a device: never opened here (``open_guarded`` refuses it)
        size = st.st_size
        if size <= STREAM_ABOVE // GZIP_RATIO:
            return False
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
    except OSError:
        return False
    return (size * GZIP_RATIO if gz else size) > STREAM_ABOVE


def json_pieces(path: str, within: str | None = None) -> Iterator[bytes]:
    """The file's JSON bytes in pieces (inflated when it is gzip), refused past
    ``streamed_cap()``."""
    cap = streamed_cap()
    with open_guarded(path, within=within) as fh:
        gz = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        if gz:
            yield from inflate_pieces(fh, path, cap)
            return
        if os.fstat(fh.fileno()).st_size > cap:
            raise json_too_large(path, cap)
        while True:
            piece = fh.read(8 << 20)
            if not piece:
                return
            yield piece


class _Joined:
    """The pieces' columns, their text renumbered into the whole trace's labels."""

    def __init__(self) -> None:
        self.pieces: dict[str, list[np.ndarray]] = {}
        self.labels: dict[str, list[str]] = {}
        self.index: dict[str, dict[str, int]] = {}
        self.pid_labels: dict[str, str] = {}
        self.tid_labels: dict[str, str] = {}
        self.meta_events: list[Any] = []
        self.rows = 0

    def add(self, raw: RawColumns) -> None:
        for name, codes in raw.cols.items():
            if name in raw.cats:
                known = self.index.setdefault(name, {})
                labels = self.labels.setdefault(name, [])
                lut = np.empty(len(raw.cats[name]) + 1, np.int32)
                for i, label in enumerate(raw.cats[name]):
                    code = known.get(label)
                    if code is None:
                        code = known[label] = len(labels)
                        labels.append(label)
                    lut[i] = code
                lut[-1] = -1  # code -1 picks the trailing -1
                codes = lut[codes]
            # a column most events leave unset is kept sparse piece by piece: the
            # pieces never hold it whole
            self.pieces.setdefault(name, []).append(held(codes, name))
        self.meta_events += raw.meta_events
        self.rows += len(raw.cols["ts"])

    def columns(self) -> RawColumns:
        """One ``RawColumns``, the pieces joined a column at a time (each column's
        pieces freed as it is joined)."""
        cols: dict[str, np.ndarray] = {}
        for name in list(self.pieces):
            parts = self.pieces.pop(name)
            if all(isinstance(p, Sparse) for p in parts):
                cols[name] = held(Sparse.join(parts), name)
            else:
                cols[name] = np.concatenate([p.dense() if isinstance(p, Sparse) else p
                                             for p in parts])
            del parts
        cats = {name: self.labels[name] for name in self.labels}
        raw = RawColumns(cols, cats, None, self.meta_events, self.pid_labels,
                         self.tid_labels)
        raw.names = native.LabelAt(cols["name"], cats["name"])
        return raw


def _last_cut(buf: bytearray, limit: int) -> tuple[int, int] | None:
    """The last boundary between two events before ``limit``: (end of the one
    before, the ``{`` of the next), or None."""
    i = buf.rfind(b"}", 0, limit)
    while i >= 0:
        m = _NEXT_EVENT.match(buf, i + 1)
        if m:
            return i + 1, m.end() - 1
        i = buf.rfind(b"}", 0, i)
    return None


def _last_piece(buf: bytes, joined: _Joined) -> dict[str, Any] | None:
    """Scan the last events and the end of the file into ``joined``: ``buf`` is
    all that is left after the last cut (events, the array's ``]``, the members
    after it, the closing ``}``), which wrapped as ``{"traceEvents":[`` + ``buf``
    is a document whose other members are those after the array. Those
    members, or None when the scanner declines it."""
    doc = b'{"traceEvents":[' + buf
    scanned = native.scan(doc)
    if scanned is None:
        if len(buf) > MAX_HEAD:
            return None
        try:  # no event left (the scanner takes no empty array): the members alone
            rest = msgspec.json.decode(doc)
        except msgspec.DecodeError:
            return None
        if not isinstance(rest, dict) or rest.get("traceEvents") != []:
            return None
        rest.pop("traceEvents")
        return rest
    raw = native.columns_of(doc, scanned, joined.pid_labels, joined.tid_labels)
    if raw is None:
        return None
    joined.add(raw)
    try:
        members = {msgspec.json.decode(b'"' + doc[k:k + kn] + b'"'):
                   msgspec.json.decode(doc[v:v + vn]) for k, kn, v, vn in scanned[1]}
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    members.pop("traceEvents", None)
    return members


def _scan(piece: bytes, joined: _Joined) -> bool:
    """Scan one piece of events into ``joined``; False when the scanner or the
    native conversion declines it."""
    doc = b'{"traceEvents":[' + piece + b"]}"
    scanned = native.scan(doc)
    if scanned is None:
        return False
    raw = native.columns_of(doc, scanned, joined.pid_labels, joined.tid_labels)
    if raw is None:
        return False
    joined.add(raw)
    return True


def load_in_pieces(path: str, within: str | None = None,
                   piece_bytes: int = PIECE_BYTES) -> tuple[RawColumns, KinetoTrace] | None:
    """The trace's columns and its other top-level members, read in pieces of
    about ``piece_bytes``; None when it cannot be read this way (module
    docstring): the caller reads it whole. ``RefusedFile`` past the cap, and
    ``OSError`` / ``zlib.error`` / ``EOFError`` from the file, as the
    whole-file reader raises them."""
    if not native.available():
        return None
    stream = json_pieces(path, within)
    buf = bytearray()
    match = None
    for more in stream:
        buf += more
        match = _EVENTS_KEY.search(buf)
        if match or len(buf) > MAX_HEAD:
            break
    if match is None:
        return None
    try:
        head = msgspec.json.decode(bytes(buf[:match.end() - 1]) + b"[]}")
    except msgspec.DecodeError:
        return None
    if not isinstance(head, dict):
        return None
    del buf[:match.end()]
    joined = _Joined()
    done = False
    most = MAX_GROWTH * piece_bytes
    while True:
        while not done and len(buf) < piece_bytes:
            more = next(stream, None)
            if more is None:
                done = True
            else:
                buf += more
        if done:
            after = _last_piece(bytes(buf), joined)
            del buf
            if after is None:
                return None
            head.update(after)
            break
        cut = _last_cut(buf, piece_bytes)
        if cut is None:
            if piece_bytes >= most:
                return None
            piece_bytes *= 2  # an event larger than a piece: take more
            continue
        if not _scan(bytes(buf[:cut[0]]), joined):
            return None
        del buf[:cut[1]]
    if not joined.rows:
        return None  # no event but metadata: the whole-file path words the error
    head.pop("traceEvents", None)
    try:
        rest = msgspec.convert(head, KinetoTrace)
    except msgspec.ValidationError:
        return None
    return joined.columns(), rest
